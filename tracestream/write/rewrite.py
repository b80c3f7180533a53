"""The rewrite pass: stream the source again and apply the plan's edits in order.

The stream is cut exactly where the index pass cut it. Chunks without edits are
copied as they are; chunks with edits go to a worker (`rewrite_chunk`), which
copies every unchanged byte and splices the relocated events. A retired
metadata event is dropped with its following separator; new events go just
after the last original event and the `tracestream` member just after the last
top-level value (or in place of an older one).
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np
from isal import isal_zlib

from tracestream import _native
from tracestream.errors import TraceError
from tracestream.index.builder import TraceIndex
from tracestream.index.records import concat_rows, take_rows
from tracestream.jsontext import template_parts
from tracestream.model import MEMBER_WITH_ARGS, MEMBER_WITHOUT_ARGS
from tracestream.parallel.memory import collector_paused, release_memory
from tracestream.parallel.pool import SLOTS_PER_WORKER, InlinePool, outcome
from tracestream.parallel.slots import deliver, received, slot_buffer, write_result
from tracestream.plan.planner import DELETE, KEEP, Plan
from tracestream.progress import Meter, Progress, or_silent
from tracestream.read.hashing import PieceChecksum, ReadStats
from tracestream.read.source import PLAIN_BLOCK, TraceSource, read_span
from tracestream.write.relocate import relocate
from tracestream.write.sink import OutputFile

_TRIM_EVERY = 8


class StreamCursor:
    """Sequential access to the decompressed stream by absolute offset."""

    def __init__(self, blocks: Iterable[bytes]):
        self._blocks = iter(blocks)
        self._data = b""
        self._base = 0  # absolute offset of _data[0]
        self.pos = 0  # absolute offset of the next byte not yet consumed

    def _next_block(self) -> None:
        block = next(self._blocks, None)
        if block is None:
            raise TraceError(
                "input ended early in the rewrite pass (it changed since the index pass)")
        self._base += len(self._data)
        self._data = block

    def copy_to(self, out: OutputFile, offset: int) -> None:
        """Write [pos, offset) to `out` and advance."""
        while self.pos < offset:
            rel = self.pos - self._base
            if rel >= len(self._data):
                self._next_block()
                continue
            end = min(len(self._data), offset - self._base)
            out.write(self._data[rel:end])
            self.pos = self._base + end

    def take(self, length: int) -> bytes:
        """The next `length` bytes (copied once, even across blocks)."""
        parts = []
        need = length
        while need:
            rel = self.pos - self._base
            if rel >= len(self._data):
                self._next_block()
                continue
            piece = memoryview(self._data)[rel : rel + need]
            parts.append(piece)
            need -= len(piece)
            self.pos += len(piece)
        return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)

    def skip(self, length: int) -> None:
        """Advance past the next `length` bytes without copying them."""
        target = self.pos + length
        while self.pos < target:
            rel = self.pos - self._base
            if rel >= len(self._data):
                self._next_block()
                continue
            self.pos = min(self._base + len(self._data), target)

    def _rest(self) -> Iterator[bytes]:
        """The bytes that are left, a block at a time (consumed as they are yielded)."""
        while True:
            rel = self.pos - self._base
            if rel < len(self._data):
                yield self._data[rel:]
            self._base += len(self._data)
            self.pos = self._base
            block = next(self._blocks, None)
            if block is None:
                self._data = b""
                return
            self._data = block

    def take_rest(self) -> bytes:
        """Everything that is left (the bytes after the last event: a few top-level keys)."""
        return b"".join(self._rest())

    def drain(self, out: OutputFile) -> None:
        """Copy everything that is left."""
        for data in self._rest():
            out.write(data)


class FileCursor:
    """StreamCursor's reads of an uncompressed file, by offset: only the bytes asked for
    are read (the worker processes read the chunks they rewrite themselves, `skip`), and
    every byte of the pass is checksummed in file order (`checksum`: what is read here as
    it is read, a skipped span by the CRC its worker returns, see `PieceChecksum.fill`)."""

    def __init__(self, fd: int, checksum: PieceChecksum):
        self._fd = fd
        self.checksum = checksum
        self.pos = 0

    def close(self) -> None:
        os.close(self._fd)

    def _read(self, length: int) -> bytes:
        data = os.pread(self._fd, length, self.pos)
        if len(data) < length:
            raise TraceError(
                "input ended early in the rewrite pass (it changed since the index pass)")
        self.checksum.read(data)
        self.pos += length
        return data

    def copy_to(self, out: OutputFile, offset: int) -> None:
        """Write [pos, offset) to `out` and advance."""
        while self.pos < offset:
            out.write(self._read(min(PLAIN_BLOCK, offset - self.pos)))

    def take(self, length: int) -> bytes:
        """The next `length` bytes."""
        return self._read(length) if length else b""

    def skip(self, length: int) -> int:
        """Advance past the next `length` bytes, read elsewhere: the number of their span
        in the checksum."""
        self.pos += length
        return self.checksum.span(length)

    def drain(self, out: OutputFile) -> None:
        """Copy everything that is left."""
        for data in self._rest():
            out.write(data)

    def take_rest(self) -> bytes:
        """Everything that is left (the bytes after the last event: a few top-level keys)."""
        return b"".join(self._rest())

    def _rest(self) -> Iterator[bytes]:
        while data := os.pread(self._fd, PLAIN_BLOCK, self.pos):
            self.checksum.read(data)
            self.pos += len(data)
            yield data


_ARGS_LENGTH = len(b'"args": {')
_MEMBER_PARTS = template_parts(MEMBER_WITH_ARGS)
_NO_ARGS_MEMBER_PARTS = template_parts(MEMBER_WITHOUT_ARGS)
"""The two members around their pid, tid and ordinal, for `_native.splice`."""
_EMPTY_ARGS = re.compile(rb'"args": \{[ \t\r\n]*\}')


def _absolute(rows: np.ndarray, starts: np.ndarray, field: str) -> np.ndarray:
    """A SPLICE_FIELDS column as chunk positions (negative markers stay as they are)."""
    relative = rows[field].astype(np.int64)
    return np.where(relative >= 0, relative + starts, relative)


def rewrite_chunk(data: bytes, offset: int, rows: np.ndarray, actions: np.ndarray,
                  targets: dict, into=None, *,
                  splice=None) -> tuple[bytes | int, tuple[bytes, ...]]:
    """A chunk (starting at absolute `offset`) with its edits applied, and the separators
    its dropped events took with them. `into` (a worker's shared slot): where the C
    extension may write the chunk, returning its length instead of its bytes.

    `rows` are the span records of the chunk's changed events (ascending), `actions`
    the plan's action for each. A dropped event takes its following separator with
    it (the report keeps it, so `restore` puts back the exact bytes); b"" marks the
    chunk's last event (the caller then skips the separator after the chunk, see
    `dropped_last`).

    Where the index pass found the event's "pid", "tid" and "args" keys (see
    keyscan.splice_positions), the event is spliced directly; anything else goes
    through `relocate`. `splice` splices instead of `_native.splice`: `verify` gives the
    numpy twin (`_native.reference.splice`) to cross-check the rewrite's.
    """
    starts = rows["offset"] - offset
    ends = starts + rows["length"]
    pid = _absolute(rows, starts, "pid_start"), _absolute(rows, starts, "pid_end")
    tid = _absolute(rows, starts, "tid_start"), _absolute(rows, starts, "tid_end")
    braces = _absolute(rows, starts, "args_brace")
    spliced = _splice_in_place(data, rows["ordinal"], actions, targets, ends, pid, tid, braces,
                               into, splice=splice)
    if spliced is not None:
        return spliced, ()
    out = []
    append = out.append
    pos = 0
    dropped = []
    codes = actions.tolist()
    new_tids = [targets[c][0] if c != DELETE else b"" for c in codes]
    new_pids = [targets[c][1] if c != DELETE else None for c in codes]
    groups = [targets[c][2] if c != DELETE else None for c in codes]
    empty_args = {m.start() for m in _EMPTY_ARGS.finditer(data)}
    columns = [starts.tolist(), ends.tolist(), rows["ordinal"].tolist(), codes, new_tids,
               new_pids, pid[0].tolist(), pid[1].tolist(), tid[0].tolist(), tid[1].tolist(),
               braces.tolist(), groups]
    for (start, end, ordinal, action, new_tid, new_pid, p0, p1, t0, t1, brace,
         group) in zip(*columns):
        if action == DELETE:
            append(data[pos:start])
            pos = _after_separator(data, end)
            dropped.append(data[end:pos])
            continue
        positions = None
        if p0 >= 0 and t0 > p1 and (brace > t1 or (brace == -1 and data[end - 1] == 0x7D)):
            # Kineto's order (pid, tid, ..., args), found by the index pass: relocate needs
            # not search the event again (`brace` is just inside args, relocate's at its `{`)
            positions = ((p0 - start, p1 - start), (t0 - start, t1 - start),
                         brace - 1 - start if brace > t1 else -1,
                         brace - _ARGS_LENGTH in empty_args)
        append(data[pos:start])
        append(relocate(data[start:end], new_tid, ordinal, new_pid, positions, group))
        pos = end
    append(data[pos:])
    return b"".join(out), tuple(dropped)


def dropped_last(dropped: tuple[bytes, ...]) -> bool:
    """Whether a chunk's last event was dropped (see `rewrite_chunk`): a separator inside a
    chunk holds its comma, only the chunk's last event has none."""
    return bool(dropped) and not dropped[-1]


def _splice_in_place(data: bytes, ordinals, actions, targets, ends, pid, tid,
                     braces, into=None, *, splice=None) -> bytes | int | None:
    """The chunk with every changed event spliced in place, or None unless all can be
    (written into `into` by the C extension where it fits: then its length).

    The common case, every changed event relocated with its keys in Kineto's order
    (pid, tid, ..., args), is assembled from whole columns: four pieces per event
    (the bytes up to its tid value, the new tid, the bytes up to the inside of
    its args, the provenance member, with its lane group's where the plan has lane groups;
    a new pid is spliced into the first piece), by
    `splice` (`_native.splice` unless one is given).
    """
    p0, p1 = pid
    t0, t1 = tid
    if not len(actions) or (actions == DELETE).any() or not ((p0 >= 0) & (t0 > p1)).all():
        return None
    view = np.frombuffer(data, np.uint8)
    with_args = braces > t1
    closing = view[ends - 1] == 0x7D
    if not (with_args | ((braces == -1) & closing)).all():
        return None
    resume = np.where(with_args, braces, ends - 1)  # where the original bytes go on
    previous = np.empty_like(resume)
    previous[0] = 0
    previous[1:] = resume[:-1]
    codes = actions.tolist()
    lane = {code: targets[code] for code in set(codes)}
    new_tids = list(map({code: tid for code, (tid, _, _) in lane.items()}.__getitem__, codes))
    new_pids = list(map({code: pid for code, (_, pid, _) in lane.items()}.__getitem__, codes))
    groups = None  # without lane groups no member has one (the splice's usual bytes)
    if any(group is not None for _, _, group in lane.values()):
        groups = list(map({code: group for code, (_, _, group) in lane.items()}.__getitem__,
                          codes))
    columns = tuple(np.ascontiguousarray(column, np.int64)
                    for column in (previous, p0, p1, t0, t1, resume, ordinals))
    return (splice or _native.splice)(data, columns, with_args, new_tids, new_pids,
                                      _MEMBER_PARTS, _NO_ARGS_MEMBER_PARTS, groups,
                                      *(() if into is None else (into,)))


def rewrite_file_chunk(path: str, offset: int, length: int, rows: np.ndarray,
                       actions: np.ndarray, targets: dict, slot: int | None = None
                       ) -> tuple[bytes | int, tuple[bytes, ...], int]:
    """`rewrite_sent_chunk` of a span of a plain file, read by the worker itself, and the
    CRC-32 of the bytes it read (the parent checksums the pass from these, see FileCursor)."""
    data = read_span(path, offset, length)
    return (*rewrite_sent_chunk(data, offset, rows, actions, targets, slot),
            isal_zlib.crc32(data))


def file_span_crc(path: str, offset: int, length: int) -> int:
    """The CRC-32 of a span of a plain file that a pass leaves out, read by a worker (see
    FileCursor): the pass still checksums every byte of its source (a file cut short
    since then gives another CRC, which the pass's end refuses)."""
    return isal_zlib.crc32(read_span(path, offset, length))


def rewrite_received_chunk(slot: int, length: int, offset: int, rows: np.ndarray,
                           actions: np.ndarray,
                           targets: dict) -> tuple[bytes | int, tuple[bytes, ...]]:
    """`rewrite_sent_chunk` of a chunk the parent put in `slot`; the result goes back in it."""
    return rewrite_sent_chunk(received(slot, length), offset, rows, actions, targets, slot)


def rewrite_sent_chunk(data: bytes, offset: int, rows: np.ndarray, actions: np.ndarray,
                       targets: dict, slot: int | None = None
                       ) -> tuple[bytes | int, tuple[bytes, ...]]:
    """`rewrite_chunk` in a worker; the result goes to a shared slot when it was given one
    (see parallel.slots.deliver), spliced straight into it where it can be."""
    data, dropped = rewrite_chunk(data, offset, rows, actions, targets, slot_buffer(slot))
    return (data if isinstance(data, int) else deliver(data, slot)), dropped


def submit_chunk(pool, cursor: StreamCursor | FileCursor, by_path: str | None,
                 slot: int | None, chunk, rows: np.ndarray, actions: np.ndarray,
                 targets: dict) -> tuple[object, int | None]:
    """A worker's `rewrite_chunk` of `chunk`, the cursor's next bytes, and the number of
    its span in the cursor's checksum where the worker reads it from `by_path` itself
    (else None: it is read here and goes out and back in `slot` where it fits, else as
    bytes, its result still back in the slot where that fits)."""
    if by_path is not None:
        return (pool.submit(rewrite_file_chunk, by_path, chunk.offset, chunk.length, rows,
                            actions, targets, slot), cursor.skip(chunk.length))
    data = cursor.take(chunk.length)
    if slot is not None and pool.slots.put(slot, data):
        return pool.submit(rewrite_received_chunk, slot, len(data), chunk.offset, rows,
                           actions, targets), None
    return pool.submit(rewrite_sent_chunk, data, chunk.offset, rows, actions, targets,
                       slot), None


def _after_separator(data: bytes, pos: int) -> int:
    """Position after the whitespace and one comma that follow an event (or the end)."""
    size = len(data)
    while pos < size and data[pos] in b" \t\r\n":
        pos += 1
    if pos < size and data[pos] == 0x2C:  # ','
        pos += 1
        while pos < size and data[pos] in b" \t\r\n":
            pos += 1
    return pos


def edits(index: TraceIndex, plan: Plan) -> Iterator[tuple[int, int, int, int]]:
    """(ordinal, offset, length, action) of every candidate the plan changes, in file order."""
    start = 0
    actions = plan.actions
    for batch in index.spans.batches():
        part = actions[start : start + len(batch)]
        changed = np.flatnonzero(part != KEEP)
        if len(changed):
            rows = take_rows(batch, changed)
            yield from zip(
                rows["ordinal"].tolist(), rows["offset"].tolist(), rows["length"].tolist(),
                part[changed].tolist(),
            )
        start += len(batch)


def chunk_edits(index: TraceIndex, plan: Plan) -> Iterator[tuple[object, np.ndarray, np.ndarray]]:
    """(chunk, span records of its changed events, their actions) for every chunk, in order.

    Streams the span store (which may be on disk) alongside the chunk list.
    """
    def changed() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        start = 0
        for batch in index.spans.batches():
            part = plan.actions[start : start + len(batch)]
            start += len(batch)
            mask = part != KEEP
            if mask.any():
                yield take_rows(batch, mask), part[mask]

    batches = changed()
    rows = np.zeros(0, index.spans.dtype)
    acts = np.zeros(0, np.uint16)
    exhausted = False
    for chunk in index.chunks:
        limit = chunk.first_ordinal + chunk.count
        while not exhausted and (not len(rows) or rows["ordinal"][-1] < limit):
            more = next(batches, None)
            if more is None:
                exhausted = True
                break
            rows = concat_rows([rows, more[0]])
            acts = np.concatenate([acts, more[1]])
        cut = int(np.searchsorted(rows["ordinal"], limit))
        yield chunk, rows[:cut], acts[:cut]
        rows, acts = rows[cut:], acts[cut:]


def rewrite(source: TraceSource, index: TraceIndex, plan: Plan, out: OutputFile,
            *, progress: Progress | None = None, pool=None, report_rows=None) -> None:
    """The rewrite pass into `out`. `report_rows`: (the report's guide rows, where they go),
    to make each block of guides' report rows with its events (AppendedEvents.texts).
    `progress` sees the phase "rewrite" (see tracestream.progress)."""
    meter = or_silent(progress).phase("rewrite", source.progress_total)
    with collector_paused():
        try:
            _rewrite(source, index, plan, out, meter,
                     pool if pool is not None else InlinePool(), report_rows)
        except Exception:
            if not out.failed:
                _refuse_if_changed(source)
            raise
        finally:
            meter.close()


def _refuse_if_changed(source: TraceSource) -> None:
    """TraceError when the source's bytes are not the index pass's (read them all again).

    An edit applied to bytes that changed after the index pass (same size and
    mtime, or changed while this pass read them) can fail in any way; the user
    should hear that the input changed, not about an event or a bug.
    """
    stats = ReadStats()
    for _ in source.read(stats):
        pass
    source.finish_read(stats)


def _rewrite(source, index, plan, out, meter: Meter, pool, report_rows) -> None:
    stats = ReadStats()
    by_path = source.plain_path if pool.workers else None

    def written(offset: int) -> None:  # the output holds the source's bytes up to `offset`
        meter.advance_to(stats.position(offset))

    if by_path is not None:  # the workers read what they rewrite
        cursor = FileCursor(source.open_plain(), PieceChecksum())
        try:
            _rewrite_from(cursor, index, plan, out, pool, by_path, report_rows, written)
        finally:
            cursor.close()
        cursor.checksum.finish(stats)
    else:
        blocks: Iterable[bytes] = source.read(stats)
        _rewrite_from(StreamCursor(blocks), index, plan, out, pool, by_path, report_rows,
                      written)
    source.finish_read(stats)
    meter.advance_to(stats.raw_bytes)  # (the bytes after the last event too)


def _rewrite_from(cursor: StreamCursor | FileCursor, index, plan, out, pool,
                  by_path: str | None, report_rows=None, written=lambda offset: None) -> None:
    """The rewrite pass over `cursor`; chunks with edits go to the workers, which read them
    themselves from `by_path` when it is given. `written(offset)`: the output holds the
    source's bytes up to `offset` (decompressed), after each chunk."""
    layout = index.layout
    member = _member_edit(index, plan)
    if member is not None and member[0] < layout.events_open:
        _splice(cursor, out, member)
        member = None
    # items in output order: (separator bytes, payload bytes or a worker's future, whether
    # the separator goes with a dropped event before it, the result's slot, the chunk's span
    # in the checksum when its worker read it)
    pending: deque = deque()
    # the pool has a slot for each chunk in flight (up to window + 1, see pool_for)
    window = SLOTS_PER_WORKER * pool.workers
    ends_dropped = False  # the last chunk written ended with a dropped event
    separators: list[bytes] = []  # what each dropped event took with it, in file order
    first = True

    flushed = 0

    def flush_one() -> None:
        nonlocal ends_dropped, flushed
        flushed += 1
        if flushed % _TRIM_EVERY == 0:
            release_memory()
        separator, payload, conditional, slot, span, end = pending.popleft()
        if conditional and ends_dropped:
            separators[-1] = separator  # left out with the event before it
        else:
            out.write(separator)
        if isinstance(payload, bytes):
            out.write(payload)
            ends_dropped = False
        else:
            result, dropped, *read_crc = outcome(payload)
            if span is not None:  # the worker read the chunk: the CRC of what it read
                cursor.checksum.fill(span, *read_crc)
            separators.extend(dropped)
            ends_dropped = dropped_last(dropped)
            write_result(out, result, slot, pool.slots)
        written(end)

    for chunk, rows, actions in chunk_edits(index, plan):
        separator = cursor.take(chunk.offset - cursor.pos)
        slot = pool.slots.acquire() if len(rows) and pool.slots is not None else None
        span = None
        if len(rows):
            payload, span = submit_chunk(pool, cursor, by_path, slot, chunk, rows, actions,
                                         plan.targets)
        else:
            payload = cursor.take(chunk.length)
        pending.append((separator, payload, not first, slot, span, chunk.offset + chunk.length))
        first = False
        while len(pending) > window:
            flush_one()
    while pending:
        flush_one()
    insert_at = layout.last_event_end if layout.event_count else layout.events_open + 1
    if cursor.pos < insert_at:
        cursor.copy_to(out, insert_at)
    if plan.appended:
        lead = b"" if (not layout.event_count or ends_dropped) else b",\n"
        # guide events (and their report rows): made a block at a time
        for text in plan.appended.texts(report_rows):
            out.write(lead)
            out.write(text)
            lead = b",\n"
    elif ends_dropped:
        raise TraceError("internal error: a dropped last event left a dangling separator")
    _record_separators(plan, separators)
    if member is not None:
        _splice(cursor, out, member)
    cursor.drain(out)


def _record_separators(plan: Plan, separators: list[bytes]) -> None:
    """Give each retired event in the report the separator it took out of the trace."""
    compaction = plan.report.get("compaction", plan.report)
    retired = sorted(compaction.get("retired_track_metadata", []),
                     key=lambda row: row["source_event_index"])
    if len(retired) != len(separators):
        raise TraceError(f"internal error: {len(separators)} events dropped, "
                         f"{len(retired)} retired")
    for row, separator in zip(retired, separators):
        row["separator"] = separator.decode()


def _member_edit(index: TraceIndex, plan: Plan) -> tuple[int, int, bytes] | None:
    """Where the `tracestream` member goes: replacing an earlier one, else after the last key."""
    if plan.top_level_member is None:
        return None
    for value in index.layout.values:
        if value.key == "tracestream":
            return value.value_start, value.value_end, plan.top_level_member.split(b": ", 1)[1]
    end = _last_member_end(index)
    return end, end, b",\n  " + plan.top_level_member


def _splice(cursor: StreamCursor, out: OutputFile, edit: tuple[int, int, bytes]) -> None:
    start, end, text = edit
    cursor.copy_to(out, start)
    cursor.take(end - start)
    out.write(text)


def _last_member_end(index: TraceIndex) -> int:
    layout = index.layout
    ends = [v.value_end for v in layout.values] + [layout.events_close + 1]
    return max(ends)
