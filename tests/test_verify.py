"""`verify` and `restore`: lossless by proof, and tampering caught by name."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import (
    REAL_WITH_GPU,
    TERMINAL,
    assert_refused,
    assert_same_bytes,
    assert_verified,
    layers_args,
    read_bytes,
    real_trace,
    run,
)

from samples.generate import LM_HEAD


@pytest.fixture(scope="module")
def compacted(tmp_path_factory):
    """A layers + compaction output of a generated trace (plain JSON), and its source."""
    from samples.generate import TraceConfig, generate

    folder = tmp_path_factory.mktemp("verify")
    source = folder / "source.json"
    generate(source, TraceConfig(iterations=3))
    out = folder / "annotated.json"
    result = run(*layers_args(source, out, "--max-gpu-lanes", "10", "--end-anchor-regex",
                              TERMINAL, passes=3))
    assert result.returncode == 0, result.stderr.decode()
    return source, out


@pytest.mark.parametrize("command", ["layers", "compact", "layers+lanes"])
@pytest.mark.parametrize("suffix", [".json", ".json.gz", ".json.zst"])
def test_outputs_verify_and_restore_exactly(traces, tmp_path, command, suffix):
    trace, _ = traces(f"v{suffix}", iterations=2)
    out = tmp_path / f"out{suffix}"
    if command == "compact":
        args = ["compact", "--trace", trace, "--output", out]
    else:
        extra = ["--max-gpu-lanes", "10"] if command == "layers+lanes" else []
        args = layers_args(trace, out, *extra, passes=2)
    assert run(*args).returncode == 0
    result = run("verify", "--trace", trace, "--output", out)
    assert result.returncode == 0, result.stdout.decode()
    assert result.stdout.decode().startswith("verified: all checks hold")
    restored = tmp_path / "restored.json"
    result = run("restore", "--trace", out, "--output", restored)
    assert result.returncode == 0, result.stderr.decode()
    assert_same_bytes(restored, trace)  # `cmp` with the decompressed source is silent


@pytest.mark.parametrize("name", REAL_WITH_GPU)
def test_real_traces_verify_and_restore(name, tmp_path):
    trace = real_trace(name)
    out = tmp_path / "out.json.gz"
    assert run("compact", "--trace", trace, "--output", out).returncode == 0
    assert_verified(trace, out)
    restored = tmp_path / "restored.json"
    assert run("restore", "--trace", out, "--output", restored).returncode == 0
    assert_same_bytes(restored, trace)


def test_json_verdict(compacted):
    source, out = compacted
    result = run("verify", "--trace", source, "--output", out, "--json")
    verdict = json.loads(result.stdout)
    assert verdict["verdict"] == "ok" and result.returncode == 0
    names = {c["name"] for c in verdict["checks"]}
    assert {"source sha256", "restored events equal the source", "depth zero on synthetic tracks",
            "flows on their activity's lane", "guides", "kernel and stream counts"} <= names


# -- tampering ------------------------------------------------------------------------------


def tamper(compacted, tmp_path, edit) -> tuple[Path, Path]:
    """A copy of the annotated trace (and its report) with `edit` applied to its text."""
    source, out = compacted
    copy = tmp_path / "tampered.json"
    text = out.read_text()
    changed = edit(text)
    assert changed != text, "the tampering must change something"
    copy.write_text(changed)
    shutil.copy(f"{out}.layers.json", f"{copy}.layers.json")
    return source, copy


def failed_checks(source, output, report=None) -> dict[str, str]:
    args = ["verify", "--trace", source, "--output", output, "--json"]
    if report:
        args += ["--report", report]
    result = run(*args)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    verdict = json.loads(result.stdout)
    return {c["name"]: c["detail"] for c in verdict["checks"] if not c["ok"]}


def _first_kernel(text: str, name: str = "flash_fwd") -> re.Match:
    return re.search(
        r'"name": "' + name + r'[^"]*", "pid": 0, "tid": (\d+),\n\s*"ts": (\d+)\.(\d{3})', text
    )


def test_kernel_shifted_by_one_ns(compacted, tmp_path):
    def edit(text):
        m = _first_kernel(text)
        ns = int(m.group(3)) + 1
        return text[: m.start(3)] + f"{ns:03d}" + text[m.end(3):]

    failures = failed_checks(*tamper(compacted, tmp_path, edit))
    assert "the restored bytes differ" in failures["restored events equal the source"]
    detail = failures["output equals the plan"]
    assert "field ts" in detail and re.search(r"\.\d{3} vs \d+\.\d{3}", detail)


def test_dropped_event(compacted, tmp_path):
    def edit(text):
        start = text.index('  {\n    "ph": "X", "cat": "cpu_op"')
        end = text.index("  },\n", start) + len("  },\n")
        return text[:start] + text[end:]

    failures = failed_checks(*tamper(compacted, tmp_path, edit))
    assert "restored events equal the source" in failures


def test_kernel_moved_to_another_lane(compacted, tmp_path):
    source, out = compacted
    report = json.loads(Path(f"{out}.layers.json").read_text())
    lanes = report["compaction"]["groups"][0]["lane_tids"]

    def edit(text):
        m = re.search(r'"name": "' + re.escape(LM_HEAD) + r'", "pid": 0, "tid": (\d+)', text)
        other = next(t for t in lanes if t != int(m.group(1)))
        return text[: m.start(1)] + str(other) + text[m.end(1):]

    failures = failed_checks(*tamper(compacted, tmp_path, edit))
    assert "the plan puts it at pid 0 tid" in failures["output equals the plan"]


_RELOCATED_FLOW = r'"ph": "f", "id": \d+, "pid": 0, "tid": (\d+), "ts": (\d+)\.\d{3}'


def test_flow_moved_off_its_activitys_lane(compacted, tmp_path):
    source, out = compacted
    report = json.loads(Path(f"{out}.layers.json").read_text())
    lanes = report["compaction"]["groups"][0]["lane_tids"]

    def edit(text):
        m = re.search(_RELOCATED_FLOW, text)
        other = next(t for t in lanes if t != int(m.group(1)))
        return text[: m.start(1)] + str(other) + text[m.end(1):]

    failures = failed_checks(*tamper(compacted, tmp_path, edit))
    assert list(failures) == ["output equals the plan"]  # one tampered value, one failure
    assert re.fullmatch(r"event \d+ \(f 'ac2g' pid 0 tid \d+ ts [0-9.]+\) is at pid 0 tid \d+, "
                        r"the plan puts it at pid 0 tid \d+", failures["output equals the plan"])


@pytest.mark.parametrize("ts", ["1", "1900000000000000"], ids=["before", "after"])
def test_flow_moved_away_from_every_activity(compacted, tmp_path, ts):
    """Before every activity of its stream, or after all of them (past every end)."""
    def edit(text):
        m = re.search(_RELOCATED_FLOW, text)
        return text[: m.start(2)] + ts + text[m.end(2):]

    failures = failed_checks(*tamper(compacted, tmp_path, edit))
    # named once by the plan check; the restore check fails by hash; nothing follows on
    assert list(failures) == ["restored events equal the source", "output equals the plan"]
    assert "field ts: " in failures["output equals the plan"]


def test_renamed_kernel(compacted, tmp_path):
    failures = failed_checks(*tamper(compacted, tmp_path,
                                     lambda t: t.replace(f'"{LM_HEAD}"', '"lm_head"', 1)))
    assert "the restored bytes differ" in failures["restored events equal the source"]
    detail = failures["output equals the plan"]
    assert f'field name: "{LM_HEAD[:40]}' in detail and 'vs "lm_head"' in detail


def test_changed_stream(compacted, tmp_path):
    def edit(text):
        m = re.search(r'"stream": (\d+)', text[text.index('"_compact_gpu_track"') - 600:])
        base = text.index('"_compact_gpu_track"') - 600
        return text[: base + m.start(1)] + "99999" + text[base + m.end(1):]

    failures = failed_checks(*tamper(compacted, tmp_path, edit))
    assert "the restored bytes differ" in failures["restored events equal the source"]
    assert "field args.stream" in failures["output equals the plan"]


def test_report_from_another_source(compacted, traces, tmp_path):
    source, out = compacted
    other, _ = traces("other_source.json", iterations=3, seed=7)
    other_out = tmp_path / "other.json"
    assert run(*layers_args(other, other_out, "--max-gpu-lanes", "10", passes=3)).returncode == 0
    failures = failed_checks(source, out, f"{other_out}.layers.json")
    assert "a report from another source" in failures["source sha256"]


def test_report_without_a_source_hash(compacted, tmp_path):
    """A hand-edited report with a null hash fails that check (no traceback)."""
    source, out = compacted
    report = json.loads(Path(f"{out}.layers.json").read_text())
    report["source_sha256"] = None
    edited = tmp_path / "edited.layers.json"
    edited.write_text(json.dumps(report))
    failures = failed_checks(source, out, edited)
    assert "differs from the report's None" in failures["source sha256"]


def test_two_slices_overlapping_on_a_lane(compacted, tmp_path):
    """Stretch one kernel so it overlaps the next slice on its lane."""
    def edit(text):
        m = re.search(r'"name": "' + re.escape(LM_HEAD) + r'", "pid": 0, "tid": \d+,\n'
                      r'\s*"ts": [0-9.]+, "dur": ([0-9.]+)', text)
        return text[: m.start(1)] + "900.000" + text[m.end(1):]

    failures = failed_checks(*tamper(compacted, tmp_path, edit))
    assert list(failures) == ["restored events equal the source", "output equals the plan"]
    assert "field dur: " in failures["output equals the plan"]


def test_unreadable_inputs_exit_2(compacted, tmp_path):
    source, out = compacted
    broken = tmp_path / "broken.json"
    broken.write_bytes(out.read_bytes()[:1000])
    shutil.copy(f"{out}.layers.json", f"{broken}.layers.json")
    assert_refused(run("verify", "--trace", source, "--output", broken), "truncated")
    missing = tmp_path / "missing.json"
    assert_refused(run("verify", "--trace", missing, "--output", out), "not found")
    lonely = tmp_path / "lonely.json"
    shutil.copy(out, lonely)
    assert_refused(run("verify", "--trace", source, "--output", lonely), "no report")


def test_restore_refuses_existing_output_and_edited_input(compacted, tmp_path):
    source, out = compacted
    existing = tmp_path / "exists.json"
    existing.write_text("x")
    assert_refused(run("restore", "--trace", out, "--output", existing), "already exists")
    assert existing.read_text() == "x"

    def edit(text):
        start = text.index('  {\n    "ph": "X", "cat": "cpu_op"')
        end = text.index("  },\n", start) + len("  },\n")
        return text[:start] + text[end:]

    _, tampered = tamper(compacted, tmp_path, edit)
    restored = tmp_path / "restored.json"
    assert_refused(run("restore", "--trace", tampered, "--output", restored),
                   "does not match its report", restored)


def test_restore_of_a_layers_only_output_is_the_prefix(decode_trace, tmp_path):
    trace, _ = decode_trace
    out = tmp_path / "out.json.gz"
    assert run(*layers_args(trace, out, passes=1)).returncode == 0
    restored = tmp_path / "restored.json"
    assert run("restore", "--trace", out, "--output", restored).returncode == 0
    assert_same_bytes(restored, trace)
    assert b'"tracestream":' not in read_bytes(restored)


# -- the chunked comparison -----------------------------------------------------------------


def chunked_and_per_event(monkeypatch, source, output, report=None, workers=None):
    """(verdict of the chunked comparison, verdict of the per-event one, whether the chunked
    one settled it), with the output read in chunks of ~2 KB so that most of its chunks
    are read a column at a time (by `workers` processes, if any)."""
    from functools import partial

    from tracestream.commands.verify import run as module

    monkeypatch.setattr(module, "DocumentScanner",
                        partial(module.DocumentScanner, chunk_bytes=2000))
    settled = []
    chunked = module._fast_compare

    def spy(*args):
        settled.append(chunked(*args))
        return settled[-1]

    monkeypatch.setattr(module, "_fast_compare", spy)
    fast = module.verify(source, output, report, workers=workers)
    monkeypatch.setattr(module, "_fast_compare", lambda *args: False)
    slow = module.verify(source, output, report)
    return fast, slow, settled == [True]


@pytest.mark.parametrize("workers", [0, 2])
def test_chunked_comparison_is_the_per_event_one(compacted, monkeypatch, workers):
    fast, slow, settled = chunked_and_per_event(monkeypatch, *compacted, workers=workers)
    assert settled and fast.ok
    assert fast.to_json() == slow.to_json()


def test_chunked_comparison_of_gzip_files_is_the_per_event_one(compacted, monkeypatch,
                                                                tmp_path):
    """A compressed source's chunks reach the workers through the shared slots, the
    planned bytes come back in the same slot: the same verdict as event by event."""
    import gzip

    source = tmp_path / "source.json.gz"
    source.write_bytes(gzip.compress(compacted[0].read_bytes(), compresslevel=1))
    out = tmp_path / "annotated.json.gz"
    result = run(*layers_args(source, out, "--max-gpu-lanes", "10", "--end-anchor-regex",
                              TERMINAL, passes=3))
    assert result.returncode == 0, result.stderr.decode()
    fast, slow, settled = chunked_and_per_event(monkeypatch, source, out, workers=2)
    assert settled and fast.ok
    assert fast.to_json() == slow.to_json()


def test_chunked_checks_hold_the_per_event_records(compacted, monkeypatch):
    """The output-only checks of the planned chunks (many, retired events between them)
    hold the records the per-event comparison makes of the output's events: the same
    slices, flows and output ordinals, so any failure would name the same events (moved
    activities for the flow-binding check only on the tracks flows come from)."""
    from tracestream import engine
    from tracestream.commands.verify import output_checks as module

    held = []
    close = module.OutputChecks.close

    def keep_then_close(checks):
        stores = {**checks.binding, **checks.depth_stores()}
        held.append(({name: [row for block in store.sorted_blocks() for row in block.tolist()]
                      for name, store in stores.items()},
                     checks.relocated_events, checks.relocated_flows, checks.lane_slices))
        close(checks)

    run_index = engine.run_index

    def small_chunks(source, options, **kwargs):
        options.chunk_bytes = 3000
        return run_index(source, options, **kwargs)

    monkeypatch.setattr(module.OutputChecks, "close", keep_then_close)
    monkeypatch.setattr(engine, "run_index", small_chunks)
    fast, slow, settled = chunked_and_per_event(monkeypatch, *compacted, workers=0)
    assert settled and fast.ok and slow.ok
    chunked, per_event = held
    # the chunked check keeps moved activities only where flows come from (they bind none
    # elsewhere): the per-event check's rows there
    source = per_event[0]["source"]
    flows_from = {track for track, _, _, mode, _ in source if mode != 0}
    per_event[0]["source"] = [row for row in source if row[0] in flows_from or row[3] != 0]
    assert len(per_event[0]["source"]) < len(source)
    assert chunked == per_event
    assert chunked[2] and all(len(rows) for rows in chunked[0].values())


def _plus_one(match: re.Match) -> str:
    return f"{match.group(1)}{int(match.group(2)) + 1}"


@pytest.mark.parametrize("pattern, replace", [
    (r'("relocated_events": )(\d+)', _plus_one),
    (r'("kernel_count": )(\d+)', _plus_one),
    (r'("guide_end_us": )(\d+)', _plus_one),
    (r'("lane_tids": \[)()', r"\g<1>999, "),
], ids=["relocated", "kernels", "guide-row", "lanes"])
def test_chunked_comparison_fails_the_report_as_the_per_event_one(compacted, monkeypatch,
                                                                    tmp_path, pattern, replace):
    """The output is as planned, so the chunked comparison settles it: the output-only
    checks it makes a chunk at a time fail the edited report with the same words."""
    source, out = compacted
    text = Path(f"{out}.layers.json").read_text()
    edited = tmp_path / "edited.layers.json"
    edited.write_text(re.sub(pattern, replace, text, count=1))
    assert edited.read_text() != text
    fast, slow, settled = chunked_and_per_event(monkeypatch, source, out, edited, workers=2)
    assert settled and not fast.ok
    assert fast.to_json() == slow.to_json()


def test_chunked_comparison_leaves_a_changed_output_to_the_per_event_one(compacted,
                                                                         monkeypatch, tmp_path):
    def edit(text):
        m = _first_kernel(text)
        return text[: m.start(3)] + f"{(int(m.group(3)) + 1) % 1000:03d}" + text[m.end(3):]

    fast, slow, settled = chunked_and_per_event(monkeypatch, *tamper(compacted, tmp_path, edit))
    assert not settled and not fast.ok
    assert "field ts" in {c.name: c.detail for c in fast.checks}["output equals the plan"]
    assert fast.to_json() == slow.to_json()


@pytest.mark.parametrize("separator", [b",\n  ", b" ,"])
def test_chunked_comparison_leaves_changed_separators_to_restore(compacted, monkeypatch,
                                                                 tmp_path, separator):
    """A separator between events is no event: the output still equals the plan event for
    event, but it is not the planned bytes, and restore's hash names it."""
    source, out = compacted
    copy = tmp_path / "respaced.json"
    data = out.read_bytes()
    at = data.index(b"},\n", data.index(b'"traceEvents"') + 200) + 1
    copy.write_bytes(data[:at] + separator + data[at + 2:])
    shutil.copy(f"{out}.layers.json", f"{copy}.layers.json")
    fast, slow, settled = chunked_and_per_event(monkeypatch, source, copy)
    assert not settled
    assert [c.name for c in fast.checks if not c.ok] == ["restored events equal the source"]
    assert fast.to_json() == slow.to_json()


@pytest.mark.parametrize("workers", [0, 2])
def test_the_chunked_run_hashes_a_plain_source_once(compacted, monkeypatch, workers):
    """Restore's check compares the restored bytes with the plain source file and hashes
    the file on the way: the main process starts no hash of its own, and the verdict
    names the source's sha256."""
    import hashlib

    from tracestream.commands.verify import run as module
    from tracestream.read import source as source_module

    started = []

    class Counted(source_module.Hasher):
        def __init__(self, *args):
            started.append(args)
            super().__init__(*args)

    monkeypatch.setattr(source_module, "Hasher", Counted)
    source, out = compacted
    verdict = module.verify(source, out, workers=workers)
    assert verdict.ok and not started
    details = {c.name: c.detail for c in verdict.checks}
    assert hashlib.sha256(source.read_bytes()).hexdigest()[:16] in details[
        "restored events equal the source"]


def test_a_report_with_another_source_text_hash_fails_as_event_by_event(compacted,
                                                                        monkeypatch, tmp_path):
    """The restored bytes are the source file's, but the report's source_data_sha256 is not
    their hash: the chunked run leaves it to the per-event comparison, same verdict."""
    source, out = compacted
    text = Path(f"{out}.layers.json").read_text()
    edited = tmp_path / "edited.layers.json"
    edited.write_text(re.sub(r'("source_data_sha256": ")(.)', lambda m: m.group(1) + (
        "1" if m.group(2) == "0" else "0"), text, count=1))
    assert edited.read_text() != text
    fast, slow, settled = chunked_and_per_event(monkeypatch, source, out, edited, workers=2)
    assert not settled and not fast.ok
    assert "source_data_sha256" in {c.name: c.detail for c in fast.checks}[
        "restored events equal the source"]
    assert fast.to_json() == slow.to_json()


def test_an_object_as_a_category_is_verified_not_an_internal_error(compacted, tmp_path):
    """An X event whose `cat` is an object is no activity: compacted and verified as the
    rest (verify once stopped on it with an internal error)."""
    source, _ = compacted
    odd = tmp_path / "odd-category.json"
    text = source.read_text()
    at = text.index("[", text.index('"traceEvents"')) + 1
    odd.write_text(text[:at] + '{"ph": "X", "cat": {"a": 1}, "name": "odd", "pid": 1, '
                   '"tid": 1, "ts": 1, "dur": 1},' + text[at:])
    out = tmp_path / "odd.out.json"
    result = run("compact", "--trace", odd, "--output", out, "--max-gpu-lanes", "10")
    assert result.returncode == 0, result.stderr
    assert_verified(odd, out)


def test_an_object_as_a_kernels_device_is_a_failed_check(compacted, tmp_path):
    """An output no rewrite makes (the index pass refuses such a source): verify names the
    field, no internal error."""
    def edit(text):
        at = text.index('"_compact_gpu_track"')
        device = text.index('"device": ', at) + len('"device": ')
        end = text.index(",", device)
        return text[:device] + '{"x": 1}' + text[end:]

    source, tampered = tamper(compacted, tmp_path, edit)
    result = run("verify", "--trace", source, "--output", tampered)
    assert result.returncode == 1 and "Traceback" not in result.stderr.decode()
    assert 'field args.device: 0 vs {"x":1}' in result.stdout.decode()


def test_a_tampered_output_piped_in_gets_its_verdict(tmp_path):
    """From a pipe, the first pass stops at the first difference; the checks after it read
    the whole stream (they read a truncated spool and refused the output as truncated)."""
    from samples.generate import TraceConfig, generate

    source, out = tmp_path / "source.json", tmp_path / "out.json"
    generate(source, TraceConfig(iterations=300))  # ~13 MB: more than the reader runs ahead
    assert run("compact", "--trace", source, "--output", out).returncode == 0
    text = out.read_bytes()
    at = text.index(b'"dur": ', 3_000_000) + len(b'"dur": ')
    tampered = text[:at] + (b"8" if text[at:at + 1] == b"9" else b"9") + text[at + 1:]
    result = run("verify", "--trace", source, "--output", "-", "--report",
                 f"{out}.compact.json", stdin=tampered)
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith(b"NOT verified") and b"truncated" not in result.stdout
    assert run("verify", "--trace", source, "--output", "-", "--report", f"{out}.compact.json",
               stdin=text).returncode == 0
