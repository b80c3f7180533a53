"""Layer guides: which anchor matches label which layer, and where each guide ends.

Pure functions over the kernel matches the index pass found. The tool never
guesses: the user gives the offset of the verified first layer, the layer count,
the stride and the extras per pass; anything that does not fit is refused.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracestream.errors import TraceError, require_utf8
from tracestream.matches import Match, MatchTable, MatchView
from tracestream.timebase import Decimal10

GUIDE_NOTICE = (
    "Navigation aid: the interval from this layer's verified anchor kernel to the next "
    "layer's anchor (or to the verified terminal kernel's end). Not a layer latency and "
    "not exclusive ownership of the kernels inside it."
)

NEXT_LAYER_ANCHOR = "next_layer_anchor"
TERMINAL_KERNEL_END = "terminal_kernel_end"
ANCHOR_POINT_ONLY = "anchor_point_only"


@dataclass(frozen=True)
class LayerSpec:
    """What the user verified: the anchor, where L0 starts, and the pass structure."""

    anchor_regex: str
    num_layers: int
    anchor_offset: int
    phase: str
    evidence: str
    passes: int = 1
    anchor_stride: int = 1
    extra_anchors_per_pass: int = 0
    first_layer: int = 0
    end_anchor_regex: str | None = None
    pid: Any = None
    device: Any = None

    def validate(self) -> None:
        if not self.phase or not self.phase.strip():
            raise TraceError("--phase must not be empty (e.g. 'target-verify')")
        if not self.evidence or not self.evidence.strip():
            raise TraceError(
                "--evidence must not be empty: say how you verified that the anchor runs "
                "once per layer and where L0 is"
            )
        for name, value, least in (
            ("--anchor-offset", self.anchor_offset, 0),
            ("--num-layers", self.num_layers, 1),
            ("--passes", self.passes, 1),
            ("--anchor-stride", self.anchor_stride, 1),
            ("--extra-anchors-per-pass", self.extra_anchors_per_pass, 0),
            ("--first-layer", self.first_layer, 0),
        ):
            if value < least:
                raise TraceError(f"{name} must be >= {least}, got {value}")
            if value > LARGEST_COUNT:
                raise TraceError(f"{name} must be <= {LARGEST_COUNT}, got {value}")
        for name, text in (("--anchor-regex", self.anchor_regex), ("--phase", self.phase),
                           ("--evidence", self.evidence),
                           ("--end-anchor-regex", self.end_anchor_regex),
                           ("--pid", self.pid), ("--device", self.device)):
            require_utf8(text, name)


LARGEST_COUNT = 2**31 - 1
"""Largest layer number, count, offset or stride: far above any real model, and small
enough that every sum of them fits the packed int64 arrays and JSON's exact integers."""


@dataclass
class Guide:
    pass_index: int
    layer_id: int
    anchor_index: int
    anchor: Match
    start: Decimal10
    end: Decimal10
    end_text: str
    boundary_kind: str

    @property
    def guide_start_us(self) -> int:
        return self.start.round_us()

    @property
    def guide_end_us(self) -> int:
        return self.end.round_us()


def anchor_index(spec: LayerSpec, pass_index: int, layer: int) -> int:
    """Match index of layer `layer` in pass `pass_index`: K + p*(N*S + E) + l*S."""
    per_pass = spec.num_layers * spec.anchor_stride + spec.extra_anchors_per_pass
    return spec.anchor_offset + pass_index * per_pass + layer * spec.anchor_stride


def required_matches(spec: LayerSpec) -> int:
    """Matches needed from the offset: every layer of every pass, extras between passes."""
    per_pass = spec.num_layers * spec.anchor_stride + spec.extra_anchors_per_pass
    return (spec.passes - 1) * per_pass + spec.num_layers * spec.anchor_stride


def select_gpu(matches, pid: Any, device: Any, what: str) -> tuple[Any, Any]:
    """The one (pid, device) the matches are on, or a refusal that lists the candidates."""
    gpus = matches.gpus() if isinstance(matches, MatchTable) else Counter(
        (m.pid, m.device) for m in matches)
    if pid is not None:
        gpus = Counter({key: n for key, n in gpus.items() if _same(key[0], pid)})
        if not gpus:
            raise TraceError(f"no kernel matches {what} in pid {pid}")
    pids: Counter = Counter()
    for (p, _), n in gpus.items():
        pids[p] += n
    if len(pids) > 1:
        listing = ", ".join(f"pid {p}: {n}" for p, n in sorted(pids.items(), key=_order))
        raise TraceError(
            f"{what} matches kernels in several processes ({listing}); pick one with --pid"
        )
    chosen_pid = next(iter(pids))
    if device is not None:
        gpus = Counter({key: n for key, n in gpus.items() if _same(key[1], device)})
        if not gpus:
            raise TraceError(f"no kernel matches {what} on device {device} of pid {chosen_pid}")
    devices: Counter = Counter()
    for (_, d), n in gpus.items():
        devices[d] += n
    if len(devices) > 1:
        listing = ", ".join(f"device {d}: {n}" for d, n in sorted(devices.items(), key=_order))
        raise TraceError(
            f"{what} matches kernels on several devices of pid {chosen_pid} ({listing}); "
            "pick one with --device"
        )
    return chosen_pid, next(iter(devices))


def _same(value: Any, wanted: Any) -> bool:
    return value == wanted or str(value) == str(wanted)


def _order(item):
    key = item[0]
    return (0, key, "") if isinstance(key, int) else (1, 0, str(key))


def on_gpu(matches, pid: Any, device: Any):
    """Matches on one GPU, sorted by exact start time (ties in file order)."""
    if isinstance(matches, MatchTable):
        return matches.on_gpu(pid, device)
    chosen = [m for m in matches if m.pid == pid and m.device == device]
    chosen.sort(key=lambda m: (m.ts.floor_ns(), m.ts, m.ordinal))
    return chosen


def build_guides(
    anchors: list[Match], terminals: list[Match] | None, spec: LayerSpec
) -> list[Guide]:
    """One guide per selected layer; refuses whatever does not fit the spec."""
    needed = required_matches(spec)
    available = len(anchors) - spec.anchor_offset
    if available < needed:
        raise TraceError(
            f"need {needed} anchors from offset {spec.anchor_offset}, found {max(available, 0)} "
            f"({spec.passes} pass(es) x {spec.num_layers} layers x stride {spec.anchor_stride}"
            f" + {spec.extra_anchors_per_pass} extra between passes; {len(anchors)} matches "
            "in all)"
        )
    guides = []
    previous: Match | None = None
    for p in range(spec.passes):
        for layer in range(spec.num_layers):
            index = anchor_index(spec, p, layer)
            anchor = anchors[index]
            if previous is not None and not previous.ts < anchor.ts:
                raise TraceError(
                    f"anchors are not strictly increasing in time: match {index} (pass {p}, "
                    f"layer L{spec.first_layer + layer}) at ts {anchor.ts_text} does not come "
                    f"after the previous selected anchor at ts {previous.ts_text}"
                )
            previous = anchor
            last = layer == spec.num_layers - 1
            upper_index = anchor_index(spec, p + 1, 0) if last else index + spec.anchor_stride
            upper = anchors[upper_index] if upper_index < len(anchors) else None
            if upper is not None and not anchor.ts < upper.ts:
                raise TraceError(
                    f"anchor match {upper_index} at ts {upper.ts_text} does not come after "
                    f"match {index} at ts {anchor.ts_text} (pass {p}, layer "
                    f"L{spec.first_layer + layer}): duplicate anchor times"
                )
            terminal = None
            if terminals is not None:
                terminal = _terminal_in_window(
                    terminals, anchor, upper, p, spec.first_layer + layer
                )
            if not last:
                end, end_text, kind = upper.ts, upper.ts_text, NEXT_LAYER_ANCHOR
            elif terminal is not None:
                end = terminal.end
                end_text, kind = end.to_text(), TERMINAL_KERNEL_END
            else:
                end, end_text, kind = anchor.ts, anchor.ts_text, ANCHOR_POINT_ONLY
            guides.append(
                Guide(p, spec.first_layer + layer, index, anchor, anchor.ts, end, end_text, kind)
            )
    return guides


def _terminal_in_window(terminals, anchor: Match, upper: Match | None, p: int, layer_id: int):
    inside = [t for t in _candidates(terminals, anchor, upper)
              if anchor.ts <= t.ts and (upper is None or t.ts < upper.ts)]
    where = f"pass {p}, layer L{layer_id}"
    window = f"[{anchor.ts_text}, {upper.ts_text if upper else 'end of trace'})"
    if not inside:
        raise TraceError(
            f"no terminal kernel (--end-anchor-regex) in the window of {where}: {window} µs"
        )
    if len(inside) > 1:
        raise TraceError(
            f"{len(inside)} terminal kernels in the window of {where}: {window} µs; "
            "the terminal must run exactly once per layer"
        )
    terminal = inside[0]
    if upper is not None and upper.ts < terminal.end:
        raise TraceError(
            f"the terminal kernel of {where} (ts {terminal.ts_text}, dur {terminal.dur_text}) "
            f"ends after the next anchor at ts {upper.ts_text}"
        )
    return terminal


def _candidates(terminals, anchor: Match, upper: Match | None):
    """Terminals that may start in [anchor, upper): a bisect on ns (1 ns of slack)."""
    if not isinstance(terminals, MatchView):
        return terminals
    starts = terminals.starts
    low = int(np.searchsorted(starts, anchor.ts.floor_ns() - 1, "left"))
    high = len(starts) if upper is None else int(
        np.searchsorted(starts, upper.ts.floor_ns() + 1, "right"))
    return terminals[low:high]
