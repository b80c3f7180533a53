"""Progress on stderr: a tqdm bar per phase at a terminal, plain lines in a log.

The library measures (tracestream.progress: `phase(name, total, unit)` and a meter's
`advance_to(done)`, once per chunk); this module shows. `advance_to` only stores the
count: a bar is drawn by a thread of the meter's own twice a second, so the phase's
thread never waits on the terminal. When stderr is not a terminal (a nightly job's log),
a phase writes a plain line each time it passes a tenth of its total and at least every
30 s (`index 40% 412 MB/1.0 GB 160 MB/s eta 4s`), and a last line when it ends if it
wrote any. A phase shorter than a second shows nothing either way, so a small trace's
run (or refusal) prints only its summary (or its one error line).

tqdm rather than rich: one pure-Python package without dependencies (rich brings
pygments and markdown-it, 13 MB), imported only where a terminal shows bars, and an
update costs it 0.6 µs against rich's 2.7 µs (docs/design.md has the numbers).
"""

from __future__ import annotations

import os
import sys
import threading
import time

SHOW_AFTER = 1.0
"""Seconds a phase runs before anything of it is shown."""
LOG_EVERY = 30.0
"""Seconds between two log lines of a phase at most (when it passes no tenth)."""
DRAW_EVERY = 0.5
"""Seconds between two redraws of a terminal bar."""


def progress_for(quiet: bool, stream=None):
    """The progress a command shows on `stream` (stderr): None when `quiet`, bars at a
    terminal, else log lines."""
    if quiet:
        return None
    stream = stream if stream is not None else sys.stderr
    return TerminalProgress(stream) if stream.isatty() else LogProgress(stream)


def amount(count: float) -> str:
    """`412 MB`, `1.0 GB`: bytes with decimal prefixes, as the bars show them."""
    for prefix in ("", "k", "M", "G", "T"):
        if count < 999.5 or prefix == "T":
            break
        count /= 1000
    return f"{count:.0f} {prefix}B" if count >= 99.5 or not prefix else f"{count:.1f} {prefix}B"


def duration(seconds: float) -> str:
    """`4s`, `2m05s`, `1h02m`: an eta or an elapsed time in a log line."""
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def log_line(name: str, done: int, total: int | None, unit: str, seconds: float,
             *, end: bool = False, note: str = "") -> str:
    """One progress line of a phase for a log: `index 40% 412 MB/1.0 GB 160 MB/s eta 4s`,
    at the end `index done: 1.0 GB in 6s, 160 MB/s` (`index stopped at 40%: ...` short of
    its total: failed or interrupted); without a total, no percent or eta.
    Other units are counted (`batch 40% 4/10 traces eta 1m30s`), and steps get no eta
    (a plan's steps are not equal work). `note` goes at the end (`, 1 failed`)."""
    note = f", {note}" if note else ""
    rate = done / seconds if seconds > 0 else 0.0
    if unit == "B":
        count = f"{amount(done)}/{amount(total)}" if total else amount(done)
        speed = f" {amount(rate)}/s"
    else:
        count = f"{done:,}/{total:,} {unit}" if total else f"{done:,} {unit}"
        speed = ""
    if end and total and done < total:  # failed, interrupted, or a comparison cut short
        return (f"{name} stopped at {min(99, 100 * done // total)}%: {count} in "
                f"{duration(seconds)}{note}")
    if end:
        return f"{name} done: {amount(done) if unit == 'B' else count} in " \
               f"{duration(seconds)}{speed.replace(' ', ', ', 1)}{note}"
    if not total:
        return f"{name} {count}{speed} ({duration(seconds)}){note}"
    percent = min(100, 100 * done // total)
    eta = (f" eta {duration((total - done) / rate)}"
           if rate > 0 and unit != "steps" else f" ({duration(seconds)})")
    return f"{name} {percent}% {count}{speed}{eta}{note}"


class LogProgress:
    """Plain progress lines for a stream that is not a terminal (see the module)."""

    def __init__(self, stream, clock=time.monotonic, wake: float | None = 1.0):
        self.stream = stream
        self.clock = clock
        self.wake = wake  # how often a meter's thread calls `beat` (None: no thread)
        self.broken = False  # the stream refused a line: progress is not worth a failed run

    def phase(self, name: str, total: int | None, unit: str = "B") -> LogMeter:
        return LogMeter(self, name, total, unit)


class LogMeter:
    """A phase's log lines: at each tenth passed, every LOG_EVERY seconds, and at the end."""

    def __init__(self, progress: LogProgress, name: str, total: int | None, unit: str):
        self._progress = progress
        self.name, self.total, self.unit = name, total, unit
        self.done = 0
        self.note = ""  # said at the end of each line (batch: `1 failed, 45.3 MB/s`)
        self._start = progress.clock()
        self._last = self._start  # when the last line was written (or the phase began)
        self._tenths = 0  # tenths of the total already passed
        self._lines = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beats = None
        if progress.wake is not None:
            self._beats = threading.Thread(target=self._beating, daemon=True,
                                           name=f"progress {name}")
            self._beats.start()

    def advance_to(self, done: int) -> None:
        self.done = done
        if not self.total:
            return
        tenths = min(10, 10 * done // self.total)
        if tenths > self._tenths:
            self._tenths = tenths
            if tenths < 10:
                self._write_if_shown()

    def _beating(self) -> None:
        while not self._stop.wait(self._progress.wake):
            self.beat()

    def beat(self) -> None:
        """A line when the last is LOG_EVERY seconds old (a phase that passes no tenth
        for that long: a long plan, a stalled pipe), so a log never goes quiet longer."""
        if self._progress.clock() - self._last >= LOG_EVERY:
            self._write_if_shown()

    def _write_if_shown(self, *, end: bool = False) -> None:
        now = self._progress.clock()
        if now - self._start < SHOW_AFTER:
            return
        with self._lock:
            if self._progress.broken:
                return
            try:
                self._progress.stream.write(
                    log_line(self.name, self.done, self.total, self.unit, now - self._start,
                             end=end, note=self.note) + "\n")
                self._progress.stream.flush()
            except (OSError, ValueError):  # a closed pipe (`2>&1 | head`): the run goes on
                self._progress.broken = True
            self._last = now
            self._lines += 1

    def close(self) -> None:
        self._stop.set()
        if self._beats is not None:
            self._beats.join()
        if self._lines:
            self._write_if_shown(end=True)

    def echo(self, line: str) -> None:
        """A line on stdout (batch's result lines), which a log keeps apart anyway."""
        print(line, flush=True)


class TerminalProgress:
    """A tqdm bar per phase on a terminal, left on screen when the phase ends."""

    def __init__(self, stream):
        self.stream = stream

    def phase(self, name: str, total: int | None, unit: str = "B") -> TerminalMeter:
        return TerminalMeter(self.stream, name, total, unit)


class TerminalMeter:
    """A phase's bar, drawn from a thread of its own (see the module)."""

    def __init__(self, stream, name: str, total: int | None, unit: str):
        from tqdm import tqdm

        self.done = 0
        self.note = ""  # shown after the bar (batch: `1 failed, 45.3 MB/s`)
        self._start = time.monotonic()
        scaled = unit == "B"
        try:  # a terminal of no size (a pty nobody sized) would get bars of no width
            sized = os.get_terminal_size(stream.fileno()).columns > 0
        except (AttributeError, OSError, ValueError):
            sized = False
        self._bar = tqdm(total=total, desc=name, unit=unit,
                         unit_scale=scaled, unit_divisor=1000, file=stream, delay=SHOW_AFTER,
                         mininterval=DRAW_EVERY, dynamic_ncols=sized,
                         ncols=None if sized else 80, nrows=None if sized else 24, leave=True)
        self._lock = threading.Lock()  # the bar is drawn here and from `echo`
        self._stop = threading.Event()
        self._draw = threading.Thread(target=self._drawing, daemon=True,
                                      name=f"progress {name}")
        self._draw.start()

    def advance_to(self, done: int) -> None:
        self.done = done

    def _drawing(self) -> None:
        while not self._stop.wait(DRAW_EVERY):
            self._catch_up()

    def _catch_up(self) -> None:
        with self._lock:
            self._draw_now()

    def _draw_now(self) -> None:
        bar = self._bar
        if self.note != bar.postfix:
            bar.set_postfix_str(self.note, refresh=False)
        if self.done > bar.n:
            bar.update(self.done - bar.n)  # (tqdm draws nothing before its delay)
        elif time.monotonic() - self._start >= SHOW_AFTER:
            bar.refresh()  # the elapsed time goes on while the count stands still

    def close(self) -> None:
        self._stop.set()
        self._draw.join()
        self._catch_up()
        self._bar.close()

    def echo(self, line: str) -> None:
        """A line on stdout above the bar (tqdm clears the bar, writes, draws it again with
        the count as of now); before the bar shows, just the line (tqdm's redraw would show
        it early)."""
        from tqdm import tqdm

        with self._lock:
            if time.monotonic() - self._start < SHOW_AFTER:
                print(line, flush=True)
                return
            self._draw_now()
            tqdm.write(line, file=sys.stdout)
