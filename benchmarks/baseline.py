"""The in-memory baseline: layer guides and lanes as a user would write them with the stdlib.

    python -m benchmarks.baseline --trace T --output O --anchor-regex '^_q_rope_store$' \\
        --num-layers 8 --anchor-offset 0 --passes 1 --extra-anchors-per-pass 1 --max-gpu-lanes 10

`json.load` the whole trace (gzip/zstd through the gzip/zstandard modules),
do the same layer and lane logic plainly in Python on the dicts, `json.dump`
the result (compressed like ours: gzip level 1, zstd level 3).

This is a *speed and memory reference*, not a second implementation: it has
none of tracestream's refusal rules (ambiguous pids, incomplete passes, flows
that bind to nothing, non-GPU events on emptied rows, ...), it compares float
timestamps (so 19-digit epoch values lose their last digits and touching
kernels may share a lane that Perfetto would overlap), and `json.dump` rewrites
every number and every byte of whitespace. Its output is not expected to pass
`tracestream verify`. What it measures is the cost of the obvious approach:
a document in memory several times the size of the file, and the stdlib's
parser and (pure Python, streaming) encoder.
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import io
import json
import re
from collections import defaultdict

import zstandard

ACTIVITY = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "Kernel", "Memcpy", "Memset"}
SCOPE = "gpu_user_annotation"
LANE_TID_BASE = 1_000_000_000
SCOPE_PID_BASE = 1_000_000


def load(path: str):
    """The whole document, decompressed by magic bytes (as a user would, with stdlib + zstd)."""
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic[:2] == b"\x1f\x8b":
        with gzip.open(path, "rb") as fh:
            return json.load(fh)
    if magic == b"\x28\xb5\x2f\xfd":
        with open(path, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as fh:
            return json.load(fh)
    with open(path, "rb") as fh:
        return json.load(fh)


def dump(doc, path: str, compression: str) -> None:
    """json.dump to a text stream over the chosen compressor."""
    if compression == "gzip":
        with gzip.open(path, "wt", compresslevel=1, encoding="utf-8") as fh:
            json.dump(doc, fh)
    elif compression == "zstd":
        with open(path, "wb") as raw:
            writer = zstandard.ZstdCompressor(level=3).stream_writer(raw)
            with io.TextIOWrapper(writer, encoding="utf-8") as fh:
                json.dump(doc, fh)
    else:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)


def _args(event) -> dict:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def anchor_matches(events: list, pattern: re.Pattern) -> list[dict]:
    """Kernel events whose name matches, on the GPU with the most matches, sorted by ts."""
    by_gpu = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "kernel" in str(e.get("cat", "")).lower() \
                and pattern.search(str(e.get("name", ""))):
            by_gpu[(e.get("pid"), _args(e).get("device"))].append(e)
    if not by_gpu:
        raise SystemExit("no anchor matches")
    matches = max(by_gpu.values(), key=len)
    matches.sort(key=lambda e: e["ts"])
    return matches


def guides(matches: list, num_layers: int, offset: int, passes: int, stride: int,
           extra: int, phase: str) -> list[dict]:
    """One slice per layer, from match K + p*(N*S+E) + l*S to the next layer's anchor."""
    per_pass = num_layers * stride + extra
    out = []
    pid = matches[0]["pid"]
    for p in range(passes):
        for layer in range(num_layers):
            i = offset + p * per_pass + layer * stride
            start = matches[i]["ts"]
            # the last layer has no terminal kernel here: a zero-length marker
            end = matches[i + stride]["ts"] if layer + 1 < num_layers else start
            out.append({"ph": "X", "cat": "layer_guide", "name": f"L{layer}", "pid": pid,
                        "tid": LANE_TID_BASE - 1, "ts": int(round(start)),
                        "dur": int(round(end)) - int(round(start)),
                        "args": {"pass": p, "phase": phase, "anchor_index": i}})
    return out


def allocate(items: list[tuple[float, float, int]]) -> tuple[list[int], int]:
    """Greedy lanes over (start, end, index) sorted by start: a heap of lane end times."""
    heap: list[tuple[float, int]] = []
    lanes = []
    count = 0
    for start, end, _ in items:
        if heap and heap[0][0] <= start:
            lane = heap[0][1]
            heapq.heapreplace(heap, (end, lane))
        else:
            lane = count
            count += 1
            heapq.heappush(heap, (end, lane))
        lanes.append(lane)
    return lanes, count


def _group_events(events: list) -> dict:
    """GPU activity per (pid, device) and scopes per pid: (start, end, index) lists."""
    groups = defaultdict(list)
    for i, e in enumerate(events):
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat in ACTIVITY:
            key = ("activity", e.get("pid"), _args(e).get("device"))
        elif cat == SCOPE:
            key = ("scopes", e.get("pid"), None)
        else:
            continue
        ts = float(e["ts"])
        groups[key].append((ts, ts + float(e.get("dur", 0)), i))
    return groups


def _relocate(event: dict, index: int, pid, tid) -> None:
    """New row, and the provenance restore would need (original pid/tid, index, args?)."""
    args = event.get("args")
    had_args = isinstance(args, dict)
    if not had_args:
        args = event["args"] = {}
    args["_compact_gpu_track"] = {"pid": event.get("pid"), "tid": event.get("tid"),
                                  "index": index, "had_args": had_args}
    event["pid"] = pid
    event["tid"] = tid


def _thread_meta(pid, tid, name: str, sort_index: int) -> list[dict]:
    return [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}},
            {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
             "args": {"sort_index": sort_index}}]


def compact(events: list, max_lanes: int) -> tuple[list[dict], set]:
    """Relocate activity and scopes to lanes; returns new metadata and the emptied rows."""
    moved_from: set = set()
    where: dict = {}
    added = []
    scope_pids: dict = {}
    for (kind, pid, device), items in _group_events(events).items():
        items.sort()
        lanes, count = allocate(items)
        if count > max_lanes:
            raise SystemExit(f"{kind} of pid {pid} device {device} needs {count} lanes")
        target_pid = pid if kind == "activity" else scope_pids.setdefault(
            pid, SCOPE_PID_BASE + len(scope_pids))
        base = LANE_TID_BASE + 100 * (device or 0)
        for (start, _, i), lane in zip(items, lanes, strict=True):
            e = events[i]
            moved_from.add((e.get("pid"), e.get("tid")))
            where[(e.get("pid"), e.get("tid"), start)] = (target_pid, base + lane)
            _relocate(e, i, target_pid, base + lane)
        for lane in range(count):
            added += _thread_meta(target_pid, base + lane,
                                  f"GPU lane {lane} (synthetic; {kind} {device})", lane)
    _move_flows(events, where, moved_from)
    return added, moved_from


def _move_flows(events: list, where: dict, moved_from: set) -> None:
    """Flows on moved rows follow the activity that starts at their time on their row."""
    for e in events:
        if e.get("ph") in ("s", "t", "f") and (e.get("pid"), e.get("tid")) in moved_from:
            target = where.get((e.get("pid"), e.get("tid"), float(e["ts"])))
            if target is not None:
                e["pid"], e["tid"] = target


def annotate(doc, spec: argparse.Namespace):
    """The whole job on the in-memory document."""
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    matches = anchor_matches(events, re.compile(spec.anchor_regex))
    new = guides(matches, spec.num_layers, spec.anchor_offset, spec.passes, spec.anchor_stride,
                 spec.extra_anchors_per_pass, spec.phase)
    if spec.max_gpu_lanes:
        added, emptied = compact(events, spec.max_gpu_lanes)
        retired = {"thread_name", "thread_sort_index"}
        events[:] = [e for e in events if not (e.get("ph") == "M" and e.get("name") in retired
                                                and (e.get("pid"), e.get("tid")) in emptied)]
        new += added
    events.extend(new)
    return doc


def compression_of(path: str, explicit: str | None) -> str:
    if explicit:
        return explicit
    return "gzip" if path.endswith(".gz") else "zstd" if path.endswith(".zst") else "none"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.baseline",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--anchor-regex", required=True)
    parser.add_argument("--num-layers", type=int, required=True)
    parser.add_argument("--anchor-offset", type=int, required=True)
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--anchor-stride", type=int, default=1)
    parser.add_argument("--extra-anchors-per-pass", type=int, default=0)
    parser.add_argument("--phase", default="target-verify")
    parser.add_argument("--max-gpu-lanes", type=int, default=None)
    parser.add_argument("--compress", choices=("none", "gzip", "zstd"), default=None)
    spec = parser.parse_args(argv)
    doc = annotate(load(spec.trace), spec)
    dump(doc, spec.output, compression_of(spec.output, spec.compress))


if __name__ == "__main__":
    main()
