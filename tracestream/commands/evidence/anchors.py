"""`anchors`: every match of an anchor on one GPU in time order, its clusters and gaps.

Read-only evidence for `layers --anchor-offset/--num-layers`: it reports counts, times and
gaps so a user can verify an anchor, its layer count and its first complete pass; it never
picks an offset."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

import numpy as np

from tracestream.commands.evidence.histograms import (
    cluster_median_gaps,
    gap_histogram,
    size_histogram,
)
from tracestream.commands.evidence.inspect import index_trace
from tracestream.commands.evidence.readings import (
    after_last_anchor,
    cross_verdict,
    matches_before,
    outside_windows,
    separation,
    start_gaps,
    verdict_text,
    window_counts,
)
from tracestream.commands.evidence.rows import ClusterRows, FlaggedRows, MatchRows
from tracestream.commands.evidence.tables import bar, histogram, short, table_lines
from tracestream.errors import Option, SpecError, compile_pattern
from tracestream.index.builder import IndexOptions, TraceIndex
from tracestream.index.matches import MatchView
from tracestream.jsontext import RawJSON, dumps
from tracestream.parallel.memory import collector_paused
from tracestream.plan.cadence import GAP_FACTOR, gap_factor_problem, rule_text, starts_at_breaks
from tracestream.plan.selection import on_gpu, select_gpu


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
        "counts": histogram(counted),
        "flagged": FlaggedRows(anchors, flagged, counts[flagged]),
        "outside_windows": outside_windows(before, first, sizes, len(cross)),
        "after_last_anchor": histogram(tails),
        "verdict": cross_verdict(counted, tails, sizes),
        "rule": "counts matches in [anchor i, anchor i+1) for consecutive anchors inside a "
                "cluster only (the gap between clusters is not a layer); flags counts != 1",
    }


def find_anchors(trace, anchor_regex: str, *, pid=None, device=None,
                 cross_check: str | None = None, factor: float = GAP_FACTOR,
                 stdin=None, progress=None, workers: int | None = None,
                 max_event_bytes: int | None = None) -> dict:
    """Every match of the anchor on one GPU in time order, its clusters, histograms of
    its gaps and cluster sizes, and a verdict: data, which `anchors_lines`,
    `anchors_summary_json` and `anchors_json_rows` render.

    `progress`, `workers` and `max_event_bytes` as `inspect_trace` takes them.
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
        index = index_trace(trace, options, stdin, progress, workers, max_event_bytes)
        return _anchors_report(index, anchor_regex, pid, device, cross_check, factor)


def _anchors_report(index: TraceIndex, anchor_regex: str, pid, device,
                    cross_check: str | None, factor: float) -> dict:
    try:
        found = index.matches["anchor"]
        pid, device = select_gpu(found, pid, device, "anchor_regex", anchor_regex,
                                 index.kernel_vocabulary)
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
        gaps = gap_histogram(between, median, factor)
        medians = cluster_median_gaps(between, first, sizes)
        del between  # 8 bytes a match: the rows compute their own gaps
        origin_ns = index.origin.floor_ns() if index.origin is not None else 0
        report = {
            "anchor_regex": anchor_regex,
            "pid": pid,
            "device": device,
            "count": len(anchors),
            "names": anchors.name_counts(),
            "verdict": verdict_text(len(anchors), first, sizes, spread["max_inside_ratio"]),
            "origin_us": index.origin_text or None,
            "median_gap_us": None if median is None else round(median / 1000, 3),
            "gap_factor": factor,
            "rule": rule_text(factor, median),
            "separation": spread,
            "clusters": ClusterRows(anchors, first, sizes, medians, origin_ns),
            "gap_histogram": gaps,
            "cluster_sizes": size_histogram(sizes),
            "matches": MatchRows(anchors, first, index.origin),
        }
        if cross_check is not None:
            report["cross_check"] = _cross_check(index, cross_check, anchors, first, sizes,
                                                 pid, device)
        return report
    finally:
        index.close()


def _placeholder(key: str) -> bytes:
    return b'"\x00%s\x00"' % key.encode()  # orjson never writes a NUL byte


def anchors_summary_json(report: dict) -> Iterator[bytes]:
    """The anchors report as one JSON object, in pieces, without its per-match rows
    (`anchors_json_rows` writes those): its cluster and flagged-window rows are streamed
    a batch at a time (a nightly trace has hundreds of thousands of passes).

    An empty list of flagged windows stays in the head: `dumps` writes an object
    without exact numbers in orjson's compact form, as it always has.
    """
    streamed = {"clusters": report["clusters"]}
    head = {key: RawJSON(_placeholder(key)) if key in streamed else value
            for key, value in report.items() if key != "matches"}
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
            yield (b"," if start else b"") + rows.json_text(start, stop)
        yield b"]"
    yield text


def anchors_json_rows(report: dict) -> Iterator[bytes]:
    """Every match as one JSON object a line (`MatchRows.json_lines`: every time as exact
    decimal text), a batch of lines at a time, each piece ending in a newline."""
    rows = report["matches"]
    for start, stop in rows.batches():
        yield rows.json_lines(start, stop) + b"\n"


HEAD_ROWS = 20
TAIL_ROWS = 5
"""Rows of a long table shown without --all: the first HEAD_ROWS and the last TAIL_ROWS
(a big trace has tens of thousands of matches; the verdict and clusters come first)."""

BAR_WIDTH = 40


def anchors_lines(report: dict, *, all_rows: bool = False) -> Iterator[str]:
    """Human-readable anchors report, a line at a time, most telling first: the verdict,
    the clusters, histograms of the gaps and the cluster sizes, the cross-check, then the
    matches. Long tables show their first and last rows (`all_rows`: every row, streamed,
    never held as a whole)."""
    names = ", ".join(f"{short(n, 60)} ({c})" for n, c in report["names"].items())
    cross = report.get("cross_check")
    yield (f"anchor {report['anchor_regex']!r} on pid {report['pid']} device "
           f"{report['device']}: {report['count']} matches ({names})")
    yield f"verdict: {report['verdict']}"
    if cross is not None:
        yield f"cross-check verdict: {cross['verdict']}"
    yield ("(no offset or layer count is chosen for you: pass --anchor-offset, --num-layers "
           "and --extra-anchors-per-pass to `layers` yourself)")
    yield (f"times: ms from the trace origin (ts {report['origin_us']} us); index = the number "
           "--anchor-offset refers to")
    yield ""
    yield f"clusters: {report['rule']}"
    sep = report["separation"]
    if sep["max_inside_ratio"] is not None:
        between = sep["min_between_ratio"]
        yield (f"  largest gap inside a cluster: {sep['max_inside_ratio']:g} x median; smallest "
               "gap between clusters: " + (f"{between:g} x median" if between is not None
                                           else "-"))
    yield from _capped_table(
        ["cluster", "first index", "last index", "count", "start ms", "end ms", "span ms",
         "median gap us"], report["clusters"], all_rows, "clusters")
    yield ""
    yield from _gap_histogram_lines(report["gap_histogram"], report["gap_factor"])
    yield ""
    yield from _size_histogram_lines(report["cluster_sizes"])
    if cross is not None:
        yield from _cross_check_lines(cross, all_rows)
    yield ""
    yield "matches:"
    yield from _capped_table(["index", "t ms", "stream", "dur us", "gap us", "cluster"],
                             report["matches"], all_rows, "matches",
                             widest=report["matches"].widest_columns)


def _capped_table(headers: list[str], rows, all_rows: bool, noun: str,
                  widest=None) -> Iterator[str]:
    """A table of `rows` (their `table_columns`, every column right-aligned): all of them,
    streamed a batch at a time, or, when there are many and not `all_rows`, the first
    HEAD_ROWS and the last TAIL_ROWS around a line that says how many are left out."""
    count = len(rows)
    right = [True] * len(headers)
    if all_rows or count <= HEAD_ROWS + TAIL_ROWS:
        yield from table_lines(headers, lambda: (
            rows.table_columns(start, stop) for start, stop in rows.batches()), right,
            widest=widest)
        return
    lines = list(table_lines(headers, lambda: iter([
        rows.table_columns(0, HEAD_ROWS), rows.table_columns(count - TAIL_ROWS, count)]),
        right))
    yield from lines[: 1 + HEAD_ROWS]
    yield (f"  … {count - HEAD_ROWS - TAIL_ROWS:,} more {noun} (--all shows every one)")
    yield from lines[1 + HEAD_ROWS :]


def _us(value: float) -> str:
    """A bucket bound in µs, without trailing zeros (bounds are whole ns)."""
    return f"{value:,.3f}".rstrip("0").rstrip(".")


def _gap_histogram_lines(histogram: dict, factor: float) -> Iterator[str]:
    buckets = histogram["buckets"]
    if not buckets:
        yield "gaps between consecutive matches: none (fewer than 2 matches)"
        return
    zeros = "; 0 - 0: gaps of 0" if buckets[0]["to_us"] == 0 else ""
    yield (f"gaps between consecutive matches: {histogram['gaps']:,} (a row counts the gaps "
           f"above its first bound, up to and including its second{zeros})")
    lows = [_us(b["from_us"]) for b in buckets]
    highs = [_us(b["to_us"]) for b in buckets]
    low_width, high_width = max(map(len, lows)), max(map(len, highs))
    most = max(b["count"] for b in buckets)
    marked = False
    for bucket, low, high in zip(buckets, lows, highs):
        if bucket["breaks"] and not marked:
            yield (f"  -- above {_us(histogram['break_above_us'])} us ({factor:g} x the median): "
                   "a gap starts a new cluster --")
            marked = True
        yield (f"  {low:>{low_width}} - {high:>{high_width}} us  "
               f"{bar(bucket['count'], most, BAR_WIDTH):<{BAR_WIDTH}}  {bucket['count']:,}")


def _size_histogram_lines(histogram: dict) -> Iterator[str]:
    buckets = histogram["buckets"]
    yield f"cluster sizes (matches in a cluster): {histogram['clusters']:,} cluster(s)"
    labels = [f"{b['from_size']:,}" if b["from_size"] == b["to_size"]
              else f"{b['from_size']:,}-{b['to_size']:,}" for b in buckets]
    width = max(map(len, labels))
    most = max(b["clusters"] for b in buckets)
    for bucket, label in zip(buckets, labels):
        yield (f"  {label:>{width}}  "
               f"{bar(bucket['clusters'], most, BAR_WIDTH):<{BAR_WIDTH}}  {bucket['clusters']:,}")


def _cross_check_lines(cross: dict, all_rows: bool) -> Iterator[str]:
    counts = ", ".join(f"{n} window(s) with {k}" for k, n in cross["counts"].items())
    tails = ", ".join(f"{n} cluster(s) with {k} match(es)"
                      for k, n in cross["after_last_anchor"].items())
    yield ""
    yield (f"cross-check {cross['regex']!r}: {cross['matches']} matches on this GPU; "
           f"{cross['windows']} windows between consecutive anchors inside a cluster "
           "(the gap between clusters is not a layer and is not counted)")
    yield (f"  {counts or 'no windows'}; {cross['outside_windows']} match(es) outside the "
           "counted windows")
    yield f"  after the last anchor of a cluster (up to the next cluster): {tails}"
    if len(cross["flagged"]):
        yield from _capped_table(
            ["from index", "to index", "count", "window start us", "window end us"],
            cross["flagged"], all_rows, "flagged windows")
    yield f"  cross-check verdict: {cross['verdict']}"
