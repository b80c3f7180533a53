"""`anchors`: every match of an anchor on one GPU in time order, its clusters and gaps.

Read-only evidence for `layers --anchor-offset/--num-layers`: it reports counts, times and
gaps so a user can verify an anchor, its layer count and its first complete pass; it never
picks an offset."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

import numpy as np

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
from tracestream.commands.evidence.tables import cell_texts, histogram, short, table_lines
from tracestream.errors import Option, SpecError, compile_pattern
from tracestream.index.builder import IndexOptions, TraceIndex
from tracestream.index.matches import MatchView
from tracestream.jsontext import RawJSON, RawNumber, dumps
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
    """Every match of the anchor on one GPU in time order, its clusters, and a verdict.

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
