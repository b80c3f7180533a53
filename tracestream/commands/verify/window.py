"""`verify` of a window: the output is the window's events of the source, as planned.

The source is indexed and re-planned with the options the report recorded, its window
included; the window's rewrite is run again and its bytes compared with the output's as
they come (nothing is written, nothing held). The report's window counts are checked
against the plan's. Restore's check does not apply: a window is not the whole trace."""

from __future__ import annotations

import contextlib
from pathlib import Path

import orjson

from tracestream.commands.report_shape import report_specs
from tracestream.commands.verify.verdict import Verdict, sha_problem, short_text
from tracestream.engine import build_plan
from tracestream.errors import TraceError
from tracestream.jsontext import PrettyWriter
from tracestream.plan.report import load_report
from tracestream.plan.window import spec_from_options, split_mb
from tracestream.progress import Progress, or_silent
from tracestream.read.hashing import ReadStats
from tracestream.read.sizing import pool_for
from tracestream.read.source import TraceSource
from tracestream.write.window import rewrite_window

_COUNTS = ("passes", "guides", "first_guide", "last_guide", "start_us", "end_us",
           "flows_kept", "flows_dropped", "flows_without_time", "source_events_written",
           "source_events_left_out")


class ComparingSink:
    """Where the planned bytes go: compared with the output's, block by block; the first
    difference is kept (`problem`)."""

    failed = False
    stdout = False

    def __init__(self, annotated: TraceSource):
        self.stats = ReadStats()
        self._blocks = annotated.read(self.stats)
        self._data = memoryview(b"")
        self._kept = b""  # the current block (its memoryview's owner)
        self.offset = 0  # output bytes compared so far
        self.problem: str | None = None

    def _more(self) -> bool:
        block = next(self._blocks, None)
        if block is None:
            return False
        self._kept = block
        self._data = memoryview(block)
        return True

    def write(self, planned) -> None:
        planned = memoryview(planned)
        while self.problem is None and len(planned):
            if not len(self._data) and not self._more():
                self.problem = (f"the output ends at byte {self.offset:,}, where the window "
                                f"holds more: {short_text(bytes(planned[:80]))}")
                return
            n = min(len(planned), len(self._data))
            if planned[:n] != self._data[:n]:
                at = next(k for k in range(n) if planned[k] != self._data[k])
                self.problem = (f"byte {self.offset + at:,} of the output differs from the "
                                f"window's: {short_text(bytes(self._data[at:at + 80]))} where "
                                f"the plan has {short_text(bytes(planned[at:at + 80]))}")
                return
            self.offset += n
            planned, self._data = planned[n:], self._data[n:]

    def finish(self) -> None:
        if self.problem is None and (len(self._data) or self._more()):
            self.problem = (f"the output goes on after byte {self.offset:,}, where the window "
                            f"ends: {short_text(bytes(self._data[:80]))}")
        for _ in self._blocks:  # read to the end: the output's own checks (size, gzip CRC)
            pass


def verify_window(trace: str, output: str, data: dict, report_path: Path, *,
                  tmpdir: str | None, workers: int | None, max_event_bytes: int | None,
                  progress: Progress | None) -> Verdict:
    """The verdict on a window output (see module docstring)."""
    progress = or_silent(progress)
    layer_spec, compact_spec = report_specs(data)
    window = spec_from_options(data["options"].get("window"))
    verdict = Verdict()
    with pool_for(trace, workers) as pool, \
            TraceSource(trace, max_event_bytes=max_event_bytes, spool_dir=tmpdir) as source, \
            TraceSource(output, hashes_data=False, max_event_bytes=max_event_bytes,
                        spool_dir=tmpdir) as annotated:
        try:
            index, plan = build_plan(
                source, layer_spec, compact_spec, output_name=data.get("output_file", ""),
                report_name=data.get("report_file", report_path.name),
                command=data.get("command", ""), tmpdir=tmpdir, pool=pool, progress=progress,
                source_name=data.get("source_file"), window=window)
        except TraceError as exc:
            if source.first_stats is None:
                raise
            verdict.add("source sha256", sha_problem(source, data), "matches the report")
            verdict.add("re-plan from the source", [str(exc)], "")
            return verdict
        try:
            sink = ComparingSink(annotated)
            rewrite_window(source, index, [plan], [sink], pool=pool, progress=progress,
                           phase="verify")
            sink.finish()
            report_problem = _report_problem(plan, source, annotated, report_path)
        finally:
            index.close()
            plan.window.cut.linked.close()
        verdict.add("source sha256", sha_problem(source, data),
                    f"{str(data.get('source_sha256', ''))[:16]}… matches the report")
        planned = plan.report["window"]
        written = data.get("window") if isinstance(data.get("window"), dict) else {}
        verdict.add("window", [
            f"the report's window {key} is {written.get(key)!r}, the plan's {planned.get(key)!r}"
            for key in _COUNTS if written.get(key) != planned.get(key)],
            f"{planned['option']}: {planned['start_ms']} … {planned['end_ms']} ms, "
            f"{planned['source_events_written']:,} source events, "
            f"{planned['flows_dropped']:,} flows dropped at its edges")
        verdict.add("output as planned", [sink.problem] if sink.problem else [],
                    f"every byte of the output is the window's as planned "
                    f"({sink.offset:,} bytes: {plan.report['output_event_count']:,} events)")
        verdict.add("report as planned", [report_problem] if report_problem else [],
                    "every byte of the report is the plan's (its guides, lanes and counts)")
    return verdict


def _report_problem(plan, source: TraceSource, annotated: TraceSource,
                    report_path: Path) -> str | None:
    """Where the report differs from the plan's, written as the run writes it (with the
    source's hashes and the output's compression), compared as it is made: a report of
    10^6 guide rows is never held."""
    report = plan.report
    report["source_sha256"] = source.sha256()
    report["source_data_sha256"] = source.data_sha256()
    report["output_compression"] = annotated.compression
    with open(report_path, "rb") as file:
        compared = _FileComparer(file)
        PrettyWriter(report, compared.write).finish()
        return compared.finish()


class _FileComparer:
    """write() compares the bytes with the file's next ones; the first difference is kept."""

    def __init__(self, file):
        self._file = file
        self.offset = 0
        self.problem: str | None = None

    def write(self, planned: bytes) -> None:
        if self.problem is not None:
            return
        found = self._file.read(len(planned))
        if found != planned:
            at = next((k for k, (a, b) in enumerate(zip(found, planned)) if a != b),
                      min(len(found), len(planned)))
            self.problem = (f"byte {self.offset + at:,} of the report differs from the "
                            f"plan's: {short_text(found[at:at + 60])} where the plan has "
                            f"{short_text(planned[at:at + 60])}")
        self.offset += len(planned)

    def finish(self) -> str | None:
        if self.problem is None and self._file.read(1):
            self.problem = f"the report goes on after byte {self.offset:,}, where the plan's ends"
        return self.problem


def is_manifest(output: str) -> bool:
    """Whether `output` names a split's manifest (`<output>.pieces.json`)."""
    return str(output).endswith(".pieces.json")


def verify_pieces(trace: str, manifest: str, *, tmpdir: str | None, workers: int | None,
                  max_event_bytes: int | None, progress: Progress | None) -> Verdict:
    """Every piece a manifest lists, checked in one pass: the split is planned again from
    the source and the options the pieces' reports recorded, and each piece's bytes are
    compared with its planned ones as they come."""
    progress = or_silent(progress)
    data = _manifest(manifest)
    folder = Path(manifest).parent
    rows = data["pieces"]
    reports = [load_report(folder / row["report"])[0] for row in rows]
    layer_spec, compact_spec = report_specs(reports[0])
    split = split_mb(data["split_mb"])
    verdict = Verdict()
    with pool_for(trace, workers) as pool, \
            TraceSource(trace, max_event_bytes=max_event_bytes, spool_dir=tmpdir) as source, \
            contextlib.ExitStack() as files:
        names = [(r.get("output_file", ""), r.get("report_file", "")) for r in reports]
        try:
            index, plan = build_plan(
                source, layer_spec, compact_spec, output_name="", report_name="",
                command=reports[0].get("command", ""), tmpdir=tmpdir, pool=pool,
                progress=progress, source_name=reports[0].get("source_file"), window=split,
                piece_names=lambda count: (names + [("", "")] * count)[:count])
        except TraceError as exc:
            if source.first_stats is None:
                raise
            verdict.add("source sha256", sha_problem(source, data), "matches the manifest")
            verdict.add("re-plan from the source", [str(exc)], "")
            return verdict
        plans = plan.window.cut.plans
        try:
            if len(plans) != len(rows):
                verdict.add("source sha256", sha_problem(source, data), "matches the manifest")
                verdict.add("pieces", [f"the manifest lists {len(rows)} piece(s), the plan "
                                       f"cuts {len(plans)}"], "")
                return verdict
            annotated = [files.enter_context(TraceSource(
                str(folder / row["file"]), hashes_data=False, max_event_bytes=max_event_bytes,
                spool_dir=tmpdir)) for row in rows]
            sinks = [ComparingSink(piece) for piece in annotated]
            rewrite_window(source, index, plans, sinks, pool=pool, progress=progress,
                           phase="verify")
            for sink in sinks:
                sink.finish()
            report_problems = [
                f"{row['report']}: {problem}" for row, p, piece in zip(rows, plans, annotated)
                if (problem := _report_problem(p, source, piece, folder / row["report"]))]
        finally:
            index.close()
            plan.window.cut.linked.close()
        verdict.add("source sha256", sha_problem(source, data),
                    f"{str(data.get('source_sha256', ''))[:16]}… matches the manifest")
        problems = []
        for row, report, p in zip(rows, reports, plans):
            planned = p.report["window"]
            problems += [f"piece {row['piece']}: the manifest's {key} is {row.get(key)!r}, "
                         f"the plan's {planned.get(key)!r}"
                         for key in ("start_us", "end_us", "passes", "guides")
                         if row.get(key) != planned.get(key)]
            written = report.get("window") if isinstance(report.get("window"), dict) else {}
            problems += [f"piece {row['piece']}: its report's window {key} is "
                         f"{written.get(key)!r}, the plan's {planned.get(key)!r}"
                         for key in _COUNTS if written.get(key) != planned.get(key)]
        verdict.add("pieces", problems,
                    f"{len(rows)} pieces cut as planned, their reports' counts hold")
        differ = [f"{row['file']}: {sink.problem}" for row, sink in zip(rows, sinks)
                  if sink.problem]
        verdict.add("pieces as planned", differ,
                    f"every byte of every piece is its window's as planned "
                    f"({sum(s.offset for s in sinks):,} bytes)", total=len(differ))
        verdict.add("reports as planned", report_problems,
                    "every byte of every piece's report is the plan's")
    return verdict


def _manifest(path: str) -> dict:
    """The manifest as data; TraceError when it is not one."""
    try:
        data = orjson.loads(Path(path).read_bytes())
    except OSError as exc:
        raise TraceError(f"cannot read manifest {path}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise TraceError(f"cannot read manifest {path}: {exc}") from None
    rows = data.get("pieces") if isinstance(data, dict) else None
    if (not isinstance(data, dict) or data.get("kind") != "pieces"
            or not isinstance(data.get("split_mb"), str) or not isinstance(rows, list)
            or not rows or not all(isinstance(r, dict) and isinstance(r.get("file"), str)
                                   and isinstance(r.get("report"), str) for r in rows)):
        raise TraceError(f"{path} is not a tracestream pieces manifest")
    return data
