"""The rewrite pass of a window: only the events the window holds (index.window's rule),
with the plan's edits, in the source's order.

The stream is cut where the index pass cut it. A chunk whose events all lie outside the
window (none in every window, no linked event kept) is skipped undecoded; one whose
events all lie inside (no linked event dropped, no metadata retired) is copied or edited
as the full rewrite does it; any other goes to a worker (`window_chunk`), which decodes
it, keeps the members and edits the runs of them. Events are joined by ",\\n" where the
source's separators were cut out; the bytes before the first event and after the last
are the source's.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from tracestream.index.decode import decode_chunk, event_spans
from tracestream.index.window import ChunkTimes, Window, chunk_times
from tracestream.parallel.memory import collector_paused, release_memory
from tracestream.parallel.pool import SLOTS_PER_WORKER, InlinePool, outcome
from tracestream.plan.planner import DELETE, Plan
from tracestream.progress import Progress, or_silent
from tracestream.read.hashing import ReadStats
from tracestream.read.source import TraceSource
from tracestream.write.rewrite import (
    StreamCursor,
    _member_edit,
    _refuse_if_changed,
    _splice,
    chunk_edits,
    rewrite_chunk,
)
from tracestream.write.sink import OutputFile

_TRIM_EVERY = 8
_JOIN = b",\n"


def window_chunk(data: bytes, offset: int, first_ordinal: int, rows: np.ndarray,
                 actions: np.ndarray, targets: dict, window: Window,
                 kept_linked: np.ndarray) -> tuple[bytes, int]:
    """The chunk's members of `window` with their edits, joined, and how many there are.

    `rows`/`actions`: the plan's edits of the chunk (as `rewrite_chunk` takes them; a
    DELETE is a retired metadata event, left out); `kept_linked`: the ordinals of the
    chunk's linked events the plan keeps."""
    events = decode_chunk(data, offset)
    starts, ends = _spans(events, data)
    times: ChunkTimes = chunk_times(events)
    keep = times.members(window, kept_linked - first_ordinal)
    local = rows["ordinal"] - first_ordinal
    keep[local[actions == DELETE]] = False
    if not keep.any():
        return b"", 0
    edited = actions != DELETE
    rows, actions, local = rows[edited], actions[edited], local[edited]
    # runs of consecutive members: each is copied (and edited) as one piece
    edges = np.diff(np.r_[0, keep.view(np.int8), 0])
    run_starts, run_stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    pieces = []
    for first, stop in zip(run_starts.tolist(), run_stops.tolist()):
        lo, hi = int(starts[first]), int(ends[stop - 1])
        at = slice(*np.searchsorted(local, [first, stop]).tolist())
        piece, _ = rewrite_chunk(data[lo:hi], offset + lo, rows[at], actions[at], targets)
        pieces.append(piece)
    return _JOIN.join(pieces), int(keep.sum())


def _spans(events, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The events' byte spans (the scan's where it made them, else event_spans')."""
    if hasattr(events, "spans") and len(events):
        starts, ends = (np.frombuffer(b, np.int64) for b in events.spans())
        if starts[0] == 0 and ends[-1] == len(data):
            return starts, ends
    return event_spans(data, len(events))


def rewrite_window(source: TraceSource, index, plan: Plan, out: OutputFile, *,
                   progress: Progress | None = None, pool=None, report_rows=None,
                   phase: str = "rewrite") -> None:
    """The rewrite pass of a plan with a window (as write.rewrite.rewrite takes it), which
    counts what it wrote into the report; `progress` sees it as `phase`."""
    meter = or_silent(progress).phase(phase, source.progress_total)
    stats = ReadStats()
    pool = pool if pool is not None else InlinePool()
    with collector_paused():
        try:
            events = _rewrite_window(
                StreamCursor(source.read(stats)), index, plan, out, pool, report_rows,
                lambda offset: meter.advance_to(stats.position(offset)))
            source.finish_read(stats)
            meter.advance_to(stats.raw_bytes)
        except Exception:
            if not out.failed:
                _refuse_if_changed(source)
            raise
        finally:
            meter.close()
    added = plan.report["added_event_count"]
    plan.report["output_event_count"] = events + added
    plan.report["window"].update(source_events_written=events,
                                 source_events_left_out=index.event_count - events)


def _rewrite_window(cursor: StreamCursor, index, plan: Plan, out: OutputFile, pool,
                    report_rows, written) -> int:
    """The pass over `cursor`: the number of source events written."""
    window = plan.window.window
    kept = plan.window.linked.kept
    layout = index.layout
    member = _member_edit(index, plan)
    if member is not None and member[0] < layout.events_open:
        _splice(cursor, out, member)
        member = None
    pending: deque = deque()  # (payload bytes or a worker's future, chunk end)
    depth = max(1, SLOTS_PER_WORKER * pool.workers)
    state = {"wrote": False, "events": 0, "flushed": 0}

    def flush_one() -> None:
        payload, count, end = pending.popleft()
        state["flushed"] += 1
        if state["flushed"] % _TRIM_EVERY == 0:
            release_memory()
        if not isinstance(payload, bytes):
            payload, count = outcome(payload)
        if payload:
            if state["wrote"]:
                out.write(_JOIN)
            out.write(payload)
            state["wrote"] = True
            state["events"] += count
        written(end)

    first = True
    for chunk, rows, actions in chunk_edits(index, plan):
        head = cursor.take(chunk.offset - cursor.pos)
        if first:  # the document up to the first event: the source's
            out.write(head)
            first = False
        lo, hi = np.searchsorted(kept, [chunk.first_ordinal,
                                        chunk.first_ordinal + chunk.count]).tolist()
        kept_here = kept[lo:hi]
        end = chunk.offset + chunk.length
        outside = (chunk.last_ns < window.start_ns or chunk.first_ns >= window.end_ns)
        if outside and not chunk.always and not len(kept_here):
            cursor.skip(chunk.length)
            pending.append((b"", 0, end))
        elif (chunk.first_ns >= window.start_ns and chunk.last_ns < window.end_ns
              and len(kept_here) == chunk.linked and not (actions == DELETE).any()):
            data = cursor.take(chunk.length)  # every event is a member
            if len(rows):
                pending.append((pool.submit(_edited, data, chunk.offset, rows, actions,
                                            plan.targets, chunk.count), 0, end))
            else:
                pending.append((data, chunk.count, end))
        else:
            data = cursor.take(chunk.length)
            pending.append((pool.submit(window_chunk, data, chunk.offset, chunk.first_ordinal,
                                        rows, actions, plan.targets, window, kept_here),
                            0, end))
        while len(pending) > depth:
            flush_one()
    while pending:
        flush_one()
    insert_at = layout.last_event_end if layout.event_count else layout.events_open + 1
    if cursor.pos < insert_at:
        cursor.skip(insert_at - cursor.pos)
    if plan.appended:
        lead = _JOIN if state["wrote"] else b""
        for text in plan.appended.texts(report_rows):
            out.write(lead)
            out.write(text)
            lead = _JOIN
    if member is not None:
        _splice(cursor, out, member)
    cursor.drain(out)
    return state["events"]


def _edited(data: bytes, offset: int, rows: np.ndarray, actions: np.ndarray, targets: dict,
            count: int) -> tuple[bytes, int]:
    """A chunk whose every event is a member, with its edits (no metadata retired)."""
    return rewrite_chunk(data, offset, rows, actions, targets)[0], count
