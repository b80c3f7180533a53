"""What the user asks for: `LayerSpec` (the verified anchor, where L0 starts, the pass
structure) and `CompactSpec` (lanes per device), validated before any input is read, and
the arithmetic of a spec's counts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tracestream.errors import Option, SpecError, compile_pattern, require_utf8
from tracestream.index.lanegroups import (
    AUTO,
    BUILT_IN,
    GROUP_NAME,
    MAX_CUSTOM_GROUPS,
    LaneGroups,
)
from tracestream.plan.cadence import GAP_FACTOR, gap_factor_problem

GUIDE_NOTICE = (
    "Navigation aid: the interval from this layer's verified anchor kernel to the next "
    "layer's anchor (or to the verified terminal kernel's end). Not a layer latency and "
    "not exclusive ownership of the kernels inside it."
)

NEXT_LAYER_ANCHOR = "next_layer_anchor"
TERMINAL_KERNEL_END = "terminal_kernel_end"
ANCHOR_POINT_ONLY = "anchor_point_only"

ALL_PASSES = "all"
"""`passes` that labels every complete pass from the offset."""

NAMES_IN_REFUSAL = 6  # kernel names listed when a pattern matches several
NAMES_IN_REPORT = 10


@dataclass(frozen=True)
class LayerSpec:
    """What the user verified: the anchor, where L0 starts, and the pass structure."""

    anchor_regex: str
    num_layers: int
    anchor_offset: int
    phase: str
    evidence: str
    passes: int | str = 1  # a count, or "all": every complete pass from the offset
    anchor_stride: int = 1
    extra_anchors_per_pass: int = 0
    first_layer: int = 0
    end_anchor_regex: str | None = None
    pid: Any = None
    device: Any = None
    gap_factor: float = GAP_FACTOR  # the cadence rule of `anchors`: a break is > F x median
    allow_several_anchor_names: bool = False  # the pattern may match several kernel names
    allow_gaps: bool = False  # a selected pass may cross a cadence break

    def validate(self) -> None:
        """Refuses values no trace can satisfy; messages name the spec fields."""
        if not self.phase or not self.phase.strip():
            raise SpecError(Option("phase"), " must not be empty (e.g. 'target-verify')")
        if not self.evidence or not self.evidence.strip():
            raise SpecError(
                Option("evidence"), " must not be empty: say how you verified that the anchor "
                "runs once per layer and where L0 is"
            )
        if self.passes != ALL_PASSES and (isinstance(self.passes, bool)
                                          or not isinstance(self.passes, int)):
            raise SpecError(Option("passes"), f" must be a count or 'all', got {self.passes!r}")
        for name, value, least in (
            ("anchor_offset", self.anchor_offset, 0),
            ("num_layers", self.num_layers, 1),
            ("passes", 1 if self.passes == ALL_PASSES else self.passes, 1),
            ("anchor_stride", self.anchor_stride, 1),
            ("extra_anchors_per_pass", self.extra_anchors_per_pass, 0),
            ("first_layer", self.first_layer, 0),
        ):
            if value < least:
                raise SpecError(Option(name), f" must be >= {least}, got {value}")
            if value > LARGEST_COUNT:
                raise SpecError(Option(name), f" must be <= {LARGEST_COUNT}, got {value}")
        if (problem := gap_factor_problem(self.gap_factor)) is not None:
            raise SpecError(Option("gap_factor"), problem)
        for name, text in (("anchor_regex", self.anchor_regex), ("phase", self.phase),
                           ("evidence", self.evidence), ("end_anchor_regex", self.end_anchor_regex),
                           ("pid", self.pid), ("device", self.device)):
            require_utf8(text, name)

    @property
    def matches_per_pass(self) -> int:
        """Matches one pass uses: its layers' anchors and the extras before the next pass."""
        return self.num_layers * self.anchor_stride + self.extra_anchors_per_pass


LARGEST_COUNT = 2**31 - 1
"""Largest layer number, count, offset or stride: far above any real model, and small
enough that every sum of them fits the packed int64 arrays and JSON's exact integers."""


def anchor_index(spec: LayerSpec, pass_index: int, layer: int) -> int:
    """Match index of layer `layer` in pass `pass_index`: K + p*(N*S + E) + l*S."""
    return spec.anchor_offset + pass_index * spec.matches_per_pass + layer * spec.anchor_stride


def required_matches(spec: LayerSpec, passes: int | None = None) -> int:
    """Matches needed from the offset: every layer of every pass, extras between passes."""
    passes = spec.passes if passes is None else passes
    return (passes - 1) * spec.matches_per_pass + spec.num_layers * spec.anchor_stride


def complete_passes(spec: LayerSpec, count: int) -> int:
    """How many complete passes `count` matches hold from the offset (extras are needed
    only between passes, so the last pass may end the trace)."""
    available = count - spec.anchor_offset
    layer_matches = spec.num_layers * spec.anchor_stride
    if available < layer_matches:
        return 0
    return (available - layer_matches) // spec.matches_per_pass + 1


def with_passes(spec: LayerSpec, count: int) -> LayerSpec:
    """The spec with `passes` a number: `all` becomes every complete pass from the offset
    (at least 1, so that too few matches are refused with their counts)."""
    if spec.passes != ALL_PASSES:
        return spec
    return dataclasses.replace(spec, passes=max(complete_passes(spec, count), 1))


def coverage(spec: LayerSpec, count: int) -> dict:
    """What the selection leaves out: complete passes from the offset not labelled, and
    matches outside the selection (before the offset, skipped, or after its last pass)."""
    complete = complete_passes(spec, count)
    used = required_matches(spec)
    return {
        "complete_passes": complete,
        "unlabelled_complete_passes": complete - spec.passes,
        "labelled_anchor_count": spec.passes * spec.num_layers,
        "matches_outside_selection": count - used,
    }


MAX_LANES_LIMIT = 10
"""Most display lanes a device may get: more would not be a compact view."""


@dataclass(frozen=True)
class CompactSpec:
    """The compact view asked for: at most `max_lanes` lanes per device, of one GPU process
    (`pid`) or of every one (None).

    `lane_groups="auto"` and `lane_group` (custom groups: (name, pattern) pairs, tried in
    order on each kernel's name) give each semantic group of a device lanes of its own (see
    index.lanegroups); both absent, the device's activity shares its lanes as before."""

    max_lanes: int = MAX_LANES_LIMIT
    pid: Any = None
    lane_groups: str | None = None
    lane_group: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        # a report's options hold JSON arrays: the same groups as tuples (hashable, equal)
        if isinstance(self.lane_group, (list, tuple)) and all(
                isinstance(g, (list, tuple)) for g in self.lane_group):
            object.__setattr__(self, "lane_group", tuple(tuple(g) for g in self.lane_group))

    def validate(self) -> None:
        if not 1 <= self.max_lanes <= MAX_LANES_LIMIT:
            raise SpecError(Option("max_lanes"), f" must be between 1 and 10, got {self.max_lanes}")
        require_utf8(self.pid, "pid")
        self.lane_group_set()

    def lane_group_set(self) -> LaneGroups | None:
        """The lane groups asked for, validated and compiled; None for the one shared set of
        lanes per device (neither option given)."""
        if self.lane_groups is not None and self.lane_groups != AUTO:
            raise SpecError(Option("lane_groups"), f" must be {AUTO!r}, got {self.lane_groups!r}")
        if not isinstance(self.lane_group, tuple) or not all(
                isinstance(g, tuple) and len(g) == 2 and all(isinstance(x, str) for x in g)
                for g in self.lane_group):
            raise SpecError(Option("lane_group"), " must be NAME=REGEX pairs")
        if len(self.lane_group) > MAX_CUSTOM_GROUPS:
            raise SpecError(Option("lane_group"), f" is given {len(self.lane_group)} times; "
                            f"at most {MAX_CUSTOM_GROUPS} custom groups fit in 10 lanes")
        custom = []
        for name, pattern in self.lane_group:
            require_utf8(pattern, "--lane-group")
            if not GROUP_NAME.fullmatch(name):
                raise SpecError(Option("lane_group"), f" {name!r}: a group name is a letter "
                                "then up to 31 letters, digits, '_', '.' or '-'")
            folded = name.casefold()  # `Compute` beside `compute` would read as one group
            if folded in BUILT_IN or folded in (n.casefold() for n, _ in custom):
                raise SpecError(Option("lane_group"), f" {name!r}: the name of "
                                + ("a built-in group (" + ", ".join(BUILT_IN) + ")"
                                   if folded in BUILT_IN else "another --lane-group")
                                + "; choose another name")
            if not pattern:
                raise SpecError(Option("lane_group"), f" {name!r} has an empty pattern, which "
                                "matches every kernel; give a REGEX after the =")
            custom.append((name, compile_pattern(pattern, "lane_group")))
        if self.lane_groups is None and not custom:
            return None
        return LaneGroups(auto=self.lane_groups == AUTO, custom=tuple(custom))


def lane_group_option(text: str) -> tuple[str, str]:
    """A `--lane-group NAME=REGEX` value as its (name, pattern) pair (split at the first
    `=`: a pattern may hold more)."""
    name, equals, pattern = text.partition("=")
    if not equals:
        raise SpecError(Option("lane_group"), f" {text!r} must be NAME=REGEX")
    return name, pattern


def validate_specs(layer_spec: LayerSpec | None, compact_spec: CompactSpec | None) -> None:
    """Refuse, before any input is read, what no trace can satisfy: the specs' values and
    patterns that do not compile (SpecError naming the spec fields)."""
    if layer_spec is not None:
        layer_spec.validate()
        compile_pattern(layer_spec.anchor_regex, "anchor_regex")
        if layer_spec.end_anchor_regex is not None:
            compile_pattern(layer_spec.end_anchor_regex, "end_anchor_regex")
    if compact_spec is not None:
        compact_spec.validate()

