"""`restore`: write the source event array back from an annotated trace, in one pass.

Added events are dropped, relocated events go back to their original pid/tid
with the provenance removed (each is spliced back to its exact source bytes),
retired metadata returns at its source index, and the top-level `tracestream`
member is removed. Every other byte of every event is copied as it is.
"""

from __future__ import annotations

import orjson

from tracestream.document import DocumentScanner, TopLevelValue
from tracestream.edit import unrelocate
from tracestream.errors import TraceError
from tracestream.sink import (
    OutputFile,
    check_compress_level,
    compression_for,
    input_identity,
    refuse_writing_input,
)
from tracestream.source import ReadStats, TraceSource
from tracestream.verify import find_report, load_report


def restore(trace, output, report: str | None = None, *, compress: str | None = None,
            compress_level: int | None = None) -> dict:
    """Write the source trace's events and top-level keys from an annotated trace."""
    trace, output = str(trace), str(output)
    refuse_writing_input(input_identity(trace), output, "output", trace)
    check_compress_level(compression_for(output, compress), compress_level)
    report_path = find_report(trace, report)
    data, retired = load_report(report_path)
    original = data["original_event_count"]
    appended_from = data["output_event_count"] - data["added_event_count"]
    with TraceSource(trace) as annotated, OutputFile(
        output, compression=compression_for(output, compress), level=compress_level
    ) as out:
        stats = ReadStats()
        scanner = DocumentScanner(annotated.read(stats))
        layout = scanner.layout
        pending = list(retired)  # (source index, bytes), sorted
        restored = 0
        relocated = 0
        started = False

        def emit(raw: bytes) -> None:
            nonlocal restored
            out.write(b",\n" + raw if restored else b"\n" + raw)
            restored += 1

        def flush_retired() -> None:
            while pending and pending[0][0] == restored:
                emit(pending.pop(0)[1])

        previous = data.get("source_tracestream")
        for chunk in scanner.chunks():
            if not started:
                out.write(_prefix(layout.shape, layout.values, previous))
                started = True
            for i, raw in enumerate(chunk.events):
                position = chunk.first_ordinal + i
                if position >= appended_from:
                    continue
                raw = bytes(raw)
                flush_retired()
                if b"_compact_gpu_track" in raw:
                    raw, index = unrelocate(raw)
                    if index != restored:
                        raise TraceError(
                            f"{trace} does not match its report: event {position} says it is "
                            f"source event {index} but sits at source position {restored} "
                            "(was the file edited?)"
                        )
                    relocated += 1
                emit(raw)
        if not started:
            out.write(_prefix(layout.shape, layout.values, previous))
        flush_retired()
        if pending or restored != original:
            raise TraceError(
                f"restored {restored} events but the report says the source had {original}: "
                f"{trace} does not match its report {report_path}"
            )
        annotated.finish_read(stats)
        after = layout.values[layout.events_key_index:] if layout.shape == "object" else []
        out.write(_suffix(layout.shape, after, previous))
        out.commit()
    return {"events": restored, "relocated": relocated, "retired": len(retired),
            "dropped": data["added_event_count"], "report": str(report_path)}


def _members(values: list[TopLevelValue], previous: bytes | None) -> list[bytes]:
    """Top-level members as the source had them: ours dropped, a previous one put back."""
    members = []
    for value in values:
        if value.key != "tracestream":
            members.append(orjson.dumps(value.key) + b": " + value.raw)
        elif previous is not None:
            members.append(b'"tracestream": ' + previous)
    return members


def _prefix(shape: str, values: list[TopLevelValue], previous: bytes | None) -> bytes:
    if shape == "array":
        return b"["
    head = b"".join(b"\n  " + m + b"," for m in _members(values, previous))
    return b"{" + head + b'\n  "traceEvents": ['


def _suffix(shape: str, after: list[TopLevelValue], previous: bytes | None) -> bytes:
    if shape == "array":
        return b"\n]\n"
    tail = b"".join(b",\n  " + m for m in _members(after, previous))
    return b"\n  ]" + tail + b"\n}\n"
