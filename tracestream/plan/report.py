"""Finding and reading the report of an annotated trace (`verify` and `restore` read it)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec
import orjson

from tracestream.errors import TraceError, malformed_report
from tracestream.read.document import DocumentScanner

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


_READ_BYTES = 1 << 20
_WRAPPED_KEYS = ("compaction", "retired_track_metadata", "source_tracestream")


def _scan(path) -> tuple[DocumentScanner, Iterator]:
    """A scanner of a report file whose `layers` rows are its "events" (read a chunk of
    rows at a time, never the whole file), and its chunks."""
    def blocks() -> Iterator[bytes]:
        with open(path, "rb") as fh:
            while block := fh.read(_READ_BYTES):
                yield block

    scanner = DocumentScanner(blocks(), events_key="layers", events_required=False)
    return scanner, scanner.chunks()


class LayerRows(Sequence):
    """A report's `layers` rows, read from its file when asked for: a nightly run writes
    10^5-10^6 of them, so they are counted, never held."""

    def __init__(self, path, count: int):
        self.path = path
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[dict]:
        _, chunks = _scan(self.path)
        for chunk in chunks:
            for raw in chunk.events:
                row = msgspec.json.decode(raw)
                if not isinstance(row, dict):  # an edited report: refused as restore does
                    raise malformed_report(f"a `layers` row is "
                                           f"{bytes(raw)[:40].decode(errors='replace')}, "
                                           "not an object")
                yield row

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(itertools.islice(self, *i.indices(self.count)))
        if i < 0:
            i += self.count
        if not 0 <= i < self.count:
            raise IndexError(i)
        return next(itertools.islice(self, i, None))

    def __repr__(self) -> str:
        return f"<{self.count} layers rows in {self.path}>"


def load_report(path: Path) -> tuple[dict, list[tuple[int, bytes]]]:
    """The report as plain data, and the retired metadata events as exact bytes.

    The `layers` rows are counted, not kept: `data["layers"]` reads them from the file
    (LayerRows). The source's own `tracestream` member, if it had one, is kept as exact
    bytes in the data under `source_tracestream`.
    """
    try:
        scanner, chunks = _scan(path)
        count = sum(len(chunk.events) for chunk in chunks)
        values = {value.key: value.raw for value in scanner.layout.values}
        report = {key: msgspec.json.decode(raw) for key, raw in values.items()}
        parts = msgspec.json.decode(b"{" + b",".join(
            orjson.dumps(key) + b":" + values[key] for key in _WRAPPED_KEYS if key in values
        ) + b"}", type=_Wrapped)
    except (OSError, TraceError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TraceError(f"cannot read report {path}: {exc}") from None
    if scanner.layout.shape != "object" or report.get("tool") != "tracestream":
        raise TraceError(f"{path} is not a tracestream report")
    if scanner.layout.events_open >= 0:  # in its place among the keys
        items = list(report.items())
        items.insert(scanner.layout.events_key_index, ("layers", LayerRows(path, count)))
        report = dict(items)
    retired = parts.retired_track_metadata
    if parts.compaction is not None:
        retired = parts.compaction.retired_track_metadata
    report["source_tracestream"] = bytes(parts.source_tracestream) or None
    return report, sorted((r.source_event_index, bytes(r.event)) for r in retired)
