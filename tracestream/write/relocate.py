"""Byte-level edits of one event: relocate it to a lane, and undo that exactly.

A relocated event is its original bytes with two splices: the `tid` value (and,
for GPU scopes, the `pid` value) replaced, and a provenance member inserted as
the first member of `args` (or an `args` member appended when the event had
none).
Nothing else moves, so every number keeps its text, and `unrelocate` gives back
the original bytes exactly.

Positions come from a fast path (no backslash in the event, each key spelled
once, so the only `"tid"` token is the top-level key), else from a small
tokenizer that walks the top-level members.
"""

from __future__ import annotations

import re

import msgspec

from tracestream.errors import TraceError
from tracestream.model import MEMBER_WITH_ARGS, MEMBER_WITHOUT_ARGS, PROVENANCE_KEY

_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]', re.S)
_SCALAR_VALUE = re.compile(rb'[ \t\r\n]*:[ \t\r\n]*(-?[0-9]+|"[^"]*")')
_OBJECT_VALUE = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*\{[ \t\r\n]*(\}?)")
_JSON_SCALAR = rb'(?:"(?:[^"\\]|\\.)*"|-?[0-9][0-9.eE+-]*|true|false|null)'
_PROVENANCE_MEMBER = re.compile(
    rb'"' + PROVENANCE_KEY.encode() + rb'": \{"pid": (?P<pid>' + _JSON_SCALAR + rb'), '
    rb'"tid": (?P<tid>' + _JSON_SCALAR + rb'), '
    rb'"source_event_index": (?P<index>[0-9]+)(?:, "group": "(?P<group>[^"\\]*)")?, '
    rb'"had_args": (?P<had>true|false)\}(?P<trail>, )?',
    re.S,
)
_PROVENANCE_MARK = b'"' + PROVENANCE_KEY.encode() + b'": {"pid": '
_ADDED_ARGS = b', "args": '


_W = rb"[ \t\r\n]*"
_SCALAR = rb'(-?[0-9]+|"[^"\\]*")'
_KINETO_HEAD = re.compile(
    rb"\{" + _W + rb'"ph"' + _W + rb":" + _W + rb'"[^"\\]*"' + _W + rb"," + _W
    + rb"(?:" + rb'"(?:cat|name|id)"' + _W + rb":" + _W + rb'(?:"[^"\\]*"|-?[0-9]+)' + _W + rb","
    + _W + rb")*"
    + rb'"pid"' + _W + rb":" + _W + _SCALAR + _W + rb"," + _W
    + rb'"tid"' + _W + rb":" + _W + _SCALAR
    # simple members up to "args": {, in one go (absent: the search below decides)
    + rb"(?:(?:" + _W + rb"," + _W + rb'"(?:ts|dur|cat|name|bp|s|id)"' + _W + rb":" + _W
    + rb'(?:"[^"\\]*"|-?[0-9][0-9.eE+-]*))*'
    + _W + rb"," + _W + rb'"args"' + _W + rb":" + _W + rb"(\{)" + _W + rb"(\}?))?"
)
_MOVED_KEYS = re.compile(rb'"(?:pid|tid|args)"' + _W + rb":")


def _kineto_positions(raw: bytes):
    """Positions for events in Kineto's key order (ph, cat/name/id, pid, tid, ...), or None.

    The match walks the event's first members from its `{` in JSON grammar, so
    the pid and tid it finds are top-level; the one search after them proves no
    other "pid", "tid" or "args" key follows except one `args` object.
    """
    if b"\\" in raw:  # a key spelled with escapes (`"\\u0061rgs"`) is that key: see
        return None  # _exact_positions, which decodes every key
    m = _KINETO_HEAD.match(raw)
    if m is None or _MOVED_KEYS.search(raw, m.end()) is not None:
        return None
    if m.group(3) is None:
        return m.span(1), m.span(2), -1, False
    return m.span(1), m.span(2), m.start(3), bool(m.group(4))


def _fast_positions(raw: bytes):
    """(pid span, tid span, args '{' position or -1, args empty) the quick way, or None.

    Valid when the event has no backslash and each of "pid", "tid", "args" occurs
    at most once: every `"` is then a string delimiter, so the only `"tid"` token
    is the top-level key.
    """
    if b"\\" in raw or raw.count(b'"pid"') != 1 or raw.count(b'"tid"') != 1:
        return None
    pid = _SCALAR_VALUE.match(raw, raw.find(b'"pid"') + 5)
    tid = _SCALAR_VALUE.match(raw, raw.find(b'"tid"') + 5)
    if pid is None or tid is None:
        return None
    args_count = raw.count(b'"args"')
    if args_count == 0:
        return pid.span(1), tid.span(1), -1, False
    if args_count != 1:
        return None
    args = _OBJECT_VALUE.match(raw, raw.find(b'"args"') + 6)
    if args is None:
        return None
    brace = raw.rindex(b"{", args.start(), args.start(1))
    return pid.span(1), tid.span(1), brace, bool(args.group(1))


def _exact_positions(raw: bytes):
    spans = member_spans(raw)
    if "pid" not in spans or "tid" not in spans:
        return None
    args = spans.get("args")
    if args is None:
        return spans["pid"], spans["tid"], -1, False
    if raw[args[0] : args[0] + 1] != b"{":
        return "args"
    empty = raw[args[0] + 1 : args[1] - 1].strip() == b""
    return spans["pid"], spans["tid"], args[0], empty


def member_spans(raw: bytes) -> dict[str, tuple[int, int]]:
    """Value spans of the top-level members of one JSON object (the exact way)."""
    spans: dict[str, tuple[int, int]] = {}
    depth = 0
    key = None
    value_start = None
    expect_key = False
    for m in _TOKEN.finditer(raw):
        tok = m.group()
        c = tok[:1]
        if depth == 1 and c == b'"' and expect_key:
            key = msgspec.json.decode(tok)
            expect_key = False
            continue
        if depth == 1 and c == b":":
            value_start = _skip_ws(raw, m.end())
            continue
        if c in (b"{", b"["):
            depth += 1
            if depth == 1:
                expect_key = True
            continue
        if c in (b"}", b"]"):
            if depth == 1 and key is not None:
                spans[key] = (value_start, _rstrip_end(raw, m.start()))
                key = None
            depth -= 1
            continue
        if c == b"," and depth == 1:
            if key is not None:
                spans[key] = (value_start, _rstrip_end(raw, m.start()))
                key = None
            expect_key = True
    return spans


def _skip_ws(raw: bytes, pos: int) -> int:
    while raw[pos : pos + 1] in (b" ", b"\t", b"\r", b"\n"):
        pos += 1
    return pos


def _rstrip_end(raw: bytes, pos: int) -> int:
    while pos > 0 and raw[pos - 1 : pos] in (b" ", b"\t", b"\r", b"\n"):
        pos -= 1
    return pos


def relocate(raw: bytes, new_tid: bytes, ordinal: int, new_pid: bytes | None = None,
             positions: tuple | None = None, group: bytes | None = None) -> bytes:
    """The event moved to (`new_pid`, `new_tid`), with its provenance first in `args`.

    `positions` (pid span, tid span, args brace, args empty), when the index pass
    found them, saves searching the event again. `group`: the lane group's member the
    provenance holds after the source index (`, "group": "NAME"`), with lane groups.
    """
    found = positions or locate_members(raw)
    if found == "args":
        raise TraceError(f"event {ordinal}: `args` is not an object; cannot add provenance")
    if found is None:
        raise TraceError(f"event {ordinal}: cannot locate its pid/tid to relocate it")
    (p0, p1), (t0, t1), brace, empty = found
    if brace >= 0:
        member = with_group(MEMBER_WITH_ARGS % (raw[p0:p1], raw[t0:t1], ordinal), group)
        if not empty:
            member += b", "
        if brace > t1:  # Kineto's order: pid, tid, ..., args
            head = raw[:p0] + new_pid + raw[p1:t0] if new_pid is not None else raw[:t0]
            return b"".join((head, new_tid, raw[t1 : brace + 1], member, raw[brace + 1 :]))
        edits = [(t0, t1, new_tid), (brace + 1, brace + 1, member)]
    else:
        edits = [(t0, t1, new_tid),
                 (len(raw) - 1, len(raw) - 1, with_group(
                     MEMBER_WITHOUT_ARGS % (raw[p0:p1], raw[t0:t1], ordinal), group))]
    if new_pid is not None:
        edits.append((p0, p1, new_pid))
    return _apply_edits(raw, edits)


def with_group(member: bytes, group: bytes | None) -> bytes:
    """A provenance member with its lane group's member (or None) just before `had_args`,
    where the splice writes it (a pid or tid text, a JSON scalar, cannot hold the unescaped
    `, "had_args"` this looks for)."""
    if group is None:
        return member
    at = member.rindex(_HAD_ARGS)
    return member[:at] + group + member[at:]


_HAD_ARGS = b', "had_args": '


def locate_members(raw: bytes, *, kineto_first: bool = True):
    """Where an event's pid and tid values and its `args` lie: (pid span, tid span, args
    brace or -1, args empty), "args" when `args` is not an object, None when they cannot be
    found. Kineto's key order is tried first (one regular expression), then an event whose
    keys each appear once, then a full tokenizing read."""
    return ((_kineto_positions(raw) if kineto_first else None) or _fast_positions(raw)
            or _exact_positions(raw))


def _apply_edits(raw: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    """`raw` with each (start, end, replacement) applied; the edits do not overlap."""
    edits.sort()
    out = []
    pos = 0
    for start, end, piece in edits:
        out.append(raw[pos:start])
        out.append(piece)
        pos = end
    out.append(raw[pos:])
    return b"".join(out)


def provenance_match(raw: bytes) -> re.Match | None:
    """The provenance member where the rewrite puts it, or None: the first member of the
    event's own (top-level) `args`, and for an event that had no args, the whole `args`
    member appended last. The key's text anywhere else (a name, a nested object) is not
    provenance."""
    return _locate(raw)[0]


def _locate(raw: bytes) -> tuple[re.Match | None, re.Match | None]:
    """(`provenance_match`, the Kineto head match that found the args, if one did: its
    pid and tid spans lie before the member)."""
    if _PROVENANCE_MARK not in raw:
        return None, None
    head = _KINETO_HEAD.match(raw)
    if head is not None and head.group(3) is not None:
        brace = head.start(3)
    else:
        head = None
        args = member_spans(raw).get("args")
        if args is None or raw[args[0] : args[0] + 1] != b"{":
            return None, None
        brace = args[0]
    m = _PROVENANCE_MEMBER.match(raw, brace + 1)
    if m is None or m.group("had") == b"true":
        return m, head
    added = raw[brace - len(_ADDED_ARGS) : brace] == _ADDED_ARGS and raw[m.end():] == b"}}"
    return (m, head) if added and not m.group("trail") else (None, None)


def provenance_of(raw: bytes):
    """(pid text, tid text, source index, had_args) of a relocated event, or None."""
    m = provenance_match(raw)
    if m is None:
        return None
    return m.group("pid"), m.group("tid"), int(m.group("index")), m.group("had") == b"true"


def unrelocate(raw: bytes) -> tuple[bytes, int]:
    """The original bytes of a relocated event, and its source index."""
    undone = undo_relocation(raw)
    if undone is None:
        raise TraceError("event has no tracestream provenance to restore")
    return undone


def undo_relocation(raw: bytes) -> tuple[bytes, int] | None:
    """`unrelocate`, or None when the event carries no provenance (see provenance_match)."""
    m, head = _locate(raw)
    if m is None:
        return None
    pid_text, tid_text = m.group("pid"), m.group("tid")
    index = int(m.group("index"))
    if m.group("had") == b"true":
        cut_start, cut_end = m.start(), m.end()
    else:
        cut_start, cut_end = m.start() - len(_ADDED_ARGS + b"{"), m.end() + 1
    if head is not None:  # pid and tid where the head found them, before the member
        (p0, p1), (t0, t1) = head.span(1), head.span(2)
        return b"".join((raw[:p0], pid_text, raw[p1:t0], tid_text, raw[t1:cut_start],
                         raw[cut_end:])), index
    stripped = raw[:cut_start] + raw[cut_end:]
    found = locate_members(stripped, kineto_first=False)
    if not isinstance(found, tuple):
        raise TraceError(f"event {index}: cannot locate its pid/tid to restore it")
    (p0, p1), (t0, t1), _, _ = found
    edits = [(t0, t1, tid_text)]
    if stripped[p0:p1] != pid_text:
        edits.append((p0, p1, pid_text))
    return _apply_edits(stripped, edits), index
