"""Progress on stderr (bytes read per pass, with rate) when a person is watching."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator


class Progress:
    """Wraps the decompressed block stream of a pass and reports its throughput."""

    def __init__(self, stream=None, interval: float = 0.5):
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval

    @classmethod
    def for_terminal(cls, quiet: bool) -> Progress | None:
        if quiet or not sys.stderr.isatty():
            return None
        return cls()

    def wrap(self, blocks: Iterable[bytes], label: str) -> Iterator[bytes]:
        start = last = time.monotonic()
        total = 0
        for block in blocks:
            total += len(block)
            now = time.monotonic()
            if now - last >= self.interval:
                self._show(label, total, now - start)
                last = now
            yield block
        self._show(label, total, time.monotonic() - start, end="\n")

    def _show(self, label: str, total: int, seconds: float, end: str = "") -> None:
        rate = total / seconds / 1e6 if seconds > 0 else 0.0
        self.stream.write(f"\r{label}: {total / 1e6:,.1f} MB read, {rate:,.0f} MB/s   {end}")
        self.stream.flush()
