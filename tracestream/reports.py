"""Finding and reading the report of an annotated trace (`verify` and `restore` read it)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from tracestream.errors import TraceError

REPORT_SUFFIXES = ("layers", "compact")


def find_report(output: str, report: str | None) -> Path:
    """The report given, else `<output>.layers.json` or `<output>.compact.json`."""
    if report:
        path = Path(report)
        if not path.is_file():
            raise TraceError(f"report not found: {path}")
        return path
    if output == "-":
        raise TraceError("reading the annotated trace from stdin needs --report PATH")
    found = [Path(f"{output}.{kind}.json") for kind in REPORT_SUFFIXES]
    found = [p for p in found if p.is_file()]
    if not found:
        raise TraceError(
            f"no report next to {output} (looked for {output}.layers.json and "
            f"{output}.compact.json); name it with --report"
        )
    if len(found) > 1:
        raise TraceError(f"two reports next to {output}; name the right one with --report")
    return found[0]


class _Retired(msgspec.Struct):
    source_event_index: int
    event: msgspec.Raw


class _Compaction(msgspec.Struct):
    retired_track_metadata: list[_Retired] = []


class _Wrapped(msgspec.Struct):
    compaction: _Compaction | None = None
    retired_track_metadata: list[_Retired] = []
    source_tracestream: msgspec.Raw = msgspec.Raw()


def load_report(path: Path) -> tuple[dict, list[tuple[int, bytes]]]:
    """The report as plain data, and the retired metadata events as exact bytes.

    The source's own `tracestream` member, if it had one, is kept as exact bytes
    in the data under `source_tracestream`.
    """
    try:
        data = path.read_bytes()
        report = msgspec.json.decode(data)
        parts = msgspec.json.decode(data, type=_Wrapped)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TraceError(f"cannot read report {path}: {exc}") from None
    if not isinstance(report, dict) or report.get("tool") != "tracestream":
        raise TraceError(f"{path} is not a tracestream report")
    retired = parts.retired_track_metadata
    if parts.compaction is not None:
        retired = parts.compaction.retired_track_metadata
    report["source_tracestream"] = bytes(parts.source_tracestream) or None
    return report, sorted((r.source_event_index, bytes(r.event)) for r in retired)
