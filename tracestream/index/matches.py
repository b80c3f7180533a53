"""Kernels that matched a user's pattern, kept as packed columns.

A large trace can hold millions of anchor matches (one per layer per pass); as
Python objects they would dominate memory. `MatchTable` packs each in 41 bytes:
ordinal, track, group, exact start and duration in ns, stream and name ids, and
how the source wrote the numbers, so their exact text is regenerated on
demand (Kineto's three-decimal and integer forms; other forms are kept as text).
The packed rows spill to disk past a budget; only the start ns stay in memory.
It reads like a sequence of `Match` objects.
"""

from __future__ import annotations

import operator
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from tracestream.index import timebase
from tracestream.index.records import DEFAULT_BUDGET, RecordStore
from tracestream.parallel.memory import release_memory

MATCH_DTYPE = np.dtype([
    ("ordinal", "<i8"), ("track", "<i4"), ("group", "<i4"), ("start", "<i8"), ("dur", "<i8"),
    ("form", "i1"), ("stream", "<i4"), ("name", "<i4"),
])
THREE_DECIMALS = 0
INTEGER = 1
AS_TEXT = 2


@dataclass
class Match:
    """A kernel whose name matched one of the user's patterns (times as exact text)."""

    ordinal: int
    pid: Any
    tid: Any
    device: Any
    name: str
    ts_text: str
    dur_text: str
    stream: Any

    @cached_property
    def ts(self) -> timebase.Decimal10:
        return timebase.parse_decimal(self.ts_text)

    @cached_property
    def dur(self) -> timebase.Decimal10:
        return timebase.parse_decimal(self.dur_text)

    @property
    def end(self) -> timebase.Decimal10:
        return self.ts + self.dur


def number_form(ts_text: bytes, dur_text: bytes, start_ns: int, dur_ns: int) -> int:
    """How to write (ts, dur) back exactly: from their ns in one of Kineto's forms, or as text."""
    if ts_text == _three(start_ns) and dur_text == _three(dur_ns):
        return THREE_DECIMALS
    if ts_text == _integer(start_ns) and dur_text == _integer(dur_ns):
        return INTEGER
    return AS_TEXT


def number_forms(ts_texts: list[bytes], dur_texts: list[bytes], start_ns: np.ndarray,
                 dur_ns: np.ndarray) -> np.ndarray:
    """`number_form` of many matches: one regex over all texts decides the common cases
    (every value canonical with three decimals, or every value a canonical integer);
    otherwise each value is compared with its writing in each form, written a column at
    a time, so a chunk with one differently written value is not read one match at a
    time."""
    if not ts_texts:
        return np.zeros(0, np.int8)
    blob = b",".join(ts_texts) + b"," + b",".join(dur_texts)
    for form, canonical in _CANONICAL_FORMS:
        if canonical.fullmatch(blob):
            return np.full(len(ts_texts), form, np.int8)
    forms = np.full(len(ts_texts), AS_TEXT, np.int8)
    whole = (start_ns % 1000 == 0) & (dur_ns % 1000 == 0)  # what _integer writes at all
    forms[whole & _equal(ts_texts, integers(start_ns)) & _equal(dur_texts, integers(dur_ns))] = (
        INTEGER)
    forms[_equal(ts_texts, threes(start_ns)) & _equal(dur_texts, threes(dur_ns))] = (
        THREE_DECIMALS)
    return forms


def _equal(texts: list[bytes], written: list[bytes]) -> np.ndarray:
    """Whether each text is the written one, compared a column at a time."""
    return np.fromiter(map(operator.eq, texts, written), bool, len(texts))


def _canonical_column(number: bytes) -> re.Pattern:
    return re.compile(rb"(?:" + number + rb",)*" + number)


_CANONICAL_FORMS = (
    # what _three writes: no leading zeros, three decimals, no "-0.000"
    (THREE_DECIMALS, _canonical_column(
        rb"(?:(?:0|[1-9][0-9]*)\.[0-9]{3}|-(?:[1-9][0-9]*\.[0-9]{3}|0\.(?!000)[0-9]{3}))")),
    # what _integer writes: no leading zeros, no "-0"
    (INTEGER, _canonical_column(rb"(?:0|-?[1-9][0-9]*)")),
)


def _three(ns: int) -> bytes:
    return timebase.us_text(ns).encode()


def threes(ns: np.ndarray) -> list[bytes]:
    """`_three` of a column: one formatting call for all values (their magnitudes), a sign
    put before each negative one."""
    if not len(ns):
        return []
    pairs = np.empty(2 * len(ns), np.int64)
    pairs[0::2], pairs[1::2] = np.divmod(np.abs(ns), 1000)
    texts = ((b"%d.%03d," * len(ns)) % tuple(pairs.tolist()))[:-1].split(b",")
    for k in np.flatnonzero(ns < 0).tolist():
        texts[k] = b"-" + texts[k]
    return texts


def _integer(ns: int) -> bytes:
    if ns % 1000:
        return b""
    return b"%d" % (ns // 1000)


def integers(ns: np.ndarray) -> list[bytes]:
    """`_integer` of a column of whole µs: one formatting call for all values."""
    if not len(ns):
        return []
    return ((b"%d," * len(ns)) % tuple((ns // 1000).tolist()))[:-1].split(b",")


_WRITE = {THREE_DECIMALS: _three, INTEGER: _integer}
"""How a (ts, dur) of each form but AS_TEXT is written back from its ns."""


def _by_form(forms: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """The texts of values `ns` written in their forms, a form at a time, as an object
    array (None where the form is AS_TEXT: the caller fills those in)."""
    texts = np.empty(len(ns), object)
    for form, write in ((THREE_DECIMALS, threes), (INTEGER, integers)):
        at = np.flatnonzero(forms == form)
        if len(at):
            texts[at] = write(ns[at])
    return texts


def _intern(values: list, ids: dict, value) -> int:
    """The id of `value` in `values`, appending it once (1 and 1.0 and "1" stay apart)."""
    key = (type(value), value)
    found = ids.get(key)
    if found is None:
        found = ids[key] = len(values)
        values.append(value)
    return found


def _concatenate_consuming(parts: list[np.ndarray]) -> np.ndarray:
    """One array of all parts, freeing each part once copied: millions of matches (a
    10 GB trace) are held once, not twice.

    The parts are small (one chunk's matches each) and live among other small
    allocations, so freeing them returns nothing to the system by itself; the
    heap is trimmed after every few MB copied.
    """
    joined = np.empty(sum(len(p) for p in parts), parts[0].dtype if parts else np.int64)
    pos = 0
    copied = 0
    parts.reverse()
    while parts:
        part = parts.pop()
        joined[pos : pos + len(part)] = part
        pos += len(part)
        copied += part.nbytes
        del part
        if copied >= _TRIM_BYTES:
            release_memory()
            copied = 0
    release_memory()
    return joined


_TRIM_BYTES = 8 << 20


def _position(values: list, value) -> int:
    """The index of `value` in `values`, appended when missing."""
    if value not in values:
        values.append(value)
    return values.index(value)


class MatchTable(Sequence):
    """All matches of one pattern, in file order (ordinals ascending).

    A 10 GB nightly trace holds millions of matches. Only their start ns (8 bytes
    each, what sorting and the vectorised checks compare) stay in memory; the
    packed rows go to a `RecordStore` that spills to a temporary file past its
    budget, and are read back (`take`) a few at a time: a block of guides, a
    batch of report rows.
    """

    def __init__(self, tracks: list, groups: list, *, tmpdir: str | None = None,
                 budget: int = DEFAULT_BUDGET):
        self._tracks = tracks  # the index's (pid, tid) table, shared
        self._groups = groups  # the index's (pid, device) table, shared
        self._store = RecordStore(MATCH_DTYPE, budget=budget, tmpdir=tmpdir)
        self._start_parts: list[np.ndarray] = []
        self._starts: np.ndarray | None = np.zeros(0, np.int64)
        self._group_counts: Counter = Counter()  # group id -> matches
        self.names: list = []
        self._name_ids: dict = {}
        self.streams: list = []
        self._stream_ids: dict = {}
        self.texts: dict[int, tuple[str, str]] = {}  # row -> (ts, dur) text, form AS_TEXT
        self._text_rows: np.ndarray | None = np.zeros(0, np.int64)

    def intern_name(self, name) -> int:
        return _intern(self.names, self._name_ids, name)

    def intern_stream(self, stream) -> int:
        return _intern(self.streams, self._stream_ids, stream)

    def extend(self, rows: np.ndarray, texts: dict[int, tuple[str, str]]) -> None:
        """Add rows (already in global numbering); `texts` keyed by position in `rows`."""
        base = len(self)
        for k, pair in texts.items():
            self.texts[base + k] = pair
        if texts:
            self._text_rows = None
        self._store.append(rows)
        self._start_parts.append(rows["start"].copy())  # not a view: the rows may spill
        self._starts = None
        groups, counts = np.unique(rows["group"], return_counts=True)
        self._group_counts.update(dict(zip(groups.tolist(), counts.tolist())))

    @property
    def starts(self) -> np.ndarray:
        """Floor ns of each match's start, in file order: the one column kept in memory."""
        if self._starts is None:
            self._starts = _concatenate_consuming(self._start_parts)
            self._start_parts = [self._starts]
        return self._starts

    def take(self, which: np.ndarray) -> np.ndarray:
        """The packed rows `which` (MATCH_DTYPE), read back from the store."""
        return self._store.take(which)

    def as_text(self, which: np.ndarray) -> np.ndarray:
        """Whether each of rows `which` keeps its (ts, dur) as text (form AS_TEXT)."""
        if not self.texts:
            return np.zeros(len(which), bool)
        if self._text_rows is None:
            self._text_rows = np.array(sorted(self.texts), np.int64)
        return np.isin(which, self._text_rows)

    def __len__(self) -> int:
        return len(self._store)

    def match(self, row: int) -> Match:
        r = self.take(np.array([row]))[0]
        pid, tid = self._tracks[int(r["track"])]
        device = self._groups[int(r["group"])][1]
        write = _WRITE.get(int(r["form"]))
        if write is not None:
            ts_text, dur_text = write(int(r["start"])).decode(), write(int(r["dur"])).decode()
        else:
            ts_text, dur_text = self.texts[row]
        return Match(int(r["ordinal"]), pid, tid, device, self.names[int(r["name"])], ts_text,
                     dur_text, self.streams[int(r["stream"])])

    def tid_of(self, track: int):
        return self._tracks[track][1]

    def texts_of(self, which: np.ndarray, rows: np.ndarray | None = None
                 ) -> tuple[list[bytes], list[bytes]]:
        """The (ts, dur) texts of rows `which`, as `match(row)` gives them, as bytes: each
        of Kineto's forms written a column at a time, only rows kept as text one by one
        (`rows`: `take(which)`, when the caller has read them already)."""
        rows = self.take(which) if rows is None else rows
        forms = rows["form"]
        return (self._texts(which, forms, rows["start"], 0),
                self._texts(which, forms, rows["dur"], 1))

    def start_texts(self, which: np.ndarray, rows: np.ndarray | None = None) -> list[bytes]:
        """The ts texts of rows `which` (`texts_of`'s first list), their durations not
        written (guides and most report rows show starts only)."""
        rows = self.take(which) if rows is None else rows
        return self._texts(which, rows["form"], rows["start"], 0)

    def _texts(self, which: np.ndarray, forms: np.ndarray, ns: np.ndarray,
               part: int) -> list[bytes]:
        """One column's texts (part 0: ts, 1: dur): all in one of Kineto's forms written
        at once (the usual case: every match of a trace is written alike), else a form at
        a time, rows kept as text one by one."""
        if (forms == THREE_DECIMALS).all():
            return threes(ns)
        if (forms == INTEGER).all():
            return integers(ns)
        texts = _by_form(forms, ns)
        for k in np.flatnonzero(forms == AS_TEXT).tolist():
            texts[k] = self.texts[int(which[k])][part].encode()
        return texts.tolist()

    def ends_of(self, which: np.ndarray, rows: np.ndarray | None = None
                ) -> tuple[list[bytes], np.ndarray]:
        """The exact end (ts + dur) of rows `which`: its text, as `match(row).end.to_text()`
        gives it, and its ceiling in ns."""
        rows = self.take(which) if rows is None else rows
        ns = rows["start"] + rows["dur"]
        forms = rows["form"]
        if (forms == THREE_DECIMALS).all():  # exact in ns: the sum is, too
            return threes(ns), ns
        texts, ceils = _by_form(forms, ns), ns.copy()
        for k in np.flatnonzero(forms == AS_TEXT).tolist():
            exact = self.match(int(which[k])).end
            texts[k] = exact.to_text().encode()
            ceils[k] = exact.ceil_ns()
        return texts.tolist(), ceils

    def exact_times(self, which: np.ndarray, *, end: bool = False,
                    rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(floor ns, whole µs rounded half up) of the start (or, with `end`, the exact end)
        of rows `which`: from the packed ns where the source wrote whole ns (Kineto's
        forms), else from the exact decimal (rows kept as text, which may hold sub-ns
        digits)."""
        rows = self.take(which) if rows is None else rows
        floor = rows["start"] + rows["dur"] if end else rows["start"].copy()
        rounded = (floor + 500) // 1000  # halves up, as Decimal10.round_us
        for k in np.flatnonzero(rows["form"] == AS_TEXT).tolist():
            match = self.match(int(which[k]))
            exact = match.end if end else match.ts
            floor[k], rounded[k] = exact.floor_ns(), exact.round_us()
        return floor, rounded

    def whole_ns(self, which: np.ndarray) -> np.ndarray:
        """Whether each of rows `which` has start and duration in whole ns (exact in the
        packed columns)."""
        return ~self.as_text(which)

    def column_batches(self, field: str) -> Iterator[np.ndarray]:
        """One packed column of every row in file order, a block of rows at a time."""
        for batch in self._store.batches():
            yield batch[field]

    @classmethod
    def from_matches(cls, matches: Sequence[Match]) -> MatchTable:
        """A table of Match objects (tests and small callers), in the given order."""
        tracks: list = []
        groups: list = []
        table = cls(tracks, groups)
        rows = np.zeros(len(matches), MATCH_DTYPE)
        texts = {}
        for k, m in enumerate(matches):
            start, dur = m.ts.floor_ns(), m.dur.floor_ns()
            form = number_form(m.ts_text.encode(), m.dur_text.encode(), start, dur)
            if form == AS_TEXT:
                texts[k] = (m.ts_text, m.dur_text)
            rows[k] = (m.ordinal, _position(tracks, (m.pid, m.tid)),
                       _position(groups, (m.pid, m.device)), start, dur, form,
                       table.intern_stream(m.stream), table.intern_name(m.name))
        table.extend(rows, texts)
        return table

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.match(k) for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.match(i)

    def __iter__(self) -> Iterator[Match]:
        for i in range(len(self)):
            yield self.match(i)

    def gpus(self) -> Counter:
        """Matches per (pid, device)."""
        found: Counter = Counter()
        for group, count in sorted(self._group_counts.items()):
            found[self._groups[group]] += count
        return found

    def on_gpu(self, pid, device) -> MatchView:
        """This GPU's matches sorted by exact start (ties in file order)."""
        wanted = [g for g, key in enumerate(self._groups) if key == (pid, device)]
        starts = self.starts
        if sum(self._group_counts[g] for g in wanted) == len(self):  # no selection to make
            # rows are in file order: already sorted, or a stable sort breaks ties by ordinal
            if not self.texts and bool((starts[1:] >= starts[:-1]).all()):
                return MatchView(self, FileOrder(len(starts)))
            order = np.argsort(starts, kind="stable")
        else:
            picked = np.flatnonzero(np.concatenate(
                [np.isin(groups, wanted) for groups in self.column_batches("group")]))
            order = picked[np.argsort(starts[picked], kind="stable")]
        if self.texts:
            order = self._exact_ties(order)
        return MatchView(self, narrow(order))

    def _exact_ties(self, order: np.ndarray) -> np.ndarray:
        """Re-sort runs of equal ns that hold a value kept as text (it may have digits
        below 1 ns) by their exact value; only those runs are looked at one by one."""
        starts = self.starts[order]
        tied = np.flatnonzero(starts[1:] == starts[:-1])  # order[k] ties with order[k + 1]
        if not len(tied):
            return order
        new_run = np.flatnonzero(np.diff(tied) != 1) + 1
        run_lo = tied[np.concatenate([[0], new_run])]
        run_hi = tied[np.concatenate([new_run - 1, [len(tied) - 1]])] + 2
        as_text = np.zeros(len(order) + 1, np.int64)
        np.cumsum(self.as_text(order), out=as_text[1:])
        texty = as_text[run_hi] > as_text[run_lo]
        for lo, hi in zip(run_lo[texty].tolist(), run_hi[texty].tolist()):
            order[lo:hi] = sorted(order[lo:hi].tolist(), key=lambda i: (self.match(i).ts, i))
        return order


def narrow(order: np.ndarray) -> np.ndarray:
    """Row numbers as int32 where they fit: 4 bytes a match less, millions of matches."""
    return order.astype(np.int32) if len(order) < 2**31 else order


class FileOrder:
    """The time order of a table's matches when they came in time order: position k is
    row k, so nothing is stored (4 bytes a match less). Indexed like the row-number
    array it stands for: by a position, a slice or an array of positions."""

    def __init__(self, count: int):
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, at):
        if isinstance(at, slice):
            return np.arange(*at.indices(self.count), dtype=np.int64)
        if isinstance(at, np.ndarray):
            rows = np.where(at < 0, at + self.count, at).astype(np.int64)
            if len(rows) and (rows.min() < 0 or rows.max() >= self.count):
                raise IndexError("match position out of range")
            return rows
        return range(self.count)[at]

    def tolist(self) -> list[int]:
        return list(range(self.count))


class MatchView(Sequence):
    """Some rows of a MatchTable in a chosen order (what `on_gpu` returns)."""

    def __init__(self, table: MatchTable, order: np.ndarray | FileOrder):
        self.table = table
        self.order = order  # view position -> table row

    @property
    def starts(self) -> np.ndarray:
        """Floor ns of each match's start, in this view's order (read only: in file order,
        the table's own column, not a copy of 8 bytes a match)."""
        if isinstance(self.order, FileOrder):
            return self.table.starts
        return self.table.starts[self.order]

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.table.match(int(k)) for k in self.order[i]]
        return self.table.match(int(self.order[i]))

    def __iter__(self) -> Iterator[Match]:
        for k in self.order.tolist():
            yield self.table.match(k)

    def name_counts(self) -> dict:
        """Kernel names of these matches with their counts, most frequent first (ties by
        first appearance in the file), counted on the packed name ids."""
        table = self.table
        counts = np.zeros(len(table.names), np.int64)
        if len(self.order) == len(table):  # every row (a view is a permutation of its rows)
            for names in table.column_batches("name"):
                counts += np.bincount(names, minlength=len(counts))
        else:
            inside = np.zeros(len(table), bool)
            inside[self.order] = True
            at = 0
            for names in table.column_batches("name"):
                counts += np.bincount(names[inside[at : at + len(names)]],
                                      minlength=len(counts))
                at += len(names)
        ids = np.flatnonzero(counts)
        pairs = sorted(zip(counts[ids].tolist(), ids.tolist()), key=lambda p: (-p[0], p[1]))
        return {table.names[name]: count for count, name in pairs}
