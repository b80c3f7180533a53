"""The restore check of verify: the annotated trace spliced back must give the source's bytes."""

from __future__ import annotations

from tracestream.commands.restore import HashingWriter, Undo, splice_back
from tracestream.errors import TraceError
from tracestream.read.hashing import FileComparison
from tracestream.read.source import TraceSource


def restoration_problems(source: TraceSource, annotated: TraceSource, data: dict,
                      retired) -> tuple[list[str], str]:
    """`restore`'s own splice of the output (the output and report alone, no plan), its
    bytes compared with the source's by sha256; (problems, the hash)."""
    try:
        undo = Undo.from_report(data, retired, annotated.name)
    except TraceError as exc:
        return [str(exc)], ""
    problem, restored = restored_from(annotated, undo)
    if problem:
        return [problem], ""
    return digest_problems(restored, source, undo), restored


def digest_problems(restored: str, source: TraceSource, undo: Undo) -> list[str]:
    """The restored bytes' sha256 against the source's and the report's."""
    actual = source.data_sha256()
    if restored != actual:
        return [f"the restored bytes differ from the source's (sha256 {restored[:16]}… vs "
                f"{actual[:16]}…)"]
    if undo.sha256 != actual:
        return [f"the report's source_data_sha256 {undo.sha256[:16]}… is not the source's "
                f"{actual[:16]}…"]
    return []


def restored_sha256(path: str, undo: Undo, max_event_bytes: int | None = None
                    ) -> tuple[str, str]:
    """`restored_from` the output file at `path` (in a worker process), the quick way: a
    digest that is not the source's sends verify to the exact one.

    The output is first cut where its events seem to end, not decoded (`splice_back`'s
    `speculative`); where that does not give the report's source digest back (an output
    whose events hold `}, {` in a string, or one that differs), its events are cut
    exactly, as before, and that digest is the answer."""
    with TraceSource(path, hashes_data=False, max_event_bytes=max_event_bytes) as annotated:
        problem, digest = restored_from(annotated, undo, quick=True, speculative=True)
    if not problem and digest == undo.sha256:
        return problem, digest
    with TraceSource(path, hashes_data=False, max_event_bytes=max_event_bytes) as annotated:
        return restored_from(annotated, undo, quick=True)


def restored_matches(path: str, undo: Undo, source_path: str,
                     max_event_bytes: int | None = None) -> tuple[str, str, int, int]:
    """`restored_sha256`'s check against the plain source file at `source_path` (in a
    worker): the restored bytes compared with the file's as they are made, the quick way
    first, then exactly. ("", the file's sha256, size, CRC-32) when they are its bytes
    (for `TraceSource.adopt_sha256`), else (why restore's splice failed or "", "", 0, 0)."""
    for speculative in (True, False):
        problem = ""  # (the exact splice's answer is the one given)
        comparison = None
        try:
            comparison = FileComparison(source_path)
            with TraceSource(path, hashes_data=False, max_event_bytes=max_event_bytes) as annotated:
                splice_back(annotated, undo, comparison, quick=True, speculative=speculative)
            if comparison.ended():
                return "", comparison.hexdigest(), comparison.size, comparison.crc32
        except TraceError as exc:
            problem = str(exc)
        finally:
            if comparison is not None:
                comparison.close()
    return problem, "", 0, 0


def restored_from(annotated: TraceSource, undo: Undo, *, quick: bool = False,
                   speculative: bool = False) -> tuple[str, str]:
    """(why restore's splice failed, "") or ("", the sha256 of the bytes it restores)."""
    writer = HashingWriter()
    try:
        splice_back(annotated, undo, writer, quick=quick, speculative=speculative)
    except TraceError as exc:
        return str(exc), ""
    return "", writer.hexdigest()
