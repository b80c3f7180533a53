"""What `verify` returns: a verdict made of named checks, and how a difference is shown."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from tracestream.model import decode_head

MAX_LISTED = 5


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Verdict:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def add(self, name: str, problems: list[str], passed: str, *, total: int | None = None
            ) -> None:
        """A check: failed with `problems` (the first few of `total`, when given), else
        passed."""
        total = len(problems) if total is None else total
        if problems:
            more = f" (+{total - MAX_LISTED} more)" if total > MAX_LISTED else ""
            self.checks.append(Check(name, False, "; ".join(problems[:MAX_LISTED]) + more))
        else:
            self.checks.append(Check(name, True, passed))

    def summary(self) -> str:
        head = "verified: all checks hold" if self.ok else (
            f"NOT verified: {sum(not c.ok for c in self.checks)} check(s) failed")
        lines = [head]
        for c in self.checks:
            lines.append(f"  [{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"verdict": "ok" if self.ok else "failed",
                "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks]}


def sha_problem(source, data: dict) -> list[str]:
    """The source's sha256 against the report's (a TraceSource: its hash is waited for)."""
    actual = source.sha256()
    expected = data.get("source_sha256")
    if actual == expected:
        return []
    return [f"source sha256 {actual[:16]}… differs from the report's {str(expected)[:16]}… "
            "(a report from another source?)"]


def replan_failed(verdict: Verdict, source, data: dict, exc: Exception,
                  against: str = "the report") -> Verdict:
    """The verdict where the source could be read but not planned again: its sha256 (a
    report from another source says why) and the plan's refusal."""
    verdict.add("source sha256", sha_problem(source, data), f"matches {against}")
    verdict.add("re-plan from the source", [str(exc)], "")
    return verdict


TEXT_VALUES = msgspec.json.Decoder(float_hook=lambda text: _Num(text))


class _Num(str):
    """A float kept as its text, so comparisons are digit for digit."""

    def __repr__(self) -> str:
        return str(self)


def first_difference(a: bytes, b: bytes) -> str:
    """'field ts: 1.5 vs 1.6' for the first value that differs between two events."""
    try:
        x, y = TEXT_VALUES.decode(a), TEXT_VALUES.decode(b)
    except msgspec.DecodeError:
        return "not comparable JSON"
    path = _diff(x, y, "")
    return path or "same values, different bytes"


def _diff(x: Any, y: Any, path: str) -> str | None:
    if isinstance(x, dict) and isinstance(y, dict):
        for key in list(x) + [k for k in y if k not in x]:
            if key not in y:
                return f"field {path}{key}: {_show(x[key])} vs missing"
            if key not in x:
                return f"field {path}{key}: missing vs {_show(y[key])}"
            found = _diff(x[key], y[key], f"{path}{key}.")
            if found:
                return found
        if list(x) != list(y):
            return f"field order of {path or 'event'} differs"
        return None
    if isinstance(x, list) and isinstance(y, list):
        if len(x) != len(y):
            return f"field {path.rstrip('.')}: {len(x)} items vs {len(y)}"
        for i, (a, b) in enumerate(zip(x, y)):
            found = _diff(a, b, f"{path}{i}.")
            if found:
                return found
        return None
    if type(x) is not type(y) or x != y:
        return f"field {path.rstrip('.')}: {_show(x)} vs {_show(y)}"
    return None


def _show(value: Any) -> str:
    text = msgspec.json.encode(value).decode() if not isinstance(value, _Num) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def short_text(raw: bytes) -> str:
    try:
        head = decode_head(raw)
        return f"{head.ph} {head.name!r} pid {head.pid} tid {head.tid} ts {head.ts}"
    except msgspec.MsgspecError:
        return raw[:60].decode(errors="replace")
