"""What a successful run must satisfy: `verify` passes and `restore` gives the source back."""

from __future__ import annotations

from pathlib import Path

from tracestream.document import DocumentScanner
from tracestream.source import TraceSource

from .support import TALLY, leftovers


def parts(path: Path) -> tuple[list[bytes], list[tuple[str, bytes]], str]:
    """(event bytes, top-level (key, value bytes), shape) of a trace, by the engine's scanner."""
    with TraceSource(str(path)) as source:
        scanner = DocumentScanner(source.read())
        events = [bytes(raw) for chunk in scanner.chunks() for raw in chunk.events]
        layout = scanner.layout
    return events, [(v.key, v.raw) for v in layout.values], layout.shape


def assert_verified(source: Path, output: Path, report: Path | None = None, *,
                    byte_exact: bool = False) -> None:
    """`verify` holds and `restore` reproduces every source event and top-level value exactly.

    `byte_exact`: the source is in restore's own layout, so the whole file comes back.
    """
    from tracestream.restore import restore
    from tracestream.verify import verify

    verdict = verify(source, output, report, workers=0)
    assert verdict.ok, verdict.summary()
    restored = Path(f"{output}.restored.json")
    restore(output, restored, report)
    try:
        if byte_exact:
            assert restored.read_bytes() == Path(source).read_bytes()
        else:
            assert parts(restored) == parts(source)
    finally:
        restored.unlink()
    TALLY["outputs verified and restored exactly"] += 1


def assert_written(folder: Path, output: Path, kind: str) -> None:
    """Exactly the output and its report, no temporary file beside them."""
    assert leftovers(folder) == sorted([output.name, f"{output.name}.{kind}.json"])
