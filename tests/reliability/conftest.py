"""Fixtures of the reliability suite, and the tally it prints at the end of a run."""

from __future__ import annotations

import shutil

import pytest

from .support import TALLY, Cli, ForkServers, scratch_dir


@pytest.fixture(scope="session")
def cli():
    """Run the CLI: `cli(*args, fresh=False, cwd=..., stdin=..., env=..., timeout=...)`."""
    scratch = scratch_dir()
    servers = ForkServers(2, scratch)
    try:
        yield Cli(servers)
    finally:
        servers.close()
        shutil.rmtree(scratch, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    if not TALLY:
        return
    terminalreporter.section("reliability tally")
    for what, count in sorted(TALLY.items()):
        terminalreporter.write_line(f"{count:8,d}  {what}")
