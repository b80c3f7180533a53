"""Semantic lane groups (`--lane-groups auto`, `--lane-group NAME=REGEX`): which group each GPU
activity's display lanes belong to, so communication and copies get lanes of their own
instead of sharing a lane with whatever compute kernel happens not to overlap them.

The index pass classifies every slice here (a small code per slice in the sweep records,
one byte each), where the kernel's name is at hand; the plan then packs each group of a
device on lanes of its own. Codes are positions in `LaneGroups.names`, which is also the
order of the device's lanes: compute, communication, memory, sync, then custom groups in the
order given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from tracestream.model import GPU_SCOPE, KERNEL, LAYER_GUIDE, MEMCPY, MEMSET, SYNC

AUTO = "auto"
"""The one value of `--lane-groups`."""
COMPUTE, COMMUNICATION, MEMORY, SYNC_GROUP = "compute", "communication", "memory", "sync"
BUILT_IN = (COMPUTE, COMMUNICATION, MEMORY, SYNC_GROUP)
COMMUNICATION_PATTERN = (
    r"nccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|send_?recv"
    r"|cross_device_reduce"
)
"""Kernel names (re.search, case-insensitive) `auto` puts in *communication*: NCCL's kernels
and the collective names of custom all-reduce and all-gather kernels (vLLM's
`cross_device_reduce_1stage`, ...)."""
_COMMUNICATION = re.compile(COMMUNICATION_PATTERN, re.IGNORECASE)
GROUP_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,31}")
"""A custom group's name: written unescaped into lane names and the provenance member."""
MAX_CUSTOM_GROUPS = 6
"""More groups than lanes (10 at most) could never all be shown."""


@dataclass(frozen=True)
class LaneGroups:
    """The groups asked for, validated (see `plan.specs.CompactSpec`): `auto` and the custom
    groups' (name, compiled pattern) in the order given."""

    auto: bool
    custom: tuple[tuple[str, re.Pattern], ...] = ()
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def names(self) -> tuple[str, ...]:
        """Every group, in lane order; a group's code is its position."""
        return (BUILT_IN if self.auto else (COMPUTE,)) + tuple(name for name, _ in self.custom)

    def kind_codes(self) -> np.ndarray:
        """The code of every category kind as an array indexed by kind (a kernel's code is
        then refined by its name): with `auto`, copies and memsets are memory and syncs
        sync; everything else starts as compute."""
        codes = np.zeros(max(KERNEL, MEMCPY, MEMSET, SYNC, GPU_SCOPE, LAYER_GUIDE) + 1, np.int8)
        if self.auto:
            codes[[MEMCPY, MEMSET]] = BUILT_IN.index(MEMORY)
            codes[SYNC] = BUILT_IN.index(SYNC_GROUP)
        return codes

    def of_kernel(self, name) -> int:
        """The code of a kernel by its name: the first custom pattern that matches it, else
        (with `auto`) communication when it looks like a collective, else compute. A name
        that is not a string is matched as its text (a number), as anchor patterns are."""
        key = (type(name), name)  # True == 1 == 1.0, but their texts differ
        code = self._memo.get(key)
        if code is None:
            code = self._classify(name if isinstance(name, str) else str(name))
            if len(self._memo) < 1 << 14:  # a trace has a few thousand kernel names
                self._memo[key] = code
        return code

    def _classify(self, text: str) -> int:
        first = len(BUILT_IN) if self.auto else 1
        for k, (_, pattern) in enumerate(self.custom):
            if pattern.search(text):
                return first + k
        if self.auto and _COMMUNICATION.search(text):
            return BUILT_IN.index(COMMUNICATION)
        return 0
