"""A real trace replicated in time up to a size, keeping its exact text.

    python -m benchmarks.replicate --trace real.json.gz --output big.json --size 1GB

The generator writes the shape we chose; a real Kineto trace has its own
(multi-line objects, integer or three-decimal µs, string pids such as
`"Traces"`, its own mix of CPU and GPU events). To measure that shape at
1 GB, the source's events are written again and again, copy `k` shifted by
`k` whole periods in time, until the output reaches the size:

* every byte of every event is kept except the number text of its top-level
  `ts` (the integer part grows by `k * period` µs; the fraction's digits are
  kept) and of its top-level integer `id` (flow ids grow by `k * id_span`, so
  the copies' flows never share an id);
* metadata events (`ph: M`) are written once, in copy 0, where they were;
* the bytes around the event array (top-level keys before and after it) and
  between events are the source's own.

The period is the source's time span (earliest `ts` to latest `ts + dur` of
its non-metadata events) rounded up to whole µs plus one µs, so copies never
overlap. The source is held in memory (it is one copy); the output is written
copy by copy and never held.
"""

from __future__ import annotations

import argparse
import gzip
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec
import zstandard

_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]]')
_COLON = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*")
_NUMBER = re.compile(rb"(-?)(\d+)(\.\d+)?([eE][-+]?\d+)?")
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "Kernel", "Memcpy", "Memset"}
KERNEL_CATEGORIES = {"kernel", "Kernel"}


def read_source(path: Path) -> bytes:
    """The decompressed bytes of a (small) trace, compression from the magic bytes."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    if data[:4] == b"\x28\xb5\x2f\xfd":
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return data


def top_level_number(event: bytes, key: str) -> tuple[int, int] | None:
    """(start, end) of the number text of `event`'s top-level `key`, or None.

    Strings and brackets are tokenised by one regex so a key of the same name
    inside `args` (or inside a string) is never taken for the top-level one.
    """
    depth = 0
    for token in _TOKENS.finditer(event):
        text = token.group()
        if text in (b"{", b"["):
            depth += 1
        elif text in (b"}", b"]"):
            depth -= 1
        elif depth == 1:
            colon = _COLON.match(event, token.end())
            if colon is None or msgspec.json.decode(text) != key:
                continue
            number = _NUMBER.match(event, colon.end())
            return (number.start(), number.end()) if number else None
    return None


def shifted(number: bytes, offset: int) -> bytes:
    """`number` + `offset` (an integer) with the fraction's digits kept as written."""
    match = _NUMBER.fullmatch(number)
    if match is None or match.group(1) or match.group(4):
        raise ValueError(f"cannot shift {number!r}: only non-negative decimals are replicated")
    return str(int(match.group(2)) + offset).encode() + (match.group(3) or b"")


@dataclass
class Piece:
    """One event of the source: its text cut around the numbers a copy shifts."""

    separator: bytes  # the source's bytes between the previous event and this one
    parts: list[bytes]  # text, number, text, number, text ... (numbers at odd places)
    kinds: list[str]  # "ts" or "id" for each number
    metadata: bool


@dataclass
class Template:
    """The source cut into what every copy repeats and what is written once."""

    head: bytes
    pieces: list[Piece]
    tail: bytes
    period_us: int
    id_span: int
    copy_separator: bytes  # before the first event of copies 1, 2, ...

    def copy(self, k: int) -> bytes:
        """Copy `k`'s events, each after its separator (copy 0 is the source's array)."""
        offsets = {"ts": k * self.period_us, "id": k * self.id_span}
        out = []
        for piece in self.pieces:
            if k and piece.metadata:
                continue
            out.append(self.copy_separator if k and not out else piece.separator)
            if k == 0:
                out += piece.parts
                continue
            for j, part in enumerate(piece.parts):
                out.append(shifted(part, offsets[piece.kinds[j // 2]]) if j % 2 else part)
        return b"".join(out)


def event_array(text: bytes) -> tuple[int, int]:
    """(start, end) of the event array's bytes, brackets included."""
    stripped = text.lstrip()
    if stripped[:1] == b"[":
        start = len(text) - len(stripped)
        return start, text.rindex(b"]") + 1
    events = _TOP.decode(text).get("traceEvents")
    if events is None:
        raise ValueError("no traceEvents array")
    raw = bytes(events)
    start = text.index(raw)
    return start, start + len(raw)


def cut(event: bytes, numbers: list[tuple[int, int, str]]) -> tuple[list[bytes], list[str]]:
    parts, kinds, at = [], [], 0
    for start, end, kind in sorted(numbers):
        parts += [event[at:start], event[start:end]]
        kinds.append(kind)
        at = end
    parts.append(event[at:])
    return parts, kinds


def build_template(text: bytes) -> Template:
    """Cut the source's event array into pieces; measure its period and id span."""
    start, end = event_array(text)
    array = text[start:end]
    raws = _RAW_LIST.decode(array)
    pieces: list[Piece] = []
    at = 1  # after the '['
    lo, hi = math.inf, -math.inf
    ids: list[int] = []
    for raw in raws:
        event = bytes(raw)
        found = array.index(event, at)
        separator, at = array[at:found], found + len(event)
        decoded = msgspec.json.decode(event)
        metadata = decoded.get("ph") == "M"
        numbers = []
        if not metadata:
            ts = top_level_number(event, "ts")
            if ts is not None:
                numbers.append((*ts, "ts"))
                value = float(event[ts[0]:ts[1]])
                dur = decoded.get("dur")
                lo = min(lo, value)
                hi = max(hi, value + (dur if isinstance(dur, (int, float)) else 0))
            flow_id = decoded.get("id")
            if isinstance(flow_id, int) and not isinstance(flow_id, bool):
                span = top_level_number(event, "id")
                if span is not None:
                    numbers.append((*span, "id"))
                    ids.append(flow_id)
        parts, kinds = cut(event, numbers)
        pieces.append(Piece(separator, parts, kinds, metadata))
    if lo == math.inf:
        raise ValueError("no timed events to replicate")
    later = [p.separator for p in pieces[1:] if b"," in p.separator]
    return Template(
        head=text[:start + 1], pieces=pieces, tail=array[at:] + text[end:],
        period_us=math.ceil(hi) - math.floor(lo) + 1,
        id_span=(max(ids) - min(ids) + 1) if ids else 0,
        copy_separator=later[0] if later else b",\n",
    )


@dataclass
class Replica:
    """What `replicate` wrote: the copies, their period, and the bytes."""

    copies: int
    period_us: int
    id_span: int
    events_per_copy: int
    metadata_events: int
    bytes: int


def replicate(source: Path, output: Path, size: int) -> Replica:
    """Write copies of `source` to `output` (plain JSON) until it holds `size` bytes."""
    template = build_template(read_source(source))
    written = 0
    copies = 0
    with open(output, "wb") as fh:
        fh.write(template.head)
        written += len(template.head)
        while copies == 0 or written + len(template.tail) < size:
            chunk = template.copy(copies)
            fh.write(chunk)
            written += len(chunk)
            copies += 1
        fh.write(template.tail)
        written += len(template.tail)
    metadata = sum(p.metadata for p in template.pieces)
    return Replica(copies, template.period_us, template.id_span,
                   len(template.pieces) - metadata, metadata, written)


def gpu_activity(source: Path) -> int:
    """GPU activity events (kernels, copies, sets, syncs) in a trace: 0 means no GPU."""
    events = _events(read_source(source))
    return sum(1 for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES)


def kernel_matches(source: Path, pattern: str) -> int:
    """Kernels whose name matches `pattern` on the GPU with the most of them (per copy)."""
    regex = re.compile(pattern)
    counts: dict = {}
    for e in _events(read_source(source)):
        if e.get("ph") == "X" and e.get("cat") in KERNEL_CATEGORIES \
                and regex.search(str(e.get("name", ""))):
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            key = (str(e.get("pid")), str(args.get("device")))
            counts[key] = counts.get(key, 0) + 1
    return max(counts.values(), default=0)


def _events(text: bytes) -> list:
    doc = msgspec.json.decode(text)
    return doc.get("traceEvents", []) if isinstance(doc, dict) else doc


def main(argv=None) -> None:
    from samples.generate import parse_size

    parser = argparse.ArgumentParser(prog="python -m benchmarks.replicate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, required=True, help="the source trace")
    parser.add_argument("--output", type=Path, required=True, help="plain JSON to write")
    parser.add_argument("--size", type=parse_size, required=True, help="e.g. 1GB")
    opts = parser.parse_args(argv)
    replica = replicate(opts.trace, opts.output, opts.size)
    print(f"{opts.output}: {replica.copies} copies, period {replica.period_us} µs, "
          f"{replica.bytes:,} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
