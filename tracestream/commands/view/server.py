"""`tracestream view`: open a local trace in the Perfetto UI in one step.

Why a server at all: ui.perfetto.dev cannot be handed a local file or a
``localhost`` URL. Its Content-Security-Policy forbids foreign fetches, and
browsers block cross-origin reads (Perfetto docs, "Deep linking to the Perfetto
UI", section "Why can't I just pass a URL?"). The supported way in is
``postMessage`` from a page that holds the trace. So this server serves that
page (`page.py`), plus the trace itself, on 127.0.0.1 only.

The handshake (perfetto.dev/docs/visualization/deep-linking-to-perfetto-ui,
/embedding-the-ui and /embedding-api-reference; the UI side is
ui/src/frontend/post_message_handler.ts in google/perfetto):

1. The page loads the UI. The message channel is not buffered, so the page
   posts ``'PING'`` every 250 ms until the UI answers ``'PONG'``. The UI
   answers only after its listener is registered and
   ``document.readyState == 'complete'``.
2. Then the page fetches ``/trace`` and posts
   ``{perfetto: {buffer: ArrayBuffer, title, fileName}}``. After the first
   trace the UI removes its listener, so the page posts once per handshake.
3. The UI accepts messages whose ``event.source`` is ``window.parent`` (iframe)
   or ``window.opener`` (``window.open``). It opens traces without a consent
   prompt when the sender's origin is ``127.0.0.1``/``localhost``, which is
   why the page must be loaded from http://127.0.0.1:PORT/, also through an
   ssh tunnel.

Window or iframe: iframe. Perfetto supports both, and its docs give the
``window.open`` flow first. But popup blockers allow ``window.open`` only right
after a user gesture ("Common pitfalls" in the deep-linking doc). When the CLI
opens the page there is no gesture, so a popup would be blocked. A full-page
iframe of the normal UI (not ``mode=embedded``, so the sidebar and the query
page stay) needs no gesture. A button offers the ``window.open`` flow as a
fallback; a click is a user gesture. Messages go to the UI URL's origin only,
and ``PONG`` counts only if it comes from that origin and that window. The page
is not served with ``Cross-Origin-Opener-Policy: same-origin``, because
Perfetto's docs warn that this header breaks the link between the windows.

Compressed traces:
* gzip: sent as it is. Trace processor recognises the gzip magic
  ``1f 8b`` and unpacks it (src/trace_processor/util/trace_type.cc,
  ``kGzipTraceType``; the UI hands posted buffers to trace processor), so the
  browser gets the smaller bytes.
* zstd: trace processor has no zstd magic in that list, so the UI would
  reject the file. We decompress on the fly with ``zstandard`` and send the
  text gzip-compressed at level 1 (ISA-L) with ``Content-Encoding: gzip``: the
  browser inflates it, so the UI receives the trace's exact text, and the wire
  (an ``ssh -L`` tunnel, say) carries about a tenth of it. The size is not
  known in advance, so that response has no Content-Length and is chunked
  (HTTP/1.1) or ends when the connection closes (HTTP/1.0).
The format is decided by the file's first bytes, not its name.

Shared machines: GPU and cluster nodes have other users, and any of them can connect to
127.0.0.1. So every run makes a random token, prints the address with it
(``http://127.0.0.1:PORT/?token=...``), and ``/`` and ``/trace`` answer 403 without it
(the page passes it on to ``/trace``; ``Referrer-Policy: no-referrer`` keeps it from the
UI). A client that never finishes its request headers is dropped after
HEADER_TIMEOUT seconds. A zstd file that is corrupt from the start is a 502 with the
reason; one that breaks mid-way ends a chunked response without its last chunk, so
the browser's fetch fails instead of receiving a short trace. Either way the
server reports one line (to its `report` callable, else the `tracestream.view` logger;
the CLI prints it), never a traceback.

Pieces: given the manifest a ``--split-mb`` run wrote (``OUT.json.pieces.json``, see
`pieces.py`), ``/`` is a list of the pieces instead (no script; its own CSP), and piece
N is served as a single trace is: its handshake page at ``/piece/N`` (with a link back)
fetches ``/trace/N``. ``/trace`` is then 404; every route needs the token.

Limits: the browser holds the whole trace in one ArrayBuffer, and the Perfetto
UI's in-browser engine has its own memory ceiling (a few GB). For bigger traces
Perfetto suggests ``trace_processor --httpd``
(docs/visualization/large-traces.md). The server side only ever holds one 1 MiB block.
"""

from __future__ import annotations

import io
import logging
import os
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import TCPServer

from isal import isal_zlib

from tracestream.commands.view import DEFAULT_UI_URL
from tracestream.commands.view.page import (
    TraceFile,
    content_security_policy,
    display_name,
    is_loopback_host,
    pieces_route_for,
    render_page,
    route_for,
    token_matches,
    ui_origin,
)
from tracestream.commands.view.pieces import (
    PiecesManifest,
    listing_security_policy,
    read_manifest,
    render_listing,
)
from tracestream.errors import TraceError, one_line
from tracestream.read.compression import detect_compression, zstd_blocks

GZIP_WBITS = 31
"""zlib's window bits for a gzip header and trailer (16 + the 32 KiB window)."""

__all__ = ["DEFAULT_UI_URL", "TraceFile", "ViewServer", "address_lines", "describe_pieces",
           "describe_trace"]

LOOPBACK = "127.0.0.1"
BLOCK_SIZE = 1 << 20  # bytes per read from disk: this bounds the server's memory


_POLL_SECONDS = 0.2  # how quickly serve_forever notices shutdown()
HEADER_TIMEOUT = 10.0
"""Seconds a client may take to send its request line and headers, all of them together
(then it is dropped): one byte every few seconds does not keep a connection open."""
MAX_CONNECTIONS = 32
"""Connections served at once (a thread each); one more is closed at once."""


def describe_trace(trace_path) -> TraceFile:
    """Checks the trace now, so a bad path fails before a browser is opened."""
    path = Path(trace_path)
    if not path.exists():
        raise TraceError(f"trace not found: {path}")
    if not path.is_file():
        raise TraceError(f"trace is not a regular file: {path}")
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    if not head:
        raise TraceError(f"trace is empty, nothing to show: {path}")
    name = display_name(path)
    zstd = detect_compression(head) == "zstd"  # also pzstd's, which starts with a skippable frame
    file_name = name[: -len(".zst")] if zstd and name.endswith(".zst") else name
    return TraceFile(path=path, title=name, file_name=file_name, zstd=zstd)


def describe_pieces(manifest: PiecesManifest) -> dict[int, TraceFile]:
    """Each piece checked as a single trace is (an empty or unreadable piece refuses the
    manifest now, before a browser is opened), by piece number."""
    traces = {}
    for piece in manifest.pieces:
        try:
            traces[piece.number] = describe_trace(piece.path)
        except TraceError as exc:
            raise TraceError(f"pieces manifest {manifest.path}: piece {piece.number}: "
                             f"{exc}") from None
    return traces


class _Handler(BaseHTTPRequestHandler):
    """Serves '/', '/trace' and a 404 for everything else; only GET and HEAD exist.

    For a pieces manifest: '/' (the list), '/piece/N' (piece N's page), '/trace/N' (its
    bytes), and a 404 for everything else, '/trace' included."""

    server_version = "tracestream-view"
    server: _LoopbackServer
    timeout = None  # set per connection in setup(): HEADER_TIMEOUT until the headers are in

    def setup(self):
        super().setup()
        self.rfile.close()  # the socket's own reader, replaced by one with a deadline
        self._reader = _DeadlineReader(self.connection, time.monotonic() + HEADER_TIMEOUT)
        self.rfile = io.BufferedReader(self._reader)

    def parse_request(self) -> bool:
        """The headers are in: the body may take as long as the browser needs."""
        parsed = super().parse_request()
        self._reader.deadline = None
        return parsed

    def version_string(self) -> str:
        return self.server_version

    def do_GET(self):
        self._respond(send_body=True)

    def do_HEAD(self):
        self._respond(send_body=False)

    def log_message(self, format, *args):
        """Quiet: the terminal shows only the address and the Ctrl-C hint."""

    def raw_target(self) -> str:
        """The request target as sent. self.path has had a leading '//' collapsed to '/'."""
        words = self.requestline.split()
        return words[1] if len(words) >= 2 else ""

    def _respond(self, send_body: bool) -> None:
        if not is_loopback_host(self.headers.get("Host")):
            self.send_error(403, "Host must be 127.0.0.1 or localhost")
            return
        if self.server.pieces is not None:
            self._respond_pieces(send_body)
            return
        route = route_for(self.raw_target())
        if route is not None and not token_matches(self.raw_target(), self.server.token):
            self.send_error(403, "Open the address tracestream view printed (with its token)")
            return
        try:
            if route == "page":
                self._send_page(send_body, self.server.trace)
            elif route == "trace":
                self._send_trace(send_body, self.server.trace)
            else:
                self.send_error(404)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the browser went away mid-transfer: nothing to do

    def _respond_pieces(self, send_body: bool) -> None:
        route = pieces_route_for(self.raw_target())
        if route is not None and not token_matches(self.raw_target(), self.server.token):
            self.send_error(403, "Open the address tracestream view printed (with its token)")
            return
        kind, number = route or (None, None)
        trace = self.server.piece_traces.get(number) if number is not None else None
        try:
            if kind == "list":
                self._send_listing(send_body)
            elif kind == "piece" and trace is not None:
                self._send_page(send_body, trace, (number, len(self.server.piece_traces)))
            elif kind == "trace" and trace is not None:
                self._send_trace(send_body, trace)
            else:
                self.send_error(404)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _send_listing(self, send_body: bool) -> None:
        nonce = secrets.token_urlsafe(16)
        # (a lone surrogate in a manifest's text is valid JSON, not UTF-8: replaced)
        body = render_listing(self.server.pieces, nonce, self.server.token).encode(
            "utf-8", "replace")
        self.send_response(200)
        self._common_headers("text/html; charset=utf-8")
        self.send_header("Content-Security-Policy", listing_security_policy(nonce))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def _common_headers(self, content_type: str) -> None:
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")

    def _send_text(self, code: int, text: str) -> None:
        """A plain-text answer the page shows as it is (send_error's HTML and its Latin-1
        status line would mangle a file name)."""
        body = text.encode("utf-8", "replace")
        self.send_response(code)
        self._common_headers("text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_page(self, send_body: bool, trace: TraceFile,
                   piece: tuple[int, int] | None = None) -> None:
        nonce = secrets.token_urlsafe(16)
        body = render_page(trace, self.server.ui_url, nonce, self.server.token,
                           piece=piece).encode("utf-8", "replace")
        self.send_response(200)
        self._common_headers("text/html; charset=utf-8")
        self.send_header("Content-Security-Policy",
                         content_security_policy(nonce, self.server.ui_url))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def _send_trace(self, send_body: bool, trace: TraceFile) -> None:
        try:
            fh = trace.path.open("rb")
        except OSError:
            self.send_error(500, "cannot read the trace file any more")
            return
        with fh:
            if trace.zstd:
                self._send_zstd(fh, send_body, trace.title)
                return
            self.send_response(200)
            self._common_headers("application/octet-stream")
            size = os.fstat(fh.fileno()).st_size
            self.send_header("Content-Length", str(size))
            self.end_headers()
            if send_body:
                copy_blocks(fh, self.wfile, size)

    def _send_zstd(self, fh, send_body: bool, title: str) -> None:
        """Decompressed on the fly and sent gzip-compressed (`Content-Encoding: gzip`, which
        the browser undoes). Its length is unknown, so the body is chunked (HTTP/1.1
        clients) or ends with the connection: a stream that turns out corrupt mid-way ends
        without the last chunk (and without the gzip trailer), which the browser's fetch
        reports as an error."""
        blocks = open_decompressed(fh, title)
        try:
            first = next(blocks, b"")
        except TraceError as exc:  # corrupt from the start: nothing sent yet, so say why
            self.server.report(str(exc))
            self._send_text(502, str(exc))
            return
        self.close_connection = True  # one response per connection: its end is clear
        chunked = self.request_version == "HTTP/1.1"
        if chunked:
            self.protocol_version = "HTTP/1.1"  # this response only
        self.send_response(200)
        self._common_headers("application/octet-stream")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Connection", "close")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if not send_body:
            return
        out = _ChunkedWriter(self.wfile) if chunked else self.wfile
        packer = isal_zlib.compressobj(1, isal_zlib.DEFLATED, GZIP_WBITS)
        try:
            out.write(packer.compress(first))
            for block in blocks:
                out.write(packer.compress(block))
        except TraceError as exc:  # no last chunk: the browser sees a broken body
            self.server.report(f"{exc}; the transfer to the browser was broken off")
            return
        out.write(packer.flush())
        if chunked:
            out.finish()


class _DeadlineReader(io.RawIOBase):
    """The connection's bytes, each read given only the time left until `deadline`
    (monotonic seconds; None: no limit) so that the deadline holds for the whole request,
    not for each read."""

    def __init__(self, sock, deadline: float | None):
        self._sock = sock
        self.deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.deadline is None:
            self._sock.settimeout(None)
        else:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request headers took too long")
            self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _ChunkedWriter:
    """HTTP/1.1 chunked transfer coding over a stream: `finish()` writes the last chunk."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, data: bytes) -> None:
        if data:
            self._stream.write(b"%x\r\n" % len(data) + data + b"\r\n")

    def finish(self) -> None:
        self._stream.write(b"0\r\n\r\n")


def open_decompressed(fh, name: str):
    """Decompressed blocks of a zstd file, read 64 KB at a time (an output block is that
    times the compression ratio); TraceError where it is corrupt or truncated."""
    return zstd_blocks(iter(lambda: fh.read(64 << 10), b""), name)


def copy_blocks(source, sink, limit: int | None = None, block_size: int = BLOCK_SIZE) -> int:
    """Copies source to sink one block at a time and returns the byte count.

    `limit` keeps the body equal to the Content-Length already sent, even if a profiler is
    still appending to the file.
    """
    total = 0
    while limit is None or total < limit:
        block = source.read(block_size if limit is None else min(block_size, limit - total))
        if not block:
            break
        sink.write(block)
        total += len(block)
    return total


class _LoopbackServer(ThreadingHTTPServer):
    """An HTTP server that listens on 127.0.0.1 only and never resolves host names."""

    daemon_threads = True  # a transfer still running must not keep the process alive
    allow_reuse_address = True

    def __init__(self, port: int, trace: TraceFile, ui_url: str, token: str, report,
                 pieces: PiecesManifest | None = None,
                 piece_traces: dict[int, TraceFile] | None = None):
        self.trace = trace
        self.pieces = pieces  # None: a single trace
        self.piece_traces = piece_traces or {}
        self.ui_url = ui_url
        self.token = token
        self.report = report  # one line for the terminal about a request that failed
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__((LOOPBACK, port), _Handler)

    def process_request(self, request, client_address):
        """One thread per connection, at most MAX_CONNECTIONS of them."""
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def server_bind(self):
        """HTTPServer.server_bind would call getfqdn(), a DNS lookup that can hang offline."""
        TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address):
        """A browser dropping the connection is normal; anything else is one line, never a
        traceback in the middle of the terminal."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, TimeoutError)):
            text = one_line(exc)
            self.report(f"internal error while serving a request: {type(exc).__name__}: {text}")


_LOG = logging.getLogger("tracestream.view")


def _report(line: str) -> None:
    """Where a serving error goes unless the caller says (the CLI prints it on stderr)."""
    _LOG.error(line)


class ViewServer:
    """Serves a trace and the Perfetto handshake page on http://127.0.0.1:PORT/.

    Given a pieces manifest (see tracestream.commands.view.pieces), it serves the list of
    its pieces at '/' instead, and each piece as a single trace is served.

    The port is bound in the constructor, so `url` is known before serving starts. It is a
    context manager: leaving the block shuts the server down.
    """

    def __init__(self, trace_path, *, port: int = 0, ui_url: str = DEFAULT_UI_URL,
                 report=None):
        ui_origin(ui_url)  # validates before anything is bound
        self.trace = describe_trace(trace_path)
        self.pieces = read_manifest(trace_path)
        piece_traces = describe_pieces(self.pieces) if self.pieces is not None else None
        self.ui_url = ui_url
        self.token = secrets.token_urlsafe(24)  # a new one every run: see the module notes
        try:
            self._httpd = _LoopbackServer(port, self.trace, ui_url, self.token,
                                          report or _report, self.pieces, piece_traces)
        except OSError as exc:
            raise TraceError(f"cannot listen on {LOOPBACK}:{port}: {exc.strerror or exc}") from None
        self.port: int = self._httpd.server_address[1]
        self.url: str = f"http://{LOOPBACK}:{self.port}/?token={self.token}"
        self._thread: threading.Thread | None = None
        self._serving = False  # httpd.shutdown() would wait forever if nothing ever served

    def start(self) -> None:
        """Serves in a background thread and returns at once."""
        if self._thread is not None:
            return
        self._serving = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": _POLL_SECONDS},
            name=f"tracestream-view:{self.port}",
            daemon=True,
        )
        self._thread.start()

    def serve_forever(self) -> None:
        """Serves in this thread. Returns on shutdown() from another thread or on Ctrl-C."""
        self._serving = True
        try:
            self._httpd.serve_forever(poll_interval=_POLL_SECONDS)
        except KeyboardInterrupt:
            pass
        finally:
            self._httpd.server_close()

    def shutdown(self) -> None:
        """Stops serving and frees the port. It is safe to call more than once."""
        if self._serving:
            self._httpd.shutdown()
        if self._thread is not None:
            self._thread.join()
        self._httpd.server_close()

    def __enter__(self) -> ViewServer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()


def address_lines(server: ViewServer) -> list[str]:
    """What to tell the user: the address, the ssh tunnel for remote machines, how to stop."""
    port = server.port
    if server.pieces is not None:
        count = len(server.pieces.pieces)
        return [
            f"Serving the {count} piece{'s' if count != 1 else ''} listed in "
            f"{server.trace.path} at {server.url}",
            f"Open that address in your browser: it lists the pieces, and a click on one hands "
            f"it to {server.ui_url}.",
            "Nothing is uploaded: the pieces go only from this process to your own browser.",
            f"On a remote machine, run `ssh -L {port}:127.0.0.1:{port} host` on your computer "
            f"and open {server.url} there (use --port to keep the same port between runs).",
            "Press Ctrl-C to stop.",
        ]
    return [
        f"Serving {server.trace.path} at {server.url}",
        f"Open that address in your browser; the page hands the trace to {server.ui_url}.",
        "Nothing is uploaded: the trace goes only from this process to your own browser.",
        f"On a remote machine, run `ssh -L {port}:127.0.0.1:{port} host` on your computer "
        f"and open {server.url} there (use --port to keep the same port between runs).",
        "Press Ctrl-C to stop.",
    ]
