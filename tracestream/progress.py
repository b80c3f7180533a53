"""How far a long run is: the library measures, the caller shows.

The library never prints, so the commands take `progress`, an object with one method,
`phase(name, total, unit)`, called as each phase starts (index, plan, rewrite, verify,
restore). It returns a meter that the phase moves forward with `advance_to(done)` (a
cumulative count, never a step) and ends with `close()`, also when the phase fails.

A byte phase counts the bytes of its input as they lie on disk or come down the pipe:
for a compressed input, its compressed bytes (so the total is the file's size and the
percent is honest); `total` is None where the size is not known in advance (the first
read of stdin or a pipe). The plan counts steps. `advance_to` is called once per chunk
of a few MB, from the thread that runs the phase, so it must be cheap; a meter that
draws should do so from its own thread or at a rate of its own choosing.

The CLI's meters (bars at a terminal, plain lines in a log) are in
`tracestream.cli.progress`; a notebook can pass any object of this shape, or nothing.
"""

from __future__ import annotations

from typing import Protocol


class Meter(Protocol):
    def advance_to(self, done: int) -> None:
        """`done` units of the phase's total are through (it only grows)."""

    def close(self) -> None:
        """The phase ended (whether or not it reached its total)."""


class Progress(Protocol):
    def phase(self, name: str, total: int | None, unit: str = "B") -> Meter:
        """A meter for the phase starting now (`unit`: "B" bytes, or "steps")."""


class _Silent:
    """The progress of a caller that asked for none: every call does nothing."""

    def phase(self, name: str, total: int | None, unit: str = "B") -> _Silent:
        return self

    def advance_to(self, done: int) -> None:
        pass

    def close(self) -> None:
        pass


SILENT = _Silent()


def or_silent(progress: Progress | None) -> Progress:
    """The caller's progress, or one that shows nothing (the phases need not ask)."""
    return SILENT if progress is None else progress
