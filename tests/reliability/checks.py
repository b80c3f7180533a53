"""What a successful run must satisfy: `verify` passes and `restore` gives the source back."""

from __future__ import annotations

from pathlib import Path

from conftest import assert_same_bytes

from .support import TALLY, leftovers


def assert_verified(source: Path, output: Path, report: Path | None = None) -> None:
    """`verify` holds and `restore` gives back the source's (decompressed) bytes exactly."""
    from tracestream.commands.restore import restore
    from tracestream.commands.verify import verify

    verdict = verify(source, output, report, workers=0)
    assert verdict.ok, verdict.summary()
    restored = Path(f"{output}.restored.json")
    restore(output, restored, report)
    try:
        assert_same_bytes(restored, source)
    finally:
        restored.unlink()
    TALLY["outputs verified and restored byte for byte"] += 1


def assert_written(folder: Path, output: Path, kind: str) -> None:
    """Exactly the output and its report, no temporary file beside them."""
    assert leftovers(folder) == sorted([output.name, f"{output.name}.{kind}.json"])
