"""The in-memory baseline: each benchmarked job as a user would write it with the stdlib.

    python -m benchmarks.baseline --job layers --trace T --output O \\
        --anchor-regex '^_q_rope_store$' --num-layers 8 --anchor-offset 0 --passes 6 \\
        --extra-anchors-per-pass 1 --end-anchor-regex 'moe_finalize' --max-gpu-lanes 10
    python -m benchmarks.baseline --job compact --trace T --output O --max-gpu-lanes 10
    python -m benchmarks.baseline --job inspect --trace T
    python -m benchmarks.baseline --job anchors --trace T --anchor-regex R [--cross-check R2]

`json.load` the whole trace (gzip/zstd through the gzip/zstandard modules),
do the same job plainly in Python on the dicts, and `json.dump` the result
(compressed like ours: gzip level 1, zstd level 3; `inspect` and `anchors`
dump their summary to stdout instead). `layers` labels the same passes as
ours, with the same terminal rule when `--end-anchor-regex` is given (exactly
one terminal starts in each layer's window and ends before the next anchor;
the last layer of a pass ends at its terminal's end); `compact` is `layers`
without guides.

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
import bisect
import gzip
import heapq
import io
import json
import re
import sys
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


def kernel_matches(events: list, pattern: re.Pattern) -> dict:
    """Kernel events whose name matches, per (pid, device)."""
    by_gpu = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "kernel" in str(e.get("cat", "")).lower() \
                and pattern.search(str(e.get("name", ""))):
            by_gpu[(e.get("pid"), _args(e).get("device"))].append(e)
    return by_gpu


def anchor_matches(events: list, pattern: re.Pattern, pid: str | None = None):
    """(gpu, matches): on `pid` if given, else the GPU with the most matches; sorted by ts."""
    by_gpu = kernel_matches(events, pattern)
    if pid is not None:
        by_gpu = {k: v for k, v in by_gpu.items() if str(k[0]) == pid}
    if not by_gpu:
        raise SystemExit("no anchor matches")
    gpu = max(by_gpu, key=lambda k: len(by_gpu[k]))
    matches = by_gpu[gpu]
    matches.sort(key=lambda e: float(e["ts"]))
    return gpu, matches


def _end(event) -> float:
    return float(event["ts"]) + float(event.get("dur", 0))


def terminal_in(starts: list[float], terminals: list, low: float, high: float | None,
                where: str):
    """The one terminal that starts in [low, high) and ends by `high` (else exit)."""
    first = bisect.bisect_left(starts, low)
    last = len(starts) if high is None else bisect.bisect_left(starts, high)
    if last - first != 1:
        raise SystemExit(f"{last - first} terminal kernels in the window of {where}")
    terminal = terminals[first]
    if high is not None and _end(terminal) > high:
        raise SystemExit(f"the terminal of {where} ends after the next anchor")
    return terminal


def guides(matches: list, spec: argparse.Namespace, terminals: list | None) -> list[dict]:
    """One slice per layer, from match K + p*(N*S+E) + l*S to the next layer's anchor.

    The last layer of a pass ends at its terminal's end (with terminals), else
    it is a zero-length marker.
    """
    stride, num_layers = spec.anchor_stride, spec.num_layers
    per_pass = num_layers * stride + spec.extra_anchors_per_pass
    starts = [float(t["ts"]) for t in terminals] if terminals is not None else []
    out = []
    pid = matches[0]["pid"]
    for p in range(spec.passes):
        for layer in range(num_layers):
            i = spec.anchor_offset + p * per_pass + layer * stride
            start = float(matches[i]["ts"])
            last = layer + 1 == num_layers
            upper = i + stride if not last else spec.anchor_offset + (p + 1) * per_pass
            high = float(matches[upper]["ts"]) if upper < len(matches) else None
            end = high if not last else start
            if terminals is not None:
                terminal = terminal_in(starts, terminals, start, high, f"pass {p} L{layer}")
                if last:
                    end = _end(terminal)
            out.append({"ph": "X", "cat": "layer_guide", "name": f"L{layer}", "pid": pid,
                        "tid": LANE_TID_BASE - 1, "ts": int(round(start)),
                        "dur": int(round(end)) - int(round(start)),
                        "args": {"pass": p, "phase": spec.phase, "anchor_index": i}})
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
    """`layers` (guides, and lanes with --max-gpu-lanes) or `compact` on the document."""
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    new = []
    if spec.job == "layers":
        gpu, matches = anchor_matches(events, re.compile(spec.anchor_regex), spec.pid)
        terminals = None
        if spec.end_anchor_regex:
            terminals = kernel_matches(events, re.compile(spec.end_anchor_regex)).get(gpu, [])
            terminals.sort(key=lambda e: float(e["ts"]))
        new = guides(matches, spec, terminals)
    if spec.max_gpu_lanes:
        added, emptied = compact(events, spec.max_gpu_lanes)
        retired = {"thread_name", "thread_sort_index"}
        events[:] = [e for e in events if not (e.get("ph") == "M" and e.get("name") in retired
                                                and (e.get("pid"), e.get("tid")) in emptied)]
        new += added
    events.extend(new)
    return doc


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """Most intervals open at once (a heap of end times over starts in order)."""
    heap: list[float] = []
    peak = 0
    for start, end in sorted(intervals):
        while heap and heap[0] <= start:
            heapq.heappop(heap)
        heapq.heappush(heap, end)
        peak = max(peak, len(heap))
    return peak


def inspect_summary(doc, top: int = 30) -> dict:
    """What `inspect` reports: processes, GPUs (streams, counts, peak overlap), names, flows."""
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    gpus: dict = defaultdict(lambda: {"categories": defaultdict(int), "streams": set(),
                                      "intervals": [], "names": defaultdict(int)})
    processes, flows, annotations = {}, defaultdict(int), defaultdict(int)
    for e in events:
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "process_name":
            processes[str(e.get("pid"))] = _args(e).get("name")
        elif ph in ("s", "t", "f"):
            flows[str(e.get("cat"))] += 1
        elif ph == "X" and e.get("cat") in ACTIVITY:
            gpu = gpus[f"{e.get('pid')}/{_args(e).get('device')}"]
            gpu["categories"][e["cat"]] += 1
            gpu["streams"].add(e.get("tid"))
            gpu["intervals"].append((float(e["ts"]), _end(e)))
            gpu["names"][e.get("name")] += 1
        elif ph == "X" and e.get("cat") == "user_annotation":
            annotations[e.get("name")] += 1
    return {
        "events": len(events), "processes": processes, "flows": dict(flows),
        "gpus": {key: {"categories": dict(g["categories"]), "streams": len(g["streams"]),
                       "peak_overlap": peak_overlap(g["intervals"]),
                       "top_names": sorted(g["names"].items(), key=lambda kv: -kv[1])[:top]}
                 for key, g in gpus.items()},
        "user_annotations": sorted(annotations.items(), key=lambda kv: -kv[1])[:top],
    }


def anchors_report(doc, spec: argparse.Namespace) -> dict:
    """What `anchors` reports: every match in time order, its gap and cluster (and the
    cross-check's count of the second landmark between consecutive anchors)."""
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    gpu, matches = anchor_matches(events, re.compile(spec.anchor_regex), spec.pid)
    starts = [float(m["ts"]) for m in matches]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    median = sorted(gaps)[len(gaps) // 2] if gaps else 0.0
    checks = []
    if spec.cross_check:
        second = kernel_matches(events, re.compile(spec.cross_check)).get(gpu, [])
        marks = sorted(float(e["ts"]) for e in second)
        checks = [bisect.bisect_left(marks, b) - bisect.bisect_left(marks, a)
                  for a, b in zip(starts, starts[1:])]
    cluster, rows, flagged = 0, [], 0
    for i, m in enumerate(matches):
        gap = gaps[i - 1] if i else None
        if gap is not None and gap > spec.gap_factor * median:
            cluster += 1
        elif gap is not None and checks and checks[i - 1] != 1:
            flagged += 1  # only pairs inside a cluster are expected to hold one
        rows.append({"index": i, "ts": m["ts"], "dur": m.get("dur"),
                     "stream": _args(m).get("stream"), "gap": gap, "cluster": cluster,
                     "cross_check": checks[i - 1] if i and checks else None})
    return {"pid": gpu[0], "device": gpu[1], "matches": len(matches), "median_gap": median,
            "clusters": cluster + 1, "rows": rows, "flagged": flagged}


def compression_of(path: str, explicit: str | None) -> str:
    if explicit:
        return explicit
    return "gzip" if path.endswith(".gz") else "zstd" if path.endswith(".zst") else "none"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.baseline",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", choices=("layers", "compact", "inspect", "anchors"),
                        default="layers")
    parser.add_argument("--trace", required=True)
    parser.add_argument("--output", help="the new trace (layers, compact)")
    parser.add_argument("--anchor-regex")
    parser.add_argument("--end-anchor-regex")
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--anchor-offset", type=int, default=0)
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--anchor-stride", type=int, default=1)
    parser.add_argument("--extra-anchors-per-pass", type=int, default=0)
    parser.add_argument("--pid", help="GPU process of the anchors (default: most matches)")
    parser.add_argument("--phase", default="target-verify")
    parser.add_argument("--max-gpu-lanes", type=int, default=None)
    parser.add_argument("--compress", choices=("none", "gzip", "zstd"), default=None)
    parser.add_argument("--cross-check", help="anchors: second landmark to count")
    parser.add_argument("--gap-factor", type=float, default=3.0)
    spec = parser.parse_args(argv)
    if spec.job in ("layers", "anchors") and not spec.anchor_regex:
        parser.error(f"--job {spec.job} needs --anchor-regex")
    if spec.job in ("layers", "compact") and not spec.output:
        parser.error(f"--job {spec.job} needs --output")
    doc = load(spec.trace)
    if spec.job == "inspect":
        json.dump(inspect_summary(doc), sys.stdout)
    elif spec.job == "anchors":
        json.dump(anchors_report(doc, spec), sys.stdout)
    else:
        doc = annotate(doc, spec)
        dump(doc, spec.output, compression_of(spec.output, spec.compress))


if __name__ == "__main__":
    main()
