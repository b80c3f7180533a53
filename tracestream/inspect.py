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

from tracestream import speedups
from tracestream.api import compile_pattern
from tracestream.cadence import GAP_FACTOR, cluster_matches, gaps, rule_text
from tracestream.errors import Option, SpecError, TraceError
from tracestream.events import GPU_SCOPE, KERNEL, MEMCPY, MEMSET, SYNC
from tracestream.guides import on_gpu, select_gpu
from tracestream.index import SCOPES, IndexOptions, Match, TraceIndex, run_index
from tracestream.jsontext import RawJSON, RawNumber, dumps
from tracestream.lanes import GroupLanes
from tracestream.matches import THREE_DECIMALS, MatchView
from tracestream.progress import Progress
from tracestream.source import TraceSource
from tracestream.spill import take_rows
from tracestream.workers import collector_paused, pool_for

INSIDE_VARIATION = 1.1
"""Largest in-cluster gap (in median gaps) above which the verdict mentions sub-structure."""

NAME_WIDTH = 110  # longest kernel/annotation name in human-readable tables


# -- small pure helpers --------------------------------------------------------


def separation(times: Sequence[int], clusters: Sequence[tuple[int, int]],
               median_ns: float | None) -> dict:
    """Largest gap inside clusters and smallest gap between them, in median gaps.

    This is the margin of the rule: a clean split has inside ~1 and between >> 1.
    """
    if median_ns is None or median_ns <= 0:
        return {"max_inside_ratio": None, "min_between_ratio": None}
    between_gaps = gaps(times)
    first_of_cluster = np.array([start for start, _ in clusters[1:]], np.int64)
    is_between = np.zeros(len(between_gaps), bool)
    is_between[first_of_cluster - 1] = True
    inside = between_gaps[~is_between]
    between = between_gaps[is_between]
    return {
        "max_inside_ratio": round(int(inside.max()) / median_ns, 2) if len(inside) else None,
        "min_between_ratio": round(int(between.min()) / median_ns, 2) if len(between) else None,
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


def verdict_text(count: int, clusters: Sequence[tuple[int, int]],
                 max_inside_ratio: float | None = None) -> str:
    """One line: what the cluster sizes are consistent with. States facts, picks nothing."""
    text = _sizes_text(count, clusters)
    if max_inside_ratio is not None and max_inside_ratio > INSIDE_VARIATION:
        text += (
            f"; gaps inside clusters reach {max_inside_ratio:g} x the median: a cluster may "
            "hold several short passes or layers of different kinds (see the gap column)"
        )
    return text


def _sizes_text(count: int, clusters: Sequence[tuple[int, int]]) -> str:
    sizes = Counter(n for _, n in clusters)
    if len(clusters) == 1:
        return (
            f"{count} match(es) in 1 cluster: the gaps do not separate passes; "
            f"{count} is consistent with {readings(count)}, or with several passes whose "
            "gaps are not larger — verify in the model config and the timeline"
        )
    if len(sizes) == 1:
        size = clusters[0][1]
        return (
            f"{len(clusters)} clusters of {size}: consistent with {readings(size)} — "
            "verify in the model config"
        )
    common, times = sizes.most_common(1)[0]
    odd = [(s, n) for s, n in clusters if n != common]
    listing = ", ".join(f"{n} at index {s}" for s, n in odd[:6]) + (" …" if len(odd) > 6 else "")
    return (
        f"{len(clusters)} clusters of unequal size: {times} of {common} ({readings(common)}); "
        f"others: {listing}. A short first or last cluster may be a pass cut by the capture "
        "window; another size may be another phase — the offset must start a complete pass of "
        "the verified phase; verify in the model config"
    )


def exact_key(match: Match) -> tuple:
    """Sort key in exact time order that compares as plain ints unless the ns floors tie."""
    return (match.ts.floor_ns(), match.ts)


def cross_check_windows(anchor_ts: Sequence, cross_ts: Sequence,
                        clusters: Sequence[tuple[int, int]]) -> list[dict]:
    """Count cross-check matches in [anchor i, anchor i+1) for consecutive anchors of a cluster.

    Windows that span two clusters are not counted: the gap between passes is
    not a layer. Both sequences must be sorted; times compare exactly.
    """
    windows = []
    for start, n in clusters:
        for i in range(start, start + n - 1):
            lo = bisect_left(cross_ts, anchor_ts[i])
            hi = bisect_left(cross_ts, anchor_ts[i + 1])
            windows.append({"from_index": i, "to_index": i + 1, "count": hi - lo})
    return windows


def outside_windows(anchor_ts: Sequence, cross_ts: Sequence,
                    clusters: Sequence[tuple[int, int]]) -> int:
    """Cross-check matches that fall in no counted window (before, between or after clusters)."""
    inside = 0
    for start, n in clusters:
        inside += bisect_left(cross_ts, anchor_ts[start + n - 1]) - bisect_left(
            cross_ts, anchor_ts[start])
    return len(cross_ts) - inside


def after_last_anchor(anchor_ts: Sequence, cross_ts: Sequence,
                      clusters: Sequence[tuple[int, int]]) -> list[int]:
    """Per cluster: cross-check matches from its last anchor up to the next cluster (or the end).

    A terminal there means the last anchor opens a layer; none means it is
    more likely an extra anchor (an output head) — evidence, not a decision.
    """
    counts = []
    for c, (start, n) in enumerate(clusters):
        lo = bisect_left(cross_ts, anchor_ts[start + n - 1])
        hi = (bisect_left(cross_ts, anchor_ts[clusters[c + 1][0]]) if c + 1 < len(clusters)
              else len(cross_ts))
        counts.append(hi - lo)
    return counts


def cross_verdict(window_counts: Sequence[int], tails: Sequence[int],
                  clusters: Sequence[tuple[int, int]]) -> str:
    """What the cross-check counts are consistent with (one sentence, no choice made)."""
    bad = sum(1 for n in window_counts if n != 1)
    if bad:
        return (
            f"{bad} window(s) without exactly one match: there the anchor or the cross-check "
            "kernel does not run once per layer (a different phase, a partial pass, or the "
            "wrong landmark)"
        )
    sizes = {n for _, n in clusters}
    if not window_counts or len(sizes) != 1:
        return "every counted window holds exactly one match"
    size = sizes.pop()
    if all(t == 0 for t in tails):
        return (
            f"every cluster has {size - 1} windows with one match each and none after its last "
            f"anchor: consistent with {size - 1} layers + 1 extra anchor per pass"
        )
    if all(t == 1 for t in tails):
        return (
            f"every window holds one match and one more follows each cluster's last anchor: "
            f"consistent with {size} layers per pass"
        )
    return "every counted window holds exactly one match; the matches after the last anchor vary"


def _histogram(values: Iterable[int]) -> dict[str, int]:
    return {str(k): v for k, v in sorted(Counter(values).items())}


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
                indent: str = "  ") -> Iterator[str]:
    """Lines of an aligned table. `make_batches()` yields the cells a batch of rows at a
    time, as columns of texts; it is called twice (widths, then lines), so a table of
    millions of rows never exists as a whole."""
    right = right or [False] * len(headers)
    widths = [len(h) for h in headers]
    for columns in make_batches():
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


def _index(trace, options: IndexOptions, stdin=None, quiet: bool = True,
           workers: int | None = None) -> TraceIndex:
    """The read-only commands' index pass (chunks observed in worker processes, as in
    `layers`, when the input is large enough or `workers` says so)."""
    with pool_for(str(trace), workers) as pool, \
            TraceSource(str(trace), stdin=stdin) as source:
        return run_index(source, options, progress=Progress.for_terminal(quiet), pool=pool)


# -- inspect -----------------------------------------------------------------


def peak_overlaps(index: TraceIndex, groups: set[int]) -> dict[int, GroupLanes]:
    """The greedy lane allocator over each activity group: lanes = peak overlap (= what
    compaction would need), and the time the last lane opened. The read-only index's
    sweep holds slices only (index.PEAK_DTYPE)."""
    states: dict[int, GroupLanes] = {g: GroupLanes() for g in groups}
    for block in index.sweep.sorted_blocks():
        for g in groups:
            mask = block["group"] == g
            if not mask.any():
                continue
            states[g].place_block(block["key"][mask], block["hi"][mask])
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


def _gpu_row(index: TraceIndex, g: int, lanes: GroupLanes, origin_ns: int, top: int) -> dict:
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


def inspect_trace(trace, *, top: int = 30, stdin=None, quiet: bool = True,
                  workers: int | None = None) -> dict:
    """One streamed pass: processes, GPUs (counts, streams, peak overlap), names, flows.

    `workers`: processes for the per-chunk work (None: by input size; 0: none).
    """
    if top < 0:
        raise TraceError(f"--top must be >= 0, got {top}")
    options = IndexOptions(count_names=True, records=False, sweep=True)
    with collector_paused():
        index = _index(trace, options, stdin, quiet, workers)
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
        out += ["", f"top kernels of pid {g['pid']} device {g['device']} "
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


class MatchRows(Sequence):
    """The anchors report's match rows, made one at a time from the packed matches.

    A 10 GB trace holds millions of anchor matches: as dicts they would take GBs,
    so `anchors` streams them to its output instead of holding them.
    """

    def __init__(self, anchors: MatchView, times: np.ndarray, clusters, origin_ns: int):
        self.anchors = anchors
        self.times = times
        self.cluster_of = np.repeat(np.arange(len(clusters)), [n for _, n in clusters])
        self.origin_ns = origin_ns

    def __len__(self) -> int:
        return len(self.anchors)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        row = {key: values[0] for key, values in self.columns(i, i + 1).items()}
        row["ts_us"] = RawNumber(row["ts_us"].decode())
        row["dur_us"] = RawNumber(row["dur_us"].decode())
        return row

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def batches(self, size: int = 4096) -> Iterator[tuple[int, int]]:
        """(start, stop) of consecutive row ranges: output is streamed a batch at a time."""
        for start in range(0, len(self), size):
            yield start, min(start + size, len(self))

    def columns(self, start: int, stop: int) -> dict[str, list]:
        """Rows start..stop a column at a time, exact times as bytes: no dict, Match or
        RawNumber per row (`self[i]` is row i of this)."""
        table = self.anchors.table
        rows, c = self._columns(start, stop)
        return {**{k: c[k] for k in ("index", "ts_us", "dur_us", "rel_ms", "gap_us")},
                "stream": [table.streams[s] for s in rows["stream"].tolist()],
                "tid": [table.tid_of(t) for t in rows["track"].tolist()],
                "cluster": c["cluster"], "event": c["event"]}

    def _gaps(self, start: int, stop: int) -> np.ndarray:
        """Start-to-start gaps (ns) of rows start..stop; the first match's is NO_GAP."""
        times = self.times[start:stop]
        gaps = np.empty(len(times), np.int64)
        gaps[1:] = np.diff(times)
        if len(gaps):
            gaps[0] = times[0] - self.times[start - 1] if start else NO_GAP
        return gaps

    def _columns(self, start: int, stop: int) -> tuple[np.ndarray, dict[str, list]]:
        """The packed rows start..stop, and every column but stream and tid."""
        table = self.anchors.table
        picked = self.anchors.order[start:stop]
        ts_texts, dur_texts = table.texts_of(picked)
        times = self.times[start:stop]
        gaps = self._gaps(start, stop)
        first = 0 if start else 1  # the first match has no gap
        rows = take_rows(table.rows, picked)
        return rows, {
            "index": list(range(start, stop)),
            "ts_us": ts_texts,
            "dur_us": dur_texts,
            "rel_ms": list(map(round, ((times - self.origin_ns) / 1e6).tolist(), repeat(6))),
            "gap_us": [None] * first + list(
                map(round, (gaps[first:] / 1000).tolist(), repeat(3))),
            "cluster": self.cluster_of[start:stop].tolist(),
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
        native = speedups.native
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
        native = speedups.native
        table = self.anchors.table
        picked = self.anchors.order[start:stop]
        rows = take_rows(table.rows, picked)
        if (rows["form"] == THREE_DECIMALS).all():
            ts = (native.FIXED, np.ascontiguousarray(rows["start"]), 3)
            dur = (native.FIXED, np.ascontiguousarray(rows["dur"]), 3)
        else:
            ts_texts, dur_texts = table.texts_of(picked)
            ts, dur = (native.TEXTS, ts_texts), (native.TEXTS, dur_texts)
        return (
            (native.INTEGERS, np.arange(start, stop, dtype=np.int64)), ts, dur,
            (native.SHORTEST, self.times[start:stop] - self.origin_ns, 6),
            (native.SHORTEST, self._gaps(start, stop), 3),  # NO_GAP is written as null
            _coded(native, rows["stream"], table.streams.__getitem__),
            _coded(native, rows["track"], table.tid_of),
            (native.INTEGERS, np.ascontiguousarray(self.cluster_of[start:stop], np.int64)),
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


def _cluster_rows(anchors: MatchView, clusters, origin_ns: int) -> list[dict]:
    """One row per cluster: its first match's start and its last match's exact end."""
    if not clusters:
        return []
    first = np.array([start for start, _ in clusters], np.int64)
    last = first + np.array([n for _, n in clusters], np.int64) - 1
    table = anchors.table
    starts_ns = table.rows["start"][anchors.order[first]]  # the floor ns of each ts
    start_texts, _ = table.texts_of(anchors.order[first])
    end_texts, ends_ns = table.ends_of(anchors.order[last])
    start_ms = ((starts_ns - origin_ns) / 1e6).tolist()
    span_ms = ((ends_ns - starts_ns) / 1e6).tolist()
    return [
        {
            "start_index": start,
            "count": n,
            "start_us": RawNumber(start_text.decode()),
            "end_us": RawNumber(end_text.decode()),
            "start_ms": round(rel, 6),
            "span_ms": round(span, 6),
        }
        for (start, n), start_text, end_text, rel, span in zip(
            clusters, start_texts, end_texts, start_ms, span_ms)
    ]


def _cross_check(index: TraceIndex, regex: str, anchors: list[Match], clusters,
                 pid, device) -> dict:
    cross = on_gpu(index.matches.get("cross", []), pid, device)
    cross_ts = [exact_key(m) for m in cross]
    anchor_ts = [exact_key(m) for m in anchors]
    windows = cross_check_windows(anchor_ts, cross_ts, clusters)
    tails = after_last_anchor(anchor_ts, cross_ts, clusters)
    flagged = []
    for w in windows:
        if w["count"] != 1:
            a, b = anchors[w["from_index"]], anchors[w["to_index"]]
            flagged.append({**w, "start_us": RawNumber(a.ts_text), "end_us": RawNumber(b.ts_text)})
    return {
        "regex": regex,
        "matches": len(cross),
        "windows": len(windows),
        "counts": _histogram(w["count"] for w in windows),
        "flagged": flagged,
        "outside_windows": outside_windows(anchor_ts, cross_ts, clusters),
        "after_last_anchor": _histogram(tails),
        "verdict": cross_verdict([w["count"] for w in windows], tails, clusters),
        "rule": "counts matches in [anchor i, anchor i+1) for consecutive anchors inside a "
                "cluster only (the gap between clusters is not a layer); flags counts != 1",
    }


def find_anchors(trace, anchor_regex: str, *, pid=None, device=None,
                 cross_check: str | None = None, factor: float = GAP_FACTOR,
                 stdin=None, quiet: bool = True, workers: int | None = None) -> dict:
    """Every match of the anchor on one GPU in time order, its clusters, and a verdict.

    `workers`: processes for the per-chunk work (None: by input size; 0: none).
    """
    if not factor > 1:
        raise SpecError(Option("gap_factor"), f" must be > 1, got {factor}")
    patterns = {"anchor": compile_pattern(anchor_regex, "anchor_regex")}
    if cross_check is not None:
        patterns["cross"] = compile_pattern(cross_check, "cross_check")
    options = IndexOptions(patterns=patterns, records=False, sweep=False, stats=False)
    with collector_paused():
        return _anchors_report(_index(trace, options, stdin, quiet, workers), anchor_regex,
                               pid, device, cross_check, factor)


def _anchors_report(index: TraceIndex, anchor_regex: str, pid, device,
                    cross_check: str | None, factor: float) -> dict:
    try:
        found = index.matches["anchor"]
        if not found:
            raise SpecError("no kernel matches ", Option("anchor_regex"), f" {anchor_regex!r}")
        pid, device = select_gpu(found, pid, device, "anchor_regex")
        anchors = on_gpu(found, pid, device)
        times = anchors.starts
        clusters, median = cluster_matches(times, factor)
        origin_ns = index.origin.floor_ns() if index.origin is not None else 0
        spread = separation(times, clusters, median)
        report = {
            "anchor_regex": anchor_regex,
            "pid": pid,
            "device": device,
            "count": len(anchors),
            "names": anchors.name_counts(),
            "matches": MatchRows(anchors, times, clusters, origin_ns),
            "clusters": _cluster_rows(anchors, clusters, origin_ns),
            "median_gap_us": None if median is None else round(median / 1000, 3),
            "gap_factor": factor,
            "rule": rule_text(factor, median),
            "separation": spread,
            "verdict": verdict_text(len(anchors), clusters, spread["max_inside_ratio"]),
            "origin_us": RawNumber(index.origin_text) if index.origin_text else None,
        }
        if cross_check is not None:
            report["cross_check"] = _cross_check(index, cross_check, anchors, clusters,
                                                 pid, device)
        return report
    finally:
        index.close()


_ROWS_PLACEHOLDER = b'"\x00matches\x00"'


_CLUSTER_ROW = (b'{"start_index": %d, "count": %d, "start_us": %b, "end_us": %b, '
                b'"start_ms": %b, "span_ms": %b}')


def _clusters_json(rows: list[dict]) -> RawJSON:
    """`dumps(rows)` of the cluster rows, one template per row (there are tens of thousands)."""
    return RawJSON(b"[" + b", ".join(map(_CLUSTER_ROW.__mod__, zip(
        [r["start_index"] for r in rows], [r["count"] for r in rows],
        [r["start_us"].encode() for r in rows], [r["end_us"].encode() for r in rows],
        _floats([r["start_ms"] for r in rows]), _floats([r["span_ms"] for r in rows])))) + b"]")


def anchors_json(report: dict) -> Iterator[bytes]:
    """The anchors report as one JSON object, in pieces: the match rows are streamed."""
    head, tail = dumps({**report, "matches": RawJSON(_ROWS_PLACEHOLDER),
                        "clusters": _clusters_json(report["clusters"])}).split(
        _ROWS_PLACEHOLDER)
    yield head + b"["
    rows = report["matches"]
    for start, stop in rows.batches():
        yield (b", " if start else b"") + rows.json_text(start, stop)
    yield b"]" + tail


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
                           match_columns, [True] * 6)
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
    out.append(format_table(
        ["cluster", "first index", "count", "start ms", "span ms"],
        [[c, r["start_index"], r["count"], f"{r['start_ms']:,.3f}", f"{r['span_ms']:,.3f}"]
         for c, r in enumerate(report["clusters"])],
        [True] * 5))
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
        if cross["flagged"]:
            out.append(format_table(
                ["from index", "to index", "count", "window start us", "window end us"],
                [[f["from_index"], f["to_index"], f["count"], f["start_us"], f["end_us"]]
                 for f in cross["flagged"]],
                [True] * 5))
        out.append(f"  cross-check verdict: {cross['verdict']}")
    out += ["", f"verdict: {report['verdict']}",
            "(no offset or layer count is chosen for you: pass --anchor-offset, --num-layers "
            "and --extra-anchors-per-pass to `layers` yourself)"]
    yield from out
