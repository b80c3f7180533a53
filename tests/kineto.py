"""Small hand-made Kineto traces for the rules that generated traces do not isolate."""

from __future__ import annotations

import json
from pathlib import Path


def kernel(name: str, ts, dur, *, pid=0, tid=7, device=0, cat="kernel", **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": {"device": device, "stream": tid, **args}}


def flow(ph: str, fid, ts, *, pid=0, tid=7) -> dict:
    event = {"ph": ph, "id": fid, "pid": pid, "tid": tid, "ts": ts, "cat": "ac2g", "name": "ac2g"}
    if ph == "f":
        event["bp"] = "e"
    return event


def thread_name(pid, tid, name: str) -> dict:
    return {"name": "thread_name", "ph": "M", "ts": 0, "pid": pid, "tid": tid,
            "args": {"name": name}}


def write_trace(path: Path, events: list, *, top: dict | None = None, bare: bool = False) -> Path:
    """Kineto-like formatting: one event per block, numbers exactly as given.

    A number given as a string (e.g. "1764400000005000.125") is written verbatim,
    so tests can use digits a double cannot hold.
    """
    blocks = [_event_text(e) for e in events]
    body = "[\n" + ",\n".join(blocks) + "\n]"
    if bare:
        text = body
    else:
        head = {"schemaVersion": 1, **(top or {})}
        members = [f'  {json.dumps(k)}: {json.dumps(v)}' for k, v in head.items()]
        text = "{\n" + ",\n".join(members + [f'  "traceEvents": {body}']) + "\n}\n"
    Path(path).write_text(text)
    return Path(path)


def _event_text(event: dict) -> str:
    parts = []
    for key, value in event.items():
        parts.append(f"{json.dumps(key)}: {_value(key, value)}")
    return "  {\n    " + ", ".join(parts) + "\n  }"


def _value(key: str, value) -> str:
    if key in ("ts", "dur") and isinstance(value, str):
        return value
    return json.dumps(value)


def anchor_trace(path: Path, times, *, terminals=(), dur="1", pid=0, device=0, extra=()) -> Path:
    """Anchors named `a` at `times` (µs), terminals named `t` given as (ts, dur)."""
    events = [kernel("a", str(t), dur, pid=pid, device=device) for t in times]
    events += [kernel("t", str(ts), str(d), pid=pid, device=device, tid=8) for ts, d in terminals]
    events += list(extra)
    return write_trace(path, events)
