"""The handshake page and the rules every request must pass: loopback Host, the run's token,
the routes, the UI's origin and the page's Content-Security-Policy."""

from __future__ import annotations

import html
import ipaddress
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tracestream.errors import TraceError

_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class TraceFile:
    """A validated trace: where it is, what to call it, and whether to unpack it."""

    path: Path
    title: str
    file_name: str  # the name Perfetto offers for "Download": without .zst when we unpack
    zstd: bool


def display_name(path: Path) -> str:
    """A file name that can be sent as UTF-8, even if the name on disk is not valid UTF-8."""
    return os.fsencode(path.name).decode("utf-8", "replace")


def ui_origin(ui_url: str) -> str:
    """The origin of the Perfetto UI URL (scheme://host[:port]), used as the postMessage target.

    Raises TraceError unless the URL is plain http(s) with a well-formed host.
    """
    try:
        parts = urlsplit(ui_url)
        port = parts.port
    except ValueError as exc:
        raise TraceError(f"--ui-url is not a valid URL: {ui_url!r} ({exc})") from None
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    if scheme not in _DEFAULT_PORTS or not _is_plain_host(host):
        raise TraceError(f"--ui-url must be an http:// or https:// URL with a host, got {ui_url!r}")
    if ":" in host:
        host = f"[{host}]"
    suffix = f":{port}" if port is not None and port != _DEFAULT_PORTS[scheme] else ""
    return f"{scheme}://{host}{suffix}"


def _is_plain_host(host: str) -> bool:
    """Only DNS names and IP literals: the host also goes into a CSP header."""
    if not host:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return all(part and (part.replace("-", "").isalnum() and part.isascii())
                   for part in host.rstrip(".").split("."))


def is_loopback_host(host_header: str | None) -> bool:
    """Whether a Host header names this machine.

    This guards against DNS rebinding, where a web page points its own host name at
    127.0.0.1 and then reads /trace. A missing header is allowed because browsers always
    send one.
    """
    if host_header is None:
        return True
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else ""
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    host = host.rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_matches(request_target: str, token: str) -> bool:
    """Whether the request target's query carries `token=<this run's token>` (in constant
    time: the comparison must not tell a guesser how much of it was right)."""
    query = request_target.split("?", 1)[1] if "?" in request_target else ""
    given = parse_qs(query, keep_blank_values=True).get("token", [""])[0]
    return secrets.compare_digest(given.encode(), token.encode())


def route_for(request_target: str) -> str | None:
    """Maps the raw request target to 'page', 'trace' or None (404).

    The path is compared exactly, with no unquoting or normalising, so '/..', '/%2e%2e/'
    and '/trace/x' can never reach anything. A query string on a known path is ignored.
    """
    path = request_target.split("?", 1)[0]
    return {"/": "page", "/trace": "trace"}.get(path)


_PIECE_ROUTE = re.compile(r"/(piece|trace)/([1-9][0-9]{0,5})")


def pieces_route_for(request_target: str) -> tuple[str, int | None] | None:
    """Maps the raw request target of a pieces server to ('list', None), ('piece', N) (the
    page for piece N), ('trace', N) (its bytes) or None (404).

    As in route_for, the path is compared exactly: N is plain decimal digits without a
    leading zero, so '/trace/01', '/trace/%31' and '/trace/1/' never reach a piece.
    """
    path = request_target.split("?", 1)[0]
    if path == "/":
        return ("list", None)
    match = _PIECE_ROUTE.fullmatch(path)
    if match is None:
        return None
    return (match.group(1), int(match.group(2)))


def json_for_script(value) -> str:
    """JSON that is safe inside <script type="application/json">: no '<', '>' or '&'.

    Non-ASCII, including U+2028/U+2029, is \\u-escaped by json.dumps itself.
    """
    text = json.dumps(value, ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def content_security_policy(nonce: str, ui_url: str) -> str:
    """Only our own script and style run, only the UI may be framed, only /trace is fetched.

    This is a second line of defence behind the escaping.
    """
    return (
        "default-src 'none'; "
        f"script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
        f"frame-src {ui_origin(ui_url)}; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>@TITLE@ - tracestream view</title>
<style nonce="@NONCE@">
html, body { height: 100%; margin: 0; }
body { display: flex; flex-direction: column; font: 14px system-ui, sans-serif; }
header { display: flex; gap: 1.2em; align-items: center; padding: 6px 12px;
         background: #263238; color: #eceff1; }
@BACK_STYLE@#trace-name { font-family: monospace; overflow: hidden; text-overflow: ellipsis; }
#status { flex: 1; font-weight: 600; }
#status[data-state="sent"] { color: #a5d6a7; }
#status[data-state="error"] { color: #ef9a9a; }
#perfetto { flex: 1; width: 100%; border: 0; }
</style>
</head>
<body>
<header>
<strong>tracestream view</strong>
@BACK@<span id="trace-name">@TITLE@</span>
<span id="status" role="status" data-state="loading">Loading the Perfetto UI&hellip;</span>
<button id="open-tab" type="button">Open in a new tab instead</button>
</header>
<iframe id="perfetto" title="Perfetto UI"></iframe>
<script type="application/json" id="view-config">@CONFIG@</script>
<script nonce="@NONCE@">
"use strict";
const cfg = JSON.parse(document.getElementById("view-config").textContent);
const uiOrigin = new URL(cfg.uiUrl).origin;
const statusLine = document.getElementById("status");
const frame = document.getElementById("perfetto");

function setStatus(text, state) {
  statusLine.textContent = text;
  statusLine.dataset.state = state;
}

// Perfetto drops messages sent before its listener exists, so PING until it answers.
function waitForPong(target) {
  return new Promise((resolve) => {
    const ping = () => target.postMessage("PING", uiOrigin);
    const timer = setInterval(ping, 250);
    const slow = setTimeout(() => setStatus(
      "Still waiting for the Perfetto UI at " + uiOrigin + " - is it reachable?", "waiting"),
      20000);
    function onMessage(event) {
      if (event.origin !== uiOrigin || event.source !== target || event.data !== "PONG") return;
      clearInterval(timer);
      clearTimeout(slow);
      window.removeEventListener("message", onMessage);
      resolve();
    }
    window.addEventListener("message", onMessage);
    ping();
  });
}

async function fetchTrace() {
  const response = await fetch(cfg.traceUrl, {cache: "no-store"});
  if (!response.ok) {
    const reason = (await response.text()).trim();
    throw new Error("the server answered " + response.status + (reason ? ": " + reason : ""));
  }
  try {
    return await response.arrayBuffer();
  } catch (err) {
    throw new Error("the trace broke off while it was read (" + err.message +
                    "); the terminal running tracestream view says why");
  }
}

async function sendTrace(target) {
  try {
    setStatus("Waiting for the Perfetto UI to answer\\u2026", "waiting");
    await waitForPong(target);
    setStatus("Fetching the trace\\u2026", "fetching");
    const buffer = await fetchTrace();
    const message = {perfetto: {buffer, title: cfg.title, fileName: cfg.fileName}};
    target.postMessage(message, uiOrigin, [buffer]);
    setStatus("Trace sent \\u2014 check the timeline", "sent");
  } catch (err) {
    setStatus("Could not send the trace: " + err.message +
              " (is tracestream view still running?)", "error");
  }
}

document.getElementById("open-tab").addEventListener("click", () => {
  const win = window.open(cfg.uiUrl, "_blank");
  if (win) sendTrace(win);
  else setStatus("The browser blocked the new tab; allow pop-ups for this page", "error");
});
frame.src = cfg.uiUrl;
sendTrace(frame.contentWindow);
</script>
</body>
</html>
"""


def render_page(trace: TraceFile, ui_url: str, nonce: str, token: str, *,
                piece: tuple[int, int] | None = None) -> str:
    """The handshake page. Names are escaped for both places they appear: HTML text and JSON.

    `piece`: (number, count) when the trace is a piece of a manifest: the page then fetches
    /trace/NUMBER and links back to the list at '/'.
    """
    trace_path = "/trace" if piece is None else f"/trace/{int(piece[0])}"
    config = {"uiUrl": ui_url, "title": trace.title, "fileName": trace.file_name,
              "traceUrl": f"{trace_path}?token={token}"}
    back_style = "" if piece is None else "#back { color: #80cbc4; white-space: nowrap; }\n"
    back = "" if piece is None else (
        f'<a id="back" href="/?token={html.escape(token, quote=True)}">&larr; all pieces</a>\n'
        f"<span>piece {int(piece[0])} of {int(piece[1])}</span>\n")
    return (
        _PAGE.replace("@NONCE@", nonce)
        .replace("@BACK_STYLE@", back_style)
        .replace("@BACK@", back)
        .replace("@TITLE@", html.escape(trace.title, quote=True))
        .replace("@CONFIG@", json_for_script(config))
    )
