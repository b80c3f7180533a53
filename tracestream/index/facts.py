"""What the index pass keeps of one chunk: packed records, tables and the errors it raises.

Everything here is picklable (chunks are observed in worker processes) and numbered
chunk-locally (event index within the chunk, local track and group tables); the index
builder maps that to global ids."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracestream.index.keyscan import SPLICE_FIELDS
from tracestream.index.lanegroups import LaneGroups

FLOW = 8  # candidate kind of flow events
NEXT_FLOW = 10  # sweep kind of an `f` without "bp": "e" (binds to the next slice, not its own)
META = 9  # candidate kind of thread metadata events

CANDIDATE_DTYPE = np.dtype([("index", "<i4"), ("offset", "<i8"), ("length", "<i4"),
                            ("kind", "i1"), *SPLICE_FIELDS])
SLICE_DTYPE = np.dtype([
    ("cand", "<i4"), ("track", "<i4"), ("group", "<i4"), ("kind", "i1"),
    ("start", "<i8"), ("end", "<i8"), ("lo", "<i8"), ("hi", "<i8"),
    ("lane_group", "i1"),  # its semantic lane group's code (index.lanegroups; 0 without)
])
SLICE_SUMMARY_DTYPE = np.dtype([
    ("track", "<i4"), ("group", "<i4"), ("kind", "i1"), ("lo", "<i8"), ("hi", "<i8"),
])
"""What the read-only commands keep of a slice (stats and peak overlaps): half the bytes
each result carries back from a worker."""
FLOW_DTYPE = np.dtype([("cand", "<i4"), ("track", "<i4"), ("ts", "<i8"), ("id", "<i8"),
                       ("binds_next", "?")])

SCOPES = "scopes"
NO_ID = np.iinfo(np.int64).min


@dataclass
class Context:
    """What every chunk needs to know (sent along with each chunk)."""

    patterns: dict[str, re.Pattern] = field(default_factory=dict)
    count_names: bool = False
    moves_gpu: bool = False  # compaction: refuse GPU events with duplicate keys
    records: bool = True  # the candidates' byte spans (the rewrite pass needs them)
    bounds: bool = True  # the importer bounds of GPU slices (lanes, peaks, time spans)
    checksum: bool = False  # the CRC-32 of the chunk's bytes (the pass is checksummed by parts)
    track_facts: bool = True  # other events on tracks and the provenance key (not anchors)
    lane_groups: LaneGroups | None = None  # classify each slice into its lane group (compact)
    window: bool = False  # each chunk's time range and linked events (index.window)


@dataclass
class MetaEvent:
    """A `ph: M` event about a thread (name, sort index), with its byte span and bytes."""

    ordinal: int
    offset: int
    length: int
    pid: Any
    tid: Any
    name: str
    value: Any
    raw: bytes


@dataclass
class OtherOnTrack:
    """First event on a track that is neither activity, scope, flow nor metadata."""

    ordinal: int
    ph: Any
    name: Any
    ts: Any


@dataclass
class DuplicateInFlow:
    """First flow event on a track with a key spelled twice (once escaped counts)."""

    ordinal: int
    key: str


@dataclass
class GuideEvent:
    ordinal: int
    pid: Any
    tid: Any
    args: dict


@dataclass
class ChunkFacts:
    """Everything the index keeps from one chunk, in chunk-local numbering."""

    count: int
    origin: tuple[float, str] | None  # smallest ts of the chunk (float, exact text)
    tracks: list[tuple]  # local track id -> (pid, tid)
    groups: list[tuple]  # local group id -> (pid, device or SCOPES)
    candidates: np.ndarray  # CANDIDATE_DTYPE, in file order
    slices: np.ndarray  # SLICE_DTYPE (SLICE_SUMMARY_DTYPE without ctx.records)
    flows: np.ndarray  # FLOW_DTYPE (none without ctx.records)
    flow_ids: dict[int, Any]  # local candidate -> id, for ids that are not integers
    thread_meta: list[MetaEvent]
    process_meta: list[tuple[Any, str, Any]]
    other_on_track: dict[int, OtherOnTrack]  # local track -> first other event
    duplicate_flows: dict[int, DuplicateInFlow]  # local track -> first flow with a duplicate
    matches: dict[str, tuple]  # pattern -> (MATCH_DTYPE rows, names, streams, texts), chunk-local
    guides: list[GuideEvent]
    provenance: int | None
    kernel_names: dict[int, Counter]  # local group -> names
    kernel_vocabulary: dict[Any, dict]  # pid -> {kernel name: count}, with patterns
    cpu_annotations: Counter
    flow_categories: Counter
    phase_counts: Counter
    odd_values: int = 0  # events with a ts/dur nothing reads that is not a usable number
    first_odd: tuple[int, str] | None = None  # (local index, what is odd) of the first
    crc32: int | None = None  # of the chunk's bytes, with Context.checksum
    window: tuple | None = None  # with Context.window: (first start, last end, events in
    # every window, LINKED_DTYPE rows) (see index.window.chunk_range, linked_rows)


class BadCut(Exception):
    """The chunk's cut lies inside a string or nested value (or past the event array)."""

    def __init__(self, array_ends_at: int | None = None):
        super().__init__("bad cut")
        self.array_ends_at = array_ends_at

    def __reduce__(self):  # raised in a worker, it is pickled back to the parent
        return type(self), (self.array_ends_at,)


class ChunkError(Exception):
    """Malformed input inside a chunk: `local` is the event index in the chunk (or None)."""

    def __init__(self, message: str, offset: int, local: int | None):
        super().__init__(message)
        self.message = message
        self.offset = offset
        self.local = local

    def __reduce__(self):  # raised in a worker, it is pickled back to the parent: by default
        # as ChunkError(message), which fails and breaks the process pool
        return type(self), (self.message, self.offset, self.local)
