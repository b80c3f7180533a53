"""Passes that do not line up with the cadence clusters are refused.

Three iterations of 8 anchors (10 µs apart inside, 210 µs between) read with
--num-layers 4 --passes all are 6 passes of 4: every pass is at one cadence inside,
but half of them start in the middle of an iteration. The gaps between consecutive
passes say so (some are breaks, others not): refused in one line that names the passes
and the gaps and suggests the cluster size; --allow-gaps labels them anyway.
"""

from __future__ import annotations

import json

import pytest

from .support import assert_refused, document, kernel, leftovers, sha256

ARGS = ["--anchor-regex", "^a$", "--phase", "p", "--evidence", "hand-built",
        "--anchor-offset", "0", "--passes", "all"]


@pytest.fixture
def iterations(tmp_path):
    trace = tmp_path / "src" / "t.json"
    trace.parent.mkdir()
    trace.write_bytes(document([kernel("a", 1000 + it * 280 + 10 * i, 5)
                                for it in range(3) for i in range(8)]))
    return trace


def test_passes_inside_an_iteration_are_refused(cli, tmp_path, iterations):
    before = sha256(iterations)
    out = cli("layers", "--trace", iterations, "--output", tmp_path / "o.json", *ARGS,
              "--num-layers", "4")
    line = assert_refused(out, "do not line up with the cadence clusters",
                          "pass(es) 2, 4 follow a break (up to 210.000 µs)",
                          "pass(es) 1, 3, 5 do not (10.000 µs", "ts 1040",
                          "clusters of 8", "--num-layers 8", "--allow-gaps")
    assert "pass 1 starts at match 4" in line
    assert leftovers(tmp_path) == ["src"]
    assert sha256(iterations) == before


def test_allow_gaps_labels_them_and_verify_agrees(cli, tmp_path, iterations):
    output = tmp_path / "o.json"
    out = cli("layers", "--trace", iterations, "--output", output, *ARGS, "--num-layers", "4",
              "--allow-gaps", "--quiet")
    assert out.rc == 0, out.describe()
    assert json.loads(output.with_name("o.json.layers.json").read_text())["passes"] == 6
    assert cli("verify", "--trace", iterations, "--output", output).rc == 0


def test_passes_on_the_clusters_are_accepted(cli, tmp_path, iterations):
    out = cli("layers", "--trace", iterations, "--output", tmp_path / "o.json", *ARGS,
              "--num-layers", "8", "--quiet")
    assert out.rc == 0, out.describe()
