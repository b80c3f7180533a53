"""Running a command in a fresh process and measuring its wall time and memory.

Three memory figures per run, because the tool forks worker processes and one
number cannot say everything:

* ``max_rss``: what GNU time reports (``%M``): ``ru_maxrss`` of the command,
  i.e. the peak RSS of the single largest process in its tree (the main
  process, or a reaped worker if that one was larger). The command runs under
  `/usr/bin/time` when it exists: a child forked from this (larger) Python
  process would otherwise inherit our RSS as its ``ru_maxrss`` floor.
* ``tree_rss``: peak of the summed RSS of the process and all its descendants,
  sampled from ``/proc/<pid>/statm`` every ``interval`` seconds. Forked workers
  share pages with their parent, so this counts shared pages several times.
* ``tree_pss``: peak of the summed PSS (``/proc/<pid>/smaps_rollup``), which
  divides every shared page among the processes that map it: the honest figure
  for "how much memory does this job take", and the one targets are judged by.

Sampling may miss a peak shorter than the interval; ``max_rss`` cannot.

The machine is shared: with ``memory_limit`` the whole process group is
killed as soon as a sample of its tree PSS exceeds it (the run is then
reported with ``killed`` set), so a regression that needs 17 GB fails one
row instead of the machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field

PAGE = os.sysconf("SC_PAGE_SIZE")
INTERVAL = 0.25  # smaps_rollup of a few processes costs ms: sampled often, it competes with the run
GNU_TIME = "/usr/bin/time"


@dataclass
class Run:
    """One measured process: its command, exit status, time and memory peaks (bytes)."""

    argv: list[str]
    returncode: int
    wall_s: float
    user_s: float
    sys_s: float
    max_rss: int
    tree_rss: int
    tree_pss: int
    max_procs: int
    load_before: float  # 1-minute load average when the run started (a shared machine)
    killed: str = ""  # why the watchdog killed the run ("" if it did not)
    stdout: bytes = field(default=b"", repr=False)
    stderr: bytes = field(default=b"", repr=False)

    def record(self) -> dict:
        """The JSON-able part (no captured output)."""
        data = asdict(self)
        data.pop("stdout")
        data.pop("stderr")
        data["stderr_tail"] = self.stderr.decode(errors="replace")[-500:]
        return data


def load_average() -> float:
    """The 1-minute load average: other work on the machine slows every figure."""
    try:
        with open("/proc/loadavg") as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return -1.0


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _children(pid: int) -> list[int]:
    """Direct children of `pid`, from every thread's children list (any thread may fork).

    The list is a hint (it may name pids we cannot see, or that have been reused),
    so each one is confirmed by its parent pid.
    """
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                found.update(int(x) for x in fh.read().split())
        except OSError:
            continue
    return [child for child in found if _parent(child) == pid]


def _children_by_scan(pid: int) -> list[int]:
    """Fallback when the kernel lacks /proc/*/children: scan every process's ppid."""
    return [int(name) for name in os.listdir("/proc")
            if name.isdigit() and _parent(int(name)) == pid]


_HAS_CHILDREN_FILE = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def process_tree(root: int) -> list[int]:
    """`root` and all its living descendants."""
    lister = _children if _HAS_CHILDREN_FILE else _children_by_scan
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(lister(pid))
    return tree


def rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def pss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class TreeSampler(threading.Thread):
    """Samples summed RSS and PSS of a process tree until stopped; keeps the peaks."""

    def __init__(self, root: int, interval: float = INTERVAL, limit: int | None = None):
        super().__init__(daemon=True, name="tree sampler")
        self.root = root
        self.interval = interval
        self.limit = limit
        self.peak_rss = 0
        self.peak_pss = 0
        self.max_procs = 0
        self.killed = ""
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)

    def sample(self) -> None:
        pids = process_tree(self.root)
        self.max_procs = max(self.max_procs, len(pids))
        self.peak_rss = max(self.peak_rss, sum(map(rss_of, pids)))
        pss = sum(map(pss_of, pids))
        self.peak_pss = max(self.peak_pss, pss)
        if self.limit is not None and pss > self.limit and not self.killed:
            self.killed = f"tree PSS {pss >> 20} MiB over the limit of {self.limit >> 20} MiB"
            _kill_group(self.root)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def _kill_group(pid: int) -> None:
    """SIGKILL the process group `pid` leads (the command and every worker it forked)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _gnu_time_kb(path: str) -> int | None:
    """The %M figure GNU time wrote (its last line; a killed command adds a line before)."""
    try:
        with open(path) as fh:
            lines = [line.strip() for line in fh if line.strip()]
        return int(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def run_measured(argv: list[str], *, stdout=subprocess.PIPE, env=None, cwd=None,
                 interval: float = INTERVAL, memory_limit: int | None = None) -> Run:
    """Run `argv` in a new process; wall time from spawn to reap, memory as above.

    The command leads its own process group, so the watchdog (`memory_limit`)
    and an interrupt here end it and its workers together.

    The child is reaped with `os.wait4` so its rusage is its own (and that of the
    workers it reaped), not the sum over every child this script ever had.
    Captured output goes to temporary files, never through a pipe we would have
    to drain while waiting.
    """
    import tempfile

    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out, \
            tempfile.NamedTemporaryFile(prefix="maxrss-") as rss_file:
        target = out if stdout is subprocess.PIPE else stdout
        wrapped = list(argv)
        if os.access(GNU_TIME, os.X_OK):
            wrapped = [GNU_TIME, "-f", "%M", "-o", rss_file.name, *wrapped]
        load = load_average()
        start = time.perf_counter()
        proc = subprocess.Popen(wrapped, stdout=target, stderr=err, env=env, cwd=cwd,
                                start_new_session=True)
        sampler = TreeSampler(proc.pid, interval, memory_limit)
        sampler.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            _kill_group(proc.pid)
            proc.wait()
            raise
        finally:
            wall = time.perf_counter() - start
            sampler.stop()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        max_rss = _gnu_time_kb(rss_file.name)
        return Run(
            argv=list(argv), returncode=proc.returncode, wall_s=wall,
            user_s=usage.ru_utime, sys_s=usage.ru_stime,
            max_rss=(max_rss if max_rss is not None else usage.ru_maxrss) * 1024,
            tree_rss=sampler.peak_rss, tree_pss=sampler.peak_pss,
            max_procs=sampler.max_procs, load_before=load, killed=sampler.killed,
            stdout=out.read() if stdout is subprocess.PIPE else b"", stderr=err.read(),
        )
