"""Where the time goes: summarise a py-spy raw profile of a run, worker processes included.

    py-spy record --subprocesses --format raw -o prof.txt -- tracestream layers ...
    python -m benchmarks.profile prof.txt      (or a gzip'd prof.txt.gz)

py-spy's raw ("collapsed") format is one line per distinct stack with a sample
count; with `--subprocesses`, a worker's stacks start with the parent's
`process ...` frame and then its own. Idle threads are not sampled (py-spy's
default), so a sample is a moment a thread was running or runnable: the
shares are of CPU-side work, not of wall time.

Every sample is put in one bucket by the frames it contains (the rules below,
first match wins), and leaf functions are counted for the top list.
"""

from __future__ import annotations

import argparse
import gzip
import re
from collections import Counter
from dataclasses import dataclass, field

_PROCESS = re.compile(r'^process \d+:"[^"]*"$')
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")

WORKER_RULES = (
    ("observe_chunk", "worker: observe chunks (index pass: decode, classify, pack)"),
    ("rewrite_chunk", "worker: rewrite chunks (splice relocated events)"),
    ("read_span", "worker: read its span of the file"),
    ("", "worker: other (pickling, queue, idle loop)"),
)
MAIN_RULES = (
    ("observe_chunk", "main: observe chunks inline (index pass)"),
    ("rewrite_chunk", "main: rewrite chunks inline"),
    ("_ExecutorManagerThread", "main: process-pool threads (send tasks, receive results)"),
    ("Queue._feed", "main: process-pool threads (send tasks, receive results)"),
    ("sink.py", "main/writer thread: compress + write output"),
    ("produce", "main/reader thread: read + decompress input"),
    ("run_index", "main: index pass (scan, dispatch, merge facts)"),
    ("plan_compaction", "main: plan (lane sweep, flow binding)"),
    ("plan_layers", "main: plan (anchor selection, guides)"),
    ("Planner", "main: plan (other)"),
    ("rewrite", "main: rewrite pass (copy bytes, dispatch, order results)"),
    ("verify", "main: verify"),
    ("", "main: other (start-up, imports, click, report)"),
)


@dataclass
class Summary:
    total: int = 0
    buckets: Counter = field(default_factory=Counter)
    leaves: Counter = field(default_factory=Counter)
    processes: Counter = field(default_factory=Counter)


def _frames(stack: str) -> tuple[int, list[str]]:
    """(process depth, python frames) of one collapsed stack."""
    parts = stack.split(";")
    depth = 0
    while depth < len(parts) and _PROCESS.match(parts[depth]):
        depth += 1
    return depth, parts[depth:]


def _bucket(depth: int, frames: list[str]) -> str:
    text = ";".join(frames)
    rules = WORKER_RULES if depth > 1 else MAIN_RULES
    for needle, name in rules:
        if needle in text:
            return name
    return rules[-1][1]


def _leaf(frame: str) -> str:
    m = _FRAME.match(frame)
    return f"{m.group('func')} ({m.group('file')})" if m else frame


def summarize(path: str) -> Summary:
    summary = Summary()
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            n = int(count)
            depth, frames = _frames(stack)
            summary.total += n
            summary.processes["worker" if depth > 1 else "main"] += n
            summary.buckets[_bucket(depth, frames)] += n
            if frames:
                summary.leaves[_leaf(frames[-1])] += n
    return summary


def report(summary: Summary, top: int = 15) -> str:
    """The buckets and the top leaf functions, as shares of all samples."""
    total = summary.total or 1
    lines = [f"samples: {summary.total} ("
             + ", ".join(f"{k} {v / total:.0%}" for k, v in summary.processes.most_common())
             + ")", "", "where (by the frames a sample contains):"]
    for name, n in summary.buckets.most_common():
        lines.append(f"  {n / total:6.1%}  {name}")
    lines += ["", f"top {top} leaf functions (self time):"]
    for name, n in summary.leaves.most_common(top):
        lines.append(f"  {n / total:6.1%}  {name}")
    return "\n".join(lines)


def as_dict(summary: Summary, top: int = 25) -> dict:
    total = summary.total or 1
    return {
        "samples": summary.total,
        "processes": {k: v / total for k, v in summary.processes.items()},
        "buckets": {k: v / total for k, v in summary.buckets.most_common()},
        "top_leaves": {k: v / total for k, v in summary.leaves.most_common(top)},
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", help="py-spy --format raw output")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    print(report(summarize(args.raw), args.top))


if __name__ == "__main__":
    main()
