"""Progress: every phase reports how far it is, on the input's bytes as stored; the CLI
shows bars at a terminal and plain lines in a log, and --quiet silences both."""

from __future__ import annotations

import gzip
import io
import re
import shutil

import pytest
from click.testing import CliRunner

from samples.generate import TraceConfig, generate
from tests.conftest import layers_args
from tracestream import compact, restore, verify
from tracestream.cli import main
from tracestream.cli import progress as cli_progress
from tracestream.cli.progress import (
    LogProgress,
    TerminalProgress,
    amount,
    duration,
    log_line,
    progress_for,
)
from tracestream.commands.evidence.anchors import find_anchors
from tracestream.commands.evidence.inspect import inspect_trace
from tracestream.engine import add_layer_guides
from tracestream.errors import TraceError
from tracestream.plan.specs import CompactSpec, LayerSpec
from tracestream.progress import SILENT, or_silent


class Recorded:
    """A progress that keeps every phase's counts (the library's side of the protocol)."""

    def __init__(self):
        self.phases: list[dict] = []

    def phase(self, name, total, unit="B"):
        entry = {"name": name, "total": total, "unit": unit, "counts": [], "closed": False}
        self.phases.append(entry)
        return _RecordedMeter(entry)

    def names(self) -> list[str]:
        return [p["name"] for p in self.phases]

    def get(self, name: str) -> dict:
        return next(p for p in self.phases if p["name"] == name)


class _RecordedMeter:
    def __init__(self, entry):
        self.entry = entry

    def advance_to(self, done):
        self.entry["counts"].append(done)

    def close(self):
        self.entry["closed"] = True


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A plain trace of ~11 MB (several 2 MB chunks) and its gzip copy."""
    folder = tmp_path_factory.mktemp("progress")
    plain = folder / "big.json"
    generate(plain, TraceConfig(iterations=250))
    packed = folder / "big.json.gz"
    with open(plain, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    return plain, packed


def _spec():
    return LayerSpec(anchor_regex="^_q_rope_store$", num_layers=8, anchor_offset=0,
                     phase="p", evidence="e", passes="all", extra_anchors_per_pass=1)


def _assert_counts_up_to_total(phase: dict) -> None:
    counts = phase["counts"]
    assert phase["closed"], phase["name"]
    assert counts, f"{phase['name']} reported nothing"
    assert counts == sorted(counts), f"{phase['name']} went back: {counts}"
    assert counts[-1] == phase["total"], (phase["total"], counts[-1])


# -- the library: which phases, counted on what ---------------------------------------------

@pytest.mark.parametrize("workers", [0, 2], ids=["inline", "workers"])
def test_layers_reports_index_plan_and_rewrite_on_the_file_bytes(big, tmp_path, workers):
    plain, _ = big
    seen = Recorded()
    add_layer_guides(plain, tmp_path / "o.json", _spec(), compact=CompactSpec(max_lanes=10),
                     progress=seen, workers=workers)
    assert seen.names() == ["index", "plan", "rewrite"]
    size = plain.stat().st_size
    for name in ("index", "rewrite"):
        phase = seen.get(name)
        assert phase["total"] == size and phase["unit"] == "B"
        _assert_counts_up_to_total(phase)
        assert len(phase["counts"]) >= 4  # one per chunk: a bar that moves, not one jump
    plan = seen.get("plan")
    assert plan["unit"] == "steps" and plan["total"] == 3 and plan["counts"][-1] == 3


def test_a_compressed_input_is_counted_on_its_compressed_bytes(big, tmp_path):
    _, packed = big
    seen = Recorded()
    compact(packed, tmp_path / "o.json", progress=seen, workers=0)
    assert seen.names() == ["index", "plan", "rewrite"]
    for name in ("index", "rewrite"):
        phase = seen.get(name)
        assert phase["total"] == packed.stat().st_size  # not the decompressed size
        _assert_counts_up_to_total(phase)  # every count a compressed position
    assert seen.get("plan")["total"] == 2  # lanes, report


def test_stdin_has_no_total_on_its_first_read_and_the_spool_one_after(big, tmp_path):
    plain, _ = big
    seen = Recorded()
    with open(plain, "rb") as stdin:
        compact("-", tmp_path / "o.json", stdin=stdin, progress=seen, workers=0)
    index, rewrite = seen.get("index"), seen.get("rewrite")
    assert index["total"] is None and index["counts"][-1] == plain.stat().st_size
    assert rewrite["total"] == plain.stat().st_size  # the spool knows the stream's size
    _assert_counts_up_to_total(rewrite)


def test_verify_reports_index_plan_and_the_output_compared(big, tmp_path):
    plain, _ = big
    out = tmp_path / "o.json"
    compact(plain, out, workers=0)
    seen = Recorded()
    assert verify(plain, out, progress=seen, workers=0).ok
    assert seen.names() == ["index", "plan", "verify"]
    phase = seen.get("verify")
    assert phase["total"] == out.stat().st_size
    _assert_counts_up_to_total(phase)


def test_verify_of_a_tampered_output_still_reports_its_comparison(big, tmp_path):
    """The slow comparison (the output is not the planned bytes) moves its meter too."""
    plain, _ = big
    out = tmp_path / "o.json"
    compact(plain, out, workers=0)
    data = out.read_bytes()
    at = data.rindex(b'"dur": ')
    out.write_bytes(data[:at] + b'"dur": 9' + data[at + len(b'"dur": ') + 1:])
    seen = Recorded()
    assert not verify(plain, out, progress=seen, workers=0).ok
    # the bytes compared up to the difference, then the output again event by event: two
    # phases, each counting up from its own start
    assert seen.names() == ["index", "plan", "verify", "verify events"]
    fast, events = seen.get("verify"), seen.get("verify events")
    assert fast["closed"] and fast["counts"][-1] < fast["total"]
    assert events["closed"] and events["counts"] == sorted(events["counts"])
    assert events["total"] == out.stat().st_size and events["counts"][-1] > 0


def test_restore_reports_its_one_pass(big, tmp_path):
    plain, _ = big
    out = tmp_path / "o.json"
    compact(plain, out, workers=0)
    seen = Recorded()
    restore(out, tmp_path / "back.json", progress=seen)
    assert seen.names() == ["restore"]
    assert seen.get("restore")["total"] == out.stat().st_size
    _assert_counts_up_to_total(seen.get("restore"))


def test_inspect_and_anchors_report_their_index_pass(big):
    plain, _ = big
    for call in (lambda p: inspect_trace(plain, progress=p, workers=0),
                 lambda p: find_anchors(plain, "^_q_rope_store$", progress=p, workers=0)):
        seen = Recorded()
        call(seen)
        assert seen.names() == ["index"]
        _assert_counts_up_to_total(seen.get("index"))


def test_a_phase_that_fails_is_closed(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1, "pid": 0, "tid": 0,}]}')
    seen = Recorded()
    with pytest.raises(TraceError, match="malformed JSON at byte 66"):
        compact(bad, tmp_path / "o.json", progress=seen, workers=0)
    assert seen.names() == ["index"] and seen.get("index")["closed"]
    assert not (tmp_path / "o.json").exists()


def test_silent_progress_takes_every_call():
    assert or_silent(None) is SILENT
    meter = SILENT.phase("index", 10)
    meter.advance_to(5)
    meter.close()


# -- the log lines -------------------------------------------------------------------------

def test_log_line_texts():
    assert log_line("index", 412_000_000, 1_000_000_000, "B", 2.575) == (
        "index 41% 412 MB/1.0 GB 160 MB/s eta 4s")
    assert log_line("index", 412_000_000, None, "B", 2.575) == "index 412 MB 160 MB/s (3s)"
    assert log_line("index", 10**9, 10**9, "B", 6.25, end=True) == (
        "index done: 1.0 GB in 6s, 160 MB/s")
    # steps are not equal work: no eta
    assert log_line("plan", 1, 3, "steps", 40) == "plan 33% 1/3 steps (40s)"
    assert log_line("plan", 3, 3, "steps", 40, end=True) == "plan done: 3/3 steps in 40s"
    assert log_line("batch", 4, 10, "traces", 60, note="1 failed, 45.3 MB/s") == (
        "batch 40% 4/10 traces eta 1m30s, 1 failed, 45.3 MB/s")


def test_amounts_and_durations():
    assert [amount(n) for n in (0, 999, 1000, 12_345, 99_400_000, 412e6, 1.5e12)] == [
        "0 B", "999 B", "1.0 kB", "12.3 kB", "99.4 MB", "412 MB", "1.5 TB"]
    assert [duration(s) for s in (0, 4.4, 59.6, 125, 3725)] == [
        "0s", "4s", "1m00s", "2m05s", "1h02m"]


def test_a_log_gets_a_line_per_tenth_and_one_at_the_end():
    clock, out = FakeClock(), io.StringIO()
    meter = LogProgress(out, clock=clock, wake=None).phase("index", 1000)
    for done in range(50, 1001, 50):  # 20 chunks, 0.5 s each
        clock.now += 0.5
        meter.advance_to(done)
    meter.close()
    lines = out.getvalue().splitlines()
    percents = [int(m.group(1)) for m in map(re.compile(r"index (\d+)% ").match, lines) if m]
    # nothing in the first second; then one line per tenth passed, the 100% in the end line
    assert percents == [10, 20, 30, 40, 50, 60, 70, 80, 90]
    assert lines[-1].startswith("index done: 1.0 kB in 10s")
    assert len(lines) == 10


def test_a_phase_that_ends_short_of_its_total_says_where_it_stopped():
    clock, out = FakeClock(), io.StringIO()
    meter = LogProgress(out, clock=clock, wake=None).phase("index", 1000)
    clock.now += 5
    meter.advance_to(450)
    meter.close()  # an error or ^C
    assert out.getvalue().splitlines() == [
        "index 45% 450 B/1.0 kB 90 B/s eta 6s", "index stopped at 45%: 450 B/1.0 kB in 5s"]


def test_a_short_phase_writes_nothing():
    clock, out = FakeClock(), io.StringIO()
    meter = LogProgress(out, clock=clock, wake=None).phase("index", 1000)
    for done in (300, 600, 1000):
        clock.now += 0.2
        meter.advance_to(done)
    meter.close()
    assert out.getvalue() == ""


def test_a_phase_that_passes_no_tenth_still_writes_every_30_seconds():
    clock, out = FakeClock(), io.StringIO()
    meter = LogProgress(out, clock=clock, wake=None).phase("plan", 3, "steps")
    clock.now += 29
    meter.beat()
    assert out.getvalue() == ""
    clock.now += 2
    meter.beat()
    clock.now += 10
    meter.beat()  # 10 s after the last line: nothing
    meter.advance_to(1)  # a third: past three tenths
    clock.now += 30
    meter.beat()
    meter.advance_to(3)  # (the last step passes no tenth below the end: no line)
    meter.close()
    assert out.getvalue().splitlines() == [
        "plan 0% 0/3 steps (31s)", "plan 33% 1/3 steps (41s)", "plan 33% 1/3 steps (1m11s)",
        "plan done: 3/3 steps in 1m11s"]


def test_a_closed_stream_stops_the_lines_not_the_run():
    class ClosedPipe(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    clock = FakeClock()
    meter = LogProgress(ClosedPipe(), clock=clock, wake=None).phase("index", 10)
    clock.now += 5
    for done in range(1, 11):
        meter.advance_to(done)  # raises nothing
    meter.close()


def test_a_terminal_gets_a_bar():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    progress = progress_for(False, out)
    assert isinstance(progress, TerminalProgress)
    meter = progress.phase("index", 10**8)
    meter._start -= 5  # as if it had run for 5 s: past the delay before a bar shows
    meter._bar.start_t -= 5
    meter.advance_to(5 * 10**7)
    meter.close()
    assert re.search(r"index: +50%\|.*\| 50\.0M/100M", out.getvalue())


def test_batch_lines_above_a_terminal_bar(capsys):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    bar = Terminal()
    meter = TerminalProgress(bar).phase("batch compact", 4, "traces")
    meter.advance_to(1)
    meter.echo('{"trace": "a"}')  # before the bar shows: the line alone, no early bar
    assert capsys.readouterr().out == '{"trace": "a"}\n' and bar.getvalue() == ""
    meter._start -= 5  # as if 5 s had gone by
    meter._bar.start_t -= 5
    meter.advance_to(2)
    meter.echo('{"trace": "b"}')  # the bar is drawn with the count as of now
    meter.close()
    assert '{"trace": "b"}' in capsys.readouterr().out
    assert "2/4" in bar.getvalue() and "0/4" not in bar.getvalue()


def test_quiet_and_a_log_choose_their_progress():
    assert progress_for(True, io.StringIO()) is None
    assert isinstance(progress_for(False, io.StringIO()), LogProgress)


# -- the CLI --------------------------------------------------------------------------------

@pytest.fixture
def shown_at_once(monkeypatch):
    """Progress from the first chunk on (a test trace takes less than the usual second)."""
    monkeypatch.setattr(cli_progress, "SHOW_AFTER", 0.0)


def _lines(stderr: str, phase: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(f"{phase} ")]


def test_layers_writes_progress_lines_to_a_log(big, tmp_path, shown_at_once):
    plain, _ = big
    result = CliRunner().invoke(main, layers_args(str(plain), str(tmp_path / "o.json"),
                                                  passes="all"))
    assert result.exit_code == 0, result.output
    size = amount(plain.stat().st_size)
    index = _lines(result.stderr, "index")
    assert re.fullmatch(rf"index \d+% [\d.]+ [kM]B/{size} [\d.]+ [kMG]B/s eta \d+s",
                        index[0]), index
    assert index[-1].startswith(f"index done: {size} in ")
    assert _lines(result.stderr, "rewrite")[-1].startswith(f"rewrite done: {size} in ")
    assert "elapsed:" in result.stderr  # the summary follows


@pytest.mark.parametrize("command", [
    ["compact", "--output", "{out}"],
    ["inspect"],
    ["anchors", "--anchor-regex", "^_q_rope_store$"],
], ids=["compact", "inspect", "anchors"])
def test_quiet_silences_progress(big, tmp_path, shown_at_once, command):
    plain, _ = big
    args = [a.replace("{out}", str(tmp_path / "o.json")) for a in command]
    loud = CliRunner().invoke(main, [*args, "--trace", str(plain)])
    assert loud.exit_code == 0 and _lines(loud.stderr, "index"), loud.stderr
    (tmp_path / "o.json").unlink(missing_ok=True)
    (tmp_path / "o.json.compact.json").unlink(missing_ok=True)
    quiet = CliRunner().invoke(main, [*args, "--trace", str(plain), "--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_verify_and_restore_show_progress_and_take_quiet(big, tmp_path, shown_at_once):
    plain, _ = big
    out = tmp_path / "o.json"
    compact(plain, out, workers=0)
    checked = CliRunner().invoke(main, ["verify", "--trace", str(plain), "--output", str(out)])
    assert checked.exit_code == 0, checked.output
    assert _lines(checked.stderr, "verify")[-1].startswith("verify done:")
    silent = CliRunner().invoke(main, ["verify", "--trace", str(plain), "--output", str(out),
                                       "--quiet"])
    assert silent.exit_code == 0 and silent.stderr == "" and "[ok]" in silent.stdout
    back = CliRunner().invoke(main, ["restore", "--trace", str(out), "--output",
                                     str(tmp_path / "back.json")])
    assert back.exit_code == 0 and _lines(back.stderr, "restore")
    assert back.stdout.startswith("restored ")
    again = CliRunner().invoke(main, ["restore", "--trace", str(out), "--output",
                                      str(tmp_path / "again.json"), "--quiet"])
    assert again.exit_code == 0 and again.stderr == "" and again.stdout == ""
    assert (tmp_path / "again.json").read_bytes() == plain.read_bytes()


def test_restore_json_is_one_object(big, tmp_path):
    import orjson

    plain, _ = big
    out = tmp_path / "o.json"
    compact(plain, out, workers=0)
    result = CliRunner().invoke(main, ["restore", "--trace", str(out), "--output",
                                       str(tmp_path / "back.json"), "--json", "--quiet"])
    assert result.exit_code == 0
    counts = orjson.loads(result.stdout)
    assert counts["output"] == str(tmp_path / "back.json") and counts["events"] > 0
