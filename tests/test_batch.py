"""`batch`: many traces, one task each, on a local process pool or a Dask cluster.

CLI runs go through a new process (as a user runs them) with a marker in the
environment, so the tests can prove no worker process outlives the command.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from samples.generate import TraceConfig, generate
from tracestream import engine
from tracestream.commands import batch
from tracestream.commands.batch import engines as batch_engines
from tracestream.commands.batch import execute as batch_execute
from tracestream.commands.batch import outcome as batch_outcome
from tracestream.commands.batch import tasks as batch_tasks
from tracestream.commands.verify import verify
from tracestream.commands.verify.verdict import Verdict
from tracestream.errors import TraceError
from tracestream.plan.specs import CompactSpec, LayerSpec

ROOT = Path(__file__).resolve().parents[1]
TRACESTREAM = [sys.executable, "-m", "tracestream"]
ANCHOR = "^_q_rope_store$"
EVIDENCE = "generator: one _q_rope_store per layer, one extra per pass"
LAYER_DEFAULTS = ["--anchor-regex", ANCHOR, "--num-layers", "8", "--extra-anchors-per-pass", "1",
                  "--phase", "target-verify", "--evidence", EVIDENCE]


# -- helpers ---------------------------------------------------------------------


def _processes_with(marker: str) -> list[int]:
    """Processes whose environment carries `marker` (children inherit it)."""
    found = []
    needle = f"TRACESTREAM_TEST_MARKER={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry))
    return found


def _marked_env() -> tuple[dict, str]:
    marker = uuid.uuid4().hex
    return {**os.environ, "PYTHONPATH": str(ROOT), "TRACESTREAM_TEST_MARKER": marker}, marker


def assert_none_left(marker: str) -> None:
    deadline = time.monotonic() + 10
    while (left := _processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:  # clean up before failing, so one failure does not leak into others
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"


def run_cli(*args, timeout: float = 120):
    """Run `tracestream` in a new process; assert it left no process behind."""
    env, marker = _marked_env()
    done = subprocess.run(TRACESTREAM + [str(a) for a in args], capture_output=True, env=env,
                          timeout=timeout)
    assert_none_left(marker)
    return done


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def lines_of(done) -> list[dict]:
    return [json.loads(line) for line in done.stdout.decode().splitlines() if line.strip()]


def by_name(results: list[dict]) -> dict[str, dict]:
    return {Path(r["trace"]).name: r for r in results}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Four generated ranks (different seeds and lengths) and a truncated gzip trace."""
    folder = tmp_path_factory.mktemp("ranks")
    paths = []
    for i in range(4):
        path = folder / f"TP-{i}.trace.json.gz"
        generate(path, TraceConfig(seed=i, iterations=2 + i))
        paths.append(path)
    data = paths[0].read_bytes()
    corrupt = folder / "TP-9.trace.json.gz"
    corrupt.write_bytes(data[: len(data) // 2])
    return paths, corrupt


def assert_batch_of_five(done, out: Path, ranks_) -> None:
    paths, corrupt = ranks_
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert "Traceback" not in stderr, stderr
    results = by_name(lines_of(done))
    assert len(results) == 5 and len(lines_of(done)) == 5
    for path in paths:
        r = results[path.name]
        assert r["status"] == "ok", r
        assert r["error"] is None and r["events"] > 0 and r["seconds"] >= 0
        assert r["gpu_lanes"] >= 1 and r["scope_lanes"] >= 0
        output = out / path.name.replace(".json.gz", ".compact.json.gz")
        assert r["output"] == str(output)
        assert gzip.open(output).read(1) == b"{"  # same compression as the input
        assert Path(str(output) + ".compact.json").is_file()
        verdict = verify(path, output)
        assert verdict.ok, verdict.summary()
    bad = results[corrupt.name]
    assert bad["status"] == "failed" and "truncated" in bad["error"], bad
    assert "\n" not in bad["error"]
    # no partial output, no report, no temporary file for the corrupt trace
    assert not [p for p in out.iterdir() if "TP-9" in p.name], sorted(os.listdir(out))
    assert len(list(out.iterdir())) == 8
    # stderr is not a TTY here: a plain final line and the summary table
    assert "4 ok, 0 skipped, 1 failed of 5 traces" in stderr
    assert "status" in stderr and "TP-9.trace.json.gz" in stderr


# -- pure helpers -------------------------------------------------------------------


@pytest.mark.parametrize("name, kind, compress, expected", [
    ("TP-0.trace.json.gz", "compact", None, "TP-0.trace.compact.json.gz"),
    ("TP-0.trace.json.gz", "layers", None, "TP-0.trace.layers.json.gz"),
    ("rank.json", "layers", None, "rank.layers.json"),
    ("rank.json.zst", "compact", None, "rank.compact.json.zst"),
    ("rank.json.gz", "compact", "zstd", "rank.compact.json.zst"),
    ("rank.json.gz", "compact", "none", "rank.compact.json"),
    ("rank.json", "compact", "gzip", "rank.compact.json.gz"),
    ("rank.gz", "compact", None, "rank.compact.json.gz"),
    ("rank", "compact", None, "rank.compact.json"),
])
def test_output_names(name, kind, compress, expected):
    assert batch_tasks.output_name(f"/some/dir/{name}", kind, compress) == expected


def test_manifest_errors_name_the_line(tmp_path):
    manifest = tmp_path / "ranks.jsonl"
    cases = [
        ('{"trace": "a.json", "pid": 0}\nnot json\n', "line 2"),
        ('{"trace": "a.json", "anchor_ofset": 3}\n', "anchor_ofset"),
        ('{"pid": 0}\n', "trace"),
        ('{"trace": "a.json", "num_layers": "8"}\n', "num_layers must be an integer"),
        ('\n{"trace": "a.json", "num_layers": 0}\n', "line 2: num_layers must be >= 1"),
        ('{"trace": "a.json", "anchor_regex": "("}\n', "line 1: anchor_regex"),
        ('{"trace": "a.json", "max_gpu_lanes": 11}\n', "line 1: max_gpu_lanes must be between"),
        ('{"trace": "a.json", "passes": "every"}\n', 'passes must be an integer or "all"'),
        ('{"trace": "a.json", "allow_gaps": 1}\n', "allow_gaps must be true or false"),
        ('{"trace": "a.json", "gap_factor": "3"}\n', "gap_factor must be a number"),
        ('{"trace": "a.json", "gap_factor": 0.5}\n', "line 1: gap_factor must be > 1"),
    ]
    defaults = {"anchor_regex": ANCHOR, "num_layers": 8, "anchor_offset": 0,
                "phase": "target-verify", "evidence": EVIDENCE}
    for text, fragment in cases:
        manifest.write_text(text)
        with pytest.raises(TraceError, match=fragment):
            batch.layers_tasks(str(manifest), str(tmp_path / "out"), defaults)
    manifest.write_text('{"trace": "a.json"}\n')
    with pytest.raises(TraceError, match="line 1: missing anchor_offset"):
        batch.layers_tasks(str(manifest), str(tmp_path / "out"),
                           {k: v for k, v in defaults.items() if k != "anchor_offset"})
    manifest.write_text('{"trace": "a.json"}\n{"trace": "sub/../a.json"}\n')
    with pytest.raises(TraceError, match="would both write"):
        batch.layers_tasks(str(manifest), str(tmp_path / "out"), defaults)


def test_manifest_line_wins_and_traces_are_relative_to_the_manifest(tmp_path):
    (tmp_path / "m").mkdir()
    manifest = tmp_path / "m" / "ranks.jsonl"
    manifest.write_text('# nightly ranks\n{"trace": "TP-1.json.gz", "pid": "1", "anchor_offset": 9,'
                        ' "output": "x/TP-1.out.json"}\n{"trace": "/abs/TP-0.json"}\n')
    tasks = batch.layers_tasks(str(manifest), "out", {
        "anchor_regex": ANCHOR, "num_layers": 8, "anchor_offset": 0, "phase": "p",
        "evidence": "e", "pid": "0", "max_gpu_lanes": 4})
    first, second = tasks
    assert first["trace"] == str(tmp_path / "m" / "TP-1.json.gz")
    assert first["output"] == os.path.abspath("out/x/TP-1.out.json")
    assert first["layers"]["pid"] == 1 and first["layers"]["anchor_offset"] == 9
    assert first["compact"] == {"max_lanes": 4, "pid": 1}
    assert first["compress"] == "none"  # an explicit output's compression follows its name
    assert second["trace"] == "/abs/TP-0.json"
    assert second["output"] == os.path.abspath("out/TP-0.layers.json")
    assert second["report"] == second["output"] + ".layers.json"
    assert second["layers"]["pid"] == 0 and second["layers"]["anchor_offset"] == 0


# -- 1. a batch of five, one corrupt, on each engine --------------------------------------


def test_local_engine_five_traces_one_corrupt(ranks, tmp_path):
    paths, corrupt = ranks
    out = tmp_path / "out"
    done = run_cli("batch", "compact", "--engine", "local", "--jobs", "2", "--output-dir", out,
                   "--verify", *paths, corrupt)
    assert_batch_of_five(done, out, ranks)
    assert all(r["verified"] for r in lines_of(done) if r["status"] == "ok")


def test_dask_engine_five_traces_one_corrupt(ranks, tmp_path):
    pytest.importorskip("distributed")
    paths, corrupt = ranks
    out = tmp_path / "out"
    done = run_cli("batch", "compact", "--engine", "dask", "--jobs", "2", "--output-dir", out,
                   *paths, corrupt)
    assert_batch_of_five(done, out, ranks)


# -- 2. per-rank layers from a manifest match single-file runs byte for byte ----------------


def test_manifest_layers_match_single_file_runs(tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    for i in range(2):
        generate(folder / f"TP-{i}.json", TraceConfig(gpus=2, iterations=4, seed=10 + i))
    manifest = folder / "ranks.jsonl"
    manifest.write_text(
        '{"trace": "TP-0.json", "pid": 0, "anchor_offset": 0}\n'
        '{"trace": "TP-1.json", "pid": 1, "anchor_offset": 9, "passes": 2}\n')
    out = tmp_path / "out"
    # --anchor-offset 99 and --passes 3 are defaults: the manifest's values win where given
    done = run_cli("batch", "layers", "--manifest", manifest, "--output-dir", out, "--jobs", "2",
                   "--anchor-offset", "99", "--passes", "3", *LAYER_DEFAULTS)
    assert done.returncode == 0, done.stderr.decode()
    results = by_name(lines_of(done))
    assert results["TP-0.json"]["guides"] == 8 * 3
    assert results["TP-1.json"]["guides"] == 8 * 2
    single = tmp_path / "single"
    single.mkdir()
    for i, (pid, offset, passes) in enumerate([(0, 0, 3), (1, 9, 2)]):
        spec = LayerSpec(anchor_regex=ANCHOR, num_layers=8, anchor_offset=offset,
                         phase="target-verify", evidence=EVIDENCE, passes=passes,
                         extra_anchors_per_pass=1, pid=pid)
        expected = engine.add_layer_guides(folder / f"TP-{i}.json", single / f"TP-{i}.layers.json",
                                        spec)
        assert expected.data["pid"] == pid and expected.data["anchor_offset"] == offset
        batch_output = out / f"TP-{i}.layers.json"
        assert results[f"TP-{i}.json"]["output"] == str(batch_output)
        assert batch_output.read_bytes() == (single / f"TP-{i}.layers.json").read_bytes()
    # the ranks' guides really differ (different pid and offset)
    assert (out / "TP-0.layers.json").read_bytes() != (out / "TP-1.layers.json").read_bytes()


def test_manifest_error_exits_2_before_any_work(tmp_path):
    manifest = tmp_path / "ranks.jsonl"
    manifest.write_text('{"trace": "TP-0.json", "pid": 0}\n{"trace": "TP-1.json", "pid": [1]}\n')
    done = run_cli("batch", "layers", "--manifest", manifest, "--output-dir", tmp_path / "out",
                   "--anchor-offset", "0", *LAYER_DEFAULTS)
    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert stderr.strip().count("\n") == 0 and "line 2" in stderr and "pid" in stderr
    assert done.stdout == b"" and not (tmp_path / "out").exists()



def test_a_manifest_output_the_compress_option_contradicts_exits_2_before_any_work(tmp_path):
    """A line's own `output` keeps its name's compression: a --compress against it is refused
    as the single-trace commands refuse it, before anything runs."""
    manifest = tmp_path / "ranks.jsonl"
    manifest.write_text('{"trace": "TP-0.json", "output": "TP-0.layers.json"}\n')
    done = run_cli("batch", "layers", "--manifest", manifest, "--output-dir", tmp_path / "out",
                   "--compress", "gzip", "--anchor-offset", "0", *LAYER_DEFAULTS)
    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert stderr.strip().count("\n") == 0
    assert "--compress gzip contradicts the output name" in stderr
    assert done.stdout == b"" and not (tmp_path / "out").exists()

# -- 3. --skip-existing redoes only what is missing ------------------------------------------


def test_skip_existing_reruns_only_the_missing_output(ranks, tmp_path):
    paths, _ = ranks
    out = tmp_path / "out"
    first = run_cli("batch", "compact", "--jobs", "2", "--output-dir", out, *paths[:3])
    assert first.returncode == 0, first.stderr.decode()
    outputs = {r["trace"]: Path(r["output"]) for r in lines_of(first)}
    before = {p: p.stat().st_mtime_ns for p in out.iterdir()}
    gone = outputs[str(paths[1])]
    gone.unlink()
    Path(str(gone) + ".compact.json").unlink()
    again = run_cli("batch", "compact", "--jobs", "2", "--output-dir", out, "--skip-existing",
                    *paths[:3])
    assert again.returncode == 0, again.stderr.decode()
    statuses = {Path(r["trace"]).name: r["status"] for r in lines_of(again)}
    assert statuses == {paths[0].name: "skipped", paths[1].name: "ok", paths[2].name: "skipped"}
    assert "1 ok, 2 skipped, 0 failed of 3 traces" in again.stderr.decode()
    for path, mtime in before.items():
        if path in (gone, Path(str(gone) + ".compact.json")):
            assert path.exists()
        else:
            assert path.stat().st_mtime_ns == mtime, f"{path.name} was rewritten"
    assert verify(paths[1], gone).ok
    # without --skip-existing an existing output is a failed trace, never overwritten
    third = run_cli("batch", "compact", "--jobs", "1", "--output-dir", out, paths[0])
    assert third.returncode == 1
    (line,) = lines_of(third)
    assert line["status"] == "failed" and "already exists" in line["error"]


# -- 4. --verify, a missing Dask, a worker that dies --------------------------------------------


def _compact_task(trace: Path, out: Path, **extra) -> dict:
    return batch.compact_tasks([str(trace)], str(out), **extra)[0]


def test_verify_failure_removes_output_and_report(ranks, tmp_path, monkeypatch):
    paths, _ = ranks
    out = tmp_path / "out"
    task = _compact_task(paths[0], out, verify=True)
    import tracestream.commands.verify as verify_module

    failing = Verdict()
    failing.add("restored events equal the source", ["event 7 differs"], "")
    monkeypatch.setattr(verify_module, "verify", lambda *a, **k: failing)
    result = batch_execute.run_task(task)
    assert result["status"] == "failed" and result["verified"] is False
    assert "verify failed" in result["error"] and "event 7 differs" in result["error"]
    assert list(out.iterdir()) == [], "a failed --verify must remove output and report"
    monkeypatch.undo()
    result = batch_execute.run_task(task)
    assert result["status"] == "ok" and result["verified"] is True
    assert Path(task["output"]).exists() and Path(task["report"]).exists()


def test_a_retry_takes_over_the_output_its_earlier_attempt_completed(ranks, tmp_path):
    """An engine re-runs a task whose result was lost; the output it wrote is its own."""
    paths, _ = ranks
    out = tmp_path / "out"
    task = _compact_task(paths[0], out, verify=True)
    first = batch_execute.run_task(task)
    assert first["status"] == "ok"
    again = batch_execute.run_task({**task, "attempt": 2})
    assert again["status"] == "ok" and again["verified"] is True
    counts = ("events", "gpu_lanes", "scope_lanes")
    assert {k: again[k] for k in counts} == {k: first[k] for k in counts}
    # not the same task (other options, or another trace): never taken over, never overwritten
    other = _compact_task(paths[0], out, spec=CompactSpec(max_lanes=9))
    assert "already exists" in batch_execute.run_task({**other, "attempt": 2})["error"]
    renamed = {**task, "trace": str(paths[1]), "attempt": 2}
    assert "already exists" in batch_execute.run_task(renamed)["error"]
    assert batch_execute.run_task(task)["status"] == "failed"  # a first attempt never takes over


def test_run_task_never_raises(tmp_path):
    task = _compact_task(tmp_path / "missing.json", tmp_path / "out")
    result = batch_execute.run_task(task)
    assert result["status"] == "failed" and result["error"]
    assert batch_execute.run_task({"kind": "nonsense"})["status"] == "failed"


def test_killed_worker_process_becomes_a_failed_line(ranks, tmp_path):
    """A worker blocked reading a FIFO is killed from outside: a failed line, no hang."""
    paths, _ = ranks
    fifo = tmp_path / "stuck.trace.json"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    env, marker = _marked_env()
    proc = subprocess.Popen(
        TRACESTREAM + ["batch", "compact", "--jobs", "2", "--output-dir", str(out), str(fifo),
                       str(paths[0])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        first = json.loads(proc.stdout.readline())
        assert first["status"] == "ok" and first["trace"] == str(paths[0])
        deadline = time.monotonic() + 10
        while len(workers := _children(proc.pid)) != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(workers) == 1, workers  # only the task waiting on the FIFO is left
        os.kill(workers[0], signal.SIGKILL)
        rest, stderr = proc.communicate(timeout=60)
    finally:
        watchdog.cancel()
        proc.kill()
    assert proc.returncode == 1, stderr.decode()
    (stuck,) = [json.loads(line) for line in rest.decode().splitlines()]
    assert stuck["status"] == "failed" and stuck["trace"] == str(fifo)
    assert "worker process died" in stuck["error"]
    assert not [p for p in out.iterdir() if "stuck" in p.name]
    assert_none_left(marker)


def test_dask_missing_exits_2_with_install_hint(ranks, tmp_path, monkeypatch):
    from tracestream.cli import main

    monkeypatch.setitem(sys.modules, "distributed", None)
    result = CliRunner().invoke(main, ["batch", "compact", "--engine", "dask", "--output-dir",
                                       str(tmp_path / "out"), str(ranks[0][0])])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'tracestream[dask]'" in lines[0], result.output
    assert not (tmp_path / "out").exists()


def crash_on_tp2(task: dict) -> dict:
    """A task function whose worker dies (SIGKILL) on TP-2, as an out-of-memory kill would."""
    if "TP-2" in task["trace"]:
        os.kill(os.getpid(), signal.SIGKILL)
    return batch_execute.run_task(task)


def test_local_worker_crash_becomes_a_failed_line(ranks, tmp_path):
    paths, _ = ranks
    out = tmp_path / "out"
    tasks = batch.compact_tasks([str(p) for p in paths], str(out))
    outcome = batch.run_batch(tasks, engine="local", jobs=2, task_fn=crash_on_tp2)
    results = by_name(outcome.results)
    assert len(outcome.results) == 4 and outcome.exit_code == 1
    crashed = results["TP-2.trace.json.gz"]
    assert crashed["status"] == "failed" and "worker process died" in crashed["error"]
    assert {n: r["status"] for n, r in results.items() if n != "TP-2.trace.json.gz"} == {
        "TP-0.trace.json.gz": "ok", "TP-1.trace.json.gz": "ok", "TP-3.trace.json.gz": "ok"}
    assert sorted(p.name for p in out.iterdir() if "TP-2" in p.name) == []
    import multiprocessing

    assert multiprocessing.active_children() == []


@pytest.fixture(scope="module")
def dask_cluster():
    """One LocalCluster (2 worker processes) shared by the tests that bring their own scheduler."""
    distributed = pytest.importorskip("distributed")
    import logging

    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     dashboard_address=None,
                                     silence_logs=logging.CRITICAL) as cluster:
        yield cluster
    import multiprocessing

    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert multiprocessing.active_children() == []


def test_dask_existing_scheduler(ranks, tmp_path, dask_cluster):
    paths, corrupt = ranks
    out = tmp_path / "out"
    done = run_cli("batch", "compact", "--engine", "dask", "--scheduler",
                   dask_cluster.scheduler_address, "--output-dir", out, "--verify",
                   *paths, corrupt)
    assert_batch_of_five(done, out, ranks)


def test_dask_worker_crash_becomes_a_failed_line(ranks, tmp_path, dask_cluster):
    paths, _ = ranks
    out = tmp_path / "out"
    tasks = batch.compact_tasks([str(p) for p in paths[1:3]], str(out))
    results = by_name(batch_engines.run_dask(tasks, 2, dask_cluster.scheduler_address,
                                     task_fn=crash_on_tp2))
    assert results["TP-1.trace.json.gz"]["status"] == "ok"
    crashed = results["TP-2.trace.json.gz"]
    assert crashed["status"] == "failed" and "worker process died" in crashed["error"]
    assert "KilledWorker" in crashed["error"]
    assert not [p for p in out.iterdir() if "TP-2" in p.name]


def test_usage_errors_exit_2_before_any_work(ranks, tmp_path):
    from tracestream.cli import main

    trace = str(ranks[0][0])
    out = str(tmp_path / "out")
    for args, fragment in [
        (["--scheduler", "tcp://127.0.0.1:1", trace], "--scheduler needs --engine dask"),
        (["--max-gpu-lanes", "11", trace], "between 1 and 10"),
        (["--jobs", "0", trace], "--jobs must be >= 1"),
        ([trace, trace], "would both write"),
    ]:
        result = CliRunner().invoke(main, ["batch", "compact", "--output-dir", out, *args])
        assert result.exit_code == 2, (args, result.output)
        assert fragment in result.output and result.output.count("\n") == 1, result.output
    assert not Path(out).exists()


def test_progress_and_summary_text():
    outcome = batch.BatchOutcome(total=4, seconds=2.0, results=[
        {"trace": "/t/TP-0.json", "status": "ok", "error": None, "seconds": 1.5,
         "events": 1234, "gpu_lanes": 5, "scope_lanes": 2, "input_bytes": 3_000_000},
        {"trace": "/t/TP-1.json", "status": "failed", "error": "gzip data is truncated",
         "seconds": 0.1, "events": None, "gpu_lanes": None, "scope_lanes": None,
         "input_bytes": 1_000_000},
        {"trace": "/t/TP-2.json", "status": "skipped", "error": None, "seconds": 0.0,
         "events": None, "gpu_lanes": None, "scope_lanes": None,
         "input_bytes": 9_000_000},
    ])
    assert batch_outcome.progress_note(outcome) == "1 failed, 2.0 MB/s"
    assert batch_outcome.final_line(outcome, "compact") == (
        "batch compact: 1 ok, 1 skipped, 1 failed of 4 traces in 2.0 s (2.0 MB/s of input)")
    table = batch_outcome.summary_table(outcome).splitlines()
    assert table[0].split() == ["status", "seconds", "MB", "events", "gpu_lanes", "trace"]
    assert table[1].split() == ["ok", "1.50", "3.0", "1,234", "5", "TP-0.json"]
    assert table[2].startswith("failed") and table[2].endswith("TP-1.json: gzip data is truncated")


def test_one_folder_per_rank_writes_one_output_folder_per_rank(ranks, tmp_path):
    """The usual cluster layout, every rank's trace under the same name in its own folder:
    the outputs mirror the folders, and each line gives GPU lanes and scope lanes apart,
    as the rank's report counts them."""
    from tracestream.cli import main

    paths, _ = ranks
    inputs = []
    for rank in (0, 1):
        folder = tmp_path / "runs" / f"r{rank}"
        folder.mkdir(parents=True)
        inputs.append(folder / "trace.json.gz")
        inputs[-1].write_bytes(paths[rank].read_bytes())
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["batch", "compact", "--output-dir", str(out), "--jobs",
                                       "1", *map(str, inputs)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert sorted(line["output"] for line in lines) == [
        str(out / f"r{rank}" / "trace.compact.json.gz") for rank in (0, 1)]
    for line in lines:
        report = json.loads(Path(line["report"]).read_text())
        lanes = {kind: sum(g["lanes"] for g in report["groups"] if g["kind"] == kind)
                 for kind in ("activity", "scopes")}
        assert (line["gpu_lanes"], line["scope_lanes"]) == (lanes["activity"], lanes["scopes"])
        assert line["scope_lanes"] > 0  # the generator's traces have GPU user annotations


def test_outputs_mirror_only_the_part_of_the_paths_that_differs():
    folders = batch_tasks.distinct_folders
    assert folders(["/a/r0/t.json", "/a/r1/t.json"]) == ["r0", "r1"]
    assert folders(["/a/x/r0/t.json", "/a/y/t.json"]) == ["x/r0", "y"]
    assert folders(["/a/t0.json", "/a/t1.json"]) == ["", ""]
    assert folders(["/a/t.json", "/a/r1/t.json"]) == ["", "r1"]


def test_inputs_that_would_still_write_one_output_are_refused(ranks, tmp_path):
    """`t.json` and `t.json.gz` in one folder, both written uncompressed: one name."""
    from tracestream.cli import main

    plain = tmp_path / "in" / "TP-0.trace.json"
    plain.parent.mkdir()
    plain.write_bytes(gzip.decompress(ranks[0][0].read_bytes()))
    packed = tmp_path / "in" / "TP-0.trace.json.gz"
    packed.write_bytes(ranks[0][0].read_bytes())
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["batch", "compact", "--output-dir", str(out),
                                       "--compress", "none", str(plain), str(packed)])
    assert result.exit_code == 2, result.output
    assert "would both write" in result.output and "distinct names or folders" in result.output
    assert not out.exists()


def test_the_summary_names_each_rank_by_the_part_of_its_path_that_differs():
    outcome = batch.BatchOutcome(total=2, seconds=1.0, results=[
        {"trace": f"/runs/r{rank}/trace.json", "status": "ok", "error": None, "seconds": 1.0,
         "events": 10, "gpu_lanes": 3, "scope_lanes": 2, "input_bytes": 1_000_000}
        for rank in (0, 1)])
    rows = batch_outcome.summary_table(outcome).splitlines()[1:]
    assert [row.split()[-1] for row in rows] == ["r0/trace.json", "r1/trace.json"]
