"""The C extension against numpy on one trace: the same command alternated, N pairs.

    python -m benchmarks.speedups_ab TRACE [--pairs 3] [--command layers|inspect|anchors]

Each pair runs the command once as installed and once with TRACESTREAM_PURE=1
(numpy), in turn, so a drift of the machine's speed hits both alike; it prints
every time and the means. The outputs go to a temporary folder and are removed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ANCHOR = "^_q_rope_store$"
LAYERS = ["--anchor-regex", ANCHOR, "--num-layers", "8", "--anchor-offset", "0",
          "--passes", "1", "--extra-anchors-per-pass", "1", "--phase", "target-verify",
          "--evidence", "bench", "--max-gpu-lanes", "10", "--quiet"]


def command(kind: str, trace: Path, folder: Path, run: int) -> list[str]:
    tool = [sys.executable, "-m", "tracestream", kind, "--trace", str(trace)]
    if kind == "layers":
        return tool + ["--output", str(folder / f"out{run}.json"), *LAYERS]
    if kind == "anchors":
        return tool + ["--anchor-regex", ANCHOR, "--json-rows"]  # every match row written
    return tool + ["--json"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--command", choices=("layers", "inspect", "anchors"), default="layers")
    opts = parser.parse_args()
    times: dict[str, list[float]] = {"C extension": [], "numpy": []}
    with tempfile.TemporaryDirectory(prefix="tracestream-ab-") as tmp:
        for pair in range(opts.pairs):
            for name, extra in (("numpy", {"TRACESTREAM_PURE": "1"}), ("C extension", {})):
                env = {k: v for k, v in os.environ.items() if k != "TRACESTREAM_PURE"}
                run = len(times["numpy"]) + len(times["C extension"])
                started = time.perf_counter()
                subprocess.run(command(opts.command, opts.trace, Path(tmp), run),
                               env={**env, **extra}, check=True, stdout=subprocess.DEVNULL)
                times[name].append(time.perf_counter() - started)
                print(f"pair {pair + 1}: {name:12s} {times[name][-1]:6.2f} s", flush=True)
    for name, values in times.items():
        print(f"{name:12s} mean {statistics.mean(values):6.2f} s  best {min(values):6.2f} s")


if __name__ == "__main__":
    main()
