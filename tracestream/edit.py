"""Byte-level edits of one event: relocate it to a lane, and undo that exactly.

A relocated event is its original bytes with two splices: the `tid` value (and,
for GPU scopes, the `pid` value) replaced, and a provenance member inserted at
the end of `args` (or an `args` member appended when the event had none).
Nothing else moves, so every number keeps its text, and `unrelocate` gives back
the original bytes exactly.

Positions come from a fast path (no backslash in the event, each key spelled
once) verified against msgspec's view of the event, else from a small
tokenizer that walks the top-level members.
"""

from __future__ import annotations

import re

import msgspec

from tracestream.errors import TraceError
from tracestream.events import PROVENANCE_KEY


class _Members(msgspec.Struct):
    pid: msgspec.Raw = msgspec.Raw()
    tid: msgspec.Raw = msgspec.Raw()
    args: msgspec.Raw = msgspec.Raw()


_MEMBERS = msgspec.json.Decoder(_Members)
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]', re.S)
_WS_COLON_WS = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*")
_PROVENANCE_MEMBER = re.compile(
    rb'(?P<lead>, )?"' + PROVENANCE_KEY.encode() + rb'": \{"pid": (?P<pid>.*?), "tid": (?P<tid>.*?), '
    rb'"source_event_index": (?P<index>[0-9]+), "had_args": (?P<had>true|false)\}',
    re.S,
)


def _fast_value_span(raw: bytes, key: bytes, value: bytes) -> tuple[int, int] | None:
    """Span of the only `"key"` member's value, checked against its parsed bytes."""
    quoted = b'"' + key + b'"'
    if raw.count(quoted) != 1:
        return None
    k = raw.find(quoted) + len(quoted)
    m = _WS_COLON_WS.match(raw, k)
    if m is None:
        return None
    start = m.end()
    end = start + len(value)
    if raw[start:end] != value:
        return None
    return start, end


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


def _spans(raw: bytes) -> tuple[_Members, dict[str, tuple[int, int] | None]]:
    parsed = _MEMBERS.decode(raw)
    wanted = {"pid": bytes(parsed.pid), "tid": bytes(parsed.tid), "args": bytes(parsed.args)}
    spans: dict[str, tuple[int, int] | None] = {}
    if b"\\" not in raw:
        for key, value in wanted.items():
            spans[key] = _fast_value_span(raw, key.encode(), value) if value else None
        if all(spans[k] is not None or not wanted[k] for k in wanted):
            return parsed, spans
    exact = member_spans(raw)
    for key, value in wanted.items():
        span = exact.get(key)
        spans[key] = span if value and span is not None else None
    return parsed, spans


def relocate(raw: bytes, new_tid: bytes, ordinal: int, new_pid: bytes | None = None) -> bytes:
    """The event moved to (`new_pid`, `new_tid`), with its provenance in `args`."""
    parsed, spans = _spans(raw)
    pid_text = bytes(parsed.pid)
    tid_text = bytes(parsed.tid)
    if not tid_text or not pid_text or spans["tid"] is None or spans["pid"] is None:
        raise TraceError(f"event {ordinal}: cannot locate its pid/tid to relocate it")
    args_text = bytes(parsed.args)
    has_args = spans["args"] is not None and args_text[:1] == b"{"
    if args_text and not has_args:
        raise TraceError(f"event {ordinal}: `args` is not an object; cannot add provenance")
    member = (
        b'"' + PROVENANCE_KEY.encode() + b'": {"pid": ' + pid_text + b', "tid": ' + tid_text
        + b', "source_event_index": ' + str(ordinal).encode()
        + b', "had_args": ' + (b"true" if has_args else b"false") + b"}"
    )
    edits = [(spans["tid"], new_tid)]
    if new_pid is not None:
        edits.append((spans["pid"], new_pid))
    if has_args:
        close = spans["args"][1] - 1
        empty = args_text[1:-1].strip() == b""
        edits.append(((close, close), member if empty else b", " + member))
    else:
        close = len(raw) - 1
        edits.append(((close, close), b', "args": {' + member + b"}"))
    return _apply(raw, edits)


def _apply(raw: bytes, edits) -> bytes:
    out = []
    pos = 0
    for (start, end), text in sorted(edits, key=lambda e: e[0]):
        out.append(raw[pos:start])
        out.append(text)
        pos = end
    out.append(raw[pos:])
    return b"".join(out)


def provenance_of(raw: bytes):
    """(pid text, tid text, source index, had_args) of a relocated event, or None."""
    m = _PROVENANCE_MEMBER.search(raw)
    if m is None:
        return None
    return m.group("pid"), m.group("tid"), int(m.group("index")), m.group("had") == b"true"


def unrelocate(raw: bytes) -> tuple[bytes, int]:
    """The original bytes of a relocated event, and its source index."""
    m = _PROVENANCE_MEMBER.search(raw)
    if m is None:
        raise TraceError("event has no tracestream provenance to restore")
    pid_text, tid_text = m.group("pid"), m.group("tid")
    index = int(m.group("index"))
    if m.group("had") == b"true":
        cut_start, cut_end = m.start(), m.end()
    else:
        prefix = b', "args": {'
        cut_start = m.start() - len(prefix)
        if m.group("lead") or raw[cut_start : m.start()] != prefix or raw[m.end() : m.end() + 1] != b"}":
            raise TraceError(f"event {index}: provenance is not where tracestream puts it")
        cut_end = m.end() + 1
    stripped = raw[:cut_start] + raw[cut_end:]
    parsed, spans = _spans(stripped)
    if spans["tid"] is None or spans["pid"] is None:
        raise TraceError(f"event {index}: cannot locate its pid/tid to restore it")
    edits = [(spans["tid"], tid_text)]
    if bytes(parsed.pid) != pid_text:
        edits.append((spans["pid"], pid_text))
    return _apply(stripped, edits), index
