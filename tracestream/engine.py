"""The library API: what the CLI calls, and what a notebook can call directly.

    from tracestream import add_layer_guides, LayerSpec
    report = add_layer_guides("TP-0.trace.json.gz", "TP-0.layers.trace.json.gz",
                              LayerSpec(anchor_regex="^_q_rope_store$", num_layers=40,
                                        anchor_offset=0, phase="target-verify",
                                        evidence="one Q-store per layer; L0 verified"))
    report.summary()
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tracestream.errors import (
    TraceError,
    compile_pattern,
    flag_of,
    require_utf8,
)
from tracestream.index.builder import IndexOptions, run_index
from tracestream.index.records import temp_dir_for
from tracestream.index.window import SizeBins
from tracestream.jsontext import PrettyWriter, dumps_pretty
from tracestream.parallel.memory import release_memory
from tracestream.plan.guidetext import GuideRows
from tracestream.plan.planner import Plan, Planner
from tracestream.plan.report import LayerRows
from tracestream.plan.specs import (
    ANCHOR_POINT_ONLY,
    TERMINAL_KERNEL_END,
    CompactSpec,
    LayerSpec,
    validate_specs,
)
from tracestream.plan.window import (
    SplitSpec,
    WindowPlan,
    WindowSpec,
    cut_plan,
    options_of,
    plan_windows,
)
from tracestream.progress import Progress, or_silent
from tracestream.read.compression import SUFFIXES, compression_for
from tracestream.read.sizing import pool_for
from tracestream.read.source import TraceSource
from tracestream.write.rewrite import rewrite
from tracestream.write.sink import (
    SMALL_BLOCK,
    OutputFile,
    check_compress_level,
    check_new_path,
    commit_together,
    input_identity,
    refuse_writing_input,
)
from tracestream.write.window import rewrite_window


@dataclass
class Report:
    """What a rewrite did: the report's content and where output and report went."""

    data: dict  # the report's content; its `layers` rows are read from the report file
    output: str
    report_path: str | None
    trace: str | None = None  # the source as given (for the next-step commands)
    seconds: float | None = None  # elapsed, from the call to the committed outputs
    first_guide: dict | None = None  # the first and last `layers` rows, as written
    last_guide: dict | None = None

    def summary(self) -> str:
        return summarize(self.data, self.output, self.report_path, trace=self.trace,
                         seconds=self.seconds)

    def layer_rows(self) -> Iterator[dict]:
        """The report's `layers` rows, one at a time, read from the report file (a nightly
        run writes 10^5-10^6 of them: they are never all in memory)."""
        return iter(self.data.get("layers", ()))

    def json_summary(self) -> dict:
        """What `--json` prints: the report without its per-guide rows, plus the
        guide count, the first and last guide, the lanes per device, the paths and the
        elapsed seconds (the rows are in the report file)."""
        data = {key: value for key, value in self.data.items() if key != "layers"}
        if "layers" in self.data:
            data.update(guide_count=len(self.data["layers"]), first_guide=self.first_guide,
                        last_guide=self.last_guide)
        compaction = self.data.get("compaction", self.data if "groups" in self.data else None)
        if compaction:
            data["lanes_per_device"] = [
                {"pid": g["pid"], "device": g["device"], "kind": g["kind"], "lanes": g["lanes"]}
                for g in compaction["groups"]]
        data.update(output=self.output, report=self.report_path)
        if self.seconds is not None:
            data["elapsed_seconds"] = round(self.seconds, 3)
        return data


def _finished(report: dict, report_path: str, output: str, trace: str,
              seconds: float) -> Report:
    """The Report of a run whose report file is written: its `layers` rows (made as they
    were written) become a reader of that file."""
    data = dict(report)
    rows = data.get("layers")
    if not isinstance(rows, GuideRows):
        return Report(data, output, report_path, trace, seconds)
    data["layers"] = LayerRows(report_path, len(rows))
    return Report(data, output, report_path, trace, seconds, rows.first, rows.last)


def default_report_path(output: str, kind: str) -> str:
    """`<output>.layers.json` or `<output>.compact.json`, next to the output."""
    return f"{output}.{kind}.json"


def name_in_report(path: str, report_path: str) -> str:
    """A file as its report names it: relative to the report's folder when the two share
    a folder below the file system's root, else its base name (reports get shared; the
    absolute private paths they would spell out stay home). `-` and `<stdin>` as they are."""
    if path in ("-", "<stdin>"):
        return path
    # real paths: `link/../o.json` is beside the link's target, not beside the link
    file = os.path.realpath(path)
    if file.startswith(("/proc/", "/dev/")):  # a descriptor (`<(…)`, a piped /dev/stdin)
        return path  # or a device: its name as given says more than `63` or `pipe:[…]`
    folder = os.path.dirname(os.path.realpath(report_path))
    try:
        common = os.path.commonpath([file, folder])
    except ValueError:  # different drives
        return os.path.basename(path)
    if os.path.dirname(common) == common:  # only the root in common
        return os.path.basename(path)
    return os.path.relpath(file, folder)


def _prepare_paths(trace: str, output: str, report: str | None, kind: str, stdin=None) -> str:
    source = input_identity(trace, stdin)
    refuse_writing_input(source, output, "output", trace)
    if report:
        refuse_writing_input(source, report, "report", trace)
    if output == "-":
        if not report:
            raise TraceError("writing the trace to stdout (-) needs --report PATH")
        if report == "-":
            raise TraceError("--output - and --report - would both go to stdout; "
                             "give one of them a file")
    else:
        out = Path(output)
        if trace != "-" and out.exists():
            try:
                if os.path.samefile(trace, out):
                    raise TraceError(f"output {output} is the input trace; write a new file")
            except OSError:
                pass
        check_new_path(output, "output")
    report = report or default_report_path(output, kind)
    check_new_path(report, "report")
    if trace != "-" and Path(report).resolve() == Path(trace).resolve():
        raise TraceError(f"report {report} is the input trace")
    if output != "-" and Path(report).resolve() == Path(output).resolve():
        raise TraceError("report and output are the same path")
    return report


def build_plan(source: TraceSource, layer_spec: LayerSpec | None,
               compact_spec: CompactSpec | None, *, output_name: str, report_name: str,
               command: str, tmpdir: str | None = None, progress: Progress | None = None,
               pool=None, source_name: str | None = None, after_index=None,
               hashes_source: bool = True, window: WindowSpec | SplitSpec | None = None,
               piece_names=None):
    """Index pass and plan: (index, plan). Every refusal happens here; nothing is written.

    `after_index()`, when given, is called between the two: the plan is made on one core,
    so work that needs no plan can start there (verify starts restore's splice). The
    source's sha256 starts there too, unless not `hashes_source` (verify's restore check
    hashes a plain source itself, see `TraceSource.adopt_sha256`)."""
    patterns = {}
    if layer_spec is not None:
        patterns["anchor"] = compile_pattern(layer_spec.anchor_regex, "anchor_regex")
        if layer_spec.end_anchor_regex is not None:
            patterns["terminal"] = compile_pattern(
                layer_spec.end_anchor_regex, "end_anchor_regex"
            )
    options = IndexOptions(
        patterns=patterns, tmpdir=tmpdir, moves_gpu=compact_spec is not None,
        lane_groups=compact_spec.lane_group_set() if compact_spec is not None else None,
        window=window is not None)
    index = run_index(source, options, progress=progress, pool=pool)
    if hashes_source:
        source.start_hashing()  # while the plan runs on one core (the report names the hash)
    if after_index is not None:
        after_index()
    # the plan's steps: the guides, the lanes, the report
    steps = [layer_spec is not None, compact_spec is not None, True]
    meter = or_silent(progress).phase("plan", sum(steps), "steps")
    try:
        planner = Planner(index, output_name=output_name, report_name=report_name,
                          source_name=source_name)
        layers = planner.plan_layers(layer_spec) if layer_spec is not None else None
        index.matches.clear()  # chosen: the guides keep the tables they are written from
        meter.advance_to(sum(steps[:1]))
        compaction = planner.plan_compaction(compact_spec) if compact_spec is not None else None
        meter.advance_to(sum(steps[:2]))
        if window is None:
            plan = planner.finish(command, layers, compaction,
                                  options=spec_options(layer_spec, compact_spec))
        else:
            plan = _window_plans(planner, index, window, command, layers, compaction,
                                 layer_spec, compact_spec, tmpdir, piece_names)[0]
        meter.advance_to(sum(steps))
    except BaseException:
        index.close()
        raise
    finally:
        meter.close()
    index.planned()
    release_memory()
    return index, plan


def _window_plans(planner: Planner, index, window, command: str, layers: dict | None,
                  compaction: dict | None, layer_spec, compact_spec, tmpdir,
                  piece_names) -> list[Plan]:
    """The plan of each output of a window run (one, or a split's pieces), from one
    planner: they share the lanes and the linked decisions, each has its own guides,
    report and top-level member."""
    guide_events = planner.guide_events
    guides = guide_events.guides if guide_events is not None else None
    # the lanes' and guides' plans freed tens of MB that the heap still holds: given back
    # first, the windows' own steps reuse none of it and a split's peak was theirs on top
    release_memory()
    outputs = plan_windows(window, index, guides, planner.origin_ns,
                           planner.new_track_bytes(), _guide_bytes(guide_events))
    cut = cut_plan(outputs, index, tmpdir)
    names = piece_names(len(outputs)) if piece_names is not None else None
    for number, output in enumerate(outputs):
        piece_layers = layers
        if guides is not None:
            table = dataclasses.replace(guides, first=output.guides[0], stop=output.guides[1])
            planner.guide_events = copy.copy(guide_events)
            planner.guide_events.guides = table
            piece_layers = {**layers, "layers": GuideRows(table, planner.origin_ns)}
        if names is not None:
            planner.output_name, planner.report_name = names[number]
        cut.plans.append(planner.finish(
            command, piece_layers, compaction,
            options=spec_options(layer_spec, compact_spec, output.spec),
            window=WindowPlan(output.spec, cut, number, output.report)))
    return cut.plans


def _guide_bytes(guide_events) -> int:
    """The most one guide event may take, measured on the first block written (its phase,
    evidence and anchor name make its size), with a quarter more to spare."""
    if guide_events is None or not len(guide_events):
        return SizeBins.GUIDE_BYTES
    block = next(iter(guide_events.texts()))
    count = block.count(b'"ph": "X"') or 1
    return max(SizeBins.GUIDE_BYTES, len(block) * 5 // (4 * count) + 128)


def report_rows(rep: OutputFile, report: PrettyWriter):
    """Where the rewrite hands the report's guide rows, as it makes each block of guides'
    events and rows together: (the rows, their writer), with the report's members before
    them written now (the plan's, final). None for a report on stdout, which gets nothing
    before the run is through, or one without guide rows."""
    if rep.stdout:
        return None
    rows = report.head()
    return (rows, report.rows) if isinstance(rows, GuideRows) else None


def write_report(rep: OutputFile, plan: Plan, source: TraceSource,
                 report: PrettyWriter | None = None) -> None:
    """Write the plan's report (the rest of it, after `report_rows`), with the source's
    sha256 (its thread started after the index pass) and that of its decompressed bytes
    (hashed by the index pass), after the rewrite pass."""
    plan.report["source_sha256"] = source.sha256()
    plan.report["source_data_sha256"] = source.data_sha256()
    (report or PrettyWriter(plan.report, rep.write)).finish()
    rep.close_stream()


def _run(trace, output, report, kind, command, *, layer_spec=None, compact_spec=None,
         compress=None, compress_level=None, progress=None, stdin=None, workers=None,
         max_event_bytes=None, spool_dir=None, window=None) -> Report:
    if isinstance(window, SplitSpec):
        return _run_pieces(trace, output, report, kind, command, layer_spec=layer_spec,
                           compact_spec=compact_spec, compress=compress,
                           compress_level=compress_level, progress=progress, stdin=stdin,
                           workers=workers, max_event_bytes=max_event_bytes,
                           spool_dir=spool_dir, split=window)
    started = time.monotonic()
    validate_specs(layer_spec, compact_spec)
    trace, output = str(trace), str(output)
    for what, path in (("--trace", trace), ("--output", output), ("--report", report)):
        require_utf8(path, what)  # the report records their names
    report_path = _prepare_paths(trace, output, report, kind, stdin)
    compression = compression_for(output, compress)
    check_compress_level(compression, compress_level)
    # workers fork before the reader and writer threads start
    with pool_for(trace, workers) as pool, \
            TraceSource(trace, stdin=stdin, max_event_bytes=max_event_bytes,
                        spool_dir=spool_dir) as source:
        index, plan = build_plan(
            source, layer_spec, compact_spec,
            output_name=name_in_report(output, report_path),
            report_name=os.path.basename(report_path), command=command,
            source_name=None if trace == "-" else name_in_report(trace, report_path),
            tmpdir=temp_dir_for(None if output == "-" else output), progress=progress,
            pool=pool, window=window,
        )
        try:
            plan.report["output_compression"] = compression
            with OutputFile(output, compression=compression, level=compress_level) as out, \
                    OutputFile(report_path, what="report") as rep:
                report = PrettyWriter(plan.report, rep.write)
                if plan.window is None:
                    rewrite(source, index, plan, out, progress=progress, pool=pool,
                            report_rows=report_rows(rep, report))
                else:
                    rewrite_window(source, index, [plan], [out], progress=progress, pool=pool,
                                   report_rows=[report_rows(rep, report)])
                write_report(rep, plan, source, report)
                commit_together([out, rep])
        finally:
            index.close()
    return _finished(plan.report, report_path, output, trace, time.monotonic() - started)


def piece_path(output: str, number: int) -> str:
    """`<output stem>.part-0001<suffix>`: out.json.gz -> out.part-0001.json.gz."""
    lower = output.lower()
    compressed = next((x for x in SUFFIXES if lower.endswith(x)), "")
    rest = output[: len(output) - len(compressed)]
    json_suffix = ".json" if rest.lower().endswith(".json") else ""
    stem = rest[: len(rest) - len(json_suffix)]
    return f"{stem}.part-{number:04d}{rest[len(stem):]}{output[len(rest):]}"


def manifest_path(output: str) -> str:
    return f"{output}.pieces.json"


def _run_pieces(trace, output, report, kind, command, *, layer_spec, compact_spec, compress,
                compress_level, progress, stdin, workers, max_event_bytes, spool_dir,
                split: SplitSpec) -> Report:
    """A split run: the pieces, each with its report, and the manifest that lists them."""
    started = time.monotonic()
    validate_specs(layer_spec, compact_spec)
    trace, output = str(trace), str(output)
    for what, path in (("--trace", trace), ("--output", output)):
        require_utf8(path, what)
    if output == "-" or not os.path.basename(output) or os.path.isdir(output):
        raise TraceError(f"{split.text} writes files: give --output a file name (the pieces "
                         f"are named after it), not {output!r}")
    if report is not None:
        raise TraceError(f"{split.text} writes a report beside each piece: drop --report")
    manifest = manifest_path(output)
    source_id = input_identity(trace, stdin)
    refuse_writing_input(source_id, manifest, "manifest", trace)
    check_new_path(manifest, "manifest")
    compression = compression_for(output, compress)
    check_compress_level(compression, compress_level)

    def paths(count: int) -> list[tuple[str, str]]:
        return [(piece_path(output, k + 1), default_report_path(piece_path(output, k + 1), kind))
                for k in range(count)]

    def names(count: int) -> list[tuple[str, str]]:
        for piece, piece_report in paths(count):
            check_new_path(piece, "piece")
            check_new_path(piece_report, "report")
            refuse_writing_input(source_id, piece, "piece", trace)
        return [(name_in_report(piece, piece_report), os.path.basename(piece_report))
                for piece, piece_report in paths(count)]

    with pool_for(trace, workers) as pool, \
            TraceSource(trace, stdin=stdin, max_event_bytes=max_event_bytes,
                        spool_dir=spool_dir) as source, contextlib.ExitStack() as files:
        index, plan = build_plan(
            source, layer_spec, compact_spec, output_name=output, report_name="",
            command=command, source_name=None if trace == "-" else name_in_report(trace, manifest),
            tmpdir=temp_dir_for(output), progress=progress, pool=pool, window=split,
            piece_names=names)
        try:
            plans = plan.window.cut.plans
            places = paths(len(plans))
            outs = [files.enter_context(OutputFile(piece, compression=compression,
                                                   level=compress_level, block=SMALL_BLOCK))
                    for piece, _ in places]
            reps = [files.enter_context(OutputFile(piece_report, what="report"))
                    for _, piece_report in places]
            listing = files.enter_context(OutputFile(manifest, what="manifest"))
            for p in plans:
                p.report["output_compression"] = compression
            writers = [PrettyWriter(p.report, rep.write) for p, rep in zip(plans, reps)]
            rewrite_window(source, index, plans, outs, progress=progress, pool=pool,
                           report_rows=[report_rows(rep, w) for rep, w in zip(reps, writers)])
            for p, rep, writer in zip(plans, reps, writers):
                write_report(rep, p, source, writer)
            data = pieces_manifest(plans, places, manifest, split, source, plan.report)
            listing.write(dumps_pretty(data))
            listing.close_stream()
            commit_together([*outs, *reps, listing])
        finally:
            index.close()
            plan.window.cut.linked.close()
    return Report(data, manifest, None, trace, time.monotonic() - started)


def pieces_manifest(plans: list[Plan], places, manifest: str, split: SplitSpec,
                    source: TraceSource, first_report: dict) -> dict:
    """What `<output>.pieces.json` says: each piece's file, report, range and counts."""
    pieces = []
    for p, (piece, piece_report) in zip(plans, places):
        window = p.report["window"]
        pieces.append({
            "piece": window["piece"], "file": name_in_report(piece, manifest),
            "report": name_in_report(piece_report, manifest),
            **{key: window.get(key) for key in ("start_us", "end_us", "start_ms", "end_ms",
                                                "passes", "guides", "first_guide",
                                                "last_guide")
               if key in window},
            "source_events": window["source_events_written"],
            "output_events": p.report["output_event_count"],
            "json_bytes": window["json_bytes"],
            "flows_dropped": window["flows_dropped"],
        })
    linked = plans[0].window.cut.linked
    return {
        "tool": "tracestream", "tool_version": first_report["tool_version"],
        "kind": "pieces", "command": first_report["command"], "split_mb": split.mb,
        "options": first_report["options"] | {"window": {"split_mb": split.mb}},
        "source_file": first_report["source_file"], "source_sha256": source.sha256(),
        "original_event_count": first_report["original_event_count"],
        "pieces": pieces,
        "flows_dropped": linked.dropped_total,
        "flows_without_time": linked.untimed_flows,
        "over_limit": [row["piece"] for row in pieces if row["json_bytes"] > split.limit],
    }


def add_layer_guides(trace, output, spec: LayerSpec, *, report: str | None = None,
                     compact: CompactSpec | None = None, compress: str | None = None,
                     compress_level: int | None = None, progress=None,
                     stdin=None, workers: int | None = None,
                     max_event_bytes: int | None = None, spool_dir: str | None = None,
                     window: WindowSpec | None = None) -> Report:
    """Write `output`: the trace plus verified L0, L1, … guides (and lanes, with `compact`).

    `progress`: sees the phases index, plan and rewrite (see tracestream.progress; None:
    none).
    `workers`: processes for the per-chunk work (None: by input size; 0: none).
    `max_event_bytes`: the longest single event read (None: 64 MiB).
    `spool_dir`: where a trace read from a stream (stdin, a pipe) is kept for the second
    pass, zstd-compressed when it is plain JSON (None: $TMPDIR).
    `window`: write only that window of the trace (`pass_window("2:4")`,
    `time_window("10:20")` from tracestream.plan.window; see docs/windows.md).
    """
    return _run(trace, output, report, "layers", "layers", layer_spec=spec,
                compact_spec=compact, compress=compress, compress_level=compress_level,
                progress=progress, stdin=stdin, workers=workers,
                max_event_bytes=max_event_bytes, spool_dir=spool_dir, window=window)


def compact(trace, output, spec: CompactSpec | None = None, *, report: str | None = None,
            compress: str | None = None, compress_level: int | None = None,
            progress=None, stdin=None, workers: int | None = None,
            max_event_bytes: int | None = None, spool_dir: str | None = None,
            window: WindowSpec | None = None) -> Report:
    """Write `output`: the trace with GPU activity packed into at most N display lanes
    (the other options as `add_layer_guides` takes them; a `window` by time only)."""
    return _run(trace, output, report, "compact", "compact",
                compact_spec=spec or CompactSpec(), compress=compress,
                compress_level=compress_level, progress=progress, stdin=stdin, workers=workers,
                max_event_bytes=max_event_bytes, spool_dir=spool_dir, window=window)


def spec_options(layer_spec: LayerSpec | None, compact_spec: CompactSpec | None,
                 window: WindowSpec | None = None) -> dict:
    """The options of a run, as the report records them (verify re-plans from these)."""
    options: dict = {}
    if window is not None:
        options["window"] = options_of(window)
    if layer_spec is not None:
        options["layers"] = dataclasses.asdict(layer_spec)
    if compact_spec is not None:
        compact = dataclasses.asdict(compact_spec)
        # recorded only when given: a report without them reads as before (and is unchanged)
        if compact["lane_groups"] is None:
            del compact["lane_groups"]
        if not compact["lane_group"]:
            del compact["lane_group"]
        options["compact"] = compact
    return options


_LATER_CHECKS = ("allow_several_anchor_names", "allow_gaps")
"""Checks `layers` gained after reports were first written, as the options that turn them off."""


def specs_from_options(options: dict) -> tuple[LayerSpec | None, CompactSpec | None]:
    """The specs a report records. A report written before a check existed re-plans without
    it: its output was never subject to the check, and `verify` proves fidelity, not choice."""
    layers = options.get("layers")
    if layers:
        layers = {**dict.fromkeys(_LATER_CHECKS, True), **layers}
    compact_ = options.get("compact")
    return (LayerSpec(**layers) if layers else None, CompactSpec(**compact_) if compact_ else None)


BOUNDARY_WORDS = {
    "next_layer_anchor": "the next layer's anchor",
    "terminal_kernel_end": "the end of the terminal kernel (--end-anchor-regex)",
    "anchor_point_only": "a zero-length marker at its anchor (no --end-anchor-regex)",
}
"""The report's boundary kinds, as the summary says them."""


def summarize(data: dict, output: str, report_path: str | None, *, trace: str | None = None,
              seconds: float | None = None) -> str:
    """A one-screen summary of a layers/compact report, with the next steps."""
    if data.get("kind") == "pieces":
        return "\n".join(pieces_lines(data, output, trace, seconds))
    lines = [f"output: {output}"]
    if report_path:
        lines.append(f"report: {report_path}")
    compaction = data.get("compaction", data if "groups" in data else None)
    window = data.get("window")
    lines += window_lines(data, window) if window else [events_line(data, compaction)]
    if "layers" in data:
        lines += _layers_lines(data)
    if compaction:
        for g in compaction["groups"]:
            where = (f"pid {g['pid']} device {g['device']}" if g["kind"] == "activity"
                     else f"GPU scopes of pid {g['pid']} -> pid {g['display_pid']}")
            groups = ", ".join(f"{row['group']} {row['lanes']}"
                               for row in g.get("lane_groups", ()))
            lines.append(
                f"compact view: {where}: {g['original_streams']} stream rows -> "
                f"{g['lanes']} synthetic lanes{f' ({groups})' if groups else ''} "
                f"({g['activity_count']:,} events)"
            )
    if seconds is not None:
        lines.append(f"elapsed: {seconds:,.1f} s")
    lines += next_steps(trace, output, report_path, data.get("command", "layers"))
    return "\n".join(lines)


def events_line(data: dict, compaction: dict | None) -> str:
    """Where every event went: read = unchanged + relocated + retired; written = unchanged +
    relocated + added."""
    read = data["original_event_count"]
    relocated = compaction["relocated_events"] if compaction else 0
    retired = len(compaction["retired_track_metadata"]) if compaction else 0
    return (
        f"events: {read:,} read; {read - relocated - retired:,} written unchanged, "
        f"{relocated:,} relocated to display lanes, {retired:,} retired (metadata of emptied "
        f"stream rows, kept in the report), {data['added_event_count']:,} added "
        f"({data['output_event_count']:,} written)"
    )


def pieces_lines(data: dict, manifest: str, trace: str | None,
                 seconds: float | None) -> list[str]:
    """A split run's summary: its pieces, each on a line, and the next steps."""
    pieces = data["pieces"]
    lines = [f"pieces: {len(pieces)} of at most {data['split_mb']} MB of JSON each, listed in "
             f"{manifest}"]
    for row in pieces:
        passes = (f", passes {row['passes'][0]} … {row['passes'][1] - 1}"
                  if row.get("passes") and row["passes"][1] > row["passes"][0] else "")
        lines.append(f"  {row['file']}: {row['start_ms']} … {row['end_ms']} ms{passes}, "
                     f"{row['output_events']:,} events, {row['json_bytes'] / 1e6:,.1f} MB")
    lines.append(f"flows: {data['flows_dropped']:,} left out at the cuts (a flow is written "
                 "only whole, in the piece that holds all of it)")
    if data["over_limit"]:
        lines.append(f"warning: piece(s) {', '.join(map(str, data['over_limit']))} hold more "
                     f"than {data['split_mb']} MB: what lies between two cuts (a pass, or "
                     "a time bin without guides) is larger")
    if seconds is not None:
        lines.append(f"elapsed: {seconds:,.1f} s")
    steps = []
    if trace is not None and trace != "-":
        steps.append(shlex.join(["tracestream", "verify", "--trace", trace, "--output",
                                 manifest]))
    steps.append(shlex.join(["tracestream", "view", "--trace", manifest]))
    return lines + [("next: " if k == 0 else "      ") + step for k, step in enumerate(steps)]


def window_lines(data: dict, window: dict) -> list[str]:
    """What a window run wrote: its events, its range and what its edges cut."""
    read, kept = data["original_event_count"], window["source_events_written"]
    guides = (f"; guides {window['first_guide']} … {window['last_guide']}"
              if window.get("guides") else "; no guide in it" if "guides" in window else "")
    return [
        f"events: {read:,} read; {kept:,} in the window written, {read - kept:,} left out "
        f"(outside it, or metadata of emptied stream rows), {data['added_event_count']:,} "
        f"added ({data['output_event_count']:,} written)",
        f"window: {window['option']}: {window['start_ms']} … {window['end_ms']} ms from the "
        f"trace origin{guides}",
        f"flows: {window['flows_kept']:,} kept whole, {window['flows_dropped']:,} left out "
        "at the window's edges (a flow is written only whole)",
    ]


def _layers_lines(data: dict) -> list[str]:
    """The guides in words, from the report's header (its rows are not read)."""
    first, count = data["first_layer"], data["num_layers"]
    names = f"L{first} … L{first + count - 1}" if count > 1 else f"L{first}"
    # the last layer ends at the terminal's end when there is one, else at its anchor
    last = [TERMINAL_KERNEL_END if data.get("end_anchor_regex") is not None
            else ANCHOR_POINT_ONLY]
    window = data.get("window") or {}
    written = (f" ({window['guides']:,} of them in the window)" if "guides" in window else "")
    lines = [
        f"guides: {names} x {data['passes']} pass(es) = {count * data['passes']} guides on pid "
        f"{data['pid']} device {data['device']} (track '{data['track_name']}'){written}",
        f"anchors: {data['matching_anchor_count']} matches of {data['anchor_regex']!r}, "
        f"offset {data['anchor_offset']}, stride {data['anchor_stride']}, "
        f"{data['extra_anchors_per_pass']} extra per pass; each guide ends at the next layer's "
        f"anchor, the last layer's at {' or '.join(BOUNDARY_WORDS.get(k, k) for k in last)}",
    ]
    selection = data.get("selection")
    if selection:
        text = (f"labelled {data['passes']:,} of {selection['complete_passes']:,} complete "
                f"passes from offset {data['anchor_offset']}")
        if selection["unlabelled_complete_passes"] > 0:
            text += (f"; {selection['unlabelled_complete_passes']:,} complete passes and "
                     f"{selection['matches_outside_selection']:,} of "
                     f"{data['matching_anchor_count']:,} matches stayed unlabelled "
                     "(`--passes all` labels every one)")
        elif selection["matches_outside_selection"]:
            text += (f" ({selection['matches_outside_selection']:,} of "
                     f"{data['matching_anchor_count']:,} matches outside the selection: before "
                     "the offset or after the last complete pass)")
        else:
            text += " (every match is in the selection)"
        lines.append(text)
    lines += _override_lines(data)
    return lines


def _override_lines(data: dict) -> list[str]:
    """The checks the user turned off, and what they would have refused."""
    lines = []
    if data.get("allow_several_anchor_names") and data.get("distinct_anchor_names", 1) > 1:
        lines.append(f"override {flag_of('allow_several_anchor_names')}: the pattern matches "
                     f"{data['distinct_anchor_names']} kernel names (listed in the report)")
    cadence = data.get("cadence") or {}
    if cadence.get("allow_gaps") and cadence.get("breaks"):
        first = cadence["first_break"]
        lines.append(f"override {flag_of('allow_gaps')}: {cadence['breaks']} layer gap(s) "
                     f"cross a cadence break (first in pass {first['pass_index']}, "
                     f"{first['median_ratio']:g} x the median layer gap)")
    return lines


def next_steps(trace: str | None, output: str, report_path: str | None,
               command: str) -> list[str]:
    """The commands that check the output against its source and open it."""
    if output == "-":
        return []
    steps = []
    if trace is not None and trace != "-":
        verify = ["tracestream", "verify", "--trace", trace, "--output", output]
        if report_path and report_path != default_report_path(output, command):
            verify += ["--report", report_path]
        steps.append(shlex.join(verify))
    steps.append(shlex.join(["tracestream", "view", "--trace", output]))
    return [("next: " if k == 0 else "      ") + step for k, step in enumerate(steps)]
