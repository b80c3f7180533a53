"""Scale runs: every benchmarked workload against the in-memory baseline, on multi-GB traces.

    python -m benchmarks.scale --size 1GB [--size 10GB] [--workload NAME ...]
                               [--formats plain,gzip,zstd] [--real-traces DIR]
                               [--keep] [--workdir DIR] [--repeat 2] [--profile]
                               [--split-mb N]

One row per workload (`--workload NAME`, repeatable, selects rows; a prefix
such as `real` or `real:hta_train_6streams` selects every row under it):

* `nightly`: `layers` labelling every pass of a generated CUDA-Graph decode
  trace (`samples.generate`; passes = its iterations, from the generator's
  ground truth), with `--end-anchor-regex` (the terminal kernel),
  `--extra-anchors-per-pass 1` and `--max-gpu-lanes 10`; in every format of
  `--formats` (gzip and zstd inputs are the plain trace compressed, so the
  same bytes), with the `gzip -dc | gzip -1` (zstd's analogue) reference;
* `nightly-no-terminal`: the same without `--end-anchor-regex` (what the
  terminal check costs);
* `compact`: `compact --max-gpu-lanes 10` on the nightly trace;
* `gpus8`: the nightly job on a trace of eight GPUs (`gpus=8`; anchors of
  pid 0, every GPU compacted);
* `inspect`, `anchors` (with `--cross-check` of the terminal, `--json-rows`: every match
  written, as the baseline does): on the nightly trace;
* `verify`: `verify` of the nightly output (its own row; every other output
  is verified too, in its row's verify column);
* `split`: the nightly job with `--split-mb 500` (where the JSON makes at least
  two such pieces; the labelled output, ~1.3x its source, makes 4 at 1 GB
  and 31 at 10 GB; smaller sizes a quarter of the JSON; `--split-mb N`
  chooses): the pieces, each with its report, and the manifest,
  verified in one pass by `verify --output <output>.pieces.json`; the row says
  how many pieces and the largest;
* `window`: the nightly job with `--pass-window N/2:N/2+10` (ten passes from the
  middle of the N labelled), verified as a window;
* `real:<trace>:compact`, `real:<trace>:layers`, `real:<trace>:split`: each
  real Kineto trace with GPU activity in `--real-traces DIR`, replicated in
  time up to the size (`benchmarks/replicate.py`, exact text), then `compact`,
  `layers --num-layers 1` labelling every match of a kernel that runs once per
  step (`REAL_ANCHORS`), and `compact --split-mb` (the split row's N), verified
  by its manifest. Traces without GPU activity are listed as skipped.

Every row is timed against the baseline (`benchmarks/baseline.py`:
json.load, the same job in plain Python, json.dump) doing the same work in
the same run, unless it would need more than 70% of MemAvailable (~7.5x the
JSON size); the split and window rows have none (the baseline writes only
the whole output: their baseline column is "-"). Each command runs in a fresh
process (wall time, and memory as `measure.py` explains: GNU time's max RSS,
and the summed RSS and PSS of the process tree); a run whose tree PSS passes
70% of MemAvailable is killed and reported as such. Timed commands run
`--repeat` times; the best wall time is reported with the spread (worst -
best), memory as the worst of the runs.

Without `--workload`, sizes up to 2 GB run every row (the nightly row in
every format, the others on plain input) and larger sizes run `nightly`,
`verify` and `split` on gzip input (plain output if three times the space it
needs is free). Every file a row writes (with --split-mb: every piece, its
report and the manifest) is deleted before each run and after the row.
Results go to `benchmarks/results/<date>-<host>-<size>.json`; generated
traces are deleted unless `--keep`. The targets section judges issue 23's
targets on every row and names the worst row of each (the 10 GB tree PSS
target: the nightly and split rows).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import gzip
import hashlib
import io
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.compare import compare_events
from benchmarks.measure import Run, load_average, run_measured
from benchmarks.replicate import gpu_activity, kernel_matches, replicate
from samples.generate import ANCHOR, TERMINAL, TraceConfig, generate, parse_size

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
REAL_TRACES = ROOT.parent / "shared" / "real-traces"
SUFFIX = {"plain": ".json", "gzip": ".json.gz", "zstd": ".json.zst"}
COMPRESS = {"plain": "none", "gzip": "gzip", "zstd": "zstd"}
RATIO_GUESS = {"plain": 1.0, "gzip": 5.0, "zstd": 6.0}  # conservative, for disk checks
LARGE = 2 << 30  # above this: gzip input, and only the nightly rows by default
RESTORE_MAX = 1 << 30  # restore + comparison only up to this size (plain input)
BASELINE_FACTOR = 7.5  # baseline RSS per JSON byte (json.load dicts + the text)
MEMORY_SHARE = 0.7
DISK_FACTOR = 3
NIGHTLY_ANCHOR = f"^{ANCHOR}$"
NIGHTLY_TERMINAL = f"^{re.escape(TERMINAL)}$"
LANES = ["--max-gpu-lanes", "10"]
WORKLOADS = ("nightly", "nightly-no-terminal", "compact", "gpus8", "inspect", "anchors",
             "verify", "split", "window", "real")
LARGE_WORKLOADS = ("nightly", "verify", "split")
SPLIT_MB = 500  # --split-mb of the split rows, where the JSON makes at least 2 such pieces
WINDOW_PASSES = 10  # --pass-window of the window row: this many passes from the middle
# A kernel that runs once per step in each real trace, chosen with `tracestream anchors`
# (docs/performance.md, "Real traces, replicated", says why each). Per copy: the number of
# its matches.
REAL_ANCHORS = {
    # 5 matches, one per ProfilerStep (gaps 215-217 ms = the step time)
    "hta_train_6streams": "^void split_embedding_codegen_forward_unweighted_kernel<",
    # 2 matches, one per ProfilerStep (gap 606 ms = the step time)
    "hta_sampled_rank0_5streams": "^void split_embedding_codegen_forward_unweighted_kernel<",
    # 3 matches, one per ProfilerStep (gaps 220-225 ms = the step time)
    "hta_nccl_gpu_scopes": "max_pool_backward_nchw<",
    # no step annotations and one kernel name (3 GEMMs): every match is a pass
    "hta_cuda_sync_multistream": "^ampere_sgemm_128x64_nn$",
    # one GEMM in the capture (one step)
    "hta_rocm_mi250": "^Cijk_Alik_Bljk",
    # one gemv in the capture (one step)
    "hta_legacy_categories": "^void gemmk1_kernel<",
    # the only kernel (one step)
    "hta_triton_single_kernel": "^triton_poi_fused_add_cos_sin_0$",
}
TARGETS = {"mb_per_s": 100.0, "stretch_mb_per_s": 200.0, "speedup": 10.0,
           "max_rss": 200 << 20, "tree_pss": 250 << 20, "pss_10gb": 300 << 20,
           "gzip_ratio": 2.0, "terminal_ratio": 1.5, "verify_ratio": 2.0,
           "verify_pss": 250 << 20}



def tool() -> list[str]:
    """The installed `tracestream` script next to this interpreter (as a user runs it)."""
    script = Path(sys.executable).parent / "tracestream"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tracestream"]


# -- machine and environment ---------------------------------------------------------------


def meminfo(key: str) -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.rstrip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> dict:
    """What the numbers depend on: CPUs, memory, versions, the commit (and whether it is dirty)."""
    import msgspec
    import numpy
    import orjson

    import tracestream

    return {
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "mem_total": meminfo("MemTotal"),
        "mem_available": meminfo("MemAvailable"),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "tracestream": tracestream.__version__,
        "msgspec": msgspec.__version__,
        "orjson": orjson.__version__,
        "numpy": numpy.__version__,
        "gzip": tool_version(["gzip", "--version"]),
        "zstd": tool_version(["zstd", "--version"]),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "load_average_start": load_average(),
    }


def tool_version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return "absent"
    return out.splitlines()[0] if out else "unknown"


def engine(mode: str, snapshot: Path) -> tuple[dict, dict]:
    """(environment, description) of the tracestream every command runs.

    `head` (default): the committed tracestream/ of HEAD, extracted with `git
    archive`; `worktree`: a copy of the checkout as it is now, uncommitted edits
    included; `live`: the checkout itself. A snapshot's C extension is built from
    its own C sources and its modules are compiled to bytecode; the description
    says whether the commands use the extension. A snapshot goes first on PYTHONPATH
    (the editable install's finder comes after it), so a run of an hour measures one
    version even while others edit and commit.
    """
    env = dict(os.environ)
    source = ROOT / "tracestream"
    commit = git("rev-parse", "HEAD")
    if mode != "live":
        shutil.rmtree(snapshot, ignore_errors=True)
        snapshot.mkdir(parents=True)
        if mode == "head":
            tar = subprocess.run(["git", "archive", "--format=tar", commit, "tracestream",
                                  "setup.py"], cwd=ROOT, capture_output=True, check=True).stdout
            with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
                archive.extractall(snapshot, filter="data")
        else:
            shutil.copytree(source, snapshot / "tracestream",
                            ignore=shutil.ignore_patterns("__pycache__", "*.so"))
            shutil.copy(ROOT / "setup.py", snapshot)
        # the snapshot's own C extension, built from its own tracestream/_native/speedups/
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                       cwd=snapshot, capture_output=True, check=True)
        # and its bytecode, as an install (or a user's first run) leaves it: where
        # PYTHONDONTWRITEBYTECODE is set, every timed run would compile every module
        # (~0.12 s each, measured on this VM)
        subprocess.run([sys.executable, "-m", "compileall", "-q", "tracestream"],
                       cwd=snapshot, capture_output=True, check=True)
        env["PYTHONPATH"] = str(snapshot)
        source = snapshot / "tracestream"
    digest = hashlib.sha256()
    for path in sorted([*source.rglob("*.py"), *source.rglob("*.c"), *source.rglob("*.h")]):
        digest.update(path.relative_to(source).as_posix().encode() + b"\0" + path.read_bytes())
    probe = [sys.executable, "-c", "import tracestream, tracestream._native as s; "
             "print(tracestream.__file__); print(s.describe())"]
    imported, speedups = subprocess.run(probe, env=env, capture_output=True, text=True,
                                        cwd="/").stdout.strip().splitlines()
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "tracestream")
    return env, {"mode": mode, "imported_from": imported, "speedups": speedups,
                 "sha256": digest.hexdigest(), "git_commit": commit,
                 "uncommitted_edits_measured": bool(dirty) and mode != "head",
                 "checkout_dirty_files": dirty.splitlines()}


# -- inputs ----------------------------------------------------------------------------------


@dataclass
class Input:
    """One trace that rows read: the file, its format, its JSON size, and what `layers` labels."""

    key: str  # "nightly", "gpus8", "real:<trace>"
    path: Path
    fmt: str
    nbytes: int  # uncompressed JSON bytes
    layers: list[str] | None  # the anchor options of `layers` (ours and the baseline)
    how: str
    seconds: float = 0.0
    passes: int = 0  # the passes `layers` labels (the window row's --pass-window is of these)

    def record(self) -> dict:
        return {"key": self.key, "path": str(self.path), "format": self.fmt,
                "bytes_on_disk": self.path.stat().st_size if self.path.exists() else None,
                "uncompressed_bytes": self.nbytes, "layers": self.layers, "how": self.how,
                "seconds": self.seconds, "passes": self.passes}


@dataclass(frozen=True)
class Row:
    """A workload: its name (what --workload selects), the command, and its options."""

    name: str
    kind: str  # layers | compact | inspect | anchors
    terminal: bool = True  # layers: keep --end-anchor-regex
    cut: str = ""  # "split": --split-mb (pieces + manifest); "window": --pass-window

    @property
    def writes(self) -> bool:
        return self.kind in ("layers", "compact")


NIGHTLY_ROWS = [Row("nightly", "layers"), Row("nightly-no-terminal", "layers", terminal=False),
                Row("compact", "compact"), Row("inspect", "inspect"), Row("anchors", "anchors"),
                Row("split", "layers", cut="split"), Row("window", "layers", cut="window")]


def selected(name: str, selectors) -> bool:
    """A row is selected by its name or by a prefix of it that ends at a ':'."""
    return any(name == s or name.startswith(s + ":") for s in selectors)


def wanted_under(prefix: str, selectors) -> bool:
    """Whether any row under `prefix` (e.g. an input's `real:<trace>`) is selected."""
    return selected(prefix, selectors) or any(s.startswith(prefix + ":") for s in selectors)


def nightly_layers(truth: dict, pid: int | None = None) -> list[str]:
    """Every pass of a generated trace: iterations passes of `layers` layers + 1 extra anchor."""
    args = ["--anchor-regex", NIGHTLY_ANCHOR, "--num-layers", str(truth["config"]["layers"]),
            "--anchor-offset", "0", "--passes", str(truth["iterations"]),
            "--extra-anchors-per-pass", "1" if truth["config"]["extra_anchor"] else "0"]
    if pid is not None:
        args += ["--pid", str(pid)]
    return args + ["--end-anchor-regex", NIGHTLY_TERMINAL]


def without_terminal(args: list[str]) -> list[str]:
    i = args.index("--end-anchor-regex")
    return args[:i] + args[i + 2:]


def real_layers(regex: str, passes: int) -> list[str]:
    """One guide per match of a once-per-step kernel (`--passes all` once it exists)."""
    return ["--anchor-regex", regex, "--num-layers", "1", "--anchor-offset", "0",
            "--passes", str(passes)]


def split_mb_for(nbytes: int, chosen: int | None = None) -> int:
    """--split-mb of a split row: `chosen` (--split-mb), else SPLIT_MB where the JSON makes
    at least two pieces of it (1 GB: 4 pieces, 10 GB: 31), else a quarter of the JSON."""
    if chosen:
        return chosen
    if nbytes >= 2 * SPLIT_MB * 10**6:
        return SPLIT_MB
    return max(1, nbytes // (4 * 10**6))


def pass_window_for(passes: int) -> str:
    """--pass-window of the window row: WINDOW_PASSES passes from the middle of the trace."""
    first = passes // 2
    return f"{first}:{min(passes, first + WINDOW_PASSES)}"


def disk_needed(size: int, fmt: str, out_fmt: str, keep_plain: bool) -> int:
    """Bytes on disk one input may hold at once (input, output, spill, restore, plain copy)."""
    need = size / RATIO_GUESS[fmt] + 1.25 * size / RATIO_GUESS[out_fmt] + 0.2 * size
    if fmt == "plain" and size <= RESTORE_MAX:
        need += size
    if keep_plain and fmt != "plain":
        need += size
    return int(need)


def choose_output(size: int, fmt: str, workdir: Path) -> tuple[str | None, str]:
    """Output format for an input: like the input, or for large sizes plain if the disk allows."""
    free = shutil.disk_usage(workdir).free
    wanted = ["plain", "gzip"] if size > LARGE else [fmt]
    for out_fmt in wanted:
        need = disk_needed(size, fmt, out_fmt, keep_plain=size <= LARGE)
        if free >= DISK_FACTOR * need:
            return out_fmt, f"{free / 2**30:.0f} GiB free, needs ~{need / 2**30:.1f} GiB"
    need = disk_needed(size, fmt, wanted[-1], keep_plain=False)
    return None, (f"skipped: {free / 2**30:.1f} GiB free, less than {DISK_FACTOR}x the "
                  f"~{need / 2**30:.1f} GiB it needs")


def trace_path(workdir: Path, label: str, key: str, fmt: str) -> Path:
    return workdir / f"scale-{label}-{key.replace(':', '-')}{SUFFIX[fmt]}"


def facts_path(trace: Path) -> Path:
    return trace.with_name(trace.name + ".facts.json")


def generated(path: Path, cfg: TraceConfig) -> tuple[dict, str]:
    """The generator's ground truth for `path`: generated now, or kept (--keep) with it."""
    facts = facts_path(path)
    if path.exists() and facts.exists():
        return json.loads(facts.read_text()), "existing file (--keep from an earlier run)"
    truth = asdict(generate(path, cfg))
    facts.write_text(json.dumps(truth))
    return truth, "samples.generate"


def compressed_copy(plain: Path, fmt: str, path: Path) -> str:
    """`path`: the plain trace compressed (the same bytes as the plain rows read)."""
    argv = {"gzip": ["gzip", "-1", "-c"], "zstd": ["zstd", "-q", "-3", "-c"]}[fmt]
    if not path.exists():
        with open(plain, "rb") as src, open(path, "wb") as dst:
            subprocess.run(argv, stdin=src, stdout=dst, check=True)
    return f"{' '.join(argv)} of the plain trace (same bytes)"


def replicated(source: Path, path: Path, size: int) -> tuple[dict, str]:
    """A real trace copied in time up to `size`, and what the copy holds (kept with --keep)."""
    facts = facts_path(path)
    if path.exists() and facts.exists():
        return json.loads(facts.read_text()), "existing file (--keep from an earlier run)"
    facts.write_text(json.dumps(asdict(replicate(source, path, size))))
    return json.loads(facts.read_text()), f"benchmarks.replicate of {source.name}"


# -- measuring -------------------------------------------------------------------------------


def _remove(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def written(out: Path, report: Path) -> list[Path]:
    """Every file a row's command may have written: the output and its report, or (with
    --split-mb) the pieces `<stem>.part-NNNN<suffix>`, each piece's report beside it, and
    the manifest `<output>.pieces.json`. Globbed, as the count is the run's to decide."""
    stem = out.name
    for suffix in sorted(SUFFIX.values(), key=len, reverse=True):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    pieces = sorted(out.parent.glob(glob.escape(stem) + ".part-[0-9][0-9][0-9][0-9]*"))
    return [out, report, manifest_of(out), *pieces]


def manifest_of(out: Path) -> Path:
    """The manifest a --split-mb run writes for `--output out`."""
    return out.with_name(out.name + ".pieces.json")


def summary_of(runs: list[Run], nbytes: int | None = None) -> dict:
    """Best wall time, spread, worst memory; every run kept for the record."""
    ok = [r for r in runs if r.returncode == 0]
    data = {"runs": [r.record() for r in runs], "ok": len(ok) == len(runs) and bool(runs)}
    if not data["ok"]:
        last = runs[-1] if runs else None
        data["error"] = ("not run" if last is None else last.killed
                         or last.stderr.decode(errors="replace")[-500:] or
                         f"exit {last.returncode}")
        return data
    walls = [r.wall_s for r in ok]
    data.update(best_wall_s=min(walls), spread_s=max(walls) - min(walls),
                max_rss=max(r.max_rss for r in ok), tree_rss=max(r.tree_rss for r in ok),
                tree_pss=max(r.tree_pss for r in ok))
    if nbytes:
        data["mb_per_s"] = nbytes / min(walls) / 1e6
    return data


def repeat(argv_for, times: int, opts, *, env=None, cleanup=(), stdout=subprocess.DEVNULL,
           log=None) -> list[Run]:
    """Run a command `times` times in fresh processes, removing `cleanup` before each run
    (paths, or a function that lists them when the run is due)."""
    runs = []
    for i in range(times):
        _remove(*(cleanup() if callable(cleanup) else cleanup))
        run = run_measured(argv_for(i), stdout=stdout, cwd=ROOT, env=env,
                           memory_limit=opts.memory_limit)
        runs.append(run)
        if log:
            log(f"    run {i + 1}/{times}: {run.wall_s:7.1f} s, rc {run.returncode}, "
                f"max RSS {run.max_rss / 2**20:.0f} MiB, tree PSS {run.tree_pss / 2**20:.0f} MiB"
                f" (load {run.load_before:.1f}){'  KILLED: ' + run.killed if run.killed else ''}")
        if run.returncode != 0:
            break
    return runs


def layer_args(row: Row, inp: Input) -> list[str]:
    return inp.layers if row.terminal else without_terminal(inp.layers)


def cut_args(row: Row, inp: Input, opts) -> list[str]:
    """--split-mb or --pass-window of a split or window row (nothing for the others)."""
    if row.cut == "split":
        return ["--split-mb", str(split_mb_for(inp.nbytes, opts.split_mb))]
    if row.cut == "window":
        return ["--pass-window", pass_window_for(inp.passes)]
    return []


def ours_argv(row: Row, inp: Input, out: Path, out_fmt: str, cut: list[str] = ()) -> list[str]:
    """The command a user runs for this row (the installed script of the measured engine)."""
    trace = ["--trace", str(inp.path)]
    if row.kind == "layers":
        argv = ["layers", *trace, "--output", str(out), *layer_args(row, inp),
                "--phase", "target-verify", "--evidence", "bench", *LANES, *cut, "--quiet"]
    elif row.kind == "compact":
        argv = ["compact", *trace, "--output", str(out), *LANES, *cut, "--quiet"]
    elif row.kind == "inspect":
        argv = ["inspect", *trace, "--json"]
    else:
        argv = ["anchors", *trace, "--anchor-regex", NIGHTLY_ANCHOR,
                "--cross-check", NIGHTLY_TERMINAL, "--json-rows"]  # every match, as the baseline
    if row.writes and out_fmt != "plain":
        argv += ["--compress", COMPRESS[out_fmt]]
    return tool() + argv


def baseline_argv(row: Row, inp: Input, out: Path, out_fmt: str) -> list[str]:
    """The same job in benchmarks/baseline.py."""
    argv = [sys.executable, "-m", "benchmarks.baseline", "--job", row.kind,
            "--trace", str(inp.path)]
    if row.writes:
        argv += ["--output", str(out), *LANES, "--compress", COMPRESS[out_fmt]]
    if row.kind == "layers":
        argv += [*layer_args(row, inp), "--phase", "target-verify"]
    if row.kind == "anchors":
        argv += ["--anchor-regex", NIGHTLY_ANCHOR, "--cross-check", NIGHTLY_TERMINAL]
    return argv


def reference_argv(inp: Input, out_fmt: str) -> list[str] | None:
    """`gzip -dc T | gzip -1` (or zstd's analogue) of the same bytes, to /dev/null.

    With plain output only the decompression (`gzip -dc T > /dev/null`) is the
    reference; plain input has none.
    """
    if inp.fmt == "plain":
        return None
    path = shlex.quote(str(inp.path))
    decompress = {"gzip": f"gzip -dc {path}", "zstd": f"zstd -q -dc {path}"}[inp.fmt]
    compress = {"plain": "", "gzip": " | gzip -1", "zstd": " | zstd -q -3 -c"}[out_fmt]
    return ["bash", "-o", "pipefail", "-c", f"{decompress}{compress} > /dev/null"]


def baseline_gate(uncompressed: int) -> str | None:
    """None when the baseline fits; else why it is skipped."""
    need = BASELINE_FACTOR * uncompressed
    available = meminfo("MemAvailable")
    if need > MEMORY_SHARE * available:
        return (f"skipped: would need ~{need / 2**30:.0f} GB "
                f"(> {MEMORY_SHARE:.0%} of {available / 2**30:.0f} GB available)")
    return None


def run_baseline(row: Row, inp: Input, out: Path, out_fmt: str, opts, log) -> dict:
    if opts.no_baseline:
        return {"skipped": "skipped: --no-baseline"}
    if row.cut:
        # benchmarks/baseline.py writes the whole output; a window or pieces of it would be
        # a new baseline, not the same one
        return {"skipped": "-", "why": f"the baseline has no equivalent of --{row.cut} rows"}
    why = baseline_gate(inp.nbytes)
    if why:
        log(f"    baseline {why}")
        return {"skipped": why}
    log(f"  {row.name}: baseline (json.load + Python + json.dump)")
    runs = repeat(lambda i: baseline_argv(row, inp, out, out_fmt), opts.repeat, opts,
                  cleanup=(out,), log=log)
    _remove(out)
    return summary_of(runs, inp.nbytes)


def verify_output(inp: Input, out: Path, times: int, opts, log) -> dict:
    """`tracestream verify` of an output (a split's: its manifest, every piece in one pass):
    time and memory as a row, its verdict, failed checks."""
    argv = tool() + ["verify", "--trace", str(inp.path), "--output", str(out), "--json"]
    runs = repeat(lambda i: argv, times, opts, env=opts.env, stdout=subprocess.PIPE, log=log)
    data = summary_of(runs, inp.nbytes)
    data["command"] = shlex.join(argv)
    try:
        verdict = json.loads(runs[-1].stdout)
        data["verdict"] = verdict.get("verdict")
        data["failed"] = [c for c in verdict.get("checks", []) if not c.get("ok")]
    except ValueError:
        data["verdict"] = f"no verdict (exit {runs[-1].returncode})"
    log(f"    verify: {data['verdict']}")
    return data


def restore_and_compare(inp: Input, out: Path, opts, log) -> dict:
    """`tracestream restore`, then the restored events against the source, streamed."""
    restored = out.with_name(out.name + ".restored.json")
    _remove(restored)
    argv = tool() + ["restore", "--trace", str(out), "--output", str(restored)]
    run = run_measured(argv, cwd=ROOT, env=opts.env, memory_limit=opts.memory_limit)
    data = {"run": run.record(), "wall_s": run.wall_s, "tree_pss": run.tree_pss}
    if run.returncode == 0:
        start = time.perf_counter()
        data["comparison"] = compare_events(inp.path, restored)
        data["comparison_s"] = time.perf_counter() - start
        data["verdict"] = data["comparison"]["verdict"]
    else:
        data["verdict"] = f"restore failed (exit {run.returncode})"
    _remove(restored)
    log(f"    restore: {data['verdict']} (restore {run.wall_s:.1f} s)")
    return data


def profile_ours(argv: list[str], out: Path, report: Path, raw: Path, opts, log) -> dict:
    """One more run of ours under py-spy (workers included); where the samples fall."""
    from benchmarks.profile import as_dict, summarize
    from benchmarks.profile import report as profile_report

    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        return {"skipped": "py-spy not installed (.venv/bin/pip install py-spy)"}
    _remove(out, report)
    run = run_measured([str(spy), "record", "--subprocesses", "--format", "raw", "--rate", "25",
                        "-o", str(raw), "--", *argv], cwd=ROOT, env=opts.env)
    if run.returncode != 0 or not raw.exists():
        return {"skipped": f"py-spy failed: {run.stderr.decode(errors='replace')[-300:]}"}
    summary = summarize(str(raw))
    log(profile_report(summary, 12))
    kept = RESULTS / (raw.name + ".gz")
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(raw, "rb") as src, gzip.open(kept, "wb") as dst:
        shutil.copyfileobj(src, dst)
    _remove(raw)
    return {"raw": str(kept.relative_to(ROOT)), "wall_s_under_profiler": run.wall_s,
            **as_dict(summary)}


def run_row(row: Row, inp: Input, out_fmt: str, ctx: dict, opts, log) -> dict:
    """Ours, the reference (nightly, compressed input), the baseline, verify of the output."""
    label = ctx["label"]
    res = {"workload": row.name, "kind": row.kind, "size": label, "size_bytes": ctx["size"],
           "fmt": inp.fmt, "out_fmt": out_fmt if row.writes else "-", "input": inp.key,
           "uncompressed_bytes": inp.nbytes}
    if row.kind == "layers" and not inp.layers:
        res["skipped"] = "skipped: no once-per-step anchor chosen for this trace"
        return res
    slug = row.name.replace(":", "-")
    out = opts.workdir / f"scale-{label}-{slug}-{inp.fmt}.ours{SUFFIX[out_fmt]}"
    report = Path(f"{out}.{row.kind}.json")
    cut = cut_args(row, inp, opts)
    res["cut"] = " ".join(cut)
    argv = ours_argv(row, inp, out, out_fmt, cut)
    res["command"] = shlex.join(argv)
    log(f"  {row.name} ({inp.fmt} -> {res['out_fmt']}): {res['command']}")
    runs = repeat(lambda i: argv, opts.repeat, opts, env=opts.env,
                  cleanup=lambda: written(out, report), log=log)
    res["ours"] = summary_of(runs, inp.nbytes)
    checked = out
    if row.cut == "split" and res["ours"]["ok"]:
        checked = manifest_of(out)  # verify reads every piece the manifest lists
        res["pieces"] = pieces_of(checked)
        log(f"    {res['pieces']['count']} pieces, the largest "
            f"{res['pieces']['largest_json_bytes'] / 1e6:,.0f} MB of JSON; over the limit: "
            f"{res['pieces']['over_limit'] or 'none'}")
    ref = reference_argv(inp, out_fmt) if row.name == "nightly" else None
    if ref is not None:
        log(f"  reference: {ref[-1]}")
        res["reference"] = summary_of(repeat(lambda i: ref, opts.repeat, opts, log=log),
                                      inp.nbytes)
        res["reference"]["command"] = ref[-1]
    base_out = out.with_name(out.name.replace(".ours", ".baseline"))
    res["baseline"] = run_baseline(row, inp, base_out, out_fmt, opts, log)
    if row.writes and res["ours"]["ok"]:
        if opts.no_verify:
            res["verify"] = {"verdict": "skipped (--no-verify)"}
        else:
            # the nightly output's verify is a row of its own (timed like the others)
            times = opts.repeat if row.name == "nightly" and ctx["size"] <= LARGE else 1
            res["verify"] = verify_output(inp, checked, times, opts, log)
            if row.name == "nightly" and inp.fmt == "plain" and out_fmt == "plain" \
                    and inp.nbytes <= RESTORE_MAX * 1.1:
                res["restore"] = restore_and_compare(inp, out, opts, log)
        if opts.profile and row.name == "nightly":
            raw = opts.workdir / f"{ctx['stem']}-profile-{inp.fmt}.txt"
            res["profile"] = profile_ours(argv, out, report, raw, opts, log)
    _remove(*written(out, report))
    return res


def pieces_of(manifest: Path) -> dict:
    """What a split run's manifest says of its pieces: how many, and how large."""
    data = json.loads(manifest.read_text())
    sizes = [p["json_bytes"] for p in data["pieces"]]
    return {"count": len(sizes), "split_mb": data.get("split_mb"),
            "largest_json_bytes": max(sizes), "smallest_json_bytes": min(sizes),
            "total_json_bytes": sum(sizes), "over_limit": data.get("over_limit")}


def verify_row(nightly: dict) -> dict | None:
    """The verify of the nightly output as a row: its time against the layers run's."""
    check = nightly.get("verify")
    if not check or "ok" not in check:
        return None
    return {"workload": "verify", "kind": "verify", "size": nightly["size"],
            "size_bytes": nightly["size_bytes"], "fmt": nightly["fmt"],
            "out_fmt": nightly["out_fmt"], "input": nightly["input"],
            "uncompressed_bytes": nightly["uncompressed_bytes"], "ours": check,
            "command": check.get("command"), "of": "nightly",
            "layers_best_wall_s": nightly["ours"].get("best_wall_s"),
            "verify": {"verdict": check.get("verdict")}}


# -- the inputs' rows ------------------------------------------------------------------------


def skipped_row(name: str, label: str, size: int, why: str) -> dict:
    return {"workload": name, "size": label, "size_bytes": size, "fmt": "-", "out_fmt": "-",
            "skipped": why}


def run_inputs(label: str, size: int, ctx: dict, opts, log) -> list[dict]:
    """Every selected row, input by input (each input deleted after its rows unless --keep)."""
    want = ctx["want"]
    rows: list[dict] = []
    if any(want(r.name) for r in NIGHTLY_ROWS) or want("verify"):
        rows += run_nightly(label, size, ctx, opts, log)
    if want("gpus8"):
        rows += run_generated("gpus8", TraceConfig(size_bytes=size, gpus=8),
                              [Row("gpus8", "layers")], label, size, ctx, opts, log, pid=0)
    if ctx["under"]("real"):
        rows += run_real(label, size, ctx, opts, log)
    return rows


def run_nightly(label: str, size: int, ctx: dict, opts, log) -> list[dict]:
    """The nightly trace: `nightly` in every format, the other rows on the first format."""
    want = ctx["want"]
    formats = ["gzip"] if size > LARGE else sorted(opts.formats, key=list(SUFFIX).index)
    rows: list[dict] = []
    made: list[Path] = []
    plain = trace_path(opts.workdir, label, "nightly", "plain")
    try:
        for fmt in formats:
            out_fmt, disk = choose_output(size, fmt, opts.workdir)
            if out_fmt is None:
                log(f"== {label} nightly {fmt}: {disk}")
                rows.append(skipped_row(f"nightly ({fmt})", label, size, disk))
                continue
            log(f"== {label} nightly trace, {fmt} input -> {out_fmt} output ({disk})")
            inp = nightly_input(label, size, fmt, plain, opts, made, log)
            for row in NIGHTLY_ROWS:
                # nightly in every format (verify needs its output); the others on the first
                if row.name == "nightly":
                    wanted = want("nightly") or want("verify")
                else:
                    wanted = want(row.name) and fmt == formats[0]
                if wanted:
                    res = run_row(row, inp, out_fmt, ctx, opts, log)
                    res["input_info"] = inp.record()
                    rows.append(res)
                    if row.name == "nightly" and want("verify"):
                        extra = verify_row(res)
                        if extra:
                            rows.append(extra)
    finally:
        if not opts.keep:
            _remove(*made, *(facts_path(p) for p in made))
    return rows


def nightly_input(label: str, size: int, fmt: str, plain: Path, opts, made: list, log) -> Input:
    """The nightly trace in `fmt`: generated (plain first, so every format has its bytes)."""
    start = time.perf_counter()
    path = trace_path(opts.workdir, label, "nightly", fmt)
    source = plain if size <= LARGE else path
    truth, how = generated(source, TraceConfig(size_bytes=size))
    made.append(source)
    if path != source:
        how = compressed_copy(source, fmt, path)
        made.append(path)
    os.sync()  # no timed run pays for writing back the generator's output
    inp = Input("nightly", path, fmt, truth["bytes"], nightly_layers(truth), how,
                time.perf_counter() - start, truth["iterations"])
    log(f"  input: {path.stat().st_size / 1e6:,.0f} MB on disk, {inp.nbytes / 1e6:,.0f} MB "
        f"JSON, {truth['iterations']:,} passes ({how}, {inp.seconds:.0f} s)")
    return inp


def run_generated(key: str, cfg: TraceConfig, rows: list[Row], label: str, size: int,
                  ctx: dict, opts, log, pid: int | None = None) -> list[dict]:
    """Rows on a generated trace of its own (plain; gzip above LARGE)."""
    fmt = "gzip" if size > LARGE else "plain"
    out_fmt, disk = choose_output(size, fmt, opts.workdir)
    if out_fmt is None:
        return [skipped_row(r.name, label, size, disk) for r in rows]
    log(f"== {label} {key} trace, {fmt} input -> {out_fmt} output ({disk})")
    path = trace_path(opts.workdir, label, key, fmt)
    start = time.perf_counter()
    try:
        truth, how = generated(path, cfg)
        os.sync()
        inp = Input(key, path, fmt, truth["bytes"], nightly_layers(truth, pid), how,
                    time.perf_counter() - start, truth["iterations"])
        log(f"  input: {inp.nbytes / 1e6:,.0f} MB JSON, {truth['iterations']:,} passes ({how})")
        return [{**run_row(r, inp, out_fmt, ctx, opts, log), "input_info": inp.record()}
                for r in rows]
    finally:
        if not opts.keep:
            _remove(path, facts_path(path))


def real_traces(opts) -> list[Path]:
    folder = opts.real_traces
    return sorted(folder.glob("*.json*")) if folder and folder.is_dir() else []


def run_real(label: str, size: int, ctx: dict, opts, log) -> list[dict]:
    """Each real trace with GPU activity, replicated to the size: compact, layers, and
    compact --split-mb."""
    want = ctx["want"]
    sources = real_traces(opts)
    if not sources:
        return [skipped_row("real", label, size, f"skipped: no real traces in {opts.real_traces}")]
    rows: list[dict] = []
    for source in sources:
        stem = source.name.split(".")[0]
        key = f"real:{stem}"
        if not ctx["under"](key):
            continue
        if not gpu_activity(source):
            rows.append(skipped_row(key, label, size, "skipped: no GPU activity in the trace"))
            continue
        out_fmt, disk = choose_output(size, "plain", opts.workdir)
        if out_fmt is None:
            rows.append(skipped_row(key, label, size, disk))
            continue
        log(f"== {label} {key}, replicated to plain JSON ({disk})")
        path = trace_path(opts.workdir, label, key, "plain")
        start = time.perf_counter()
        try:
            replica, how = replicated(source, path, size)
            os.sync()
            regex = REAL_ANCHORS.get(stem)
            per_copy = kernel_matches(source, regex) if regex else 0
            passes = replica["copies"] * per_copy
            inp = Input(key, path, "plain", replica["bytes"],
                        real_layers(regex, passes) if passes else None, how,
                        time.perf_counter() - start, passes)
            log(f"  input: {inp.nbytes / 1e6:,.0f} MB, {replica['copies']:,} copies, "
                f"{passes:,} anchor matches of {regex!r}")
            for row in (Row(f"{key}:compact", "compact"), Row(f"{key}:layers", "layers"),
                        Row(f"{key}:split", "compact", cut="split")):
                if want(row.name):
                    res = run_row(row, inp, out_fmt, ctx, opts, log)
                    rows.append({**res, "input_info": {**inp.record(), "replica": replica,
                                                       "anchor_matches_per_copy": per_copy}})
        finally:
            if not opts.keep:
                _remove(path, facts_path(path))
    return rows


# -- the table -----------------------------------------------------------------------------


def _mib(n: int | None) -> str:
    return f"{n / 2**20:,.0f}" if n else "-"


def _timed(part: dict | None) -> str:
    if not part:
        return "-"
    if "skipped" in part:
        return part["skipped"]
    if not part.get("ok"):
        return "FAILED: " + part.get("error", "").strip().splitlines()[-1][:120] \
            if part.get("error", "").strip() else "FAILED"
    return f"{part['best_wall_s']:.1f} (±{part['spread_s']:.1f})"


def _ratio(a: dict | None, b: dict | None, key: str = "best_wall_s") -> float | None:
    if not a or not b or not a.get("ok") or not b.get("ok"):
        return None
    return a[key] / b[key] if b[key] else None


def row_label(res: dict) -> str:
    return f"{res['workload']} {res['size']} {res['fmt']}→{res['out_fmt']}"


def verify_cell(res: dict) -> str:
    check = res.get("verify")
    if not check:
        return "-"
    text = str(check.get("verdict"))
    if res["kind"] == "verify":
        ratio = (res["ours"]["best_wall_s"] / res["layers_best_wall_s"]
                 if res["ours"].get("ok") and res.get("layers_best_wall_s") else None)
        return text + (f" ({ratio:.2f}× the layers time)" if ratio else "")
    if check.get("ok"):
        text += f" ({check['best_wall_s']:.1f} s, {_mib(check['tree_pss'])} MiB)"
    if "restore" in res:
        text += f"; restore: {res['restore']['verdict']}"
    return text


def table_row(res: dict) -> list[str]:
    if "skipped" in res:
        return [res["workload"], res["size"], "-", res["skipped"]] + ["-"] * (len(HEADER) - 4)
    ours, base, ref = res["ours"], res.get("baseline"), res.get("reference")
    speed, mem, vs_ref = _ratio(base, ours), _ratio(base, ours, "tree_pss"), _ratio(ours, ref)
    in_out = (f"{res['fmt']} source + output" if res["kind"] == "verify"
              else f"{res['fmt']} → {res['out_fmt']}")
    if res.get("pieces"):
        pieces = res["pieces"]
        in_out += (f", {pieces['count']} pieces (--split-mb {pieces['split_mb']}; "
                   f"largest {pieces['largest_json_bytes'] / 1e6:,.0f} MB)")
        if pieces.get("over_limit"):  # the manifest's list of pieces over N MB
            in_out += f", over the limit: piece(s) {', '.join(map(str, pieces['over_limit']))}"
    elif res.get("cut"):
        in_out += f", {res['cut']}"
    return [
        res["workload"], res["size"], in_out, _timed(ours),
        f"{ours['mb_per_s']:.1f}" if ours.get("ok") else "-",
        f"{_mib(ours.get('max_rss'))} / {_mib(ours.get('tree_pss'))} "
        f"({_mib(ours.get('tree_rss'))})" if ours.get("ok") else "-",
        _timed(base) if res["kind"] != "verify" else "-",
        f"{_mib(base['max_rss'])} / {_mib(base['tree_pss'])}" if base and base.get("ok")
        else "-",
        f"{speed:.2f}×" if speed else "-", f"{mem:.1f}×" if mem else "-",
        f"{_timed(ref)} (ours {vs_ref:.2f}×)" if vs_ref else _timed(ref),
        verify_cell(res),
    ]


HEADER = ["workload", "size", "in → out", "ours s (±spread)", "ours MB/s",
          "ours MiB: max RSS / tree PSS (tree RSS)", "baseline s", "baseline MiB: max / PSS",
          "speed vs baseline", "memory vs baseline", "gzip/zstd ref s", "verify"]


def table_order(res: dict) -> tuple:
    """Size, then the workloads in the order the docstring lists them, then the format."""
    name = res["workload"].split(" ")[0]
    base = "real" if name.startswith("real") else name
    order = ["nightly", "verify", "nightly-no-terminal", "compact", "gpus8", "inspect",
             "anchors", "split", "window", "real"]
    fmt = list(SUFFIX).index(res["fmt"]) if res["fmt"] in SUFFIX else -1
    nightly_pair = base in ("nightly", "verify")
    return (res["size_bytes"], order.index(base) if not nightly_pair else 0,
            fmt if nightly_pair else 0, order.index(base), name)


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(table_row(r)) + " |" for r in sorted(rows, key=table_order)]
    return "\n".join(lines)


# -- targets ---------------------------------------------------------------------------------


def target(name: str, rows: list[dict], value, holds, show, worst=min) -> dict:
    """One target judged on `rows`: the worst row, and which rows miss it or were not judged.

    `value(row)` is None when the row cannot be judged (e.g. its baseline was
    skipped); a row whose own run failed misses every target it is judged by.
    """
    failed = [r for r in rows if not r["ours"].get("ok")]
    judged = [(r, value(r)) for r in rows if r["ours"].get("ok")]
    not_judged = [row_label(r) for r, v in judged if v is None]
    judged = [(r, v) for r, v in judged if v is not None]
    missed = [row_label(r) for r in failed] + [row_label(r) for r, v in judged if not holds(v)]
    data = {"target": name, "rows": len(rows), "missed": missed, "not_judged": not_judged}
    if failed:
        data.update(holds=False, worst=row_label(failed[0]), value="the run failed")
    elif judged:
        worst_row, worst_value = worst(judged, key=lambda rv: rv[1])
        data.update(holds=not missed, worst=row_label(worst_row), value=show(worst_value))
    else:
        data.update(holds=None, worst="-", value="no row of this run measures it")
    return data


def targets(rows: list[dict]) -> list[dict]:
    """Issue 23's targets on every row (set for 1 GB plain and the 10 GB nightly row)."""
    done = [r for r in rows if "skipped" not in r]
    small = [r for r in done if r["size_bytes"] <= LARGE and r["kind"] != "verify"]
    plain = [r for r in small if r["fmt"] == "plain" and r["out_fmt"] in ("plain", "-")]
    large = [r for r in done if r["size_bytes"] > LARGE and r["workload"] in ("nightly", "split")]
    verify = [r for r in done if r["kind"] == "verify"]
    gz = [r for r in done if r["workload"] == "nightly" and r["fmt"] == r["out_fmt"] == "gzip"]
    pairs = []
    for r in done:
        if r["workload"] == "nightly-no-terminal":
            twin = [n for n in done if n["workload"] == "nightly" and n["size"] == r["size"]
                    and n["fmt"] == r["fmt"] and n["ours"].get("ok")]
            if twin:
                pairs.append({**twin[0], "without": r["ours"]})
    outputs = [r for r in done if r.get("verify") and r["kind"] != "verify"]
    mbps = lambda r: r["ours"]["mb_per_s"]  # noqa: E731
    return [
        target(f">= {TARGETS['mb_per_s']:.0f} MB/s end to end, plain in and out, every "
               "workload row", plain, mbps, lambda v: v >= TARGETS["mb_per_s"],
               lambda v: f"{v:.1f} MB/s"),
        target(f">= {TARGETS['speedup']:.0f}x the baseline in the same run, plain in and out, "
               "every workload row", plain, lambda r: _ratio(r.get("baseline"), r["ours"]),
               lambda v: v >= TARGETS["speedup"], lambda v: f"{v:.2f}x"),
        target(f"max RSS <= {TARGETS['max_rss'] >> 20} MiB, every workload row up to 2 GB",
               small, lambda r: r["ours"]["max_rss"], lambda v: v <= TARGETS["max_rss"],
               lambda v: f"{_mib(v)} MiB", worst=max),
        target(f"tree PSS <= {TARGETS['tree_pss'] >> 20} MiB, every workload row up to 2 GB",
               small, lambda r: r["ours"]["tree_pss"], lambda v: v <= TARGETS["tree_pss"],
               lambda v: f"{_mib(v)} MiB", worst=max),
        target(f"10 GB nightly and split (gzip input): complete with tree PSS <= "
               f"{TARGETS['pss_10gb'] >> 20} MiB", large, lambda r: r["ours"]["tree_pss"],
               lambda v: v <= TARGETS["pss_10gb"], lambda v: f"{_mib(v)} MiB", worst=max),
        target(f"gzip in/out <= {TARGETS['gzip_ratio']:.0f}x `gzip -dc | gzip -1`, nightly row",
               gz, lambda r: _ratio(r["ours"], r.get("reference")),
               lambda v: v <= TARGETS["gzip_ratio"], lambda v: f"{v:.2f}x", worst=max),
        target(f"--end-anchor-regex <= {TARGETS['terminal_ratio']}x the same run without it",
               pairs, lambda r: _ratio(r["ours"], r["without"]),
               lambda v: v <= TARGETS["terminal_ratio"], lambda v: f"{v:.2f}x", worst=max),
        target(f"verify of the nightly output <= {TARGETS['verify_ratio']:.0f}x the layers time",
               verify, lambda r: r["ours"]["best_wall_s"] / r["layers_best_wall_s"]
               if r.get("layers_best_wall_s") else None,
               lambda v: v <= TARGETS["verify_ratio"], lambda v: f"{v:.2f}x", worst=max),
        target(f"verify of the nightly output: tree PSS <= {TARGETS['verify_pss'] >> 20} MiB",
               verify, lambda r: r["ours"]["tree_pss"], lambda v: v <= TARGETS["verify_pss"],
               lambda v: f"{_mib(v)} MiB", worst=max),
        target("verify passes on every benchmark output", outputs,
               lambda r: 1 if r["verify"].get("verdict") == "ok" else 0
               if "skipped" not in str(r["verify"].get("verdict")) else None,
               lambda v: v == 1, lambda v: "ok" if v else "NOT ok"),
        target(f"stretch: >= {TARGETS['stretch_mb_per_s']:.0f} MB/s on every workload row",
               plain, mbps, lambda v: v >= TARGETS["stretch_mb_per_s"],
               lambda v: f"{v:.1f} MB/s"),
    ]


def _some(names: list[str], shown: int = 6) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def target_lines(judged: list[dict]) -> list[str]:
    lines = []
    for t in judged:
        mark = {True: "HOLDS ", False: "MISSED", None: "n/a   "}[t["holds"]]
        line = f"{mark}  {t['target']}: worst {t['worst']}: {t['value']}"
        if t["rows"]:
            line += f" ({t['rows'] - len(t['missed'])} of {t['rows']} rows hold"
            line += f"; missed: {_some(t['missed'])})" if t["missed"] else ")"
        if t["not_judged"]:
            line += f"; not judged (no baseline or verdict): {_some(t['not_judged'])}"
        lines.append(line)
    return lines


# -- driver ----------------------------------------------------------------------------------


def size_label(size: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def result_path(label: str) -> Path:
    day = datetime.date.today().strftime("%Y%m%d")
    path = RESULTS / f"{day}-{socket.gethostname()}-{label}.json"
    if path.exists():
        path = path.with_name(f"{path.stem}-{datetime.datetime.now():%H%M%S}.json")
    return path


def run_size(size: int, opts, log) -> dict:
    label = size_label(size)
    path = result_path(label)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    info = machine()
    selectors = opts.workload or (WORKLOADS if size <= LARGE else LARGE_WORKLOADS)
    ctx = {"label": label, "size": size, "stem": path.stem,
           "want": lambda name: selected(name, selectors),
           "under": lambda prefix: wanted_under(prefix, selectors)}
    rows = run_inputs(label, size, ctx, opts, log)
    data = {"size": label, "size_bytes": size, "started": started,
            "finished": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": [Path(sys.executable).name, "-m", "benchmarks.scale", *sys.argv[1:]],
            "workloads": list(selectors), "machine": info, "engine": opts.engine,
            "load_average_end": load_average(), "git_commit_end": git("rev-parse", "HEAD"),
            "rows": rows, "targets": targets(rows), "table": markdown(rows)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    data["path"] = str(path)
    return data


def print_results(all_data: list[dict]) -> None:
    rows = [r for data in all_data for r in data["rows"]]
    print()
    print(markdown(rows))
    print()
    print("Targets of issue 23 (set for 1 GB plain and the 10 GB nightly row; judged on every "
          "row of this run):")
    for line in target_lines(targets(rows)):
        print(line)
    for data in all_data:
        print(f"results: {os.path.relpath(data['path'], Path.cwd())}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, action="append", required=True,
                        help="uncompressed trace size, e.g. 1GB (repeatable)")
    parser.add_argument("--workload", action="append", metavar="NAME",
                        help="run only this row (repeatable): " + ", ".join(WORKLOADS)
                        + ", real:<trace>, real:<trace>:compact|layers|split (default: every "
                        "row up to 2 GB; nightly, verify and split above)")
    parser.add_argument("--split-mb", type=int, metavar="N",
                        help=f"--split-mb of the split rows (default {SPLIT_MB} where the JSON "
                             "makes at least two such pieces, else a quarter of the JSON)")
    parser.add_argument("--formats", default="plain,gzip,zstd",
                        help="input formats of the nightly row up to 2 GB (default "
                             "plain,gzip,zstd; the other rows read plain JSON)")
    parser.add_argument("--real-traces", type=Path, default=REAL_TRACES,
                        help="folder of real Kineto traces for the real:* rows")
    parser.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / "work")
    parser.add_argument("--keep", action="store_true", help="keep the generated traces")
    parser.add_argument("--repeat", type=int, default=2, help="runs per timed command")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip verify/restore of our outputs (10 GB: saves ~8 minutes here)")
    parser.add_argument("--engine", choices=("head", "worktree", "live"), default="head",
                        help="which tracestream to measure: HEAD's committed code (default), "
                             "a copy of the checkout taken at the start, or the live checkout")
    parser.add_argument("--profile", action="store_true",
                        help="one extra run of the nightly row under py-spy (needs py-spy)")
    opts = parser.parse_args(argv)
    opts.formats = [f.strip() for f in opts.formats.split(",") if f.strip()]
    unknown = set(opts.formats) - set(SUFFIX)
    if unknown:
        parser.error(f"unknown format(s) {', '.join(sorted(unknown))}: plain, gzip, zstd")
    for name in opts.workload or ():
        if name.split(":")[0] not in WORKLOADS or (":" in name and not name.startswith("real:")):
            parser.error(f"unknown workload {name!r}: {', '.join(WORKLOADS)}, real:<trace>, "
                         "real:<trace>:compact, real:<trace>:layers, real:<trace>:split")
    opts.workdir = opts.workdir.resolve()
    return opts


def main(argv=None) -> None:
    opts = parse_args(argv)
    opts.workdir.mkdir(parents=True, exist_ok=True)
    opts.memory_limit = int(MEMORY_SHARE * meminfo("MemAvailable"))

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    snap = opts.workdir / "snapshot"
    opts.env, opts.engine = engine(opts.engine, snap)
    log(f"engine: {opts.engine['mode']} = {opts.engine['imported_from']} (commit "
        f"{opts.engine['git_commit'][:10]}, sha256 {opts.engine['sha256'][:12]}, "
        f"{opts.engine['speedups']}); runs over {opts.memory_limit >> 20} MiB tree PSS "
        "are killed")
    try:
        all_data = [run_size(size, opts, log) for size in opts.size]
    finally:
        if opts.engine["mode"] != "live" and not opts.keep:
            shutil.rmtree(snap, ignore_errors=True)
    print_results(all_data)


if __name__ == "__main__":
    main()
