"""`inspect`: what a trace holds (processes, GPUs, streams, kernel names, peak overlap)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tracestream.commands.evidence.occupancy import LaneOccupancy, lane_occupancy
from tracestream.commands.evidence.tables import (
    format_table,
    ms,
    pid_order,
    pid_text,
    short,
    three_places,
    top_counts,
)
from tracestream.errors import TraceError
from tracestream.index.builder import SCOPES, IndexOptions, TraceIndex, run_index
from tracestream.index.timebase import us_text
from tracestream.jsontext import RawNumber
from tracestream.model import GPU_SCOPE, KERNEL, MEMCPY, MEMSET, SYNC
from tracestream.parallel.memory import collector_paused
from tracestream.read.sizing import pool_for
from tracestream.read.source import TraceSource


def index_trace(trace, options: IndexOptions, stdin=None, progress=None,
                workers: int | None = None, max_event_bytes: int | None = None) -> TraceIndex:
    """The read-only commands' index pass (chunks observed in worker processes, as in
    `layers`, when the input is large enough or `workers` says so)."""
    with pool_for(str(trace), workers) as pool, \
            TraceSource(str(trace), stdin=stdin, read_once=True,
                        max_event_bytes=max_event_bytes) as source:
        return run_index(source, options, progress=progress, pool=pool)


def process_kind(pid: Any, meta: dict, gpu: bool, host: bool) -> tuple[str, str]:
    """(kind, evidence): GPU activity first, then Kineto's process labels, then host events."""
    if gpu:
        return "GPU", "GPU activity or scopes"
    labels = meta.get("labels")
    if isinstance(labels, str) and labels.strip():
        if labels.strip().upper() == "CPU":
            return "CPU", "process_labels"
        if labels.strip().upper().startswith("GPU"):
            return "GPU", "process_labels (no GPU activity)"
        return "other", "process_labels"
    if host and isinstance(pid, int):
        return "CPU", "host events"
    return "other", "no GPU activity, no labels"


def _processes(index: TraceIndex, activity: Counter, scopes: Counter) -> list[dict]:
    host = {index.tracks[t][0] for t in index.other_on_track}
    rows = []
    for pid in sorted(index.pids | set(activity) | set(scopes), key=pid_order):
        meta = index.process_meta.get(pid, {})
        kind, why = process_kind(pid, meta, bool(activity[pid] or scopes[pid]), pid in host)
        rows.append({
            "pid": pid, "kind": kind, "kind_evidence": why, "name": meta.get("name"),
            "labels": meta.get("labels"), "sort_index": meta.get("sort_index"),
            "gpu_activity": activity[pid], "gpu_scopes": scopes[pid],
        })
    return rows


def _gpu_row(index: TraceIndex, g: int, occupancy: LaneOccupancy, origin_ns: int,
             top: int) -> dict:
    pid, device = index.groups[g]
    stats = index.group_stats[g]
    names = index.kernel_names.get(g, Counter())
    lanes = occupancy.peak
    at = lanes.peak_at_ns
    return {
        "pid": pid,
        "device": device,
        "streams": len(stats.tracks),
        "kernel_streams": len(stats.kernel_tracks),
        "kernels": stats.kinds.get(KERNEL, 0),
        "memcpy": stats.kinds.get(MEMCPY, 0),
        "memset": stats.kinds.get(MEMSET, 0),
        "sync": stats.kinds.get(SYNC, 0),
        "activity": sum(stats.kinds.values()),
        "max_overlap": lanes.lanes,
        "max_overlap_at_ms": ms(at, origin_ns),
        "max_overlap_at_us": RawNumber(us_text(at)) if at is not None else None,
        "occupancy": {
            "columns": occupancy.maxima.tolist(),
            "start_us": us_text(occupancy.start_ns),
            "start_ms": ms(occupancy.start_ns, origin_ns),
            "column_us": us_text(occupancy.width_ns),
        },
        "first_ms": ms(stats.first_ns, origin_ns),
        "last_ms": ms(stats.last_ns, origin_ns),
        "span_ms": ms(stats.last_ns, stats.first_ns) if stats.first_ns is not None else None,
        "distinct_kernels": len(names),
        "top_kernels": top_counts(names, top),
    }


def inspect_index(index: TraceIndex, *, top: int = 30) -> dict:
    """The inspect report of an index built with count_names and sweep records."""
    origin_ns = index.origin.floor_ns() if index.origin is not None else 0
    gpu_groups = [g for g, (_, device) in enumerate(index.groups)
                  if device != SCOPES and index.group_stats[g].kinds]
    scope_groups = [g for g, (_, device) in enumerate(index.groups) if device == SCOPES]
    lanes = lane_occupancy(index.sweep, {g: (index.group_stats[g].first_ns,
                                             index.group_stats[g].last_ns) for g in gpu_groups})
    gpu_groups.sort(key=lambda g: (pid_order(index.groups[g][0]),
                                   pid_order(index.groups[g][1])))
    activity: Counter = Counter()
    for g in gpu_groups:
        activity[index.groups[g][0]] += sum(index.group_stats[g].kinds.values())
    scopes: Counter = Counter()
    for g in scope_groups:
        scopes[index.groups[g][0]] += index.group_stats[g].kinds.get(GPU_SCOPE, 0)
    return {
        "trace": index.source_name,
        "compression": index.compression,
        "bytes": index.stats.raw_bytes,
        "decompressed_bytes": index.stats.data_bytes,
        "events": index.event_count,
        "shape": index.layout.shape,
        "origin_us": RawNumber(index.origin_text) if index.origin_text else None,
        "phases": dict(index.phase_counts.most_common()),
        "processes": _processes(index, activity, scopes),
        "gpus": [_gpu_row(index, g, lanes[g], origin_ns, top) for g in gpu_groups],
        "gpu_scopes": [
            {"pid": index.groups[g][0], "count": index.group_stats[g].kinds.get(GPU_SCOPE, 0),
             "streams": len(index.group_stats[g].tracks)}
            for g in scope_groups
        ],
        "cpu_annotations": {
            "total": sum(index.cpu_annotations.values()),
            "distinct": len(index.cpu_annotations),
            "top": top_counts(index.cpu_annotations, top),
        },
        "flow_categories": [{"category": c, "count": n}
                            for c, n in index.flow_categories.most_common()],
        "guides": {
            "count": len(index.guides),
            "pids": sorted({g.pid for g in index.guides}, key=pid_order),
        },
        "compaction_provenance": {
            "present": index.provenance_ordinal is not None,
            "first_event": index.provenance_ordinal,
        },
        "warnings": _warnings(index),
    }


def _warnings(index: TraceIndex) -> list[dict]:
    """What tracestream tolerates but a user may want to know: odd values it never reads."""
    if not index.odd_values:
        return []
    ordinal, what = index.first_odd
    return [{"kind": "odd_value_passed_through", "count": index.odd_values,
             "first": f"event {ordinal}: {what}",
             "meaning": "ts/dur that is not a usable number on events tracestream neither "
                        "moves nor reads; they are copied through untouched"}]


def inspect_trace(trace, *, top: int = 30, stdin=None, progress=None,
                  workers: int | None = None, max_event_bytes: int | None = None) -> dict:
    """One streamed pass: processes, GPUs (counts, streams, peak overlap and lane occupancy
    over time), names, flows.

    `progress`: sees the phase "index" (see tracestream.progress; None: none).
    `workers`: processes for the per-chunk work (None: by input size; 0: none).
    `max_event_bytes`: the longest single event read (None: 64 MiB).
    """
    if top < 0:
        raise TraceError(f"--top must be >= 0, got {top}")
    options = IndexOptions(count_names=True, records=False, sweep=True)
    with collector_paused():
        index = index_trace(trace, options, stdin, progress, workers, max_event_bytes)
        try:
            return inspect_index(index, top=top)
        finally:
            index.close()


RAMP = " ▁▂▃▄▅▆▇█"
"""The occupancy strip's characters: none running, then eighths of the peak."""


def occupancy_strip(columns: list[int], peak: int) -> str:
    """One character per column: blank for none, else its share of the peak rounded up
    (any activity shows; only the peak fills a whole block)."""
    return "".join(RAMP[-(-8 * n // peak)] if n else " " for n in columns)


def _occupancy_lines(gpu: dict) -> list[str]:
    strip = gpu["occupancy"]
    columns = strip["columns"]
    width_ms = float(strip["column_us"]) / 1000
    start_ms = strip["start_ms"]
    return [
        f"  pid {pid_text(gpu['pid'])} device {gpu['device']}: peak {gpu['max_overlap']} at "
        f"{three_places(gpu['max_overlap_at_ms'])} ms; {len(columns)} columns of "
        f"{width_ms:,.3f} ms from {start_ms:,.3f} to {start_ms + len(columns) * width_ms:,.3f} ms",
        f"    |{occupancy_strip(columns, max(gpu['max_overlap'], 1))}|",
    ]


def format_inspect(report: dict) -> str:
    """Human-readable tables of an inspect report (times in ms from the trace origin)."""
    out = [
        f"trace: {report['trace']} ({report['compression']}, "
        f"{report['decompressed_bytes'] / 1e6:,.1f} MB JSON, {report['events']:,} events)",
        f"origin: ts {report['origin_us']} us (times below are ms from here)",
        "",
        "processes:",
    ]
    procs = report["processes"]
    idle = [p for p in procs if p["kind"] == "GPU" and not p["gpu_activity"]
            and not p["gpu_scopes"]]
    shown = [p for p in procs if p not in idle]
    out.append(format_table(
        ["pid", "kind", "name", "labels", "GPU activity", "GPU scopes", "kind from"],
        [[pid_text(p["pid"]), p["kind"], short(p["name"], 40), short(p["labels"], 30),
          p["gpu_activity"], p["gpu_scopes"], p["kind_evidence"]] for p in shown],
        [True, False, False, False, True, True, False]))
    if idle:
        pids = ", ".join(pid_text(p["pid"]) for p in idle)
        out.append(f"  + {len(idle)} GPU process(es) with metadata only (no activity): {pids}")
    out += ["", "GPUs (pid, args.device):"]
    gpus = report["gpus"]
    if not gpus:
        out.append("  none: no kernel, gpu_memcpy, gpu_memset or cuda_sync events")
    else:
        out.append(format_table(
            ["pid", "device", "streams", "kernels", "memcpy", "memset", "sync", "peak overlap",
             "peak at ms", "first ms", "span ms"],
            [[pid_text(g["pid"]), g["device"], g["streams"], g["kernels"], g["memcpy"], g["memset"],
              g["sync"], g["max_overlap"], three_places(g["max_overlap_at_ms"]),
              three_places(g["first_ms"]), three_places(g["span_ms"])] for g in gpus],
            [True] * 11))
        out.append("  streams = stream rows with activity; peak overlap = lanes compaction "
                   "would need")
    for s in report["gpu_scopes"]:
        out.append(f"  GPU user scopes of pid {s['pid']}: {s['count']:,} on {s['streams']} row(s)")
    if gpus:
        out += ["", "lane occupancy over time (each column: the most GPU activities running "
                    f"at once in that slice of the span; '{RAMP}' scaled to the peak):"]
        for g in gpus:
            out += _occupancy_lines(g)
    for g in gpus:
        out += ["", f"top kernels of pid {pid_text(g['pid'])} device {g['device']} "
                    f"({g['distinct_kernels']:,} distinct):"]
        out.append(format_table(["count", "name"],
                                [[k["count"], short(k["name"])] for k in g["top_kernels"]],
                                [True, False]))
    cpu = report["cpu_annotations"]
    out += ["", f"CPU user annotations ({cpu['total']:,} in all, {cpu['distinct']:,} distinct; "
                "they mark host launches, not GPU boundaries):"]
    if cpu["top"]:
        out.append(format_table(["count", "name"],
                                [[a["count"], short(a["name"])] for a in cpu["top"]],
                                [True, False]))
    else:
        out.append("  none")
    out += ["", "flow categories:"]
    flows = report["flow_categories"]
    out.append(format_table(["count", "category"], [[f["count"], f["category"]] for f in flows],
                            [True, False]) if flows else "  none")
    guides = report["guides"]
    prov = report["compaction_provenance"]
    out += ["", "layer guides: " + (
        f"{guides['count']} (pid {', '.join(map(str, guides['pids']))}): already annotated"
        if guides["count"] else "none"),
        "compaction provenance: " + (
        f"yes (first at event {prov['first_event']}): compacted by tracestream"
        if prov["present"] else "none")]
    for warning in report["warnings"]:
        out += ["", f"warning: {warning['count']:,} event(s) with a ts/dur tracestream does "
                    f"not read that is not a usable number (first: {warning['first']}); "
                    "they are copied through untouched"]
    return "\n".join(out)
