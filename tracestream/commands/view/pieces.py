"""A pieces manifest (``OUT.json.pieces.json``, written by ``--split-mb``) for `view`: read and
checked here, and listed by `render_listing`, a pure function of the manifest.

`view` recognises a manifest by its content (a JSON object with ``"kind": "pieces"``); a
file whose name ends in ``.pieces.json`` must be one. Every value in it is untrusted text:
it is escaped into the listing, and a piece's ``file`` must name a file inside the
manifest's own folder (no absolute path, no ``..``, no symbolic link that leads out), so
a manifest handed over by someone else cannot make the server send any other file.
"""

from __future__ import annotations

import html
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tracestream.errors import TraceError

MANIFEST_SUFFIX = ".pieces.json"
MAX_MANIFEST_BYTES = 1 << 20
"""A bigger file is a trace, not a manifest, and is not read here: a manifest has a few
hundred bytes a piece, and --split-mb writes at most 256 pieces."""
MAX_PIECE_NUMBER = 999_999
"""Piece numbers have at most 6 digits in /piece/N and /trace/N."""


@dataclass(frozen=True)
class Piece:
    """One piece: its number, its file (checked to be inside the manifest's folder), its size
    on disk and the manifest's row for it as it was read (untrusted values)."""

    number: int
    path: Path
    file_bytes: int
    row: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PiecesManifest:
    path: Path
    title: str  # the manifest's file name, as UTF-8 text
    data: dict  # the whole manifest as read, "pieces" included (untrusted values)
    pieces: tuple[Piece, ...]

    def piece(self, number: int) -> Piece | None:
        return next((p for p in self.pieces if p.number == number), None)


def read_manifest(path) -> PiecesManifest | None:
    """The manifest at `path`, or None when the file is not one (then it is a trace).

    Raises TraceError, one line, for a file named ``*.pieces.json`` that is not a manifest,
    and for a manifest that is malformed or names a piece file that is outside its folder,
    missing or not a regular file.
    """
    path = Path(path)
    named = path.name.endswith(MANIFEST_SUFFIX)
    where = f"pieces manifest {path}"
    try:
        size = path.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            if named:
                raise TraceError(f"{where}: {size:,} bytes is too big for a manifest (at most "
                                 f"{MAX_MANIFEST_BYTES:,})")
            return None
        with path.open("rb") as fh:
            head = fh.read(64).lstrip()
            if not head.startswith(b"{"):  # gzip, zstd, a JSON array: a trace
                if named:
                    raise TraceError(f"{where}: not a JSON object, so not a manifest")
                return None
            text = head + fh.read()
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not named and b'"pieces"' not in text:
        return None  # a small trace: not worth parsing here
    try:
        data = json.loads(text)
    except RecursionError:
        if named:
            raise TraceError(f"{where}: not valid JSON (nested too deeply)") from None
        return None
    except (UnicodeDecodeError, ValueError) as exc:
        if named:
            raise TraceError(f"{where}: not valid JSON ({exc})") from None
        return None
    if not isinstance(data, dict) or data.get("kind") != "pieces":
        if named:
            raise TraceError(f'{where}: not a manifest (a JSON object with "kind": "pieces")')
        return None
    rows = data.get("pieces")
    if not isinstance(rows, list) or not rows:
        raise TraceError(f'{where}: "pieces" must be a non-empty list')
    folder = path.parent
    pieces: list[Piece] = []
    seen: set[int] = set()
    for k, row in enumerate(rows):
        if not isinstance(row, dict):
            raise TraceError(f'{where}: entry {k + 1} of "pieces" is not an object')
        number = row.get("piece")
        if (not isinstance(number, int) or isinstance(number, bool)
                or not 1 <= number <= MAX_PIECE_NUMBER):
            raise TraceError(f'{where}: entry {k + 1} of "pieces" has no piece number from 1 '
                             f'to {MAX_PIECE_NUMBER} ("piece": {_quoted(number)})')
        if number in seen:
            raise TraceError(f"{where}: piece {number} is listed twice")
        seen.add(number)
        piece_path, size = _piece_file(folder, row.get("file"), number, where)
        pieces.append(Piece(number, piece_path, size, row))
    title = os.fsencode(path.name).decode("utf-8", "replace")
    return PiecesManifest(path=path, title=title, data=data, pieces=tuple(pieces))


def _quoted(value) -> str:
    """An untrusted value for a one-line terminal message: control characters escaped."""
    return repr(value)[:200]


def _piece_file(folder: Path, name, number: int, where: str) -> tuple[Path, int]:
    """The piece's file inside `folder` and its size; TraceError if it leaves the folder or
    is not there."""
    what = f"{where}: piece {number}'s file"
    if not isinstance(name, str) or not name or "\0" in name:
        raise TraceError(f'{what} is not a file name ("file": {_quoted(name)})')
    parts = PurePosixPath(name).parts
    if name.startswith(("/", "\\")) or os.path.isabs(name):
        raise TraceError(f"{what} {_quoted(name)} is an absolute path; a manifest names its "
                         "pieces relative to its own folder")
    if ".." in parts or ".." in Path(name).parts:
        raise TraceError(f"{what} {_quoted(name)} leaves the manifest's folder (..)")
    candidate = folder / name
    try:
        if not candidate.exists():
            raise TraceError(f"{what} {_quoted(name)} is missing (looked in {folder})")
        if not candidate.is_file():
            raise TraceError(f"{what} {_quoted(name)} is not a regular file (in {folder})")
        inside = candidate.resolve().is_relative_to(folder.resolve())
        size = candidate.stat().st_size
    except OSError as exc:
        raise TraceError(f"{what} {_quoted(name)} cannot be read: {exc.strerror or exc}") from None
    if not inside:
        raise TraceError(f"{what} {_quoted(name)} leads outside the manifest's folder through a "
                         "symbolic link")
    return candidate, size


# --- the listing page -----------------------------------------------------------------------


def listing_security_policy(nonce: str) -> str:
    """The listing runs no script at all and frames nothing: only its own style."""
    return (
        "default-src 'none'; "
        f"style-src 'nonce-{nonce}'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def _esc(value) -> str:
    """Any manifest value as HTML text (None: empty)."""
    if value is None:
        return ""
    return html.escape(value if isinstance(value, str) else json.dumps(value), quote=True)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mb(value) -> str:
    """Bytes as MB (10^6 bytes, as --split-mb counts them)."""
    if not _is_count(value):
        return _esc(value)
    if value >= 10**15:  # no size a split writes: shown as the count it is
        return _count(value)
    return f"{value / 1e6:,.2f}" if value < 10_000_000 else f"{value / 1e6:,.1f}"


def _count(value) -> str:
    return f"{value:,}" if _is_count(value) else _esc(value)


def _time_range(row: dict) -> str:
    start = row.get("start_ms")
    end = row.get("end_ms")
    start_text = "start" if start is None else _esc(start)
    end_text = "end" if end is None else _esc(end)
    return f"{start_text} &hellip; {end_text}"


def _passes(value) -> str:
    """[first, end) as the manifest has it, shown as first … last."""
    if (isinstance(value, list) and len(value) == 2 and all(map(_is_count, value))
            and value[1] > value[0]):
        return f"{value[0]} &hellip; {value[1] - 1}"
    return _esc(value)


def _guides(row: dict) -> str:
    count = row.get("guides")
    text = _count(count)
    if row.get("first_guide") is not None or row.get("last_guide") is not None:
        text += (f' <span class="dim">({_esc(row.get("first_guide"))} &hellip; '
                 f'{_esc(row.get("last_guide"))})</span>')
    return text


def _size(piece: Piece) -> str:
    json_bytes = piece.row.get("json_bytes")
    if json_bytes is None:
        return _mb(piece.file_bytes)
    text = _mb(json_bytes)
    if piece.file_bytes != json_bytes:
        text += f' <span class="dim">({_mb(piece.file_bytes)} on disk)</span>'
    return text


_LISTING = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>@TITLE@ - tracestream view</title>
<style nonce="@NONCE@">
body { margin: 0; font: 14px system-ui, sans-serif; color: #212121; }
header { padding: 8px 12px; background: #263238; color: #eceff1; }
header span { font-family: monospace; margin-left: 1.2em; }
main { padding: 12px; }
p { margin: 0 0 10px; }
table { border-collapse: collapse; }
th, td { padding: 4px 10px; border-bottom: 1px solid #cfd8dc; text-align: left; }
th { background: #eceff1; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td a { font-weight: 600; }
.dim { color: #607d8b; }
code { font-family: monospace; }
</style>
</head>
<body>
<header><strong>tracestream view</strong><span id="manifest-name">@TITLE@</span></header>
<main>
<p id="summary">@SUMMARY@</p>
<p>Click a piece to open it in the Perfetto UI; its page links back here.</p>
<table id="pieces">
<thead><tr>@HEAD@</tr></thead>
<tbody>
@ROWS@
</tbody>
</table>
</main>
</body>
</html>
"""


def render_listing(manifest: PiecesManifest, nonce: str, token: str) -> str:
    """The page at '/' for a manifest: one row per piece, each a link to /piece/N.

    Every manifest value is escaped; piece numbers are the checked integers. Columns for
    passes and guides appear only when some piece has them.
    """
    data = manifest.data
    pieces = manifest.pieces
    with_passes = any("passes" in p.row for p in pieces)
    with_guides = any("guides" in p.row for p in pieces)
    with_flows = any("flows_dropped" in p.row for p in pieces)
    quoted_token = html.escape(token, quote=True)

    head = ["piece", "ms from the trace origin"]
    head += ["passes"] if with_passes else []
    head += ["guides"] if with_guides else []
    head += ["events", "MB"]
    head += ["flows left out"] if with_flows else []

    rows = []
    for piece in pieces:
        row = piece.row
        link = (f'<a href="/piece/{piece.number}?token={quoted_token}">{piece.number}</a> '
                f'<span class="dim">{_esc(row.get("file"))}</span>')
        cells = [f"<td>{link}</td>", f"<td>{_time_range(row)}</td>"]
        if with_passes:
            cells.append(f"<td>{_passes(row.get('passes'))}</td>")
        if with_guides:
            cells.append(f"<td>{_guides(row)}</td>")
        cells.append(f'<td class="num">{_count(row.get("output_events"))}</td>')
        cells.append(f'<td class="num">{_size(piece)}</td>')
        if with_flows:
            cells.append(f'<td class="num">{_count(row.get("flows_dropped"))}</td>')
        rows.append(f"<tr>{''.join(cells)}</tr>")

    summary = f"{len(pieces)} piece{'s' if len(pieces) != 1 else ''}"
    if data.get("split_mb") is not None:
        summary += f" of at most {_esc(data.get('split_mb'))} MB of JSON each"
    if data.get("source_file") is not None:
        summary += f" from <code>{_esc(data.get('source_file'))}</code>"
    if data.get("command") is not None:
        summary += f" (<code>{_esc(data.get('command'))}</code>)"
    summary += "."
    if data.get("flows_dropped") is not None:
        summary += (f" {_count(data.get('flows_dropped'))} flows left out at the cuts (a flow "
                    "is written only whole, in the piece that holds all of it).")
    values = {
        "NONCE": nonce,
        "TITLE": html.escape(manifest.title, quote=True),
        "SUMMARY": summary,
        "HEAD": "".join(f"<th>{h}</th>" for h in head),
        "ROWS": "\n".join(rows),
    }
    # one pass, so that no value can be taken for a placeholder of the template
    return re.sub(r"@([A-Z]+)@", lambda m: values[m.group(1)], _LISTING)
