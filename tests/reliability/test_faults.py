"""Faults while tracestream runs: full disks, signals, a closed pipe, a changing input, races.

Each fault must end in a non-zero exit with one clean line, no output or report
(nor a hidden temporary file), a source that is unchanged, and no worker
process left behind.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from samples.generate import TraceConfig, generate
from tracestream.engine import build_plan
from tracestream.errors import TraceError
from tracestream.plan.specs import CompactSpec
from tracestream.read.source import TraceSource
from tracestream.write.rewrite import chunk_edits, rewrite
from tracestream.write.sink import OutputFile

from .checks import assert_verified, assert_written
from .support import (
    ENV,
    PYTHON,
    ROOT,
    TALLY,
    assert_refused,
    error_line,
    exec_cli,
    leftovers,
    sha256,
)

GENERATED_LAYERS = ["--anchor-regex", "^_q_rope_store$", "--num-layers", "8", "--anchor-offset",
                    "0", "--passes", "2", "--extra-anchors-per-pass", "1", "--phase",
                    "target-verify", "--evidence", "generator: one _q_rope_store per layer"]
SIGNAL_RUNS = int(os.environ.get("TRACESTREAM_SIGNAL_RUNS") or 8)


def command(kind: str, trace, output, *extra) -> list:
    args = [kind, "--trace", trace, "--output", output, "--quiet", *extra]
    return args + GENERATED_LAYERS if kind == "layers" else args


@pytest.fixture(scope="module")
def medium(tmp_path_factory) -> Path:
    """A generated trace of ~2 MB: big enough to overflow small disks and pipe buffers."""
    path = tmp_path_factory.mktemp("medium") / "medium.json"
    generate(path, TraceConfig(iterations=30))
    return path


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> Path:
    """A generated trace of ~32 MB (both passes take long enough to be interrupted)."""
    path = tmp_path_factory.mktemp("large") / "large.json"
    generate(path, TraceConfig(size_bytes=32 << 20))
    return path


def _same_group_processes(pgid: int) -> list[str]:
    found = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True)
    return found.stdout.split()


# -- a full disk ---------------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB tmpfs (needs root and mount), unmounted afterwards."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.mark.parametrize("kind", ["layers", "compact"])
def test_disk_full_on_tmpfs(cli, medium, tiny_disk, kind):
    before = sha256(medium)
    out = cli(*command(kind, medium, tiny_disk / "out.json"))
    assert_refused(out, "no space left on the device", place=False, empty=tiny_disk)
    assert sha256(medium) == before
    TALLY["faults injected (full disk)"] += 1


def test_disk_full_after_one_of_two_files(cli, tiny_disk, tmp_path):
    """Room for the output or for its report, not for both: neither appears."""
    trace = tmp_path / "small.json"
    generate(trace, TraceConfig(iterations=2))
    roomy = tmp_path / "roomy"
    roomy.mkdir()
    assert cli(*command("compact", trace, roomy / "out.json")).rc == 0
    page = 4096
    pages = [-(-(roomy / name).stat().st_size // page) for name in (
        "out.json", "out.json.compact.json")]
    keep = max(pages) + 1
    assert keep < sum(pages) <= 64
    (tiny_disk / "filler").write_bytes(b"x" * ((64 - keep) * page))
    out = cli(*command("compact", trace, tiny_disk / "out.json"))
    assert out.rc == 2, out.describe()
    assert "no space left" in error_line(out)
    assert leftovers(tiny_disk) == ["filler"]
    TALLY["faults injected (full disk)"] += 1


@pytest.mark.parametrize("kind", ["layers", "compact"])
def test_file_size_limit(medium, tmp_path, kind):
    """RLIMIT_FSIZE: the write fails (SIGXFSZ is ignored), the run refuses cleanly."""
    folder = tmp_path / "out"
    folder.mkdir()

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    proc = subprocess.run([PYTHON, "-m", "tracestream", *map(str, command(
        kind, medium, folder / "out.json"))], capture_output=True, env=ENV, cwd=ROOT,
        preexec_fn=limit, timeout=120)
    line = error_line(_outcome(proc))
    assert proc.returncode == 2 and "file size limit exceeded" in line, line
    assert leftovers(folder) == []
    TALLY["faults injected (file size limit)"] += 1


def test_spill_to_a_full_disk(medium, tiny_disk, monkeypatch):
    """Index records spilled next to the output hit ENOSPC: a refusal, not an internal error."""
    from tracestream import engine
    from tracestream.index.records import RecordStore

    monkeypatch.setitem(RecordStore.__init__.__kwdefaults__, "budget", 4096)
    (tiny_disk / "filler").write_bytes(b"x" * ((256 - 8) << 10))
    with pytest.raises(TraceError, match="cannot spill index records"):
        engine.compact(medium, tiny_disk / "out.json", workers=0)
    assert leftovers(tiny_disk) == ["filler"]
    TALLY["faults injected (full disk)"] += 1


def _outcome(proc: subprocess.CompletedProcess):
    from .support import Outcome

    return Outcome(proc.returncode, proc.stdout, proc.stderr.decode(errors="replace"), 0.0,
                   "exec")


# -- signals at random points of both passes ------------------------------------------------


def _wait_until_reading(pid: int, trace: Path, limit: float = 20.0) -> None:
    """Until the process has the trace open (start-up is over, the first pass began)."""
    deadline = time.monotonic() + limit
    target = str(trace)
    while time.monotonic() < deadline:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return
                except OSError:
                    continue
        except FileNotFoundError:
            return  # already gone
        time.sleep(0.005)


def _phase(pid: int, folder: Path) -> str:
    """Which pass a run is in: the output's temporary file exists only in the rewrite pass."""
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return "exit"
    return "rewrite pass" if any(link.startswith(str(folder)) for link in links) else (
        "index pass or plan")


def _run_and_signal(args, trace: Path, folder: Path, signum: int, delay: float, group: bool,
                    in_rewrite: bool = False):
    """Start a run; `delay` seconds after it began reading (or, `in_rewrite`, after its
    rewrite pass began) send `signum` to it or to its group. (rc, stderr, orphans, phase)."""
    proc = subprocess.Popen([PYTHON, "-m", "tracestream", *map(str, args)], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    _wait_until_reading(proc.pid, trace)
    while in_rewrite and proc.poll() is None and _phase(proc.pid, folder) != "rewrite pass":
        time.sleep(0.002)
    time.sleep(delay)
    phase = _phase(proc.pid, folder)
    try:
        if group:  # what Ctrl-C in a terminal does: the whole foreground group
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
    except ProcessLookupError:
        pass
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"hung after signal {signum} (delay {delay:.2f}s)")
    time.sleep(0.05)
    orphans = _same_group_processes(proc.pid)
    if orphans:
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, err.decode(errors="replace"), orphans, phase


def _timeline(args, trace: Path, folder: Path) -> tuple[float, float]:
    """(when the rewrite pass starts, when the run ends), in seconds after it began reading."""
    proc = subprocess.Popen([PYTHON, "-m", "tracestream", *map(str, args)], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_until_reading(proc.pid, trace)
    started = time.monotonic()
    rewrite = None
    while proc.poll() is None:
        if rewrite is None and _phase(proc.pid, folder) == "rewrite pass":
            rewrite = time.monotonic() - started
        time.sleep(0.005)
    ended = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr.read()
    return (rewrite if rewrite is not None else ended / 2), ended


def test_signals_at_random_points(large, tmp_path):
    """SIGINT/SIGTERM to the process or its whole group, at random times of both passes."""
    rng = random.Random(20261129)
    before = sha256(large)
    timeline = {}
    for kind in ("layers", "compact"):
        folder = tmp_path / f"reference-{kind}"
        folder.mkdir()
        timeline[kind] = _timeline(command(kind, large, folder / "out.json", "--workers", "2"),
                                   large, folder)
    plan = [(kind, signum, group) for kind in ("layers", "compact")
            for signum in (signal.SIGINT, signal.SIGTERM) for group in (False, True)]
    for run in range(SIGNAL_RUNS):
        kind, signum, group = plan[run % len(plan)]
        folder = tmp_path / f"run{run}"
        folder.mkdir()
        output = folder / "out.json"
        workers = rng.choice(["0", "2"])
        rewrite, ended = timeline[kind]
        # every other run aims at the rewrite pass (the shorter one): a random time into it
        in_rewrite = run % 2 == 1
        delay = rng.uniform(0.0, (ended - rewrite) * 0.8 if in_rewrite else rewrite)
        rc, err, orphans, phase = _run_and_signal(
            command(kind, large, output, "--workers", workers), large, folder, signum, delay,
            group, in_rewrite)
        assert "Traceback" not in err, err
        assert not orphans, f"worker processes outlived the run: {orphans}"
        if rc == 0:  # finished before the signal, or it came after the commit: complete output
            assert_written(folder, output, kind)
            TALLY["signals that came too late to matter (exit 0, complete output)"] += 1
        else:
            expected = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}
            code, word = expected[signum]
            lines = [line for line in err.splitlines() if line.strip()]
            assert rc == code and len(lines) == 1 and word in lines[0], (rc, err, delay, phase)
            assert "no output was left behind" in lines[0]
            assert leftovers(folder) == [], leftovers(folder)
            TALLY["faults injected (SIGINT/SIGTERM mid-run)"] += 1
            TALLY[f"faults injected (SIGINT/SIGTERM mid-run), in the {phase}"] += 1
    assert sha256(large) == before


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_just_after_the_output_appears(medium, tmp_path, signum):
    """A signal that arrives once the output is linked into place: either both files stay
    and the exit is 0, or the commit is undone and the exit says so - never a complete
    output with an exit code and a message that say nothing was written."""
    for attempt in range(3):
        folder = tmp_path / f"run{attempt}"
        folder.mkdir()
        output = folder / "out.json"
        proc = subprocess.Popen([PYTHON, "-m", "tracestream", *map(str, command(
            "compact", medium, output))], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True)
        while proc.poll() is None and not output.exists():
            time.sleep(0.0005)
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass
        _, err = proc.communicate(timeout=60)
        err = err.decode(errors="replace")
        assert "Traceback" not in err, err
        if proc.returncode == 0:
            assert_written(folder, output, "compact")
            assert_verified(medium, output)
        else:
            assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[signum], err
            assert leftovers(folder) == [], (err, leftovers(folder))
        TALLY["faults injected (signal just after the commit)"] += 1


@pytest.fixture
def program_scope(as_program):
    """The CLI's scope (`sink.process_ends_after_commit`) around the test when `as_program`."""
    from tracestream.write import sink

    with sink.process_ends_after_commit() if as_program else contextlib.nullcontext():
        yield


@pytest.mark.parametrize("as_program", [True, False])
def test_committed_outputs_are_not_undone_by_a_late_signal(tmp_path, monkeypatch, as_program,
                                                            program_scope):
    """As a program (the CLI), Ctrl-C/SIGTERM are ignored once all files are committed, so a
    late signal cannot turn a complete run into exit 143 (or kill it while Python exits);
    called in-process (a notebook, click's runner), the caller's handlers come back."""
    from tracestream.write import sink

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        files = [OutputFile(str(tmp_path / name)) for name in ("a.json", "b.json")]
        for f in files:
            f.write(b"{}")
        sink.commit_together(files)
        now = {s: signal.getsignal(s) for s in saved}
        expected = {s: signal.SIG_IGN for s in saved} if as_program else saved
        assert now == expected
        assert leftovers(tmp_path) == ["a.json", "b.json"]
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


class _LateSignal(Exception):
    pass


@pytest.mark.parametrize("as_program", [True, False])
def test_a_signal_after_the_commit_decision_keeps_the_files(tmp_path, monkeypatch, as_program,
                                                             program_scope):
    """A SIGTERM that lands after the commit was judged complete, while the handlers are
    being put back, leaves both files: the CLI ignores it, a library caller gets it (here
    a handler that raises). It used to undo the commit and exit as an interrupt (130)."""
    from tracestream.write import sink

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def late(signum, frame):
        raise _LateSignal()

    real_signal = signal.signal
    sent = []

    def restoring(signum, handler):
        holding = getattr(signal.getsignal(signum), "__name__", "") == "hold"
        if not sent and holding and signum == signal.SIGINT:
            sent.append(signum)  # the first handler put back: SIGTERM is still held
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # the held handler runs here
        return real_signal(signum, handler)

    real_signal(signal.SIGTERM, late)
    try:
        files = [OutputFile(str(tmp_path / name)) for name in ("a.json", "b.json")]
        for f in files:
            f.write(b"{}")
        monkeypatch.setattr(signal, "signal", restoring)
        if as_program:
            sink.commit_together(files)
        else:
            with pytest.raises(_LateSignal):
                sink.commit_together(files)
        assert sent == [signal.SIGINT]
        assert leftovers(tmp_path) == ["a.json", "b.json"]
    finally:
        monkeypatch.undo()
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def _started(kind: str, trace: Path, output: Path, *, stderr) -> subprocess.Popen:
    """A run of `kind` with two workers, in a session of its own, once it reads `trace`."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "tracestream", *map(str, command(kind, trace, output, "--workers", "2"))],
        cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    _wait_until_reading(proc.pid, trace)
    return proc


def test_sigkill_leaves_no_workers(large, tmp_path):
    """A killed run (OOM killer, kill -9) leaves no output and no orphaned worker process.

    It is killed halfway through its index pass, when the workers are busy: the
    time comes from a reference run, as the passes take well under a second here.
    """
    reference = tmp_path / "reference"
    reference.mkdir()
    rewrite, _ = _timeline(command("compact", large, reference / "out.json", "--workers", "2"),
                           large, reference)
    folder = tmp_path / "out"
    folder.mkdir()
    proc = _started("compact", large, folder / "out.json", stderr=subprocess.DEVNULL)
    time.sleep(rewrite / 2)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 5
    while _same_group_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    orphans = _same_group_processes(proc.pid)
    if orphans:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not orphans, f"workers outlived their killed parent: {orphans}"
    assert leftovers(folder) == []
    TALLY["faults injected (SIGKILL mid-run)"] += 1


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_a_killed_worker_ends_the_run_in_one_line(large, tmp_path, compressed):
    """A worker killed mid-pass (OOM killer, kill -9) ends the run at once with one line,
    exit 2, nothing written and no worker left: the executor stops the other workers
    with SIGTERM, which they ignore, and used to wait for them forever at 100% CPU."""
    import gzip

    trace = large
    if compressed:
        trace = tmp_path / "large.json.gz"
        trace.write_bytes(gzip.compress(large.read_bytes(), 1))
    folder = tmp_path / "out"
    folder.mkdir()
    proc = _started("layers", trace, folder / "out.json", stderr=subprocess.PIPE)
    workers = []
    while proc.poll() is None and not workers:
        found = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
        workers = found.stdout.split()
    assert workers, "the run ended before a worker could be killed"
    os.kill(int(workers[0]), signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("hung after a worker was killed")
    orphans = _same_group_processes(proc.pid)
    if orphans:
        os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, err
    assert err.decode() == "tracestream: error: a worker process died (killed, or out of memory?)\n"
    assert not orphans, f"workers outlived the run: {orphans}"
    assert leftovers(folder) == []
    TALLY["faults injected (a worker killed)"] += 1


# -- the reader of stdout goes away ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["layers", "compact"])
def test_stdout_closed_early(medium, tmp_path, kind):
    """`tracestream ... --output - --report R | head -c 100`: exit 2, and no report R."""
    folder = tmp_path / "reports"
    folder.mkdir()
    report = folder / "r.json"
    pipeline = (" ".join(_quote(a) for a in [PYTHON, "-m", "tracestream", *command(
        kind, medium, "-", "--report", report)]) + " | head -c 100 > /dev/null; "
                "exit ${PIPESTATUS[0]}")
    proc = subprocess.run(["bash", "-c", pipeline], capture_output=True, env=ENV, cwd=ROOT,
                          timeout=120)
    out = _outcome(proc)
    assert_refused(out, "the reader closed the pipe", place=False, empty=folder)
    TALLY["faults injected (stdout closed early)"] += 1


def _quote(arg) -> str:
    import shlex

    return shlex.quote(str(arg))


# -- the input changes between the two passes ----------------------------------------------------


def _plan(source: TraceSource, kind: str, pool=None):
    from tracestream.plan.specs import LayerSpec

    spec = LayerSpec(anchor_regex="^_q_rope_store$", num_layers=8, anchor_offset=0, passes=2,
                     extra_anchors_per_pass=1, phase="target-verify", evidence="generator")
    return build_plan(source, spec if kind == "layers" else None,
                      CompactSpec() if kind == "compact" else CompactSpec(max_lanes=10),
                      output_name="out.json", report_name="out.json.r.json", command=kind,
                      pool=pool)


def _truncate(path: Path, data: bytes) -> None:
    path.write_bytes(data[: len(data) // 2])


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(b" ")


def _replace(path: Path, data: bytes) -> None:
    """Same bytes, new file (an editor's save, `cp` over it): a different inode."""
    fresh = path.with_suffix(".new")
    fresh.write_bytes(data)
    os.replace(fresh, path)


def _remove(path: Path, data: bytes) -> None:
    path.unlink()


def _edit_in_place(path: Path, data: bytes) -> None:
    """Same size, same mtime, one digit changed: only the bytes tell."""
    stat = path.stat()
    where = data.index(b'"ts": 17') + 10
    changed = bytearray(data)
    changed[where] = ord("7") if changed[where] != ord("7") else ord("3")
    with open(path, "r+b") as fh:
        fh.write(bytes(changed))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


CHANGES = {"truncated": _truncate, "appended": _append, "replaced": _replace, "removed": _remove,
           "edited_in_place": _edit_in_place}


def test_input_that_shrinks_while_the_index_pass_reads_it(large, tmp_path, monkeypatch):
    """With workers on a plain file, the main process reads only the bytes near each cut
    and the workers their chunks; when the file loses its tail while this pass reads it,
    the run is refused as the truncated trace it now is: exit 2, one line, nothing
    written."""
    from click.testing import CliRunner

    from tracestream.cli import main
    from tracestream.read.source import SkippingBlocks

    from .support import Outcome

    source_path = tmp_path / "trace.json"
    shutil.copyfile(large, source_path)
    size = source_path.stat().st_size
    read = SkippingBlocks.__next__

    def shrinking(self):  # the file loses its tail once a third of it was passed
        if self._pos >= size // 3 and source_path.stat().st_size == size:
            os.truncate(source_path, size // 3)
        return read(self)

    monkeypatch.setattr(SkippingBlocks, "__next__", shrinking)
    folder = tmp_path / "out"
    folder.mkdir()
    result = CliRunner().invoke(main, command("compact", source_path, folder / "out.json",
                                              "--workers", "2"))
    out = Outcome(result.exit_code, result.stdout_bytes, result.stderr, 0.0, "in-process")
    assert_refused(out, "input ends inside the event array", "truncated", empty=folder)


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("kind", ["layers", "compact"])
def test_input_changed_between_passes(medium, tmp_path, change, kind):
    source_path = tmp_path / "trace.json"
    shutil.copyfile(medium, source_path)
    data = source_path.read_bytes()
    folder = tmp_path / "out"
    folder.mkdir()
    with TraceSource(str(source_path)) as source:
        index, plan = _plan(source, kind)
        try:
            CHANGES[change](source_path, data)
            with pytest.raises(TraceError, match="changed between passes|disappeared") as caught:
                with OutputFile(str(folder / "out.json")) as out:
                    rewrite(source, index, plan, out)
                    out.commit()
        finally:
            index.close()
    assert "\n" not in str(caught.value)
    assert leftovers(folder) == []
    TALLY["faults injected (input changed between passes)"] += 1


@pytest.mark.parametrize("change", ["edited_in_place", "appended"])
def test_input_changed_before_it_is_hashed(medium, tmp_path, monkeypatch, change):
    """The report's sha256 comes from a read of its own, which starts after the index pass.
    Here it is held back until the report asks for it, and the input changes after the
    rewrite pass read it: only the hash's read sees the change, and the run is refused like
    any change between passes (exit 2, one line, nothing written)."""
    from click.testing import CliRunner

    from tracestream import engine
    from tracestream.cli import main

    from .support import Outcome

    source_path = tmp_path / "trace.json"
    shutil.copyfile(medium, source_path)
    data = source_path.read_bytes()
    start_hashing = TraceSource.start_hashing
    asked = []

    def when_the_report_asks(self):
        asked.append(self)
        if len(asked) > 1:  # the first call comes right after the index pass
            start_hashing(self)

    real_rewrite = engine.rewrite

    def rewrite_then_change(*args, **kwargs):
        real_rewrite(*args, **kwargs)
        CHANGES[change](source_path, data)

    monkeypatch.setattr(TraceSource, "start_hashing", when_the_report_asks)
    monkeypatch.setattr(engine, "rewrite", rewrite_then_change)
    folder = tmp_path / "out"
    folder.mkdir()
    result = CliRunner().invoke(main, command("layers", source_path, folder / "out.json"))
    out = Outcome(result.exit_code, result.stdout_bytes, result.stderr, 0.0, "in-process")
    assert_refused(out, f"input {source_path} changed between passes", place=False, empty=folder)
    assert len(asked) == 2


def test_input_edited_in_place_at_random(medium, tmp_path):
    """Same size and mtime, random bytes changed after the index pass: always the same
    refusal ("changed between passes"), whatever the edits then trip over."""
    rng = random.Random(11)
    source_path = tmp_path / "trace.json"
    original = medium.read_bytes()
    folder = tmp_path / "out"
    folder.mkdir()
    for _ in range(40):
        source_path.write_bytes(original)
        stat = source_path.stat()
        with TraceSource(str(source_path)) as source:
            index, plan = _plan(source, rng.choice(["layers", "compact"]))
            try:
                changed = bytearray(original)
                for _ in range(rng.choice([1, 1, 3, 30])):
                    changed[rng.randrange(len(changed))] = rng.randrange(256)
                with open(source_path, "r+b") as fh:
                    fh.write(bytes(changed))
                os.utime(source_path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
                with pytest.raises(TraceError, match="changed between passes"):
                    with OutputFile(str(folder / "out.json")) as out:
                        rewrite(source, index, plan, out)
                        out.commit()
            finally:
                index.close()
        assert leftovers(folder) == []
        TALLY["faults injected (input changed between passes)"] += 1


def _refused_with_workers(source_path: Path, folder: Path, change) -> TraceError:
    """Plan `compact` of `source_path` with two workers, `change(index, plan)` the input,
    then rewrite it: the refusal, once nothing is left in `folder`."""
    from tracestream.read.sizing import pool_for

    with pool_for(str(source_path), 2) as pool, TraceSource(str(source_path)) as source:
        index, plan = _plan(source, "compact", pool=pool)
        try:
            change(index, plan)
            with pytest.raises(TraceError) as caught:
                with OutputFile(str(folder / "out.json")) as out:
                    rewrite(source, index, plan, out, pool=pool)
                    out.commit()
        finally:
            index.close()
    assert leftovers(folder) == []
    return caught.value


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_input_changed_between_passes_with_workers(medium, tmp_path, change):
    """With worker processes on a plain file, the rewrite pass reads only the bytes around
    the chunks the workers rewrite, and checksums the rest by the workers' own reads: a
    change anywhere, also inside a chunk a worker reads (same size and mtime), is refused
    like any change between passes."""
    source_path = tmp_path / "trace.json"
    shutil.copyfile(medium, source_path)
    data = source_path.read_bytes()
    folder = tmp_path / "out"
    folder.mkdir()

    def changed(index, plan):
        assert any(len(rows) for _, rows, _ in chunk_edits(index, plan))  # a worker's
        CHANGES[change](source_path, data)

    refusal = str(_refused_with_workers(source_path, folder, changed))
    assert "changed between passes" in refusal or "disappeared" in refusal
    assert "\n" not in refusal


def test_input_edited_inside_a_workers_chunk(large, tmp_path):
    """One byte inside the events a worker rewrites, changed after the index pass with size
    and mtime kept: only that worker reads it, and its CRC makes the pass refuse."""
    source_path = tmp_path / "trace.json"
    shutil.copyfile(large, source_path)
    original = source_path.read_bytes()
    stat = source_path.stat()
    folder = tmp_path / "out"
    folder.mkdir()

    def edited(index, plan):
        chunk = next(chunk for chunk, rows, _ in chunk_edits(index, plan) if len(rows))
        digit = original.index(b"1", chunk.offset + chunk.length // 2)  # still valid JSON
        with open(source_path, "r+b") as fh:
            fh.seek(digit)
            fh.write(b"2")
        os.utime(source_path, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    assert "changed between passes" in str(_refused_with_workers(source_path, folder, edited))


@pytest.mark.parametrize("where", ["a chunk the window leaves out", "a chunk a worker rewrites"])
def test_window_pass_refuses_an_input_edited_where_only_a_worker_reads(large, tmp_path,
                                                                       monkeypatch, where):
    """A window's pass with workers on a plain file reads only the chunks it copies as
    they are: a worker reads each chunk it rewrites or cuts, and the CRC of each chunk
    the pass leaves out. One digit changed there after the plan (size and mtime kept) is
    refused like any change between passes: exit 2, one line, nothing written."""
    from click.testing import CliRunner

    from tracestream import engine
    from tracestream.cli import main

    from .support import Outcome

    source_path = tmp_path / "trace.json"
    shutil.copyfile(large, source_path)
    original = source_path.read_bytes()
    stat = source_path.stat()
    real_rewrite_window = engine.rewrite_window
    edited = []

    def edit_then_rewrite(source, index, plans, outs, **kwargs):
        window = plans[0].window.window
        if where == "a chunk the window leaves out":
            chunk = next(chunk for chunk in index.chunks
                         if not chunk.always and chunk.first_ns >= window.end_ns)
        else:
            chunk = next(chunk for chunk, rows, _ in chunk_edits(index, plans[0])
                         if len(rows) and not chunk.always and any(
                             plan.window.window.start_ns <= chunk.first_ns
                             and chunk.last_ns < plan.window.window.end_ns for plan in plans))
        digit = original.index(b"1", chunk.offset + chunk.length // 2)  # still valid JSON
        with open(source_path, "r+b") as fh:
            fh.seek(digit)
            fh.write(b"2")
        os.utime(source_path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        edited.append(chunk)
        return real_rewrite_window(source, index, plans, outs, **kwargs)

    monkeypatch.setattr(engine, "rewrite_window", edit_then_rewrite)
    folder = tmp_path / "out"
    folder.mkdir()
    window = ["--pass-window", "0:1"] if where == "a chunk the window leaves out" else [
        "--split-mb", "12"]
    result = CliRunner().invoke(main, command("layers", source_path, folder / "out.json",
                                              "--max-gpu-lanes", "10", "--workers", "2",
                                              *window))
    out = Outcome(result.exit_code, result.stdout_bytes, result.stderr, 0.0, "in-process")
    assert edited, out.describe()
    assert_refused(out, f"input {source_path} changed between passes", place=False, empty=folder)
    TALLY["faults injected (input changed between passes)"] += 1


def test_a_discarded_output_never_writes_into_a_file_opened_after_it(monkeypatch, tmp_path):
    """The writer thread may be in the middle of a write when its output is discarded (a
    refusal after the rewrite began): those bytes never land in a file opened afterwards,
    even one that gets the discarded output's descriptor number."""
    victim = tmp_path / "victim.json"
    victim.write_bytes(b"[]")
    real_write, writing, go_on = os.write, threading.Event(), threading.Event()

    def held_write(fd, data):  # the output's writer thread waits here until told to go on
        if threading.current_thread().name.startswith("write "):
            writing.set()
            go_on.wait(10)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", held_write)
    out = OutputFile(str(tmp_path / "out.json"))
    out.write(b"x" * (1 << 20))
    assert writing.wait(10)
    number = out._fd
    out.discard()
    fd = os.open(victim, os.O_WRONLY)
    try:
        assert fd == number  # the discarded output's number, now the victim's
        go_on.set()
        out._thread.join(10)
    finally:
        os.close(fd)
    assert victim.read_bytes() == b"[]"
    assert leftovers(tmp_path) == ["victim.json"]


# -- two writers of one output ---------------------------------------------------------------


@pytest.mark.parametrize("kinds", [("compact", "compact"), ("layers", "compact")])
def test_two_writers_one_output(medium, tmp_path, kinds):
    """Started together: exactly one wins, the other refuses; the file is one run's, whole."""
    before = sha256(medium)
    for attempt in range(3):
        folder = tmp_path / f"race{attempt}"
        folder.mkdir()
        output = folder / "out.json"
        results = [None, None]
        gate = threading.Barrier(2)

        def race(i, gate=gate, results=results, output=output):
            gate.wait()
            results[i] = exec_cli(command(kinds[i], medium, output))

        threads = [threading.Thread(target=race, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = sorted(r.rc for r in results)
        assert codes == [0, 2], [r.describe() for r in results]
        loser = next(r for r in results if r.rc == 2)
        line = error_line(loser)
        assert "already exists" in line or "appeared while writing" in line, line
        winner = kinds[[r.rc for r in results].index(0)]
        assert_written(folder, output, winner)
        assert_verified(medium, output)
        TALLY["faults injected (two writers of one output)"] += 1
    assert sha256(medium) == before


def test_stdin_spool_on_a_full_tmpdir(cli, large, tiny_disk, tmp_path):
    """stdin is spooled to $TMPDIR for the second pass: a full one is one line, exit 2,
    nothing left there nor beside the output. (The spool of plain JSON is zstd, ~1/20 of
    the stream: a 32 MB trace still overflows the 256 KiB disk.)"""
    folder = tmp_path / "out"
    folder.mkdir()
    out = cli(*command("compact", "-", folder / "out.json"), stdin=large.read_bytes(),
              env={"TMPDIR": str(tiny_disk)})
    assert_refused(out, "cannot spool the input", "set TMPDIR", place=False, empty=folder)
    assert leftovers(tiny_disk) == []
    TALLY["faults injected (full disk)"] += 1


def test_verify_of_a_piped_output_on_a_full_tmpdir(cli, large, tiny_disk, tmp_path):
    """verify reads a piped output in two passes: a spool that fills the disk is named as
    such, not taken for a truncated trace (the zstd spool fills it only part way in)."""
    out = tmp_path / "out.json"
    assert cli(*command("compact", large, out)).rc == 0
    verdict = cli("verify", "--trace", large, "--output", "-", "--report",
                  f"{out}.compact.json", stdin=out.read_bytes(), env={"TMPDIR": str(tiny_disk)})
    assert_refused(verdict, "cannot spool the input", "set TMPDIR", place=False)
    assert leftovers(tiny_disk) == []
    TALLY["faults injected (full disk)"] += 1
