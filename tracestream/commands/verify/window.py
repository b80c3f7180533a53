"""`verify` of a window: the output is the window's events of the source, as planned.

The source is indexed and re-planned with the options the report recorded, its window
included; the window's rewrite is run again and its bytes compared with the output's as
they come (nothing is written, nothing held). The report's window counts are checked
against the plan's. Restore's check does not apply: a window is not the whole trace."""

from __future__ import annotations

from pathlib import Path

import orjson
import zstandard
from isal import igzip

from tracestream.commands.report_shape import report_specs
from tracestream.commands.verify.verdict import Verdict, replan_failed, sha_problem, short_text
from tracestream.engine import (
    build_plan,
    default_report_path,
    name_in_report,
    piece_path,
    pieces_manifest,
)
from tracestream.errors import TraceError
from tracestream.jsontext import PrettyWriter, dumps
from tracestream.plan.report import load_report
from tracestream.plan.window import MAX_PIECES, spec_from_options, split_mb
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

    def __init__(self, annotated: TraceSource | None = None, blocks=None):
        """The output's bytes from `annotated` (a TraceSource), or from `blocks`."""
        self.stats = ReadStats()
        self._blocks = blocks if blocks is not None else annotated.read(self.stats)
        self._data = memoryview(b"")
        self._kept = b""  # the current block (its memoryview's owner)
        self.offset = 0  # output bytes compared so far
        self.problem: str | None = None

    def _more(self) -> bool:
        try:
            block = next(self._blocks, None)
        except (OSError, EOFError, ValueError, zstandard.ZstdError) as exc:
            self.problem = self.problem or (f"the output cannot be read after byte "
                                            f"{self.offset:,}: {exc}")
            self._blocks = iter(())
            return False
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

    def write_then(self, planned: memoryview, done) -> None:
        """OutputFile.write_then: compare `planned` (a worker's shared slot), then free it."""
        try:
            self.write(planned)
        finally:
            done()

    def finish(self) -> None:
        if self.problem is None and (len(self._data) or self._more()):
            self.problem = (f"the output goes on after byte {self.offset:,}, where the window "
                            f"ends: {short_text(bytes(self._data[:80]))}")
        try:
            for _ in self._blocks:  # read to the end: the output's own checks (size, CRC)
                pass
        except (OSError, EOFError, ValueError, zstandard.ZstdError) as exc:
            self.problem = self.problem or f"the output cannot be read to its end: {exc}"


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
            return replan_failed(verdict, source, data, exc)
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
    return str(output).endswith(_MANIFEST_SUFFIX)


def verify_pieces(trace: str, manifest: str, *, tmpdir: str | None, workers: int | None,
                  max_event_bytes: int | None, progress: Progress | None) -> Verdict:
    """Every piece a manifest lists, checked in one pass: the split is planned again from
    the source and the options the pieces' reports recorded, each piece's bytes and its
    report's are compared with the planned ones as they come, and the manifest with the
    one the split writes."""
    progress = or_silent(progress)
    data = _manifest(manifest)
    rows = data["pieces"]
    verdict = Verdict()
    places = _places(manifest, data["command"], len(rows))
    named = [name_in_report(piece, manifest) for piece, _ in places]
    reported = [name_in_report(report, manifest) for _, report in places]
    wrong = [f"piece {k + 1}: the manifest names {row['file']!r} and {row['report']!r}, the "
             f"split writes {named[k]!r} and {reported[k]!r}"
             for k, row in enumerate(rows) if (row["file"], row["report"]) != (named[k],
                                                                              reported[k])]
    if wrong:  # (nothing else is opened: a manifest names only the split's own files)
        verdict.add("pieces", wrong, "")
        return verdict
    first, names = None, []  # (the reports' whole sections, 33 of them, are not held)
    for _, report in places:
        loaded = load_report(Path(report))[0]
        first = first or loaded
        names.append((loaded.get("output_file", ""), loaded.get("report_file", "")))
    layer_spec, compact_spec = report_specs(first)
    split = split_mb(data["split_mb"])
    with pool_for(trace, workers) as pool, \
            TraceSource(trace, max_event_bytes=max_event_bytes, spool_dir=tmpdir) as source:
        try:
            index, plan = build_plan(
                source, layer_spec, compact_spec, output_name="", report_name="",
                command=data["command"], tmpdir=tmpdir, pool=pool,
                progress=progress, source_name=first.get("source_file"), window=split,
                piece_names=lambda count: (names + [("", "")] * count)[:count])
        except TraceError as exc:
            if source.first_stats is None:
                raise
            return replan_failed(verdict, source, data, exc, "the manifest")
        plans = plan.window.cut.plans
        try:
            if len(plans) != len(rows):
                verdict.add("source sha256", sha_problem(source, data), "matches the manifest")
                verdict.add("pieces", [f"the manifest lists {len(rows)} piece(s), the plan "
                                       f"cuts {len(plans)}"], "")
                return verdict
            readers = [_PieceBlocks(piece) for piece, _ in places]
            sinks = [ComparingSink(blocks=reader.blocks()) for reader in readers]
            rewrite_window(source, index, plans, sinks, pool=pool, progress=progress,
                           phase="verify")
            for sink in sinks:
                sink.finish()
            report_problems = [
                f"{row['report']}: {problem}"
                for row, p, reader, (_, report) in zip(rows, plans, readers, places)
                if (problem := _report_problem(p, source, reader, Path(report)))]
        finally:
            index.close()
            plan.window.cut.linked.close()
        verdict.add("source sha256", sha_problem(source, data),
                    f"{str(data.get('source_sha256', ''))[:16]}… matches the manifest")
        expected = orjson.loads(dumps(pieces_manifest(plans, places, manifest, split, source,
                                                      plans[0].report)))
        verdict.add("manifest as planned", _differences(expected, data),
                    f"{len(rows)} pieces cut as planned; every value of the manifest is the "
                    "split's")
        differ = [f"{row['file']}: {sink.problem}" for row, sink in zip(rows, sinks)
                  if sink.problem]
        verdict.add("pieces as planned", differ,
                    f"every byte of every piece is its window's as planned "
                    f"({sum(s.offset for s in sinks):,} bytes)", total=len(differ))
        verdict.add("reports as planned", report_problems,
                    "every byte of every piece's report is the plan's")
    return verdict


def _places(manifest: str, command: str, count: int) -> list[tuple[str, str]]:
    """The (piece, report) paths a split with `count` pieces writes beside `manifest`."""
    output = manifest[: -len(_MANIFEST_SUFFIX)]
    return [(piece_path(output, k), default_report_path(piece_path(output, k), command))
            for k in range(1, count + 1)]


def _differences(expected, found, where: str = "") -> list[str]:
    """Where two JSON values differ (a path and both values each)."""
    if isinstance(expected, dict) and isinstance(found, dict):
        out = []
        for key in list(expected) + [k for k in found if k not in expected]:
            out += _differences(expected.get(key), found.get(key), f"{where}.{key}".strip("."))
        return out
    if isinstance(expected, list) and isinstance(found, list) and len(expected) == len(found):
        out = []
        for k, (a, b) in enumerate(zip(expected, found)):
            out += _differences(a, b, f"{where}[{k}]")
        return out
    if expected == found and type(expected) is type(found):
        return []
    return [f"the manifest's {where or 'value'} is {short_text(orjson.dumps(found)[:80])}, "
            f"the split's {short_text(orjson.dumps(expected)[:80])}"]


class _PieceBlocks:
    """A piece's decompressed bytes, read as they are compared, 256 KB at a time (a split
    has up to 256 pieces open at once: no reader thread or read-ahead each)."""

    BLOCK = 256 << 10

    def __init__(self, path: str):
        self.path = path
        self.compression = "none"

    def blocks(self):
        with open(self.path, "rb") as raw:
            head = raw.read(4)
            raw.seek(0)
            if head[:2] == b"\x1f\x8b":
                self.compression, stream = "gzip", igzip.open(raw, "rb")
            elif head == b"\x28\xb5\x2f\xfd":
                self.compression = "zstd"
                stream = zstandard.ZstdDecompressor().stream_reader(raw,
                                                                    read_across_frames=True)
            else:
                stream = raw
            while data := stream.read(self.BLOCK):
                yield data


_MANIFEST_SUFFIX = ".pieces.json"


def _manifest(path: str) -> dict:
    """The manifest as data; TraceError when it is not one."""
    try:
        data = orjson.loads(Path(path).read_bytes())
    except OSError as exc:
        raise TraceError(f"cannot read manifest {path}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise TraceError(f"cannot read manifest {path}: {exc}") from None
    except RecursionError:
        raise TraceError(f"cannot read manifest {path}: nested too deeply") from None
    rows = data.get("pieces") if isinstance(data, dict) else None
    if (not isinstance(data, dict) or data.get("kind") != "pieces"
            or not isinstance(data.get("split_mb"), str)
            or data.get("command") not in ("layers", "compact")
            or not isinstance(rows, list) or not 0 < len(rows) <= MAX_PIECES
            or not all(isinstance(r, dict) and isinstance(r.get("file"), str)
                       and isinstance(r.get("report"), str) for r in rows)):
        raise TraceError(f"{path} is not a tracestream pieces manifest")
    return data
