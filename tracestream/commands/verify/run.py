"""`verify`: prove that an annotated trace is its source plus tracestream's additions.

Both files are streamed side by side, never held in memory. The source is indexed and
re-planned with the options the report recorded, so every output event can be compared
with what it must be."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from tracestream.commands.report_shape import report_specs
from tracestream.commands.restore import Undo
from tracestream.commands.verify.guides import GuideOrder
from tracestream.commands.verify.output_checks import TRIM_EVERY, OutputChecks
from tracestream.commands.verify.planned import PlannedStream, Sequential
from tracestream.commands.verify.restored import (
    digest_problems,
    restoration_problems,
    restored_from,
    restored_matches,
    restored_sha256,
)
from tracestream.commands.verify.verdict import (
    MAX_LISTED,
    TEXT_VALUES,
    Verdict,
    first_difference,
    replan_failed,
    sha_problem,
    short_text,
)
from tracestream.commands.verify.window import is_manifest, verify_pieces, verify_window
from tracestream.engine import build_plan
from tracestream.errors import TraceError
from tracestream.index.builder import TraceIndex
from tracestream.index.extract_duplicates import duplicate_key
from tracestream.model import decode_head
from tracestream.parallel.memory import release_memory
from tracestream.parallel.pool import outcome
from tracestream.plan.planner import DELETE, KEEP, Plan
from tracestream.plan.report import find_report, load_report
from tracestream.progress import SILENT, Meter, Progress, or_silent
from tracestream.read.document import SETTLE, DocumentScanner, Layout, iter_events
from tracestream.read.hashing import ReadStats
from tracestream.read.jsonbytes import SEPARATOR
from tracestream.read.sizing import pool_for
from tracestream.read.source import TraceSource
from tracestream.write.relocate import provenance_match, relocate, unrelocate
from tracestream.write.rewrite import edits


def _events(source: TraceSource, stats: ReadStats) -> tuple[DocumentScanner, Iterator]:
    scanner = DocumentScanner(source.read(stats), max_event_bytes=source.max_event_bytes)
    return scanner, iter_events(scanner.chunks())


def verify(trace, output, report: str | None = None, *, tmpdir: str | None = None,
           workers: int | None = None, max_event_bytes: int | None = None,
           progress: Progress | None = None) -> Verdict:
    """Check `output` against its source `trace`; TraceError if either cannot be read.

    `max_event_bytes`: the longest single event read (None: read.document's default).
    `progress` sees the phases index and plan (of the source), verify (the output's bytes
    compared with the planned ones) and, where they differ, verify events (the output
    read again, event by event, to name what differs); see tracestream.progress."""
    progress = or_silent(progress)
    trace, output = str(trace), str(output)
    if report is None and is_manifest(output):
        return verify_pieces(trace, output, tmpdir=tmpdir, workers=workers,
                             max_event_bytes=max_event_bytes, progress=progress)
    report_path = find_report(output, report)
    data, retired = load_report(report_path)
    if isinstance(data.get("options"), dict) and "window" in data["options"]:
        return verify_window(trace, output, data, report_path, tmpdir=tmpdir,
                             workers=workers, max_event_bytes=max_event_bytes, progress=progress)
    verdict = Verdict()
    layer_spec, compact_spec = report_specs(data)
    # workers fork before the reader threads start
    with pool_for(trace, workers) as pool, \
            TraceSource(trace, max_event_bytes=max_event_bytes, spool_dir=tmpdir) as source, \
            TraceSource(output, hashes_data=False, max_event_bytes=max_event_bytes,
                        spool_dir=tmpdir) as annotated:
        restoring = _Restoring(data, retired, annotated, source, pool)
        try:
            index, plan = build_plan(
                source, layer_spec, compact_spec, output_name=data.get("output_file", ""),
                report_name=data.get("report_file", report_path.name),
                command=data.get("command", ""), tmpdir=tmpdir, pool=pool, progress=progress,
                source_name=data.get("source_file"), after_index=restoring.start,
                hashes_source=not restoring.hashes_source,
            )
        except TraceError as exc:
            if source.first_stats is None:
                raise
            return replan_failed(verdict, source, data, exc)
        try:
            # the source's sha256 is asked for last (and listed first): its thread goes on
            # hashing while the output is compared, where waiting for it left the cores idle
            compared = Verdict()
            meter = progress.phase("verify", annotated.progress_total)
            try:
                as_planned = _fast_compare(source, annotated, index, plan, data, retired,
                                           compared, tmpdir, pool, restoring, meter)
            finally:
                meter.close()
            if not as_planned:  # the output again, event by event: a phase of its own
                source.start_hashing()  # (where restore's check was to hash the source)
                meter = progress.phase("verify events", annotated.progress_total)
                try:
                    _compare(source, annotated, index, plan, data, retired, compared, tmpdir,
                             meter)
                finally:
                    meter.close()
            verdict.add("source sha256", sha_problem(source, data),
                        f"{str(data.get('source_sha256', ''))[:16]}… matches the report")
            verdict.checks.extend(compared.checks)
        finally:
            index.close()
    return verdict


class _Restoring:
    """Restore's quick splice of the output file, in a worker, started (`start`) once the
    index pass is done: it needs no plan, and the plan is made on one core.

    For a plain source file the restored bytes are compared with the file's as they are
    made (`restored_matches`), and the file's hash made on the way is the source's
    (`hashes_source`: the main process does not hash it too); else they are hashed, for
    the hash of the source's decompressed bytes its index pass made."""

    def __init__(self, data: dict, retired, annotated: TraceSource, source: TraceSource, pool):
        try:
            self.undo = Undo.from_report(data, retired, annotated.name)
        except TraceError:  # `_compare` says why
            self.undo = None
        self._annotated, self._source, self._pool = annotated, source, pool
        self.hashes_source = (self.undo is not None and annotated.path is not None
                              and source.plain_path is not None)
        self.task = None

    def start(self) -> None:
        if self.hashes_source:
            self.task = self._pool.submit(restored_matches, self._annotated.path, self.undo,
                                          self._source.plain_path,
                                          self._annotated.max_event_bytes)
        elif self.undo is not None and self._annotated.path is not None:
            self.task = self._pool.submit(restored_sha256, self._annotated.path, self.undo,
                                          self._annotated.max_event_bytes)

    def outcome(self) -> tuple[str, str] | None:
        """(why restore's splice failed, "") or ("", the sha256 of the bytes it restores;
        "" where they are not the source file's), or None if it was not started."""
        if self.task is None:
            return None
        if not self.hashes_source:
            return outcome(self.task)
        problem, digest, size, crc32 = outcome(self.task)
        if digest:
            self._source.adopt_sha256(digest, size, crc32)
        return problem, digest


def _fast_compare(source, annotated, index: TraceIndex, plan: Plan, data: dict, retired,
                  verdict: Verdict, tmpdir, pool, restoring: _Restoring,
                  meter: Meter = SILENT) -> bool:
    """Every check, when the output is byte for byte what the plan makes of the source
    (True); else False with nothing added to `verdict`, and `_compare` names what differs.

    The planned output is made again a chunk at a time by the rewrite's splice, its
    numpy twin rather than the C extension the rewrite used (in the workers), and
    compared with the output's chunks as they are read; the output-only checks read
    each planned chunk's events at once, in the worker that made it
    (`OutputChecks.observe_chunk`): the output is those bytes wherever this returns
    True. Restore's splice has been running since the index pass (`restoring`). A
    source event with provenance in its `args` (the plan refuses those when it
    relocates) leaves this to `_compare`, which locates provenance the exact way.
    """
    undo = restoring.undo
    if index.provenance_ordinal is not None or undo is None:
        return False
    checks = OutputChecks(data, tmpdir)
    checks.bind_only_on({index.tracks[track] for track in index.flow_tracks})
    planned = PlannedStream(source, index, plan, dict(retired), pool, checks)
    try:
        # cut where events seem to end, not decoded: each chunk is compared with the
        # planned bytes, which the workers decode (see `PlannedStream`)
        out_stats = ReadStats()
        out_scan = DocumentScanner(annotated.read(out_stats), speculative=True,
                                   max_event_bytes=annotated.max_event_bytes)
        compared = partial(_compared, meter, out_stats)
        if not _as_planned(out_scan, planned, compared) or not checks.sources_complete:
            return False
        meter.advance_to(out_stats.raw_bytes)  # (the output's bytes after its last event)
        # restore's splice ran in a worker meanwhile (it reads the output file itself)
        restored = restoring.outcome()
        if restored is None:
            restored = outcome(pool.submit(partial(restored_from, quick=True), annotated,
                                           undo))
        problem, digest = restored
        if problem or not digest or digest_problems(digest, source, undo):
            return False
        _add_checks(verdict, [], digest, [], True, index.layout, out_scan.layout, plan, checks,
                    data)
        return True
    finally:
        planned.close()
        checks.close()


def _compared(meter: Meter, stats: ReadStats, offset: int) -> None:
    """The output is compared up to `offset` (decompressed; see tracestream.progress)."""
    meter.advance_to(stats.position(offset))


def _as_planned(out_scan: DocumentScanner, planned: PlannedStream,
                compared=lambda offset: None) -> bool:
    """Whether the output's events and the separators between them are the planned bytes
    (whose events the output-only checks observe as they are made, see `PlannedStream`).
    `compared(offset)`: the output is compared up to `offset`, after each chunk."""
    expected = Sequential(planned.pieces())
    base = None
    end = 0  # where the last chunk ended, from the first event on
    try:
        for number, chunk in enumerate(out_scan.chunks()):
            if chunk is SETTLE:  # every speculative chunk is confirmed as it is compared
                continue
            if number % TRIM_EVERY == 0:
                release_memory()  # chunk buffers come and go: give their pages back
            if not _chunk_as_planned(chunk, base, end, expected):
                return False
            if base is None:
                base = chunk.offset
            end = chunk.offset - base + chunk.length
            if chunk.events is None:
                out_scan.confirm(chunk)
            compared(chunk.offset + chunk.length)
    except TraceError:  # a cut inside a string, or a malformed output: `_compare` says which
        return False
    return (base is not None and expected.ended() and planned.retired_ok
            and planned.observed_ok)


def _chunk_as_planned(chunk, base: int | None, end: int, expected: Sequential) -> bool:
    """Whether an output chunk, and the separator before it (after `end`, from the first
    event at `base`), are the next planned bytes."""
    start = 0 if base is None else chunk.offset - base
    if start < end:
        return False
    gap = expected.take(start - end)
    if gap is None or (gap and not SEPARATOR.fullmatch(gap)):
        return False
    # a speculative chunk's pieces are compared where they lie, never joined (a copy of
    # every output byte)
    return all(map(expected.matches, chunk.pieces if chunk.data is None else (chunk.data,)))


def _compare(source, annotated, index: TraceIndex, plan: Plan, data: dict, retired,
             verdict: Verdict, tmpdir, meter: Meter = SILENT) -> None:
    src_stats, out_stats = ReadStats(), ReadStats()
    src_scan, src_events = _events(source, src_stats)
    out_scan, out_events = _events(annotated, out_stats)
    checks = OutputChecks(data, tmpdir)
    try:
        event_problems, in_step = _lockstep(src_events, out_events, index, plan, retired,
                                            checks, lambda: meter.advance_to(out_stats.raw_read))
        meter.advance_to(out_stats.raw_read)
        restore_problems, digest = restoration_problems(source, annotated, data, retired)
        _add_checks(verdict, restore_problems, digest, event_problems, in_step,
                    src_scan.layout, out_scan.layout, plan, checks, data)
    finally:
        checks.close()


def _add_checks(verdict: Verdict, restore_problems: list[str], digest: str,
                event_problems: list[str], in_step: bool, source_layout, output_layout,
                plan: Plan, checks: OutputChecks, data: dict) -> None:
    """The verdict's checks after the comparison (the output-only ones when it stayed in
    step)."""
    verdict.add("restored events equal the source", restore_problems,
                f"restore gives back the source byte for byte (sha256 {digest[:16]}…)")
    verdict.add("output equals the plan", event_problems,
                f"{len(plan.appended):,} added events, every relocation on its planned lane")
    if in_step:  # else the output-only checks would report what the lost step left out
        verdict.add("top-level metadata",
                    _top_level_problems(source_layout, output_layout, plan),
                    f"{len(source_layout.values)} top-level keys equal and in order")
        verdict.add("depth zero on synthetic tracks", checks.depth_problems(),
                    f"{len(checks.synthetic)} synthetic tracks import at depth zero")
        verdict.add("flows on their activity's lane", checks.binding_problems(),
                    "every relocated flow binds on its lane to the activity it binds to "
                    "on its original stream (Perfetto's rules)")
        problems, total = _guide_problems(checks.guides, data)
        verdict.add("guides", problems, _guide_text(data), total=total)
        verdict.add("kernel and stream counts", _count_problems(checks, data),
                    "per-GPU kernel and stream counts equal the report's")
        verdict.add("lanes", _lane_problems(checks, data),
                    "the report's lanes and relocation counts are the output's"
                    if "groups" in data.get("compaction", data) else "no lanes expected")


def _lockstep(src_events, out_events, index, plan, retired, checks,
              tick=lambda: None) -> tuple[list[str], bool]:
    """(plan problems, whether source and output stayed in step; `tick()` every 65,536
    source events, for progress).

    An output event that is not what the plan makes of its source event is reported
    once, and the output-only checks see the planned event instead, so one tampered
    value is named once. After MAX_LISTED such events in a row (an event dropped or
    added) the two are out of step, and comparing stops.
    """
    event_problems: list[str] = []
    planned = edits(index, plan)
    next_edit = next(planned, None)
    retired_map = dict(retired)
    targets = plan.targets
    out_ordinal = -1
    amiss = 0  # output events in a row that differ from the plan
    for ordinal, raw in src_events:
        if not ordinal & 0xFFFF:
            release_memory()  # chunk buffers come and go: give their pages back
            tick()
        raw = bytes(raw)
        action = KEEP
        if next_edit is not None and next_edit[0] == ordinal:
            action = next_edit[3]
            next_edit = next(planned, None)
        if action == DELETE:
            if retired_map.get(ordinal) != raw:
                event_problems.append(
                    f"retired event {ordinal} in the report differs from the source event")
            continue
        out = next(out_events, None)
        if out is None:
            event_problems.append(f"output ends early: source event {ordinal} ({short_text(raw)}) "
                                  "and later ones are missing")
            return event_problems, False
        out_ordinal, out_raw = out[0], bytes(out[1])
        expected = raw if action == KEEP else relocate(raw, targets[action][0], ordinal,
                                                       targets[action][1],
                                                       group=targets[action][2])
        if out_raw == expected:
            checks.observe(out_ordinal, out_raw)
            amiss = 0
            continue
        checks.observe(out_ordinal, expected)
        amiss += 1
        if amiss > MAX_LISTED:
            event_problems.insert(0, f"the output is out of step with the source from output "
                                     f"event {out_ordinal - MAX_LISTED} on (an event dropped "
                                     "or added?); stopped comparing")
            return event_problems, False
        restored = out_raw
        if provenance_match(out_raw) is not None:
            try:
                restored, _ = unrelocate(out_raw)
            except TraceError as exc:
                event_problems.append(f"output event {out_ordinal}: {exc}")
                continue
        if restored != raw:
            event_problems.append(
                f"source event {ordinal} ({short_text(raw)}) != output event {out_ordinal} "
                f"restored: {first_difference(raw, restored)}")
        elif action == KEEP:
            event_problems.append(
                f"event {ordinal} ({short_text(raw)}) was moved but the plan keeps it"
            )
        else:
            event_problems.append(
                f"event {ordinal} ({short_text(raw)}) is at {_where(out_raw)}, "
                f"the plan puts it at {_where(expected)}")
    for k, added in enumerate(plan.appended):
        out = next(out_events, None)
        if out is None:
            event_problems.append(f"added event {k} of {len(plan.appended)} is missing")
            return event_problems, False
        out_ordinal, out_raw = out[0], bytes(out[1])
        checks.observe(out_ordinal, added)
        if out_raw != added:
            event_problems.append(f"added event {k} (output event {out_ordinal}): "
                                  f"{_added_difference(added, out_raw)}")
    extra = sum(1 for _ in out_events)
    if extra:
        event_problems.append(f"the output has {extra} events more than the source and plan")
        return event_problems, False
    return event_problems, True


def _added_difference(added: bytes, out_raw: bytes) -> str:
    """What differs in an added event, read as Perfetto reads it: a key spelled twice (or
    once escaped, once not) first, since a reader may take either value."""
    duplicate = duplicate_key(out_raw)
    if duplicate is not None:
        return f"duplicate key `{duplicate}`"
    return first_difference(added, out_raw)


def _where(raw: bytes) -> str:
    head = decode_head(raw)
    return f"pid {head.pid} tid {head.tid}"


def _top_level_problems(src: Layout, out: Layout, plan: Plan) -> list[str]:
    if src.shape != out.shape:
        return [f"top level is {out.shape} in the output, {src.shape} in the source"]
    ours = [v for v in out.values if v.key == "tracestream"]
    theirs = [v for v in out.values if v.key != "tracestream"]
    source = [v for v in src.values if v.key != "tracestream"]
    problems = []
    if [v.key for v in theirs] != [v.key for v in source]:
        problems.append(f"top-level keys differ: {[v.key for v in source]} vs "
                        f"{[v.key for v in theirs]}")
    for a, b in zip(source, theirs):
        if a.key == b.key and a.raw != b.raw:
            problems.append(f"top-level {a.key!r}: {first_difference(a.raw, b.raw)}")
    if src.events_key_index - (len(src.values[: src.events_key_index]) - len(
            [v for v in src.values[: src.events_key_index] if v.key != "tracestream"])) != (
            out.events_key_index - (len(out.values[: out.events_key_index]) - len(
                [v for v in out.values[: out.events_key_index] if v.key != "tracestream"]))):
        problems.append("traceEvents moved among the top-level keys")
    if plan.top_level_member is not None:
        expected = plan.top_level_member.split(b": ", 1)[1]
        if len(ours) != 1 or TEXT_VALUES.decode(ours[0].raw) != TEXT_VALUES.decode(expected):
            problems.append("the top-level `tracestream` member is missing or differs")
    elif ours:
        problems.append("unexpected top-level `tracestream` member")
    return problems


def _guide_problems(guides: GuideOrder, data: dict) -> tuple[list[str], int]:
    """(the first problems, how many) of the guide check."""
    if "num_layers" not in data:
        return ([], 0) if not guides.count else (
            [f"{guides.count} unexpected guide events"], 1)
    expected = data["num_layers"] * data["passes"]
    problems = []
    if guides.count != expected:
        problems.append(f"{guides.count} guides, expected {data['num_layers']} layers x "
                        f"{data['passes']} passes = {expected}")
    if problems or guides.problem_count:
        return problems + guides.problems, len(problems) + guides.problem_count
    rows = list(guides.row_problems)
    total = guides.row_problem_count
    if "layers" in data and len(data["layers"]) != guides.count:
        rows.append(f"the report has {len(data['layers'])} guide rows, the output "
                    f"{guides.count} guides")
        total += 1
    return rows, total


def _lane_problems(checks: OutputChecks, data: dict) -> list[str]:
    """The report's lanes and relocation counts must be the output's: every lane it lists
    holds slices, and it counts the relocated events and flows the output holds."""
    section = data.get("compaction", data)
    if "groups" not in section:
        return []
    problems = []
    for g in section["groups"]:
        tids = g.get("lane_tids", [])
        used = [t for t in tids if checks.lane_slices.get((g.get("display_pid"), t))]
        if g.get("lanes") != len(tids) or len(used) != len(tids):
            problems.append(
                f"pid {g.get('pid')} {g.get('kind')}: the report says {g.get('lanes')} lanes "
                f"(tids {tids}), the output has slices on {len(used)} of them")
        problems += _lane_group_problems(checks, g)
    for key, found in (("relocated_events", checks.relocated_events),
                       ("relocated_flows", checks.relocated_flows)):
        if section.get(key) != found:
            problems.append(f"the report's {key} is {section.get(key)}, the output holds {found}")
    return problems


def _lane_group_problems(checks: OutputChecks, group: dict) -> list[str]:
    """With lane groups (the report's `lane_groups` of a device), each lane belongs to one
    group (no two groups list it; together they list the device's lanes) and holds only
    relocated events whose provenance names that group."""
    rows = group.get("lane_groups")
    if rows is None:
        return []
    where = f"pid {group.get('pid')} device {group.get('device')}"
    owner: dict = {}
    problems = []
    for row in rows:
        for tid in row.get("lane_tids", []):
            if tid in owner:
                problems.append(f"{where}: lane tid {tid} is listed for lane groups "
                                f"{owner[tid]} and {row.get('group')}")
            owner.setdefault(tid, row.get("group"))
    if sorted(owner, key=str) != sorted(group.get("lane_tids", []), key=str):
        problems.append(f"{where}: the lane groups list lane tids {list(owner)}, the device "
                        f"{group.get('lane_tids')}")
    for tid, name in owner.items():
        seen = checks.lane_groups.get((group.get("display_pid"), tid), {})
        others = {other: count for other, count in seen.items() if other != name}
        if others:
            held = ", ".join(f"{count} of {other}" for other, count in others.items())
            problems.append(f"{where}: lane tid {tid} (lane group {name}) holds relocated "
                            f"events of another group ({held})")
    return problems


def _guide_text(data: dict) -> str:
    if "num_layers" not in data:
        return "no guides expected, none found"
    return (f"{data['num_layers'] * data['passes']} guides ({data['num_layers']} layers x "
            f"{data['passes']} passes) in time order, no overlap, as the report's rows say")


def _count_problems(checks: OutputChecks, data: dict) -> list[str]:
    problems = []
    for gpu in data.get("gpus", []):
        key = (gpu["pid"], gpu["device"])
        kernels = checks.kernels.get(key, 0)
        streams = len(checks.streams.get(key, ()))
        if kernels != gpu["kernel_count"]:
            problems.append(f"pid {key[0]} device {key[1]}: {kernels} kernels in the output, "
                            f"report says {gpu['kernel_count']}")
        if streams != gpu["streams"]:
            problems.append(f"pid {key[0]} device {key[1]}: {streams} original streams in the "
                            f"output, report says {gpu['streams']}")
    return problems
