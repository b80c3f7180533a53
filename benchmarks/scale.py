"""Scale runs: tracestream against the in-memory baseline and gzip on generated multi-GB traces.

    python -m benchmarks.scale --size 1GB [--size 10GB] [--formats plain,gzip,zstd]
                               [--keep] [--workdir DIR] [--repeat 2] [--profile]

For every size and input format it generates a trace with `samples.generate`
and times, each in a fresh process (wall time, and memory as `measure.py`
explains: GNU time's max RSS, and the summed RSS and PSS of the process tree):

* ours: `tracestream layers ... --max-gpu-lanes 10` (both passes, end to end);
* the baseline (`benchmarks/baseline.py`: json.load, plain Python, json.dump),
  unless it would need more than 70% of MemAvailable (~7.5x the JSON size);
* the reference `gzip -dc T.gz | gzip -1 > /dev/null` (and zstd's analogue)
  on the same bytes;
* `inspect --json` and `anchors --json` on the same file;
* `verify` on our output, and for plain input up to 1 GB `restore` plus an
  independent streaming comparison of the restored events with the source.

Timed commands run `--repeat` times; the best wall time is reported with the
spread (worst - best), memory as the worst of the runs. Results go to
`benchmarks/results/<date>-<host>-<size>.json`; generated traces and outputs
are deleted unless `--keep`. Sizes above 2 GB use gzip input only (disk), and
plain output only if three times the space it needs is free.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.compare import compare_events
from benchmarks.measure import Run, load_average, run_measured
from samples.generate import ANCHOR, TraceConfig, generate, parse_size

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SUFFIX = {"plain": ".json", "gzip": ".json.gz", "zstd": ".json.zst"}
COMPRESS = {"plain": "none", "gzip": "gzip", "zstd": "zstd"}
RATIO_GUESS = {"plain": 1.0, "gzip": 5.0, "zstd": 6.0}  # conservative, for disk checks
LARGE = 2 << 30  # above this: gzip input only
RESTORE_MAX = 1 << 30  # restore + comparison only up to this size (plain input)
BASELINE_FACTOR = 7.5  # baseline RSS per JSON byte (json.load dicts + the text)
MEMORY_SHARE = 0.7
DISK_FACTOR = 3
LAYERS_ARGS = ["--anchor-regex", f"^{ANCHOR}$", "--num-layers", "8", "--anchor-offset", "0",
               "--passes", "1", "--extra-anchors-per-pass", "1"]
TARGETS = {"mb_per_s": 100.0, "speedup": 10.0, "pss_1gb": 200 << 20, "pss_10gb": 300 << 20,
           "gzip_ratio": 2.0, "read_only_speedup": 2.0}


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
    its own _speedups.c and its modules are compiled to bytecode; the description
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
        # the snapshot's own C extension, built from its _speedups.c
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
    for path in sorted([*source.rglob("*.py"), *source.rglob("*.c")]):
        digest.update(path.relative_to(source).as_posix().encode() + b"\0" + path.read_bytes())
    probe = [sys.executable, "-c", "import tracestream, tracestream.speedups as s; "
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
class Case:
    """One (size, input format) cell: the files it uses and what it found."""

    label: str
    size: int
    fmt: str
    out_fmt: str
    workdir: Path
    result: dict = field(default_factory=dict)

    @property
    def trace(self) -> Path:
        return self.workdir / f"scale-{self.label}{SUFFIX[self.fmt]}"

    @property
    def plain(self) -> Path:
        return self.workdir / f"scale-{self.label}{SUFFIX['plain']}"

    def output(self, tag: str = "ours") -> Path:
        return self.workdir / f"scale-{self.label}-{self.fmt}.{tag}{SUFFIX[self.out_fmt]}"


def disk_needed(size: int, fmt: str, out_fmt: str, keep_plain: bool) -> int:
    """Bytes on disk one case may hold at once (input, output, spill, restore, plain copy)."""
    need = size / RATIO_GUESS[fmt] + 1.25 * size / RATIO_GUESS[out_fmt] + 0.2 * size
    if fmt == "plain" and size <= RESTORE_MAX:
        need += size
    if keep_plain and fmt != "plain":
        need += size
    return int(need)


def choose_output(size: int, fmt: str, workdir: Path) -> tuple[str | None, str]:
    """Output format for a case: like the input, or for large sizes plain if the disk allows."""
    free = shutil.disk_usage(workdir).free
    wanted = ["plain", "gzip"] if size > LARGE else [fmt]
    for out_fmt in wanted:
        need = disk_needed(size, fmt, out_fmt, keep_plain=size <= LARGE)
        if free >= DISK_FACTOR * need:
            return out_fmt, f"{free / 2**30:.0f} GiB free, needs ~{need / 2**30:.1f} GiB"
    need = disk_needed(size, fmt, wanted[-1], keep_plain=False)
    return None, (f"skipped: {free / 2**30:.1f} GiB free, less than {DISK_FACTOR}x the "
                  f"~{need / 2**30:.1f} GiB it needs")


def make_input(case: Case) -> dict:
    """Generate the case's trace (or compress an existing plain one of the same size)."""
    start = time.perf_counter()
    if case.trace.exists():
        how = "existing file (--keep from an earlier run)"
    elif case.fmt != "plain" and case.plain.exists():
        tool_argv = {"gzip": ["gzip", "-1", "-c"], "zstd": ["zstd", "-q", "-3", "-c"]}[case.fmt]
        with open(case.plain, "rb") as src, open(case.trace, "wb") as dst:
            subprocess.run(tool_argv, stdin=src, stdout=dst, check=True)
        how = f"{' '.join(tool_argv)} of the plain trace (same bytes)"
    else:
        generate(case.trace, TraceConfig(size_bytes=case.size))
        how = "samples.generate"
    return {"path": str(case.trace), "bytes": case.trace.stat().st_size, "how": how,
            "seconds": time.perf_counter() - start}


# -- measuring -------------------------------------------------------------------------------


def _remove(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def summary_of(runs: list[Run], nbytes: int | None = None) -> dict:
    """Best wall time, spread, worst memory; every run kept for the record."""
    ok = [r for r in runs if r.returncode == 0]
    data = {"runs": [r.record() for r in runs], "ok": len(ok) == len(runs) and bool(runs)}
    if not ok:
        data["error"] = runs[-1].stderr.decode(errors="replace")[-500:] if runs else "not run"
        return data
    walls = [r.wall_s for r in ok]
    data.update(best_wall_s=min(walls), spread_s=max(walls) - min(walls),
                max_rss=max(r.max_rss for r in ok), tree_rss=max(r.tree_rss for r in ok),
                tree_pss=max(r.tree_pss for r in ok))
    if nbytes:
        data["mb_per_s"] = nbytes / min(walls) / 1e6
    return data


def repeat(argv_for, times: int, *, env=None, cleanup=(), stdout=subprocess.DEVNULL,
           log=None) -> list[Run]:
    """Run a command `times` times in fresh processes, removing `cleanup` before each run."""
    runs = []
    for i in range(times):
        _remove(*cleanup)
        argv = argv_for(i)
        run = run_measured(argv, stdout=stdout, cwd=ROOT, env=env)
        runs.append(run)
        if log:
            log(f"    run {i + 1}/{times}: {run.wall_s:7.1f} s, rc {run.returncode}, "
                f"max RSS {run.max_rss / 2**20:.0f} MiB, tree PSS {run.tree_pss / 2**20:.0f} MiB"
                f" (load {run.load_before:.1f})")
        if run.returncode != 0:
            break
    return runs


def ours_argv(case: Case) -> list[str]:
    out = case.output()
    argv = tool() + ["layers", "--trace", str(case.trace), "--output", str(out), *LAYERS_ARGS,
                     "--phase", "target-verify", "--evidence", "bench", "--max-gpu-lanes", "10",
                     "--quiet"]
    if case.out_fmt != "plain":
        argv += ["--compress", COMPRESS[case.out_fmt]]
    return argv


def baseline_argv(case: Case) -> list[str]:
    out = case.output("baseline")
    return [sys.executable, "-m", "benchmarks.baseline", "--trace", str(case.trace),
            "--output", str(out), *LAYERS_ARGS, "--max-gpu-lanes", "10",
            "--compress", COMPRESS[case.out_fmt]]


def reference_argv(case: Case) -> list[str] | None:
    """`gzip -dc T | gzip -1` (or zstd's analogue) of the same bytes, to /dev/null.

    With plain output only the decompression (`gzip -dc T > /dev/null`) is the
    reference; plain input has none.
    """
    if case.fmt == "plain":
        return None
    path = shlex.quote(str(case.trace))
    decompress = {"gzip": f"gzip -dc {path}", "zstd": f"zstd -q -dc {path}"}[case.fmt]
    compress = {"plain": "", "gzip": " | gzip -1", "zstd": " | zstd -q -3 -c"}[case.out_fmt]
    return ["bash", "-o", "pipefail", "-c", f"{decompress}{compress} > /dev/null"]


def baseline_gate(uncompressed: int) -> str | None:
    """None when the baseline fits; else why it is skipped."""
    need = BASELINE_FACTOR * uncompressed
    available = meminfo("MemAvailable")
    if need > MEMORY_SHARE * available:
        return (f"skipped: would need ~{need / 2**30:.0f} GB "
                f"(> {MEMORY_SHARE:.0%} of {available / 2**30:.0f} GB available)")
    return None


def uncompressed_size(case: Case, inspect_runs: list[Run]) -> int:
    """JSON bytes of the input: the file itself, or what `inspect` decompressed."""
    if case.fmt == "plain":
        return case.trace.stat().st_size
    if case.plain.exists():
        return case.plain.stat().st_size
    for run in inspect_runs:
        if run.returncode == 0 and run.stdout:
            return int(json.loads(run.stdout)["decompressed_bytes"])
    return case.size


def verify_output(case: Case, env, log) -> dict:
    """`tracestream verify` on our output: its verdict, the failed checks, the time."""
    argv = tool() + ["verify", "--trace", str(case.trace), "--output", str(case.output()),
                     "--json"]
    run = run_measured(argv, cwd=ROOT, env=env)
    data = {"run": run.record(), "wall_s": run.wall_s, "tree_pss": run.tree_pss,
            "max_rss": run.max_rss}
    try:
        verdict = json.loads(run.stdout)
        data["verdict"] = verdict.get("verdict")
        data["failed"] = [c for c in verdict.get("checks", []) if not c.get("ok")]
    except ValueError:
        data["verdict"] = f"no verdict (exit {run.returncode})"
    log(f"    verify: {data['verdict']} in {run.wall_s:.1f} s")
    return data


def restore_and_compare(case: Case, env, log) -> dict:
    """`tracestream restore`, then the restored events against the source, streamed."""
    restored = case.output("restored").with_suffix(".json")
    _remove(restored)
    argv = tool() + ["restore", "--trace", str(case.output()), "--output", str(restored)]
    run = run_measured(argv, cwd=ROOT, env=env)
    data = {"run": run.record(), "wall_s": run.wall_s, "tree_pss": run.tree_pss}
    if run.returncode == 0:
        start = time.perf_counter()
        data["comparison"] = compare_events(case.trace, restored)
        data["comparison_s"] = time.perf_counter() - start
        data["verdict"] = data["comparison"]["verdict"]
    else:
        data["verdict"] = f"restore failed (exit {run.returncode})"
    _remove(restored)
    log(f"    restore: {data['verdict']} (restore {run.wall_s:.1f} s)")
    return data


def profile_ours(case: Case, stem: str, env, log) -> dict:
    """One more run of ours under py-spy (workers included); where the samples fall."""
    from benchmarks.profile import as_dict, report, summarize

    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        return {"skipped": "py-spy not installed (.venv/bin/pip install py-spy)"}
    raw = case.workdir / f"{stem}-profile-{case.fmt}.txt"
    _remove(case.output(), Path(str(case.output()) + ".layers.json"))
    argv = [str(spy), "record", "--subprocesses", "--format", "raw", "--rate", "25",
            "-o", str(raw), "--", *ours_argv(case)]
    run = run_measured(argv, cwd=ROOT, env=env)
    if run.returncode != 0 or not raw.exists():
        return {"skipped": f"py-spy failed: {run.stderr.decode(errors='replace')[-300:]}"}
    summary = summarize(str(raw))
    log(report(summary, 12))
    kept = RESULTS / (raw.name + ".gz")
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(raw, "rb") as src, gzip.open(kept, "wb") as dst:
        shutil.copyfileobj(src, dst)
    _remove(raw)
    return {"raw": str(kept.relative_to(ROOT)), "wall_s_under_profiler": run.wall_s,
            **as_dict(summary)}


def run_case(case: Case, opts, stem: str, log) -> dict:
    """Every measurement of one (size, format) case; see the module docstring."""
    res = case.result
    log(f"== {case.label} {case.fmt} input -> {case.out_fmt} output")
    res["input"] = make_input(case)
    os.sync()  # no timed run pays for writing back the generator's (or a baseline's) output
    log(f"  input: {res['input']['bytes'] / 1e6:,.0f} MB on disk ({res['input']['how']}, "
        f"{res['input']['seconds']:.0f} s)")
    report = Path(str(case.output()) + ".layers.json")
    log("  ours: tracestream layers")
    ours = repeat(lambda i: ours_argv(case), opts.repeat, env=opts.env,
                  cleanup=(case.output(), report), log=log)
    log("  inspect / anchors")
    inspect = repeat(lambda i: tool() + ["inspect", "--trace", str(case.trace), "--json"],
                     opts.repeat, env=opts.env, stdout=subprocess.PIPE, log=log)
    anchors = repeat(lambda i: tool() + ["anchors", "--trace", str(case.trace), "--anchor-regex",
                                         f"^{ANCHOR}$", "--json"], opts.repeat, env=opts.env,
                     log=log)
    nbytes = uncompressed_size(case, inspect)
    res.update(uncompressed_bytes=nbytes, ours=summary_of(ours, nbytes),
               inspect=summary_of(inspect, nbytes), anchors=summary_of(anchors, nbytes))
    ref = reference_argv(case)
    if ref is not None:
        log(f"  reference: {ref[-1]}")
        res["reference"] = summary_of(repeat(lambda i: ref, opts.repeat, log=log), nbytes)
        res["reference"]["command"] = ref[-1]
    res["baseline"] = run_baseline(case, opts, nbytes, log)
    if res["ours"]["ok"] and opts.no_verify:
        res["verify"] = {"verdict": "skipped (--no-verify)"}
    elif res["ours"]["ok"]:
        res["verify"] = verify_output(case, opts.env, log)
        if case.fmt == "plain" and nbytes <= RESTORE_MAX * 1.1:
            res["restore"] = restore_and_compare(case, opts.env, log)
        if opts.profile:
            res["profile"] = profile_ours(case, stem, opts.env, log)
    _remove(case.output(), report)
    return res


def run_baseline(case: Case, opts, nbytes: int, log) -> dict:
    if opts.no_baseline:
        return {"skipped": "skipped: --no-baseline"}
    why = baseline_gate(nbytes)
    if why:
        log(f"  baseline {why}")
        return {"skipped": why}
    log("  baseline: json.load + Python + json.dump")
    out = case.output("baseline")
    runs = repeat(lambda i: baseline_argv(case), opts.repeat, cleanup=(out,), log=log)
    _remove(out)
    return summary_of(runs, nbytes)


# -- the table -----------------------------------------------------------------------------


def _mib(n: int | None) -> str:
    return f"{n / 2**20:,.0f}" if n else "-"


def _timed(part: dict | None) -> str:
    if not part:
        return "-"
    if "skipped" in part:
        return part["skipped"]
    if not part.get("ok"):
        return "failed"
    return f"{part['best_wall_s']:.1f} (±{part['spread_s']:.1f})"


def _ratio(a: dict | None, b: dict | None, key: str = "best_wall_s") -> float | None:
    if not a or not b or not a.get("ok") or not b.get("ok"):
        return None
    return a[key] / b[key]


def row(label: str, res: dict) -> list[str]:
    ours, base = res.get("ours", {}), res.get("baseline")
    ref = res.get("reference")
    speed = _ratio(base, ours)
    mem = _ratio(base, ours, "tree_pss")
    vs_ref = _ratio(ours, ref)
    ins = _ratio(ours, res.get("inspect"))
    anc = _ratio(ours, res.get("anchors"))
    base_mem = (f"{_mib(base['max_rss'])} / {_mib(base['tree_pss'])}"
                if base and base.get("ok") else "-")
    verdict = res.get("verify", {}).get("verdict", "-")
    if "restore" in res:
        verdict += f"; restore: {res['restore']['verdict']}"
    return [
        label, f"{res['fmt']} → {res['out_fmt']}", _timed(ours),
        f"{ours['mb_per_s']:.1f}" if ours.get("ok") else "-",
        f"{_mib(ours.get('max_rss'))} / {_mib(ours.get('tree_pss'))} "
        f"({_mib(ours.get('tree_rss'))})",
        _timed(base), base_mem,
        f"{speed:.2f}×" if speed else "-", f"{mem:.1f}×" if mem else "-",
        _timed(ref), f"{vs_ref:.2f}×" if vs_ref else "-",
        f"{_timed(res.get('inspect'))} ({ins:.1f}×)" if ins else _timed(res.get("inspect")),
        f"{_timed(res.get('anchors'))} ({anc:.1f}×)" if anc else _timed(res.get("anchors")),
        verdict,
    ]


HEADER = ["size", "in → out", "ours s (±spread)", "ours MB/s",
          "ours RSS MiB: max / tree PSS (tree RSS)", "baseline s", "baseline MiB: max / PSS",
          "speed vs baseline", "memory vs baseline", "gzip/zstd ref s", "ours / ref",
          "inspect s (speed-up)", "anchors s (speed-up)", "verify"]


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# -- targets ---------------------------------------------------------------------------------


def targets(label: str, size: int, cases: list[dict]) -> list[dict]:
    """The issue's four targets, judged on this run (tree PSS for memory)."""
    by_fmt = {c["fmt"]: c for c in cases if "ours" in c}
    out = []
    plain = by_fmt.get("plain")
    if plain and plain["ours"].get("ok"):
        rate = plain["ours"]["mb_per_s"]
        speed = _ratio(plain.get("baseline"), plain["ours"])
        ok = rate >= TARGETS["mb_per_s"] and speed is not None and speed >= TARGETS["speedup"]
        out.append({"target": f"plain JSON {label}: >= 100 MB/s and >= 10x baseline",
                    "holds": ok, "value": f"{rate:.1f} MB/s, "
                    + (f"{speed:.2f}x baseline" if speed else "baseline not run")})
    limit = TARGETS["pss_1gb"] if size <= (1 << 30) * 1.5 else TARGETS["pss_10gb"]
    for fmt, c in by_fmt.items():
        if c["ours"].get("ok"):
            pss = c["ours"]["tree_pss"]
            out.append({"target": f"peak memory {label} {fmt}: tree PSS <= {limit >> 20} MiB",
                        "holds": pss <= limit,
                        "value": f"tree PSS {_mib(pss)} MiB, max RSS "
                                 f"{_mib(c['ours']['max_rss'])} MiB, tree RSS "
                                 f"{_mib(c['ours']['tree_rss'])} MiB"})
    gz = by_fmt.get("gzip")
    if gz and gz["out_fmt"] == "gzip" and _ratio(gz["ours"], gz.get("reference")):
        r = _ratio(gz["ours"], gz["reference"])
        out.append({"target": f"gzip {label}: <= 2x `gzip -dc | gzip -1`",
                    "holds": r <= TARGETS["gzip_ratio"], "value": f"{r:.2f}x"})
    for fmt, c in by_fmt.items():
        for cmd in ("inspect", "anchors"):
            r = _ratio(c["ours"], c.get(cmd))
            if r:
                out.append({"target": f"{cmd} {label} {fmt}: >= 2x faster than layers",
                            "holds": r >= TARGETS["read_only_speedup"], "value": f"{r:.2f}x"})
    return out


# -- driver ----------------------------------------------------------------------------------


def formats_for(size: int, wanted: list[str]) -> list[str]:
    """Above LARGE only gzip input (disk); else the requested formats, plain first."""
    if size > LARGE:
        return ["gzip"]
    return sorted(wanted, key=list(SUFFIX).index)


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
    stem = path.stem
    started = datetime.datetime.now().isoformat(timespec="seconds")
    info = machine()
    cases: list[dict] = []
    made: list[Path] = []
    for fmt in formats_for(size, opts.formats):
        out_fmt, disk = choose_output(size, fmt, opts.workdir)
        if out_fmt is None:
            log(f"== {label} {fmt}: {disk}")
            cases.append({"fmt": fmt, "out_fmt": "-", "skipped": disk})
            continue
        case = Case(label, size, fmt, out_fmt, opts.workdir)
        case.result.update(fmt=fmt, out_fmt=out_fmt, disk=disk)
        try:
            run_case(case, opts, stem, log)
        finally:
            made.append(case.trace)
        cases.append(case.result)
    if not opts.keep:
        _remove(*made)
    rows = [row(label, c) for c in cases if "ours" in c]
    data = {"size": label, "size_bytes": size, "started": started,
            "finished": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": [Path(sys.executable).name, "-m", "benchmarks.scale", *sys.argv[1:]],
            "machine": info, "engine": opts.engine, "load_average_end": load_average(),
            "git_commit_end": git("rev-parse", "HEAD"),
            "cases": cases, "targets": targets(label, size, cases), "table": markdown(rows)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    data["path"] = str(path)
    return data


def print_results(all_data: list[dict]) -> None:
    rows = []
    for data in all_data:
        rows += [row(data["size"], c) for c in data["cases"] if "ours" in c]
    print()
    print(markdown(rows))
    print()
    for data in all_data:
        for t in data["targets"]:
            print(f"{'HOLDS ' if t['holds'] else 'MISSED'}  {t['target']}: {t['value']}")
        skipped = [c for c in data["cases"] if "skipped" in c]
        for c in skipped:
            print(f"SKIPPED {data['size']} {c['fmt']}: {c['skipped']}")
        print(f"results: {os.path.relpath(data['path'], Path.cwd())}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, action="append", required=True,
                        help="uncompressed trace size, e.g. 1GB (repeatable)")
    parser.add_argument("--formats", default="plain,gzip,zstd",
                        help="input formats for sizes up to 2 GB (default plain,gzip,zstd)")
    parser.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / "work")
    parser.add_argument("--keep", action="store_true", help="keep the generated traces")
    parser.add_argument("--repeat", type=int, default=2, help="runs per timed command")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip verify/restore of our output (10 GB: saves ~8 minutes here)")
    parser.add_argument("--engine", choices=("head", "worktree", "live"), default="head",
                        help="which tracestream to measure: HEAD's committed code (default), "
                             "a copy of the checkout taken at the start, or the live checkout")
    parser.add_argument("--profile", action="store_true",
                        help="one extra run of ours per case under py-spy (needs py-spy)")
    opts = parser.parse_args(argv)
    opts.formats = [f.strip() for f in opts.formats.split(",") if f.strip()]
    unknown = set(opts.formats) - set(SUFFIX)
    if unknown:
        parser.error(f"unknown format(s) {', '.join(sorted(unknown))}: plain, gzip, zstd")
    opts.workdir = opts.workdir.resolve()
    return opts


def main(argv=None) -> None:
    opts = parse_args(argv)
    opts.workdir.mkdir(parents=True, exist_ok=True)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    snap = opts.workdir / "snapshot"
    opts.env, opts.engine = engine(opts.engine, snap)
    log(f"engine: {opts.engine['mode']} = {opts.engine['imported_from']} (commit "
        f"{opts.engine['git_commit'][:10]}, sha256 {opts.engine['sha256'][:12]}, "
        f"{opts.engine['speedups']})")
    try:
        all_data = [run_size(size, opts, log) for size in opts.size]
    finally:
        if opts.engine["mode"] != "live" and not opts.keep:
            shutil.rmtree(snap, ignore_errors=True)
    print_results(all_data)


if __name__ == "__main__":
    main()
