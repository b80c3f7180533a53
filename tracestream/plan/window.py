"""A window of the output: which time range (`--pass-window P0:P1`, `--time-window
START:END`), which guides, and which linked events (flows, async slices, B/E pairs) it
keeps. The membership rule itself is index.window's; this module turns the user's words
into its nanoseconds and decides the linked events' groups over the whole trace."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from tracestream.errors import SpecError, TraceError
from tracestream.index import timebase
from tracestream.index.records import BLOCK, RecordStore
from tracestream.index.window import (
    ASYNC,
    BEGIN,
    FLOW,
    FOREVER,
    LINKED_BUDGET,
    SizeBins,
    Window,
)

_PASSES = re.compile(r"([0-9]{1,9}):([0-9]{1,9})?\Z", re.ASCII)
_MS = r"-?[0-9]{1,15}(?:\.[0-9]{1,6})?"
_TIMES = re.compile(rf"({_MS})?:({_MS})?\Z", re.ASCII)


@dataclass(frozen=True)
class WindowSpec:
    """What the user asked for: passes `first:stop` of the labelled selection (stop None:
    to the trace's end), or milliseconds from the trace origin as exact decimal text
    (None: from the start, to the end)."""

    passes: tuple[int, int | None] | None = None
    times: tuple[str | None, str | None] | None = None
    # a piece of --split-mb: its exact range in µs (None: from the start, to the end),
    # its guides' passes (None: by overlap) and (its number, the count, N MB)
    range_us: tuple[str | None, str | None] | None = None
    piece: tuple[int, int, str] | None = None

    @property
    def text(self) -> str:
        """The window as the user wrote it (reports and messages)."""
        if self.piece is not None:
            number, count, mb = self.piece
            return f"--split-mb {mb} (piece {number} of {count})"
        if self.passes is not None:
            first, stop = self.passes
            return f"--pass-window {first}:{'' if stop is None else stop}"
        start, end = self.times
        return f"--time-window {start or ''}:{end or ''}"


def pass_window(text: str) -> WindowSpec:
    """`P0:P1` (P1 may be left out: to the trace's end); SpecError otherwise."""
    m = _PASSES.match(text)
    if not m:
        raise SpecError(f"--pass-window {text[:60]!r} must be FIRST:STOP, pass numbers of the "
                        "labelled selection (e.g. 2:4 holds passes 2 and 3; 2: runs to the end)")
    first, stop = int(m[1]), None if m[2] is None else int(m[2])
    if stop is not None and stop <= first:
        raise SpecError(f"--pass-window {text!r} holds no pass: STOP must be above FIRST")
    return WindowSpec(passes=(first, stop))


def time_window(text: str) -> WindowSpec:
    """`START:END` in ms from the trace origin (either may be left out); SpecError
    otherwise."""
    m = _TIMES.match(text)
    if not m or (m[1] is None and m[2] is None):
        raise SpecError(f"--time-window {text[:60]!r} must be START:END in milliseconds from "
                        "the trace origin, to the nanosecond at most (e.g. 12.5:20; either "
                        "may be left out)")
    if m[1] is not None and m[2] is not None and (
            timebase.parse_decimal(m[2]) <= timebase.parse_decimal(m[1])):
        raise SpecError(f"--time-window {text!r} is empty: END must be above START")
    return WindowSpec(times=(m[1], m[2]))


def options_of(spec: WindowSpec) -> dict:
    """How a report records a WindowSpec (`spec_from_options` reads it back)."""
    if spec.piece is not None:
        return {"piece": list(spec.piece), "range_us": list(spec.range_us),
                "passes": None if spec.passes is None else list(spec.passes)}
    if spec.passes is not None:
        return {"passes": list(spec.passes)}
    return {"times": list(spec.times)}


def spec_from_options(options) -> WindowSpec:
    """The WindowSpec a report's `options.window` records; TraceError where it is not one."""
    if isinstance(options, dict) and ("piece" in options or "range_us" in options):
        return _piece_from_options(options)
    if not isinstance(options, dict) or len(options) != 1:
        raise TraceError("the report's options.window is not one of {\"passes\": [FIRST, "
                         "STOP]}, {\"times\": [START, END]} or a piece")
    passes, times = options.get("passes"), options.get("times")
    if passes is not None:
        if (not isinstance(passes, list) or len(passes) != 2
                or not isinstance(passes[0], int) or isinstance(passes[0], bool)
                or not (passes[1] is None or (isinstance(passes[1], int)
                                              and not isinstance(passes[1], bool)))):
            raise TraceError("the report's options.window passes are not [FIRST, STOP]")
        return pass_window(f"{passes[0]}:{'' if passes[1] is None else passes[1]}")
    if (not isinstance(times, list) or len(times) != 2
            or not all(isinstance(t, str) or t is None for t in times)):
        raise TraceError("the report's options.window times are not [START, END]")
    return time_window(f"{times[0] or ''}:{times[1] or ''}")


def _piece_from_options(options: dict) -> WindowSpec:
    options = {"passes": None, **options}  # (its three keys)
    if set(options) != {"piece", "range_us", "passes"}:
        raise TraceError("the report's options.window piece is not its piece, range_us and "
                         "passes")
    piece, range_us, passes = options["piece"], options["range_us"], options["passes"]
    shapes = (isinstance(piece, list) and len(piece) == 3
              and all(isinstance(x, int) and not isinstance(x, bool) for x in piece[:2])
              and isinstance(piece[2], str) and 1 <= piece[0] <= piece[1]
              and isinstance(range_us, list) and len(range_us) == 2
              and all(t is None or (isinstance(t, str) and _US.match(t)) for t in range_us)
              and (passes is None or (isinstance(passes, list) and len(passes) == 2 and all(
                  isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in passes))))
    if not shapes:
        raise TraceError("the report's window piece is not [NUMBER, COUNT, MB] with its "
                         "range_us [START, END] and passes")
    return WindowSpec(passes=None if passes is None else tuple(passes),
                      range_us=tuple(range_us), piece=tuple(piece))


_US = re.compile(r"-?[0-9]{1,19}\.[0-9]{3}\Z", re.ASCII)


def ms_to_ns(text: str, origin: timebase.Decimal10) -> int:
    """A time in ms from the origin as absolute ns: exact decimal arithmetic, the ceiling
    (an origin with digits below 1 ns: no event before the time asked for is let in)."""
    value = timebase.parse_decimal(text)
    us = timebase.Decimal10(value.mantissa, value.exponent + 3)
    return (origin + us).ceil_ns()


def clamp(ns: int) -> int:
    return max(-FOREVER, min(FOREVER, ns))


# -- pieces and the linked events' decisions -----------------------------------------


@dataclass
class Pieces:
    """Half-open time ranges that tile the time line, cut at `cuts` (ns, ascending):
    piece 0 runs from the start of time to cuts[0], the last from the last cut on."""

    cuts: np.ndarray

    @property
    def count(self) -> int:
        return len(self.cuts) + 1

    def of(self, ns):
        """The piece each ns lies in."""
        return np.searchsorted(self.cuts, ns, "right")

    def window(self, piece: int) -> Window:
        return Window(int(self.cuts[piece - 1]) if piece > 0 else -FOREVER,
                      int(self.cuts[piece]) if piece < len(self.cuts) else FOREVER)


DECISION_DTYPE = np.dtype([("ordinal", "<i8"), ("first", "<i4"), ("last", "<i4")])
"""A kept linked event and the pieces that keep it (first … last)."""


@dataclass
class LinkedDecisions:
    """Which pieces keep each linked event (a store in ordinal order), and per piece what
    its edges cut."""

    kept: RecordStore | None
    flows_kept: np.ndarray
    flows_dropped: np.ndarray  # flows with an event in the piece and another outside it
    untimed_flows: int = 0  # flows with an event that has no usable ts: in no piece
    dropped_total: int = 0  # flows in no piece, with a timed event (each counted once)

    def close(self) -> None:
        if self.kept is not None:
            self.kept.close()


def decide_linked(store: RecordStore | None, pieces: Pieces,
                  tmpdir: str | None = None) -> LinkedDecisions:
    """Decide every group of linked events (index.window) for every piece, streaming the
    store in (key, ts) order into a store of decisions in file order: memory holds a
    block of each, never the groups."""
    decisions = LinkedDecisions(RecordStore(DECISION_DTYPE, sort_keys=("ordinal", "first"),
                                            tmpdir=tmpdir, budget=LINKED_BUDGET),
                                np.zeros(pieces.count, np.int64),
                                np.zeros(pieces.count, np.int64))
    if store is not None and len(store):
        for group in _groups(store.sorted_blocks()):
            decisions.kept.append(_decide(group, pieces, decisions))
    return decisions


def _groups(blocks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """Blocks cut so that no key spans two (a key's rows carry over to the next block),
    of about BLOCK rows where the groups allow (the decisions' arrays are a few per row)."""
    carry = None
    for block in blocks:
        if carry is not None and len(carry):
            block = np.concatenate([carry, block])
        if not len(block):
            continue
        keys = block["key"]
        cut = int(np.searchsorted(keys, keys[-1], "left"))
        at = 0
        while cut - at > BLOCK:  # whole groups, BLOCK rows or the one group that is more
            edge = int(np.searchsorted(keys, keys[at + BLOCK], "left"))
            if edge == at:
                edge = int(np.searchsorted(keys, keys[at], "right"))
            yield block[at:edge]
            at = edge
        if cut > at:
            yield block[at:cut]
        carry = block[cut:]
    if carry is not None and len(carry):
        yield carry


def _decide(rows: np.ndarray, pieces: Pieces, decisions: LinkedDecisions) -> np.ndarray:
    """DECISION_DTYPE rows of the kept events of `rows` (whole groups, by key then ts)."""
    keys = rows["key"]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    stops = np.r_[starts[1:], len(rows)]
    role = rows["role"][starts]
    ts, timed = rows["ts"], rows["timed"]
    piece = pieces.of(ts)
    out = []
    # flows: every event timed, all in one piece
    flows = np.flatnonzero(role == FLOW)
    if len(flows):
        low = np.minimum.reduceat(np.where(timed, piece, pieces.count), starts)[flows]
        high = np.maximum.reduceat(np.where(timed, piece, -1), starts)[flows]
        all_timed = np.logical_and.reduceat(timed, starts)[flows]
        keep = all_timed & (low == high)
        np.add.at(decisions.flows_kept, low[keep], 1)
        decisions.untimed_flows += int((~all_timed).sum())
        decisions.dropped_total += int((~keep & (high >= 0)).sum())
        out.append(_rows_of(rows, starts[flows][keep], stops[flows][keep], low[keep],
                            high[keep]))
        dropped = np.zeros(len(rows), bool)
        dropped[_positions(starts[flows][~keep], stops[flows][~keep])] = True
        if dropped.any():  # each dropped flow counts once in each piece it has an event in
            group = np.cumsum(np.r_[True, keys[1:] != keys[:-1]])
            pairs = np.unique(np.stack([group[dropped & timed], piece[dropped & timed]]),
                              axis=1)
            np.add.at(decisions.flows_dropped, pairs[1], 1)
    # async slices: the span of their timed events (all untimed: every piece)
    slices = np.flatnonzero(role == ASYNC)
    if len(slices):
        lo = np.minimum.reduceat(np.where(timed, ts, FOREVER), starts)[slices]
        hi = np.maximum.reduceat(np.where(timed, rows["up"], -FOREVER - 1), starts)[slices]
        some = lo <= hi
        first, last = _span_pieces(pieces, np.where(some, lo, 0), np.where(some, hi, 0))
        first[~some], last[~some] = 0, pieces.count - 1
        out.append(_rows_of(rows, starts[slices], stops[slices], first, last))
    # B/E on a track: paired as a stack in time (then file) order
    for s, e in zip(starts[role >= BEGIN].tolist(), stops[role >= BEGIN].tolist()):
        out.append(_pairs(rows[s:e], pieces))
    return np.concatenate(out) if out else np.zeros(0, DECISION_DTYPE)


def _span_pieces(pieces: Pieces, lo: np.ndarray, hi: np.ndarray):
    """(first, last) piece that each span [lo, hi] overlaps (index.window's rule: a
    span with hi > lo reaches a piece when it ends after the piece starts)."""
    first = pieces.of(lo)
    last = np.where(hi > lo, pieces.of(np.maximum(hi, lo + 1) - 1), first)
    return first.astype(np.int64), last.astype(np.int64)


def _positions(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    if not len(starts):
        return np.zeros(0, np.int64)
    lengths = stops - starts
    return (np.repeat(starts - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
            + np.arange(lengths.sum()))


def _rows_of(rows, starts, stops, first, last) -> np.ndarray:
    """Decision rows for the events of the groups [start, stop), kept in first … last."""
    at = _positions(starts, stops)
    out = np.empty(len(at), DECISION_DTYPE)
    out["ordinal"] = rows["ordinal"][at]
    out["first"] = np.repeat(first, stops - starts)
    out["last"] = np.repeat(last, stops - starts)
    return out


def _pairs(rows: np.ndarray, pieces: Pieces) -> np.ndarray:
    """Decision rows of one track's B and E events: a pair in the pieces its span
    overlaps, a B left open in every piece from its own on (it runs to the end of the
    trace), an E left alone in its ts's piece. Paired as a stack in time, then file,
    order; the pieces are found for all of them at once."""
    order = np.lexsort((rows["ordinal"], rows["ts"]))
    ordinals, roles = rows["ordinal"][order].tolist(), rows["role"][order].tolist()
    stack: list[int] = []  # positions (in `order`) of the open Bs
    begins, ends, alone = [], [], []
    for position, role in enumerate(roles):
        if role == BEGIN:
            stack.append(position)
        elif stack:
            begins.append(stack.pop())
            ends.append(position)
        else:
            alone.append(position)
    ts, up = rows["ts"][order], rows["up"][order]
    first, last = _span_pieces(pieces, ts[begins], up[ends])
    lone = pieces.of(ts[alone]).astype(np.int64)
    opened = pieces.of(ts[stack]).astype(np.int64)
    ordinal = np.array(ordinals, np.int64)
    out = np.empty(2 * len(begins) + len(alone) + len(stack), DECISION_DTYPE)
    out["ordinal"] = np.concatenate([ordinal[begins], ordinal[ends], ordinal[alone],
                                     ordinal[stack]])
    out["first"] = np.concatenate([first, first, lone, opened])
    out["last"] = np.concatenate([last, last, lone, np.full(len(stack), pieces.count - 1)])
    return out


# -- the windows of a run ---------------------------------------------------------------


MAX_PIECES = 256
"""--split-mb writes at most this many pieces (each an open file while the pass runs)."""


@dataclass
class OutputWindow:
    """One output's window: its range, its guides (first, stop: guide numbers of the
    selection) and its report section (the rewrite adds the counts of what it wrote)."""

    spec: WindowSpec
    window: Window
    guides: tuple[int, int] | None
    report: dict


@dataclass
class CutPlan:
    """The windows a run writes, cut from one time line (`pieces`), with the linked
    events' decisions for every piece; `outputs[k]` is written from piece `piece_of[k]`."""

    pieces: Pieces
    linked: LinkedDecisions
    piece_of: list[int]
    outputs: list[OutputWindow]
    plans: list = field(default_factory=list)  # each output's Plan (engine.build_plan)


@dataclass
class WindowPlan:
    """A Plan's window: its part of the run's cut."""

    spec: WindowSpec
    cut: CutPlan
    number: int  # its position in cut.outputs
    report: dict

    @property
    def piece(self) -> int:
        return self.cut.piece_of[self.number]

    @property
    def window(self) -> Window:
        return self.cut.outputs[self.number].window


def plan_windows(spec: WindowSpec | SplitSpec, index, guides, origin_ns: int,
                 appended: int = 0, guide_bytes: int = SizeBins.GUIDE_BYTES
                 ) -> list[OutputWindow]:
    """The window `spec` asks for (or the pieces of a split), on this trace and these
    guides (a GuideTable or None); refuses what the trace cannot fill."""
    first_ns, last_ns = _extent(index)
    text = spec.text
    if first_ns is None:
        raise TraceError(f"{text}: the trace has no event with a time to cut by")
    if isinstance(spec, SplitSpec):
        return _split(spec, index, guides, origin_ns, first_ns, last_ns, appended,
                      guide_bytes)
    report: dict = {"option": text}
    if spec.piece is not None:  # (as the split wrote it: verify reads a piece alone)
        report.update(piece=spec.piece[0], pieces=spec.piece[1])
    guide_range = None
    if spec.passes is not None and spec.range_us is None:
        window, guide_range = _pass_range(spec, guides, report)
    else:
        if spec.range_us is not None:
            start, end = (None if t is None else timebase.parse_decimal(t).floor_ns()
                          for t in spec.range_us)
        else:
            start, end = (None if t is None else ms_to_ns(t, index.origin) for t in spec.times)
        window = Window(-FOREVER if start is None else clamp(start),
                        FOREVER if end is None else clamp(end))
        if spec.piece is None and (window.end_ns <= first_ns or window.start_ns > last_ns):
            raise TraceError(
                f"{text} holds no event: the trace's events lie between "
                f"{_ms(first_ns, origin_ns)} and {_ms(last_ns, origin_ns)} ms from its origin")
        if spec.passes is not None:
            guide_range = _checked_passes(spec, guides)
            report["passes"] = list(spec.passes)
        elif guides is not None:
            guide_range = _guides_overlapping(guides, window)
    _describe(report, window, guides, guide_range, first_ns, last_ns, origin_ns)
    return [OutputWindow(spec, window, guide_range, report)]


def _describe(report: dict, window: Window, guides, guide_range, first_ns: int, last_ns: int,
              origin_ns: int) -> None:
    if guides is not None:
        first, stop = guide_range
        report["guides"] = stop - first
        if stop > first:
            report["first_guide"] = _guide_name(guides, first)
            report["last_guide"] = _guide_name(guides, stop - 1)
    report.update(
        start_us=timebase.us_text(window.start_ns) if window.start_ns > -FOREVER else None,
        end_us=timebase.us_text(window.end_ns) if window.end_ns < FOREVER else None,
        start_ms=_ms(max(window.start_ns, first_ns), origin_ns),
        end_ms=_ms(min(window.end_ns, last_ns), origin_ns))


def cut_plan(outputs: list[OutputWindow], index, tmpdir: str | None = None) -> CutPlan:
    """The time line cut at every window's edges, and the linked decisions for it."""
    edges = sorted({e for o in outputs for e in (o.window.start_ns, o.window.end_ns)
                    if -FOREVER < e < FOREVER})
    pieces = Pieces(np.array(edges, np.int64))
    piece_of = [int(pieces.of(o.window.start_ns)) if o.window.start_ns > -FOREVER else 0
                for o in outputs]
    linked = decide_linked(index.linked, pieces, tmpdir)
    for output, piece in zip(outputs, piece_of):
        output.report.update(flows_kept=int(linked.flows_kept[piece]),
                             flows_dropped=int(linked.flows_dropped[piece]),
                             flows_without_time=linked.untimed_flows)
    return CutPlan(pieces, linked, piece_of, outputs)


def _extent(index) -> tuple[int | None, int | None]:
    """The first start and last end of the trace's placed events (ns), from its chunks."""
    chunks = [c for c in index.chunks if c.first_ns <= c.last_ns]
    if not chunks:
        return None, None
    return min(c.first_ns for c in chunks), max(c.last_ns for c in chunks)


def _checked_passes(spec: WindowSpec, guides) -> tuple[int, int]:
    """The guide numbers of passes spec.passes (refused where the selection has none)."""
    if guides is None:
        raise SpecError(f"{spec.text} needs layer guides (--anchor-regex …); without them "
                        "cut by --time-window")
    passes = guides.spec.passes
    first, stop = spec.passes
    if first >= passes or (stop is not None and stop > passes):
        raise TraceError(f"{spec.text}: the labelled selection has {passes} pass(es), "
                         f"0 … {passes - 1}" + ("" if stop is None else
                                                 f" (STOP may be {passes})"))
    layers = guides.spec.num_layers
    return first * layers, (passes if stop is None else stop) * layers


def _pass_range(spec: WindowSpec, guides, report: dict) -> tuple[Window, tuple[int, int]]:
    first_guide, stop_guide = _checked_passes(spec, guides)
    layers = guides.spec.num_layers
    start_ns, _ = guides.anchor_start(first_guide)
    end_ns = guides.pass_start(stop_guide // layers) if spec.passes[1] is not None else None
    report["passes"] = [first_guide // layers, stop_guide // layers]
    return Window(start_ns, FOREVER if end_ns is None else end_ns), (first_guide, stop_guide)


def _guides_overlapping(guides, window: Window) -> tuple[int, int]:
    """The run of guides that overlap `window` (by the rule of X events)."""
    hits = []
    for block in guides.blocks():
        inside = window.spans(block.start_floor_ns, block.end_floor_ns)
        if inside.any():
            numbers = (block.pass_index * guides.spec.num_layers + block.layer_id
                       - guides.spec.first_layer)[inside]
            hits += [int(numbers[0]), int(numbers[-1])]
    return (min(hits), max(hits) + 1) if hits else (0, 0)


def _guide_name(guides, number: int) -> str:
    spec = guides.spec
    p, layer = divmod(number, spec.num_layers)
    return f"pass {p} L{layer + spec.first_layer}"


def _ms(ns: int, origin_ns: int) -> str:
    """ns as exact ms from the origin, as text ("1.5", "-0.000125")."""
    ns -= origin_ns
    sign = "-" if ns < 0 else ""
    whole, frac = divmod(abs(ns), 1_000_000)
    text = f"{sign}{whole}.{frac:06d}".rstrip("0")
    return text[:-1] if text.endswith(".") else text


# -- pieces of at most N MB (--split-mb) --------------------------------------------------


@dataclass(frozen=True)
class SplitSpec:
    """--split-mb N: pieces of at most N MB (10^6 bytes) of JSON each."""

    mb: str  # as given (a positive decimal)

    @property
    def text(self) -> str:
        return f"--split-mb {self.mb}"

    @property
    def limit(self) -> int:
        value = timebase.parse_decimal(self.mb)
        return timebase.Decimal10(value.mantissa, value.exponent + 6).round_us()


_SIZE = re.compile(r"(?:0|[1-9][0-9]{0,8})(?:\.[0-9]{1,6})?\Z", re.ASCII)


def split_mb(text: str) -> SplitSpec:
    """--split-mb N (a positive number of MB); SpecError otherwise."""
    if not _SIZE.match(text) or timebase.parse_decimal(text).mantissa == 0:
        raise SpecError(f"--split-mb {text[:40]!r} must be a positive number of MB (10^6 "
                        "bytes), e.g. 500")
    return SplitSpec(text)


def _split(spec: SplitSpec, index, guides, origin_ns: int, first_ns: int,
           last_ns: int, appended: int = 0,
           guide_bytes: int = SizeBins.GUIDE_BYTES) -> list[OutputWindow]:
    """Pieces of at most spec.limit bytes by index.sizes' conservative estimate, cut at
    pass starts when there are guides (one pass per piece where a pass is larger), else at
    the size bins' edges."""
    sizes = index.sizes
    if guides is not None:
        layers = guides.spec.num_layers
        starts = _pass_starts(guides)
        candidates = starts
    else:
        layers, starts = 0, np.zeros(0, np.int64)
        candidates = sizes.bin_edges()
    candidates = candidates[(candidates > first_ns) & (candidates <= last_ns)]
    forever = np.array([FOREVER], np.int64)
    fixed = _document_bytes(index, appended)
    cuts: list[int] = []
    start, at = -FOREVER, 0  # the current piece's start; the first candidate after it
    while at < len(candidates):
        if sizes.estimate(start, forever, starts, layers, fixed, guide_bytes)[0] <= spec.limit:
            break  # the rest of the trace fits
        fitting = _first_over(spec.limit, sizes, start, candidates, at, starts, layers, fixed,
                              guide_bytes) - at
        # the piece ends at the last candidate that fits; where none does, at the first
        # (a pass larger than the limit is a piece of its own)
        step = max(fitting - 1, 0)
        start = int(candidates[at + step])
        cuts.append(start)
        at += step + 1
        if len(cuts) >= MAX_PIECES:
            raise SpecError(f"{spec.text} would cut more than {MAX_PIECES} pieces: give a "
                            "larger size")
    edges = [-FOREVER, *cuts, FOREVER]
    outputs = []
    count = len(edges) - 1
    for k in range(count):
        window = Window(edges[k], edges[k + 1])
        range_us = (None if k == 0 else timebase.us_text(edges[k]),
                    None if k == count - 1 else timebase.us_text(edges[k + 1]))
        passes = None
        guide_range = None
        if guides is not None:
            inside = np.flatnonzero(window.points(starts))
            first = int(inside[0]) if len(inside) else int(np.searchsorted(starts,
                                                                            edges[k]))
            stop = int(inside[-1]) + 1 if len(inside) else first
            passes = (first, stop)
            guide_range = (first * layers, stop * layers)
        piece = WindowSpec(passes=passes, range_us=range_us, piece=(k + 1, count, spec.mb))
        report = {"option": piece.text, "piece": k + 1, "pieces": count}
        if passes is not None:
            report["passes"] = list(passes)
        _describe(report, window, guides, guide_range, first_ns, last_ns, origin_ns)
        outputs.append(OutputWindow(piece, window, guide_range, report))
    return outputs


_ESTIMATE_BLOCK = 4096
"""Candidate cuts estimated at a time: a piece's end lies a few thousand passes on, and
the estimate of all 10^5-10^6 candidates after it (several arrays of 8 bytes each) came
to ~20 MB per piece on a 10 GB trace, held by the heap until the plan was through."""


def _first_over(limit: int, sizes, start: int, candidates: np.ndarray, at: int, *estimating
                ) -> int:
    """The first candidate from `at` whose piece from `start` may go over `limit` (or
    len(candidates)): the estimates only grow with the end, so a block at a time."""
    while at < len(candidates):
        block = candidates[at:at + _ESTIMATE_BLOCK]
        over = sizes.estimate(start, block, *estimating) > limit
        if over.any():
            return at + int(np.argmax(over))
        at += len(block)
    return at


def _document_bytes(index, appended: int) -> int:
    """The bytes of a piece besides its events: the document around them (the source's,
    its `tracestream` member) and the metadata of new tracks."""
    layout = index.layout
    around = layout.events_open + max(index.stats.data_bytes - layout.last_event_end, 0)
    return around + appended + 1024


def _pass_starts(guides) -> np.ndarray:
    """The exact start (floor ns) of each labelled pass's L0 guide, in pass order."""
    starts = []
    first_layer = guides.spec.first_layer
    saved = guides.first, guides.stop
    guides.first, guides.stop = 0, None
    try:
        for block in guides.blocks():
            starts.append(block.start_floor_ns[block.layer_id == first_layer])
    finally:
        guides.first, guides.stop = saved
    return np.concatenate(starts) if starts else np.zeros(0, np.int64)
