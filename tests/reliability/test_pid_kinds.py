"""pid 0 and pid "0" are two processes: messages tell them apart, --pid selects either.

`--pid 0` is the number, `--pid '"0"'` (in JSON quotes) the string; a pid given as a
number still finds a string pid when no number pid matches it (`--pid 7` finds "7").
"""

from __future__ import annotations

import json

import pytest

from .support import LAYERS_ARGS, assert_refused, document, kernel, leftovers


@pytest.fixture
def mixed(tmp_path):
    trace = tmp_path / "src" / "t.json"
    trace.parent.mkdir()
    events = [kernel("a", 100 + 10 * i, 5) for i in range(2)]
    events += [kernel("a", 105 + 10 * i, 5, pid="0") for i in range(2)]
    trace.write_bytes(document(events))
    return trace


def test_the_listing_tells_pid_0_from_pid_string_0(cli, tmp_path, mixed):
    out = cli("layers", "--trace", mixed, "--output", tmp_path / "o.json", *LAYERS_ARGS)
    assert_refused(out, 'several processes (pid 0: 2, pid "0": 2)', "--pid", place=False)
    assert leftovers(tmp_path) == ["src"]


@pytest.mark.parametrize("given, chosen", [("0", 0), ('"0"', "0")])
def test_pid_selects_the_number_or_the_string(cli, tmp_path, mixed, given, chosen):
    output = tmp_path / "o.json"
    out = cli("layers", "--trace", mixed, "--output", output, *LAYERS_ARGS, "--pid", given,
              "--quiet")
    assert out.rc == 0, out.describe()
    report = json.loads(output.with_name("o.json.layers.json").read_text())
    assert report["pid"] == chosen and type(report["pid"]) is type(chosen)
    assert cli("verify", "--trace", mixed, "--output", output).rc == 0


def test_compact_pid_selects_the_string(cli, tmp_path, mixed):
    output = tmp_path / "o.json"
    out = cli("compact", "--trace", mixed, "--output", output, "--pid", '"0"', "--quiet")
    assert out.rc == 0, out.describe()
    groups = json.loads(output.with_name("o.json.compact.json").read_text())["groups"]
    assert [g["pid"] for g in groups] == ["0"]


def test_a_number_pid_still_finds_a_string_pid_alone(cli, tmp_path):
    trace = tmp_path / "t.json"
    trace.write_bytes(document([kernel("a", 100 + 10 * i, 5, pid="7") for i in range(2)]))
    out = cli("layers", "--trace", trace, "--output", tmp_path / "o.json", *LAYERS_ARGS,
              "--pid", "7", "--quiet")
    assert out.rc == 0, out.describe()
