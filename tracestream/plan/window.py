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
from tracestream.index.records import RecordStore
from tracestream.index.window import ASYNC, BEGIN, FLOW, FOREVER, Window

_PASSES = re.compile(r"([0-9]{1,9}):([0-9]{1,9})?\Z", re.ASCII)
_MS = r"-?[0-9]{1,15}(?:\.[0-9]{1,9})?"
_TIMES = re.compile(rf"({_MS})?:({_MS})?\Z", re.ASCII)


@dataclass(frozen=True)
class WindowSpec:
    """What the user asked for: passes `first:stop` of the labelled selection (stop None:
    to the trace's end), or milliseconds from the trace origin as exact decimal text
    (None: from the start, to the end)."""

    passes: tuple[int, int | None] | None = None
    times: tuple[str | None, str | None] | None = None

    @property
    def text(self) -> str:
        """The window as the user wrote it (reports and messages)."""
        if self.passes is not None:
            first, stop = self.passes
            return f"--pass-window {first}:{'' if stop is None else stop}"
        start, end = self.times
        return f"--time-window {start or ''}:{end or ''}"


def pass_window(text: str) -> WindowSpec:
    """`P0:P1` (P1 may be left out: to the trace's end); SpecError otherwise."""
    m = _PASSES.match(text)
    if not m:
        raise SpecError(f"--pass-window {text!r} must be FIRST:STOP, pass numbers of the "
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
        raise SpecError(f"--time-window {text!r} must be START:END in milliseconds from the "
                        "trace origin (e.g. 12.5:20; either may be left out)")
    if m[1] is not None and m[2] is not None and (
            timebase.parse_decimal(m[2]) <= timebase.parse_decimal(m[1])):
        raise SpecError(f"--time-window {text!r} is empty: END must be above START")
    return WindowSpec(times=(m[1], m[2]))


def spec_from_options(options: dict | None) -> WindowSpec | None:
    """The WindowSpec a report's options record (None: no window)."""
    if not options:
        return None
    if not isinstance(options, dict):
        raise TraceError("the report's window options are not an object")
    passes, times = options.get("passes"), options.get("times")
    if passes is not None:
        if (not isinstance(passes, list) or len(passes) != 2
                or not all(isinstance(p, int) or p is None for p in passes) or passes[0] is None):
            raise TraceError("the report's window passes are not [FIRST, STOP]")
        text = f"{passes[0]}:{'' if passes[1] is None else passes[1]}"
        return pass_window(text)
    if (not isinstance(times, list) or len(times) != 2
            or not all(isinstance(t, str) or t is None for t in times)):
        raise TraceError("the report's window times are not [START, END]")
    return time_window(f"{times[0] or ''}:{times[1] or ''}")


def ms_to_ns(text: str, origin: timebase.Decimal10) -> int:
    """A time in ms from the origin as absolute ns (floor): exact decimal arithmetic."""
    value = timebase.parse_decimal(text)
    us = timebase.Decimal10(value.mantissa, value.exponent + 3)
    return (origin + us).floor_ns()


def clamp(ns: int) -> int:
    return max(-FOREVER, min(FOREVER, ns))


# -- the linked events' decisions ---------------------------------------------------


@dataclass
class LinkedDecisions:
    """The linked events a window keeps (their ordinals, ascending) and what it drops."""

    kept: np.ndarray
    flows_kept: int = 0
    flows_dropped: int = 0  # flows with an event in the window and another outside it
    untimed_flows: int = 0  # flows with an event that has no usable ts: in no window
    pairs_kept: int = 0  # B/E pairs and async slices kept
    notes: dict = field(default_factory=dict)


def decide_linked(store: RecordStore | None, window: Window) -> LinkedDecisions:
    """Decide every group of linked events (index.window) for `window`, streaming the
    store in (key, ts) order: memory holds the kept ordinals and a block."""
    kept: list[np.ndarray] = []
    decisions = LinkedDecisions(np.zeros(0, np.int64))
    if store is None or not len(store):
        return decisions
    for group in _groups(store.sorted_blocks()):
        kept.append(_decide(group, window, decisions))
    decisions.kept = np.sort(np.concatenate(kept)) if kept else decisions.kept
    return decisions


def _groups(blocks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """Blocks cut so that no key spans two (a key's rows carry over to the next block)."""
    carry = None
    for block in blocks:
        if carry is not None and len(carry):
            block = np.concatenate([carry, block])
        if not len(block):
            continue
        last = block["key"][-1]
        cut = int(np.searchsorted(block["key"], last, "left"))
        if cut:
            yield block[:cut]
        carry = block[cut:]
    if carry is not None and len(carry):
        yield carry


def _decide(rows: np.ndarray, window: Window, decisions: LinkedDecisions) -> np.ndarray:
    """The kept ordinals of `rows` (whole groups, sorted by key then ts)."""
    keys = rows["key"]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    stops = np.r_[starts[1:], len(rows)]
    role = rows["role"][starts]
    ts, timed = rows["ts"], rows["timed"]
    inside = timed & window.points(ts)
    out = []
    # flows: whole and inside, every event timed
    flows = np.flatnonzero(role == FLOW)
    if len(flows):
        fs, fe = starts[flows], stops[flows]
        any_in = np.logical_or.reduceat(inside, starts)[flows]
        all_in = np.logical_and.reduceat(inside, starts)[flows]
        all_timed = np.logical_and.reduceat(timed, starts)[flows]
        keep = all_in & all_timed
        decisions.flows_kept += int(keep.sum())
        decisions.flows_dropped += int((any_in & ~keep).sum())
        decisions.untimed_flows += int((~all_timed).sum())
        out.append(_rows_of(rows, fs[keep], fe[keep]))
    # async slices: the span of their timed events overlaps the window (all untimed: kept)
    slices = np.flatnonzero(role == ASYNC)
    if len(slices):
        low = np.where(timed, ts, FOREVER)
        high = np.where(timed, ts, -FOREVER - 1)
        lo = np.minimum.reduceat(low, starts)[slices]
        hi = np.maximum.reduceat(high, starts)[slices]
        some = lo <= hi
        keep = ~some | window.spans(np.where(some, lo, 0), np.where(some, hi, 0))
        decisions.pairs_kept += int(keep.sum())
        out.append(_rows_of(rows, starts[slices][keep], stops[slices][keep]))
    # B/E on a track: paired as a stack in time (then file) order
    for s, e in zip(starts[role >= BEGIN].tolist(), stops[role >= BEGIN].tolist()):
        out.append(_pairs(rows[s:e], window, decisions))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _rows_of(rows: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The ordinals of the rows in the given [start, stop) ranges."""
    if not len(starts):
        return np.zeros(0, np.int64)
    lengths = stops - starts
    at = np.repeat(starts - np.r_[0, np.cumsum(lengths)[:-1]], lengths) + np.arange(lengths.sum())
    return rows["ordinal"][at]


def _pairs(rows: np.ndarray, window: Window, decisions: LinkedDecisions) -> np.ndarray:
    """The kept ordinals of one track's B and E events: a pair when its span overlaps the
    window, a B left open when it starts before the window's end (it runs to the end of
    the trace), an E left alone when its ts is inside."""
    order = np.lexsort((rows["ordinal"], rows["ts"]))
    stack: list[tuple[int, int]] = []
    kept = []
    for ordinal, ts, role in zip(rows["ordinal"][order].tolist(), rows["ts"][order].tolist(),
                                 rows["role"][order].tolist()):
        if role == BEGIN:
            stack.append((ordinal, ts))
            continue
        if stack:
            begin, start = stack.pop()
            if window.spans(np.array([start]), np.array([ts]))[0]:
                kept += (begin, ordinal)
                decisions.pairs_kept += 1
        elif window.points(np.array([ts]))[0]:
            kept.append(ordinal)
    kept += [begin for begin, start in stack if start < window.end_ns]
    return np.array(kept, np.int64)


# -- the window of a run ----------------------------------------------------------------


@dataclass
class WindowPlan:
    """A run's window: its range, the linked events it keeps and its report section (the
    counts of what was written are filled in by the rewrite)."""

    spec: WindowSpec
    window: Window
    linked: LinkedDecisions
    report: dict


def plan_window(spec: WindowSpec, index, guides, origin_ns: int) -> WindowPlan:
    """The window `spec` asks for, on this trace and these guides (GuideTable or None):
    refuses a window the trace cannot fill; narrows `guides` to the window's."""
    first_ns, last_ns = _extent(index)
    if first_ns is None:
        raise TraceError(f"{spec.text}: the trace has no event with a time to cut by")
    report: dict = {"option": spec.text}
    if spec.passes is not None:
        window = _pass_range(spec, guides, report)
    else:
        start, end = spec.times
        window = Window(clamp(ms_to_ns(start, index.origin)) if start is not None else -FOREVER,
                        clamp(ms_to_ns(end, index.origin)) if end is not None else FOREVER)
        if window.end_ns <= first_ns or window.start_ns > last_ns:
            raise TraceError(
                f"{spec.text} holds no event: the trace's events lie between "
                f"{_ms(first_ns, origin_ns)} and {_ms(last_ns, origin_ns)} ms from its origin")
        if guides is not None:
            _guides_overlapping(guides, window)
    if guides is not None:
        report["guides"] = len(guides)
        if len(guides):
            report["first_guide"] = _guide_name(guides, guides.first)
            report["last_guide"] = _guide_name(guides, guides.first + len(guides) - 1)
    report.update(
        start_us=timebase.us_text(window.start_ns) if window.start_ns > -FOREVER else None,
        end_us=timebase.us_text(window.end_ns) if window.end_ns < FOREVER else None,
        start_ms=_ms(max(window.start_ns, first_ns), origin_ns),
        end_ms=_ms(min(window.end_ns, last_ns), origin_ns))
    linked = decide_linked(index.linked, window)
    report.update(flows_kept=linked.flows_kept, flows_dropped=linked.flows_dropped,
                  flows_without_time=linked.untimed_flows)
    return WindowPlan(spec, window, linked, report)


def _extent(index) -> tuple[int | None, int | None]:
    """The first start and last end of the trace's placed events (ns), from its chunks."""
    chunks = [c for c in index.chunks if c.first_ns <= c.last_ns]
    if not chunks:
        return None, None
    return min(c.first_ns for c in chunks), max(c.last_ns for c in chunks)


def _pass_range(spec: WindowSpec, guides, report: dict) -> Window:
    if guides is None:
        raise SpecError(f"{spec.text} needs layer guides (--anchor-regex …); without them "
                        "cut by --time-window")
    passes = guides.spec.passes
    first, stop = spec.passes
    if first >= passes or (stop is not None and stop > passes):
        raise TraceError(f"{spec.text}: the labelled selection has {passes} pass(es), "
                         f"0 … {passes - 1}" + ("" if spec.passes[1] is None else
                                                 f" (STOP may be {passes})"))
    layers = guides.spec.num_layers
    start_ns, _ = guides.anchor_start(first * layers)
    end_ns = FOREVER if stop is None or stop == passes else guides.anchor_start(stop * layers)[0]
    guides.first, guides.stop = first * layers, (passes if stop is None else stop) * layers
    report["passes"] = [first, passes if stop is None else stop]
    return Window(start_ns, end_ns)


def _guides_overlapping(guides, window: Window) -> None:
    """Narrow `guides` to the run of those that overlap `window` (by the rule of X events)."""
    hits = []
    for block in guides.blocks():
        inside = window.spans(block.start_floor_ns, block.end_floor_ns)
        numbers = (block.pass_index * guides.spec.num_layers + block.layer_id
                   - guides.spec.first_layer)
        if inside.any():
            hits += [int(numbers[inside][0]), int(numbers[inside][-1])]
    if hits:
        guides.first, guides.stop = min(hits), max(hits) + 1
    else:
        guides.first, guides.stop = 0, 0


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
