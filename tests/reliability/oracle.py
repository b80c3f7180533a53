"""An independent model of what compaction must produce, from docs/design.md, not the engine.

Lanes must equal the peak overlap of the conservative nanosecond bounds of each
group's activity: bounds that contain the exact decimal interval and the
intervals Perfetto's importer computes (`llround(double(v) * 1000)` for ts and
dur separately, or truncation in older versions; integer literals exactly).
Greedy interval partitioning is optimal, so the engine's lane count must be
exactly this peak.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

ACTIVITY = {"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "cuda_sync"}


class Num(str):
    """A JSON number kept as its text."""


def load(data: bytes):
    return json.loads(data, parse_float=Num, parse_int=Num)


def _llround(x: float) -> int:
    f = math.floor(x)
    if x >= 0:
        return int(f) + (1 if x - f >= 0.5 else 0)
    return int(f) + (1 if x - f > 0.5 else 0)


def _imported(text: str) -> tuple[int, int]:
    """(rounded, truncated) ns as the importer computes them."""
    if not any(c in text for c in ".eE"):
        return int(text) * 1000, int(text) * 1000
    x = float(text) * 1000.0
    return _llround(x), int(x)


def bounds(ts: str, dur: str) -> tuple[int, int]:
    exact_start = Fraction(ts) * 1000
    exact_end = (Fraction(ts) + Fraction(dur)) * 1000
    ts_round, ts_trunc = _imported(ts)
    dur_round, dur_trunc = _imported(dur)
    lo = min(math.floor(exact_start), ts_round, ts_trunc)
    hi = max(math.ceil(exact_end), ts_round + dur_round, ts_trunc + dur_trunc)
    # Perfetto imports slices that start together longest first, and a slice closes only
    # when its end <= the next start: a zero-length slice occupies its start nanosecond
    return lo, max(hi, math.floor(exact_start) + 1, ts_round + 1, ts_trunc + 1)


def peak(intervals) -> int:
    """Most intervals [lo, hi) alive at once; touching intervals do not overlap."""
    edges = sorted([(lo, 1) for lo, _ in intervals] + [(hi, -1) for _, hi in intervals])
    alive = best = 0
    for _, step in edges:  # at equal times -1 sorts before +1
        alive += step
        best = max(best, alive)
    return best


def _kind(cat) -> str | None:
    if not isinstance(cat, str):
        return None
    parts = [p.strip().lower() for p in cat.split(",")]
    if any(p in ACTIVITY for p in parts):
        return "activity"
    if "gpu_user_annotation" in parts:
        return "scopes"
    return None


def events_of(doc):
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def expected_lanes(source: Path, *, read=None) -> dict[tuple, dict]:
    """Per group ("activity", pid, device) or ("scopes", pid, None): peak overlap of the
    conservative bounds and of the exact intervals, and whether all numbers are integers."""
    data = read(source) if read else Path(source).read_bytes()
    groups: dict[tuple, list] = defaultdict(list)
    exact: dict[tuple, list] = defaultdict(list)
    integer: dict[tuple, bool] = defaultdict(lambda: True)
    for e in events_of(load(data)):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        kind = _kind(e.get("cat"))
        if kind is None:
            continue
        pid = _plain(e["pid"])
        device = _plain((e.get("args") or {}).get("device")) if kind == "activity" else None
        key = (kind, pid, device)
        ts, dur = str(e["ts"]), str(e["dur"])
        groups[key].append(bounds(ts, dur))
        start = Fraction(ts) * 1000
        # a zero-length slice occupies its start nanosecond (see bounds)
        exact[key].append((start, max(start + Fraction(dur) * 1000, start + 1)))
        integer[key] &= not any(c in ts + dur for c in ".eE")
    return {key: {"peak": peak(groups[key]), "exact_peak": peak(exact[key]),
                  "integers": integer[key]} for key in groups}


def _plain(value):
    """Numbers back to int (they were kept as text), strings as they are."""
    if isinstance(value, Num):
        return int(value) if value.lstrip("-").isdigit() else float(value)
    return value


def lanes_in_report(report: dict) -> dict[tuple, int]:
    section = report.get("compaction", report)
    found = {}
    for g in section["groups"]:
        key = (g["kind"], g["pid"], g["device"] if g["kind"] == "activity" else None)
        found[key] = g["lanes"]
    return found


def guide_slices(output_data: bytes) -> list[tuple[int, int, dict]]:
    """(ts, ts + dur, args) of every guide in an output, in file order (whole µs numbers)."""
    found = []
    for e in events_of(json.loads(output_data)):
        if isinstance(e, dict) and e.get("cat") == "layer_guide":
            ts, dur = int(e["ts"]), int(e["dur"])
            found.append((ts, ts + dur, e["args"]))
    return found


def guide_starts(source: Path, name: str, indices: list[int]) -> list[int]:
    """Whole-µs starts (halves up) of the guides whose anchors are the matches `indices` of
    kernel `name`, the matches ordered by exact start (ties in file order)."""
    starts = sorted((Fraction(str(e["ts"])), k) for k, e in enumerate(events_of(load(
        Path(source).read_bytes()))) if isinstance(e, dict) and e.get("name") == name
        and e.get("ph") == "X")
    return [math.floor(starts[i][0] + Fraction(1, 2)) for i in indices]


def shared_guide_start(starts: list[int]) -> bool:
    """Two guides round to one start: Perfetto would nest one under the other."""
    return any(a == b for a, b in zip(starts, starts[1:]))
