"""What an event is, as far as tracestream's decisions go: its kinds, the provenance member
a relocated event carries, and the msgspec schemas events are read by.

Each schema reads only the fields one reader needs, so msgspec skips (but validates)
everything else; they differ because their readers want different things of the same
fields:

* `ReadEvent` and `Event`: the index pass's chunk decode. `ts`/`dur` are kept as their
  exact text; the provenance key is read as present or not, whatever its value (the C
  extension's scan gives the same fields, see _native).
* `CheckEvent`: verify's chunk decode of an output. The provenance is read as an object
  (`Origin`) whose pid and tid verify compares, and a name as its JSON text.
* `Head` (and `Timing`): verify's reading of one event at a time, loose
  where the index pass is (numbers as floats, a number no double holds kept as text).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

# Event kinds (small ints so they pack into arrays).
OTHER = 0
KERNEL = 1
MEMCPY = 2
MEMSET = 3
SYNC = 4
GPU_SCOPE = 5
LAYER_GUIDE = 6
CPU_ANNOTATION = 7

ACTIVITY_KINDS = (KERNEL, MEMCPY, MEMSET, SYNC)
_ACTIVITY_CATEGORIES = {
    "kernel": KERNEL,
    "gpu_memcpy": MEMCPY,
    "memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "memset": MEMSET,
    "cuda_sync": SYNC,
}

FLOW_PHASES = frozenset(("s", "t", "f"))
GUIDE_CATEGORY = "layer_guide"
PROVENANCE_KEY = "_compact_gpu_track"
PROVENANCE_MARK = PROVENANCE_KEY.encode()
"""The provenance key as bytes: an event without them is not relocated."""
MEMBER_WITH_ARGS = (
    b'"' + PROVENANCE_MARK
    + b'": {"pid": %b, "tid": %b, "source_event_index": %d, "had_args": true}'
)
"""The provenance member a relocated event's args begin with (its original pid and tid
texts, its index in the source)."""
MEMBER_WITHOUT_ARGS = (
    b', "args": {"' + PROVENANCE_MARK
    + b'": {"pid": %b, "tid": %b, "source_event_index": %d, "had_args": false}}'
)
"""The args member appended to a relocated event that had none."""


def binds_next(ph: Any, bp: Any) -> bool:
    """Perfetto binds an `f` without `"bp": "e"` to the next slice that begins at or after it
    on its track; `s`, `t` and `f` with `"bp": "e"` to the slice enclosing it."""
    return ph == "f" and bp != "e"


def category_kind(cat: Any) -> int:
    """Kind of an `X` event from its category list (comma separated, case-insensitive)."""
    if not isinstance(cat, str):
        return OTHER
    parts = [p.strip().lower() for p in cat.split(",")]
    for part in parts:
        if part in _ACTIVITY_CATEGORIES:
            return _ACTIVITY_CATEGORIES[part]
    if "gpu_user_annotation" in parts:
        return GPU_SCOPE
    if GUIDE_CATEGORY in parts:
        return LAYER_GUIDE
    if "user_annotation" in parts:
        return CPU_ANNOTATION
    return OTHER


class CategoryKinds(dict):
    """Memoised `category_kind`: categories repeat, so classify each one once. A missing
    `cat` (None: Kineto's instants, and every metadata event) is remembered too: a real
    trace holds one or two in every step, each a Python call when it was not.

    Emptied when it holds `limit` categories and meets a new one, so a trace of ever new
    categories cannot grow it without bound (a real trace has a few dozen)."""

    def __init__(self, limit: int = 1 << 12):
        super().__init__()
        self.limit = limit

    def of(self, cat) -> int:
        """`self[cat]`, and OTHER for a `cat` that is a JSON object or array (no key, and no
        category either)."""
        try:
            return self[cat]
        except TypeError:
            return OTHER

    def __missing__(self, cat):
        kind = category_kind(cat)
        if cat is None or isinstance(cat, str):  # others are odd: classified each time
            if len(self) >= self.limit:
                self.clear()
            self[cat] = kind
        return kind


# gc=False: values decoded from JSON hold no cycles, and untracked structs are quicker to
# make (a chunk's thousands of events are decoded at once)
class ReadArgs(msgspec.Struct, gc=False):
    device: Any = None
    stream: Any = None
    provenance: Any = msgspec.field(default=msgspec.UNSET, name=PROVENANCE_KEY)


class ReadEvent(msgspec.Struct, gc=False):
    """The fields every event is classified by (everything else is skipped, but validated):
    all that the read-only commands read."""

    ph: str | None = None
    cat: Any = None
    name: Any = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: msgspec.Raw = msgspec.Raw()  # the exact number text
    dur: msgspec.Raw = msgspec.Raw()
    args: ReadArgs | None = None


class Event(ReadEvent, gc=False):
    """`ReadEvent` and what binding a flow reads (the rewrite's index pass)."""

    id: Any = None
    bp: Any = None


class Origin(msgspec.Struct, gc=False):
    pid: Any = None
    tid: Any = None
    group: Any = None  # the lane group (--lane-groups), where the output has them


class CheckArgs(msgspec.Struct, gc=False):
    device: Any = None
    origin: Origin | None = msgspec.field(default=None, name=PROVENANCE_KEY)


class CheckEvent(msgspec.Struct, gc=False):
    """What the output-only checks read of an event (`Head`'s fields, the exact ts/dur
    texts and the provenance's pid and tid), for a chunk at a time. The name is kept as
    its JSON text: only guides' names are read (`event_name`)."""

    ph: str | None = None
    cat: Any = None
    name: msgspec.Raw = msgspec.Raw()
    pid: int | str | None = None
    tid: int | str | None = None
    ts: msgspec.Raw = msgspec.Raw()
    dur: msgspec.Raw = msgspec.Raw()
    bp: Any = None
    args: CheckArgs | None = None


class HeadArgs(msgspec.Struct):
    device: Any = None
    stream: Any = None


class Head(msgspec.Struct):
    """The fields every event is classified by."""

    ph: str | None = None
    cat: Any = None
    name: Any = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: Any = None  # as loose as the index pass (a duplicate "ts" may hold anything first)
    dur: Any = None
    id: Any = None
    bp: Any = None
    args: HeadArgs | None = None


class Timing(msgspec.Struct):
    """The exact number text of `ts` and `dur`."""

    ts: msgspec.Raw = msgspec.Raw()
    dur: msgspec.Raw = msgspec.Raw()


HEAD = msgspec.json.Decoder(Head)


class _RawArgs(msgspec.Struct):
    device: msgspec.Raw = msgspec.Raw()
    stream: msgspec.Raw = msgspec.Raw()


class _RawHead(msgspec.Struct):
    ph: str | None = None
    cat: msgspec.Raw = msgspec.Raw()
    name: msgspec.Raw = msgspec.Raw()
    pid: int | str | None = None
    tid: int | str | None = None
    ts: msgspec.Raw = msgspec.Raw()
    dur: msgspec.Raw = msgspec.Raw()
    id: msgspec.Raw = msgspec.Raw()
    bp: msgspec.Raw = msgspec.Raw()
    args: _RawArgs | None = None


_RAW_HEAD = msgspec.json.Decoder(_RawHead)


def decode_head(raw: bytes) -> Head:
    """The event's Head. A number no double holds (`"ts": 1e400` on an event nothing moves,
    which the index pass lets through) is kept as its JSON text instead of failing."""
    try:
        return HEAD.decode(raw)
    except msgspec.ValidationError:
        loose = _RAW_HEAD.decode(raw)  # anything else wrong fails here as before
    args = None if loose.args is None else HeadArgs(
        _loose_value(loose.args.device), _loose_value(loose.args.stream))
    return Head(loose.ph, _loose_value(loose.cat), _loose_value(loose.name), loose.pid,
                loose.tid, _loose_value(loose.ts), _loose_value(loose.dur),
                _loose_value(loose.id), _loose_value(loose.bp), args)


def _loose_value(raw: msgspec.Raw):
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw)
    except msgspec.ValidationError:  # a number out of a double's range, somewhere in it
        return bytes(raw).decode()
TIMING = msgspec.json.Decoder(Timing)

def describe_validation_error(exc: msgspec.ValidationError) -> str:
    """`ts` must be a number, not a string' from msgspec's message."""
    text = str(exc)
    match = re.search(r"Expected `([^`]*)`, got `([^`]*)` - at `\$\.?([^`]*)`", text)
    if not match:
        if "Expected `object`" in text:
            return "is not a JSON object"
        return text
    expected, got, path = match.groups()
    expected = (
        expected.replace("float | null", "a number")
        .replace("int | str | null", "an integer or a string")
        .replace("str | null", "a string")
        .replace("object | null", "an object")
    )
    return f"field `{path}` must be {expected}, not {got}"


RAW_EVENTS = msgspec.json.Decoder(list[msgspec.Raw])
"""An array of events as their exact texts (each event's bytes, undecoded)."""

