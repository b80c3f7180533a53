"""Evidence before labels: what a trace holds (`inspect`) and where an anchor runs (`anchors`).

Both are read-only and stream the trace once through the index pass. They
report counts, times and gaps so a user can verify an anchor, its layer count
and its first complete pass; they never pick an offset or a layer count.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any

import numpy as np
import orjson

from tracestream import _native
from tracestream.errors import Option, SpecError, TraceError, compile_pattern
from tracestream.index.builder import SCOPES, IndexOptions, TraceIndex, run_index
from tracestream.index.matches import AS_TEXT, INTEGER, THREE_DECIMALS, MatchView
from tracestream.jsontext import RawJSON, RawNumber, dumps
from tracestream.model import GPU_SCOPE, KERNEL, MEMCPY, MEMSET, SYNC
from tracestream.parallel.memory import collector_paused
from tracestream.plan.cadence import GAP_FACTOR, gap_factor_problem, rule_text, starts_at_breaks
from tracestream.plan.guides import on_gpu, select_gpu
from tracestream.plan.lanes import PeakOverlap
from tracestream.read.sizing import pool_for
from tracestream.read.source import TraceSource

INSIDE_VARIATION = 1.1
"""Largest in-cluster gap (in median gaps) above which the verdict mentions sub-structure."""

NAME_WIDTH = 110  # longest kernel/annotation name in human-readable tables


# -- small pure helpers --------------------------------------------------------


def separation(between: np.ndarray, first: np.ndarray, median_ns: float | None) -> dict:
    """Largest gap inside clusters and smallest gap between them, in median gaps
    (`between`: the start-to-start gaps, `first`: each cluster's first index).

    This is the margin of the rule: a clean split has inside ~1 and between >> 1.
    """
    if median_ns is None or median_ns <= 0:
        return {"max_inside_ratio": None, "min_between_ratio": None}
    is_between = np.zeros(len(between), bool)
    is_between[first[1:] - 1] = True
    inside = int(np.max(between, where=~is_between, initial=NO_GAP))
    low = int(np.min(between, where=is_between, initial=np.iinfo(np.int64).max))
    return {
        "max_inside_ratio": round(inside / median_ns, 2) if len(first) < len(between) + 1
        else None,
        "min_between_ratio": round(low / median_ns, 2) if len(first) > 1 else None,
    }


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n) if n % d == 0]


def readings(size: int) -> str:
    """What a pass of `size` anchor matches is consistent with (never a choice)."""
    options = [f"{size} layers per pass"]
    if size > 1:
        options.append(f"{size - 1} layers + 1 extra anchor per pass (--extra-anchors-per-pass 1)")
    strides = _divisors(size)
    if strides:
        shown = ", ".join(f"{size // s} layers x stride {s}" for s in strides[:4])
        options.append(f"an anchor that runs several times per layer ({shown}, --anchor-stride)")
    return ", or ".join(options)


def verdict_text(count: int, first: np.ndarray, sizes: np.ndarray,
                 max_inside_ratio: float | None = None) -> str:
    """One line: what the cluster sizes are consistent with (clusters as their first
    indices and sizes). States facts, picks nothing."""
    text = _sizes_text(count, first, sizes)
    if max_inside_ratio is not None and max_inside_ratio > INSIDE_VARIATION:
        text += (
            f"; gaps inside clusters reach {max_inside_ratio:g} x the median: a cluster may "
            "hold several short passes or layers of different kinds (see the gap column)"
        )
    return text


def _sizes_text(count: int, first: np.ndarray, sizes: np.ndarray) -> str:
    if len(first) == 1:
        return (
            f"{count} match(es) in 1 cluster: the gaps do not separate passes; "
            f"{count} is consistent with {readings(count)}, or with several passes whose "
            "gaps are not larger — verify in the model config and the timeline"
        )
    distinct, times = np.unique(sizes, return_counts=True)
    if len(distinct) == 1:
        size = int(sizes[0])
        return (
            f"{len(first)} clusters of {size}: consistent with {readings(size)} — "
            "verify in the model config"
        )
    # the most common size; ties go to the size seen first, as Counter.most_common does
    top = np.flatnonzero(times == times.max())
    first_seen = [int(np.argmax(sizes == distinct[k])) for k in top.tolist()]
    common = int(distinct[top[int(np.argmin(first_seen))]])
    odd = np.flatnonzero(sizes != common)
    listing = ", ".join(f"{int(sizes[c])} at index {int(first[c])}"
                        for c in odd[:6].tolist()) + (" …" if len(odd) > 6 else "")
    return (
        f"{len(first)} clusters of unequal size: {int(times.max())} of {common} "
        f"({readings(common)}); others: {listing}. A short first or last cluster may be a "
        "pass cut by the capture window; another size may be another phase — the offset "
        "must start a complete pass of the verified phase; verify in the model config"
    )


def matches_before(anchor_ns: np.ndarray, cross_ns: np.ndarray) -> np.ndarray:
    """Per anchor: how many cross-check matches start before it (both in time order, as
    exact ns; ties with digits below 1 ns are the caller's to settle)."""
    return np.searchsorted(cross_ns, anchor_ns, "left")


def window_counts(before: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cross-check matches in [anchor i, anchor i+1) for every i, from `matches_before`,
    and whether that window is counted (both anchors in one cluster; `first`: each
    cluster's first index).

    Windows that span two clusters are not counted: the gap between passes is
    not a layer.
    """
    inside = np.ones(max(len(before) - 1, 0), bool)
    inside[first[1:] - 1] = False
    return np.diff(before), inside


def outside_windows(before: np.ndarray, first: np.ndarray, sizes: np.ndarray,
                    total: int) -> int:
    """Cross-check matches that fall in no counted window (before, between or after
    clusters), of `total`."""
    if not len(first):
        return total
    return total - int((before[first + sizes - 1] - before[first]).sum())


def after_last_anchor(before: np.ndarray, first: np.ndarray, sizes: np.ndarray,
                      total: int) -> np.ndarray:
    """Per cluster: cross-check matches from its last anchor up to the next cluster (or
    the end, `total`).

    A terminal there means the last anchor opens a layer; none means it is
    more likely an extra anchor (an output head) — evidence, not a decision.
    """
    upto = np.append(before[first[1:]], total)
    return upto - before[first + sizes - 1]


def cross_verdict(window_counts: np.ndarray, tails: np.ndarray, sizes: np.ndarray) -> str:
    """What the cross-check counts are consistent with (one sentence, no choice made)."""
    bad = int(np.count_nonzero(window_counts != 1))
    if bad:
        return (
            f"{bad} window(s) without exactly one match: there the anchor or the cross-check "
            "kernel does not run once per layer (a different phase, a partial pass, or the "
            "wrong landmark)"
        )
    if not len(window_counts) or (sizes != sizes[0]).any():
        return "every counted window holds exactly one match"
    size = int(sizes[0])
    if (tails == 0).all():
        return (
            f"every cluster has {size - 1} windows with one match each and none after its last "
            f"anchor: consistent with {size - 1} layers + 1 extra anchor per pass"
        )
    if (tails == 1).all():
        return (
            f"every window holds one match and one more follows each cluster's last anchor: "
            f"consistent with {size} layers per pass"
        )
    return "every counted window holds exactly one match; the matches after the last anchor vary"


def _histogram(values: np.ndarray) -> dict[str, int]:
    distinct, counts = np.unique(values, return_counts=True)
    return {str(k): v for k, v in zip(distinct.tolist(), counts.tolist())}


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
                 right: Sequence[bool] | None = None, indent: str = "  ") -> str:
    """Aligned columns; `right[i]` right-aligns column i (numbers)."""
    cells = [cell_texts(row) for row in rows]
    columns = [list(column) for column in zip(*cells, strict=True)] or [[] for _ in headers]
    return "\n".join(table_lines(headers, lambda: iter([columns]), right, indent))


def cell_text(value: Any) -> str:
    """A table cell of a value (None is printed as '-')."""
    return "-" if value is None else str(value)


def cell_texts(values: Iterable[Any]) -> list[str]:
    """Table cells of values."""
    return list(map(cell_text, values))


def table_lines(headers: Sequence[str], make_batches, right: Sequence[bool] | None = None,
                indent: str = "  ", widest=None) -> Iterator[str]:
    """Lines of an aligned table. `make_batches()` yields the cells a batch of rows at a
    time, as columns of texts; it is called twice (widths, then lines), so a table of
    millions of rows never exists as a whole. `widest()`, when given, replaces the widths
    pass: it yields (in the same shape) only cells that include the widest of each column,
    so the rows are not all formatted twice."""
    right = right or [False] * len(headers)
    widths = [len(h) for h in headers]
    for columns in (widest or make_batches)():
        widths = [max(w, max(map(len, column), default=0))
                  for w, column in zip(widths, columns, strict=True)]
    template = indent.replace("{", "{{").replace("}", "}}") + "  ".join(
        ("{:>%d}" if r else "{:<%d}") % w for w, r in zip(widths, right, strict=True))
    yield template.format(*headers).rstrip()
    for columns in make_batches():
        yield from map(str.rstrip, map(template.format, *columns))


def short(name: Any, width: int = NAME_WIDTH) -> str | None:
    """A name cut to `width` characters for tables (None stays None: printed as '-')."""
    if name is None:
        return None
    text = str(name)
    return text if len(text) <= width else text[: width - 1] + "…"


def ms(ns: int | None, origin_ns: int) -> float | None:
    """Nanoseconds as milliseconds from the trace origin (µs precision)."""
    return None if ns is None else round((ns - origin_ns) / 1e6, 6)


def us_text(ns: int) -> str:
    """Nanoseconds as exact microsecond text with three decimals."""
    sign = "-" if ns < 0 else ""
    q, r = divmod(abs(ns), 1000)
    return f"{sign}{q}.{r:03d}"


def pid_text(pid: Any) -> str:
    """A pid for tables: string pids quoted, so `""` and `"Spans"` stand out from numbers."""
    return f'"{pid}"' if isinstance(pid, str) else str(pid)


def _pid_order(pid: Any):
    return (0, pid, "") if isinstance(pid, int) else (1, 0, str(pid))


def _top(counter: Counter, top: int) -> list[dict]:
    return [{"name": name, "count": n} for name, n in counter.most_common(top)]


# -- reading -----------------------------------------------------------------


def _index(trace, options: IndexOptions, stdin=None, progress=None,
           workers: int | None = None) -> TraceIndex:
    """The read-only commands' index pass (chunks observed in worker processes, as in
    `layers`, when the input is large enough or `workers` says so)."""
    with pool_for(str(trace), workers) as pool, \
            TraceSource(str(trace), stdin=stdin, read_once=True) as source:
        return run_index(source, options, progress=progress, pool=pool)


# -- inspect -----------------------------------------------------------------


def peak_overlaps(index: TraceIndex, groups: set[int]) -> dict[int, PeakOverlap]:
    """Per activity group, what the greedy lane allocator would reach: lanes = peak overlap
    (= what compaction would need), and the time the last lane opened. The read-only
    index's sweep holds slices only (index.PEAK_DTYPE)."""
    states: dict[int, PeakOverlap] = {g: PeakOverlap() for g in groups}
    for block in index.sweep.sorted_blocks():
        for g in groups:
            mask = block["group"] == g
            if not mask.any():
                continue
            states[g].add_block(block["key"][mask], block["hi"][mask])
    return states


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
    for pid in sorted(index.pids | set(activity) | set(scopes), key=_pid_order):
        meta = index.process_meta.get(pid, {})
        kind, why = process_kind(pid, meta, bool(activity[pid] or scopes[pid]), pid in host)
        rows.append({
            "pid": pid, "kind": kind, "kind_evidence": why, "name": meta.get("name"),
            "labels": meta.get("labels"), "sort_index": meta.get("sort_index"),
            "gpu_activity": activity[pid], "gpu_scopes": scopes[pid],
        })
    return rows


def _gpu_row(index: TraceIndex, g: int, lanes: PeakOverlap, origin_ns: int, top: int) -> dict:
    pid, device = index.groups[g]
    stats = index.group_stats[g]
    names = index.kernel_names.get(g, Counter())
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
        "first_ms": ms(stats.first_ns, origin_ns),
        "last_ms": ms(stats.last_ns, origin_ns),
        "span_ms": ms(stats.last_ns, stats.first_ns) if stats.first_ns is not None else None,
        "distinct_kernels": len(names),
        "top_kernels": _top(names, top),
    }


def inspect_index(index: TraceIndex, *, top: int = 30) -> dict:
    """The inspect report of an index built with count_names and sweep records."""
    origin_ns = index.origin.floor_ns() if index.origin is not None else 0
    gpu_groups = [g for g, (_, device) in enumerate(index.groups)
                  if device != SCOPES and index.group_stats[g].kinds]
    scope_groups = [g for g, (_, device) in enumerate(index.groups) if device == SCOPES]
    lanes = peak_overlaps(index, set(gpu_groups))
    gpu_groups.sort(key=lambda g: (_pid_order(index.groups[g][0]),
                                   _pid_order(index.groups[g][1])))
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
            "top": _top(index.cpu_annotations, top),
        },
        "flow_categories": [{"category": c, "count": n}
                            for c, n in index.flow_categories.most_common()],
        "guides": {
            "count": len(index.guides),
            "pids": sorted({g.pid for g in index.guides}, key=_pid_order),
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
                  workers: int | None = None) -> dict:
    """One streamed pass: processes, GPUs (counts, streams, peak overlap), names, flows.

    `workers`: processes for the per-chunk work (None: by input size; 0: none).
    """
    if top < 0:
        raise TraceError(f"--top must be >= 0, got {top}")
    options = IndexOptions(count_names=True, records=False, sweep=True)
    with collector_paused():
        index = _index(trace, options, stdin, progress, workers)
        try:
            return inspect_index(index, top=top)
        finally:
            index.close()


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
              g["sync"], g["max_overlap"], _f3(g["max_overlap_at_ms"]), _f3(g["first_ms"]),
              _f3(g["span_ms"])] for g in gpus],
            [True] * 11))
        out.append("  streams = stream rows with activity; peak overlap = lanes compaction "
                   "would need")
    for s in report["gpu_scopes"]:
        out.append(f"  GPU user scopes of pid {s['pid']}: {s['count']:,} on {s['streams']} row(s)")
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


def _f3(value: float | None) -> str | None:
    return None if value is None else f"{value:,.3f}"


# -- anchors -----------------------------------------------------------------


class StreamedRows(Sequence):
    """Rows of a report made a batch at a time from packed columns, never held as a whole:
    `rows(start, stop)` gives rows start..stop as dicts, `json_text` their JSON text."""

    def rows(self, start: int, stop: int) -> list[dict]:
        raise NotImplementedError

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            return self.rows(start, stop)[::step] if start < stop else []
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.rows(i, i + 1)[0]

    def __iter__(self):
        for start, stop in self.batches():
            yield from self.rows(start, stop)

    def batches(self, size: int = 4096) -> Iterator[tuple[int, int]]:
        """(start, stop) of consecutive row ranges: output is streamed a batch at a time."""
        for start in range(0, len(self), size):
            yield start, min(start + size, len(self))

    def json_text(self, start: int, stop: int) -> bytes:
        """Rows start..stop as JSON text, as `dumps` writes them in a list."""
        return dumps(self.rows(start, stop))[1:-1] if start < stop else b""


class MatchRows(StreamedRows):
    """The anchors report's match rows, made a batch at a time from the packed matches.

    A 10 GB trace holds millions of anchor matches: as dicts they would take GBs,
    so `anchors` streams them to its output instead of holding them.
    """

    def __init__(self, anchors: MatchView, first: np.ndarray, origin_ns: int):
        self.anchors = anchors
        self.first = first  # each cluster's first index
        self.origin_ns = origin_ns

    def __len__(self) -> int:
        return len(self.anchors)

    def rows(self, start: int, stop: int) -> list[dict]:
        columns = self.columns(start, stop)
        rows = [dict(zip(columns, values)) for values in zip(*columns.values())]
        for row in rows:
            row["ts_us"] = RawNumber(row["ts_us"].decode())
            row["dur_us"] = RawNumber(row["dur_us"].decode())
        return rows

    def columns(self, start: int, stop: int) -> dict[str, list]:
        """Rows start..stop a column at a time, exact times as bytes: no dict, Match or
        RawNumber per row (`self[i]` is row i of this)."""
        table = self.anchors.table
        rows, c = self._columns(start, stop)
        return {**{k: c[k] for k in ("index", "ts_us", "dur_us", "rel_ms", "gap_us")},
                "stream": [table.streams[s] for s in rows["stream"].tolist()],
                "tid": [table.tid_of(t) for t in rows["track"].tolist()],
                "cluster": c["cluster"], "event": c["event"]}

    def _times(self, start: int, stop: int) -> np.ndarray:
        """Floor ns of the starts of rows start..stop."""
        return self.anchors.table.starts[self.anchors.order[start:stop]]

    def _gaps(self, start: int, stop: int) -> np.ndarray:
        """Start-to-start gaps (ns) of rows start..stop; the first match's is NO_GAP."""
        if start:
            return np.diff(self._times(start - 1, stop))
        times = self._times(start, stop)
        gaps = np.empty(len(times), np.int64)
        gaps[1:] = np.diff(times)
        gaps[:1] = NO_GAP
        return gaps

    def _clusters(self, start: int, stop: int) -> np.ndarray:
        """The cluster of each of rows start..stop."""
        return np.searchsorted(self.first, np.arange(start, stop), "right") - 1

    def _columns(self, start: int, stop: int) -> tuple[np.ndarray, dict[str, list]]:
        """The packed rows start..stop, and every column but stream and tid."""
        table = self.anchors.table
        picked = self.anchors.order[start:stop]
        rows = table.take(picked)
        ts_texts, dur_texts = table.texts_of(picked, rows)
        times = self._times(start, stop)
        gaps = self._gaps(start, stop)
        first = 0 if start else 1  # the first match has no gap
        return rows, {
            "index": list(range(start, stop)),
            "ts_us": ts_texts,
            "dur_us": dur_texts,
            "rel_ms": list(map(round, ((times - self.origin_ns) / 1e6).tolist(), repeat(6))),
            "gap_us": [None] * first + list(
                map(round, (gaps[first:] / 1000).tolist(), repeat(3))),
            "cluster": self._clusters(start, stop).tolist(),
            "event": rows["ordinal"].tolist(),
        }

    def table_columns(self, start: int, stop: int) -> list[list[str]]:
        """Rows start..stop as the text table's cells, a column at a time (index, t ms,
        stream, dur us, gap us, cluster)."""
        rows, c = self._columns(start, stop)
        streams = self.anchors.table.streams
        return [list(map(str, c["index"])), [f"{v:,.3f}" for v in c["rel_ms"]],
                _texts(rows["stream"], lambda code: cell_text(streams[code])),
                [t.decode() for t in c["dur_us"]],
                ["-" if v is None else f"{v:,.3f}" for v in c["gap_us"]],
                list(map(str, c["cluster"]))]

    def widest_rows(self, start: int, stop: int) -> np.ndarray:
        """Of rows start..stop, a few that hold the widest text-table cell of each column.

        A number's cell grows with its magnitude on each side of zero, so the widest
        are at the smallest and largest start (t ms), gap and duration (each number
        form apart); the last row has the largest index and cluster; one row per
        stream, and every row kept as text, make up the rest.
        """
        rows = self.anchors.table.take(self.anchors.order[start:stop])
        times, gaps = self._times(start, stop), self._gaps(start, stop)
        found = [len(rows) - 1, times.argmin(), times.argmax(), gaps.argmin(), gaps.argmax(),
                 *np.flatnonzero(rows["form"] == AS_TEXT).tolist(),
                 *np.unique(rows["stream"], return_index=True)[1].tolist()]
        for form in (THREE_DECIMALS, INTEGER):
            at = np.flatnonzero(rows["form"] == form)
            if len(at):
                durs = rows["dur"][at]
                found += [at[durs.argmin()], at[durs.argmax()]]
        return start + np.unique(np.array(found, np.int64))

    def widest_columns(self) -> Iterator[list[list[str]]]:
        """`table_columns` of only the `widest_rows` of each batch (the widths pass)."""
        for start, stop in self.batches():
            for row in self.widest_rows(start, stop).tolist():
                yield self.table_columns(row, row + 1)

    def json_rows(self, start: int, stop: int) -> list[bytes]:
        """Rows start..stop as JSON objects (`self[i]` with its exact numbers spliced in as
        their text)."""
        if start >= stop:
            return []
        table = self.anchors.table
        rows, c = self._columns(start, stop)
        return list(map(_ROW.__mod__, zip(
            c["index"], c["ts_us"], c["dur_us"], _floats(c["rel_ms"]), _floats(c["gap_us"]),
            _dumped(rows["stream"], table.streams.__getitem__),
            _dumped(rows["track"], table.tid_of), c["cluster"], c["event"])))

    def json_text(self, start: int, stop: int) -> bytes:
        """Rows start..stop as JSON text, `b", ".join(self.json_rows(start, stop))`: in one
        call of the C extension where it is built (a 10 GB trace has millions of rows)."""
        native = _native.native
        if native is not None and start < stop:
            text = native.json_rows(stop - start, _ROW_PARTS, self._row_columns(start, stop),
                                    b", ")
            if text is not None:
                return text
        return b", ".join(self.json_rows(start, stop))

    def _row_columns(self, start: int, stop: int) -> tuple:
        """`json_rows`' columns as the C extension's json_rows takes them.

        rel_ms and gap_us go as their integer ns: `round(k / 1e6, 6)` of an integer k is
        the double nearest k / 10**6 (the division already is, and rounding it to six
        decimals gives it back while |k| < 2**53), so orjson's shortest text of it is
        that decimal itself wherever the extension writes it (see its json_rows).
        """
        native = _native.native
        table = self.anchors.table
        picked = self.anchors.order[start:stop]
        rows = table.take(picked)
        if (rows["form"] == THREE_DECIMALS).all():
            ts = (native.FIXED, np.ascontiguousarray(rows["start"]), 3)
            dur = (native.FIXED, np.ascontiguousarray(rows["dur"]), 3)
        elif (rows["form"] == INTEGER).all():  # whole µs: written as integers
            ts = (native.INTEGERS, rows["start"] // 1000)
            dur = (native.INTEGERS, rows["dur"] // 1000)
        else:
            ts_texts, dur_texts = table.texts_of(picked, rows)
            ts, dur = (native.TEXTS, ts_texts), (native.TEXTS, dur_texts)
        return (
            (native.INTEGERS, np.arange(start, stop, dtype=np.int64)), ts, dur,
            (native.SHORTEST, self._times(start, stop) - self.origin_ns, 6),
            (native.SHORTEST, self._gaps(start, stop), 3),  # NO_GAP is written as null
            _coded(native, rows["stream"], table.streams.__getitem__),
            _coded(native, rows["track"], table.tid_of),
            (native.INTEGERS, self._clusters(start, stop).astype(np.int64)),
            (native.INTEGERS, np.ascontiguousarray(rows["ordinal"], np.int64)),
        )


_ROW = (b'{"index": %d, "ts_us": %b, "dur_us": %b, "rel_ms": %b, "gap_us": %b, "stream": %b, '
        b'"tid": %b, "cluster": %d, "event": %d}')
_ROW_PARTS = tuple(re.split(rb"%[db]", _ROW))
NO_GAP = np.iinfo(np.int64).min  # what the C extension's json_rows writes as null


def _coded(native, codes: np.ndarray, value_of) -> tuple:
    """`_dumped` as a column for the C extension's json_rows: the texts by code."""
    inverse, texts = _distinct_texts(codes, lambda code: orjson.dumps(value_of(code)))
    return native.CODED, inverse.astype(np.int64).reshape(-1), texts


def _floats(values: list) -> list[bytes]:
    """JSON text of each float (or None), as orjson writes it: one call for the column."""
    return orjson.dumps(values)[1:-1].split(b",") if values else []


def _dumped(codes: np.ndarray, value_of) -> list[bytes]:
    """JSON text of the value behind each code; each distinct code is dumped once."""
    return _texts(codes, lambda code: orjson.dumps(value_of(code)))


def _texts(codes: np.ndarray, text_of) -> list:
    """`text_of(code)` for each code, computed once per distinct code."""
    inverse, texts = _distinct_texts(codes, text_of)
    return list(map(texts.__getitem__, inverse.tolist()))


def _distinct_texts(codes: np.ndarray, text_of) -> tuple[np.ndarray, list]:
    """(each code's position among the distinct codes, `text_of` each distinct code)."""
    distinct, inverse = np.unique(codes, return_inverse=True)
    return inverse, [text_of(code) for code in distinct.tolist()]


class ClusterRows(StreamedRows):
    """One row per cluster: its first match's start and its last match's exact end (a
    nightly trace has hundreds of thousands of passes: rows are made a batch at a time)."""

    def __init__(self, anchors: MatchView, first: np.ndarray, sizes: np.ndarray,
                 origin_ns: int):
        self.anchors = anchors
        self.first = first
        self.sizes = sizes
        self.origin_ns = origin_ns

    def __len__(self) -> int:
        return len(self.first)

    def _packed(self, start: int, stop: int) -> tuple:
        """(first index, size, start text, end text, start ns, end ns) of clusters
        start..stop, a column each (numbers as int64 arrays)."""
        first = self.first[start:stop]
        sizes = self.sizes[start:stop]
        table = self.anchors.table
        starts = self.anchors.order[first]
        starts_ns = table.starts[starts]  # the floor ns of each ts
        start_texts = table.start_texts(starts)
        end_texts, ends_ns = table.ends_of(self.anchors.order[first + sizes - 1])
        return first, sizes, start_texts, end_texts, starts_ns, np.asarray(ends_ns, np.int64)

    def _columns(self, start: int, stop: int) -> tuple:
        """(first index, size, start text, end text, start ms, span ms) of clusters
        start..stop, a column each."""
        first, sizes, start_texts, end_texts, starts_ns, ends_ns = self._packed(start, stop)
        start_ms = list(map(round, ((starts_ns - self.origin_ns) / 1e6).tolist(), repeat(6)))
        span_ms = list(map(round, ((ends_ns - starts_ns) / 1e6).tolist(), repeat(6)))
        return first.tolist(), sizes.tolist(), start_texts, end_texts, start_ms, span_ms

    def rows(self, start: int, stop: int) -> list[dict]:
        return [
            {"start_index": index, "count": n, "start_us": RawNumber(start_text.decode()),
             "end_us": RawNumber(end_text.decode()), "start_ms": rel, "span_ms": span}
            for index, n, start_text, end_text, rel, span in zip(*self._columns(start, stop))
        ]

    def json_text(self, start: int, stop: int) -> bytes:
        """Rows start..stop as `dumps` writes them: in one call of the C extension where it
        is built (the ms columns as their integer ns, see MatchRows._row_columns), else
        one template per row."""
        native = _native.native
        if native is not None and start < stop:
            first, sizes, start_texts, end_texts, starts_ns, ends_ns = self._packed(start, stop)
            text = native.json_rows(stop - start, _CLUSTER_ROW_PARTS, (
                (native.INTEGERS, np.ascontiguousarray(first, np.int64)),
                (native.INTEGERS, np.ascontiguousarray(sizes, np.int64)),
                (native.TEXTS, start_texts), (native.TEXTS, end_texts),
                (native.SHORTEST, starts_ns - self.origin_ns, 6),
                (native.SHORTEST, ends_ns - starts_ns, 6)), b", ")
            if text is not None:
                return text
        first, sizes, start_texts, end_texts, start_ms, span_ms = self._columns(start, stop)
        return b", ".join(map(_CLUSTER_ROW.__mod__, zip(
            first, sizes, start_texts, end_texts, _floats(start_ms), _floats(span_ms))))

    def table_columns(self, start: int, stop: int) -> list[list[str]]:
        """Rows start..stop as the text table's cells (cluster, first index, count,
        start ms, span ms), a column at a time."""
        first, sizes, _, _, start_ms, span_ms = self._columns(start, stop)
        return [list(map(str, range(start, stop))), list(map(str, first)),
                list(map(str, sizes)), [f"{v:,.3f}" for v in start_ms],
                [f"{v:,.3f}" for v in span_ms]]


_CLUSTER_ROW = (b'{"start_index": %d, "count": %d, "start_us": %b, "end_us": %b, '
                b'"start_ms": %b, "span_ms": %b}')
_CLUSTER_ROW_PARTS = tuple(re.split(rb"%[db]", _CLUSTER_ROW))


class FlaggedRows(StreamedRows):
    """The cross-check's windows without exactly one match, one row each (made a batch at
    a time: with the wrong landmark, every window of millions is flagged)."""

    def __init__(self, anchors: MatchView, windows: np.ndarray, counts: np.ndarray):
        self.anchors = anchors
        self.windows = windows  # each flagged window's first anchor
        self.counts = counts

    def __len__(self) -> int:
        return len(self.windows)

    def rows(self, start: int, stop: int) -> list[dict]:
        windows = self.windows[start:stop]
        table = self.anchors.table
        from_texts = table.start_texts(self.anchors.order[windows])
        to_texts = table.start_texts(self.anchors.order[windows + 1])
        return [
            {"from_index": i, "to_index": i + 1, "count": n,
             "start_us": RawNumber(a.decode()), "end_us": RawNumber(b.decode())}
            for i, n, a, b in zip(windows.tolist(), self.counts[start:stop].tolist(),
                                  from_texts, to_texts)
        ]


def exact_before(anchors: MatchView, cross: MatchView, block: int = 1 << 16) -> np.ndarray:
    """`matches_before` in exact time, a block of anchors at a time.

    Where an anchor and a cross-check match start in the same ns and either is
    kept as text (it may have digits below 1 ns), their exact values decide.
    Such ties are rare; only they are compared one by one.
    """
    cross_ns = cross.starts
    cross_text = None  # cross-check matches kept as text before each position, if any
    if cross.table.texts:
        cross_text = np.zeros(len(cross) + 1, np.int32)
        np.cumsum(cross.table.as_text(cross.order), out=cross_text[1:])
    table = anchors.table
    before = np.empty(len(anchors), np.int32 if len(cross) < 2**31 else np.int64)
    for lo in range(0, len(anchors), block):
        picked = anchors.order[lo : lo + block]
        anchor_ns = table.starts[picked]
        found = matches_before(anchor_ns, cross_ns)
        tied_upto = np.searchsorted(cross_ns, anchor_ns, "right")
        tied = np.flatnonzero(tied_upto > found)
        some_text = table.as_text(picked[tied])
        if cross_text is not None:
            some_text |= cross_text[tied_upto[tied]] > cross_text[found[tied]]
        for k in tied[some_text].tolist():
            first, stop = int(found[k]), int(tied_upto[k])
            found[k] = first + bisect_left([cross[j].ts for j in range(first, stop)],
                                           anchors[lo + k].ts)
        before[lo : lo + len(picked)] = found
    return before


def _cross_check(index: TraceIndex, regex: str, anchors: MatchView, first: np.ndarray,
                 sizes: np.ndarray, pid, device) -> dict:
    cross = on_gpu(index.matches["cross"], pid, device)
    before = exact_before(anchors, cross)
    counts, inside = window_counts(before, first)
    counted = counts[inside]
    flagged = np.flatnonzero(inside & (counts != 1))
    tails = after_last_anchor(before, first, sizes, len(cross))
    return {
        "regex": regex,
        "matches": len(cross),
        "windows": len(counted),
        "counts": _histogram(counted),
        "flagged": FlaggedRows(anchors, flagged, counts[flagged]),
        "outside_windows": outside_windows(before, first, sizes, len(cross)),
        "after_last_anchor": _histogram(tails),
        "verdict": cross_verdict(counted, tails, sizes),
        "rule": "counts matches in [anchor i, anchor i+1) for consecutive anchors inside a "
                "cluster only (the gap between clusters is not a layer); flags counts != 1",
    }


def find_anchors(trace, anchor_regex: str, *, pid=None, device=None,
                 cross_check: str | None = None, factor: float = GAP_FACTOR,
                 stdin=None, progress=None, workers: int | None = None) -> dict:
    """Every match of the anchor on one GPU in time order, its clusters, and a verdict.

    `workers`: processes for the per-chunk work (None: by input size; 0: none).
    The report's match, cluster and flagged-window rows are `StreamedRows`: made
    from the packed matches a batch at a time as they are written.
    """
    if (problem := gap_factor_problem(factor)) is not None:
        raise SpecError(Option("gap_factor"), problem)
    patterns = {"anchor": compile_pattern(anchor_regex, "anchor_regex")}
    if cross_check is not None:
        patterns["cross"] = compile_pattern(cross_check, "cross_check")
    options = IndexOptions(patterns=patterns, records=False, sweep=False, stats=False,
                           track_facts=False)
    with collector_paused():
        return _anchors_report(_index(trace, options, stdin, progress, workers), anchor_regex,
                               pid, device, cross_check, factor)


def _anchors_report(index: TraceIndex, anchor_regex: str, pid, device,
                    cross_check: str | None, factor: float) -> dict:
    try:
        found = index.matches["anchor"]
        if not found:
            raise SpecError("no kernel matches ", Option("anchor_regex"), f" {anchor_regex!r}")
        pid, device = select_gpu(found, pid, device, "anchor_regex")
        anchors = on_gpu(found, pid, device)
        between = start_gaps(anchors)
        if len(between):
            # in place: the median reorders the gaps (a copy would cost 8 bytes a match),
            # which are then computed again
            median = float(np.median(between, overwrite_input=True))
            start_gaps(anchors, out=between)
            first = starts_at_breaks(between, median, factor)
        else:
            median, first = None, np.zeros(1, np.int64)
        sizes = np.diff(first, append=len(anchors))
        spread = separation(between, first, median)
        del between  # 8 bytes a match: the rows compute their own gaps
        origin_ns = index.origin.floor_ns() if index.origin is not None else 0
        report = {
            "anchor_regex": anchor_regex,
            "pid": pid,
            "device": device,
            "count": len(anchors),
            "names": anchors.name_counts(),
            "matches": MatchRows(anchors, first, origin_ns),
            "clusters": ClusterRows(anchors, first, sizes, origin_ns),
            "median_gap_us": None if median is None else round(median / 1000, 3),
            "gap_factor": factor,
            "rule": rule_text(factor, median),
            "separation": spread,
            "verdict": verdict_text(len(anchors), first, sizes, spread["max_inside_ratio"]),
            "origin_us": RawNumber(index.origin_text) if index.origin_text else None,
        }
        if cross_check is not None:
            report["cross_check"] = _cross_check(index, cross_check, anchors, first, sizes,
                                                 pid, device)
        return report
    finally:
        index.close()


def start_gaps(anchors: MatchView, block: int = 1 << 16,
               out: np.ndarray | None = None) -> np.ndarray:
    """Start-to-start gaps (ns) of the matches in view order (into `out` when given),
    computed a block at a time (the whole column of starts in view order is never made)."""
    starts = anchors.table.starts
    order = anchors.order
    if out is None:
        out = np.empty(max(len(order) - 1, 0), np.int64)
    for lo in range(0, len(out), block):
        hi = min(lo + block, len(out))
        times = starts[order[lo : hi + 1]]
        np.subtract(times[1:], times[:-1], out=out[lo:hi])
    return out


def _placeholder(key: str) -> bytes:
    return b'"\x00%s\x00"' % key.encode()  # orjson never writes a NUL byte


def anchors_json(report: dict) -> Iterator[bytes]:
    """The anchors report as one JSON object, in pieces: its rows (matches, clusters,
    flagged windows) are streamed a batch at a time.

    An empty list of flagged windows stays in the head: `dumps` writes an object
    without exact numbers in orjson's compact form, as it always has.
    """
    streamed = {"matches": report["matches"], "clusters": report["clusters"]}
    head = {**report, **{key: RawJSON(_placeholder(key)) for key in streamed}}
    cross = report.get("cross_check")
    if cross is not None and len(cross["flagged"]):
        streamed["flagged"] = cross["flagged"]
        head["cross_check"] = {**cross, "flagged": RawJSON(_placeholder("flagged"))}
    elif cross is not None:
        head["cross_check"] = {**cross, "flagged": []}
    text = dumps(head)
    for key, rows in streamed.items():
        before, text = text.split(_placeholder(key))
        yield before + b"["
        for start, stop in rows.batches():
            yield (b", " if start else b"") + rows.json_text(start, stop)
        yield b"]"
    yield text


def anchors_lines(report: dict) -> Iterator[str]:
    """Human-readable anchors report, a line at a time: matches (streamed, never held as a
    whole), clusters, rule, cross-check, verdict."""
    names = ", ".join(f"{short(n, 60)} ({c})" for n, c in report["names"].items())
    yield (f"anchor {report['anchor_regex']!r} on pid {report['pid']} device "
           f"{report['device']}: {report['count']} matches ({names})")
    yield (f"times: ms from the trace origin (ts {report['origin_us']} us); index = the number "
           "--anchor-offset refers to")
    yield ""

    def match_columns():
        rows = report["matches"]
        return (rows.table_columns(start, stop) for start, stop in rows.batches())

    yield from table_lines(["index", "t ms", "stream", "dur us", "gap us", "cluster"],
                           match_columns, [True] * 6, widest=report["matches"].widest_columns)
    out = [
        "",
        f"clusters: {report['rule']}",
    ]
    sep = report["separation"]
    if sep["max_inside_ratio"] is not None:
        between = sep["min_between_ratio"]
        out.append(
            f"  largest gap inside a cluster: {sep['max_inside_ratio']:g} x median; smallest gap "
            "between clusters: " + (f"{between:g} x median" if between is not None else "-"))
    yield from out

    def cluster_columns():
        rows = report["clusters"]
        return (rows.table_columns(start, stop) for start, stop in rows.batches())

    yield from table_lines(["cluster", "first index", "count", "start ms", "span ms"],
                           cluster_columns, [True] * 5)
    out = []
    cross = report.get("cross_check")
    if cross is not None:
        counts = ", ".join(f"{n} window(s) with {k}" for k, n in cross["counts"].items())
        tails = ", ".join(f"{n} cluster(s) with {k} match(es)"
                          for k, n in cross["after_last_anchor"].items())
        out += [
            "",
            f"cross-check {cross['regex']!r}: {cross['matches']} matches on this GPU; "
            f"{cross['windows']} windows between consecutive anchors inside a cluster "
            "(the gap between clusters is not a layer and is not counted)",
            f"  {counts or 'no windows'}; {cross['outside_windows']} match(es) outside the "
            "counted windows",
            f"  after the last anchor of a cluster (up to the next cluster): {tails}",
        ]
        yield from out
        out = []
        flagged = cross["flagged"]
        if len(flagged):

            def flagged_columns():
                for start, stop in flagged.batches():
                    batch = flagged.rows(start, stop)
                    yield [cell_texts(r[key] for r in batch) for key in (
                        "from_index", "to_index", "count", "start_us", "end_us")]

            yield from table_lines(
                ["from index", "to index", "count", "window start us", "window end us"],
                flagged_columns, [True] * 5)
        out.append(f"  cross-check verdict: {cross['verdict']}")
    out += ["", f"verdict: {report['verdict']}",
            "(no offset or layer count is chosen for you: pass --anchor-offset, --num-layers "
            "and --extra-anchors-per-pass to `layers` yourself)"]
    yield from out
