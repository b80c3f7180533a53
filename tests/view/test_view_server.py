"""The view server: exact bytes, bounded memory, nothing but '/' and '/trace', loopback only."""

from __future__ import annotations

import _thread
import fcntl
import gzip
import hashlib
import html
import http.client
import json
import os
import re
import signal
import socket
import struct
import threading
import time
import tracemalloc
import webbrowser
from contextlib import contextmanager
from pathlib import Path

import pytest

from tracestream.cli import view as cli_view
from tracestream.cli.view import view_trace
from tracestream.commands.view import DEFAULT_UI_URL
from tracestream.commands.view import page as view_page
from tracestream.commands.view import server as view
from tracestream.commands.view.server import TraceFile, ViewServer
from tracestream.errors import TraceError
from tracestream.read.compression import ZSTD_MAGIC

MB = 1 << 20
TRACE_BYTES = b'{"traceEvents": [{"ph": "X", "name": "a&b", "ts": 1, "dur": 2}]}\n'


@pytest.fixture
def trace(tmp_path) -> Path:
    path = tmp_path / "trace.json"
    path.write_bytes(TRACE_BYTES)
    return path


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """One server for the many small request-shape cases, to keep the suite quick."""
    path = tmp_path_factory.mktemp("shared") / "trace.json"
    path.write_bytes(TRACE_BYTES)
    with serving(path) as server:
        yield server


@contextmanager
def serving(trace_path, **kwargs):
    with ViewServer(trace_path, **kwargs) as server:
        server.start()
        yield server


def with_token(server: ViewServer, path: str) -> str:
    """`path` with this run's token added to its query, as the printed address has it."""
    return f"{path}{'&' if '?' in path else '?'}token={server.token}"


def get(server: ViewServer, path: str, method: str = "GET", headers=None, token: bool = True):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, with_token(server, path) if token else path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def raw_request(port: int, request: bytes) -> tuple[int, bytes]:
    """Sends bytes as they are, so no client library can tidy up the path first."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    reply = b"".join(chunks)
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(8 * MB):
            digest.update(block)
    return digest.hexdigest()


def download_sha256(server: ViewServer, path: str = "/trace") -> tuple[int, str | None, str, int]:
    """Streams a response into a hash, so the client holds one block at a time."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", with_token(server, path))
        response = conn.getresponse()
        digest, total = hashlib.sha256(), 0
        while block := response.read(MB):
            digest.update(block)
            total += len(block)
        return response.status, response.getheader("Content-Length"), digest.hexdigest(), total
    finally:
        conn.close()


def config_from_page(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="view-config">(.*?)</script>', page)
    return json.loads(match.group(1))


# --- '/' and '/trace' -------------------------------------------------------------------


def test_page_carries_the_handshake_and_a_strict_policy(trace):
    with serving(trace) as server:
        status, headers, body = get(server, "/")
    page = body.decode("utf-8")
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert int(headers["Content-Length"]) == len(body)
    for piece in ('postMessage("PING", uiOrigin)', 'event.data !== "PONG"',
                  "event.origin !== uiOrigin", "fetch(cfg.traceUrl",
                  "perfetto: {buffer, title: cfg.title, fileName: cfg.fileName}",
                  "Trace sent \\u2014 check the timeline"):
        assert piece in page
    assert config_from_page(page) == {
        "uiUrl": "https://ui.perfetto.dev", "title": "trace.json", "fileName": "trace.json",
        "traceUrl": f"/trace?token={server.token}"}
    csp = headers["Content-Security-Policy"]
    assert "frame-src https://ui.perfetto.dev;" in csp
    assert "script-src 'nonce-" in csp and "unsafe-inline" not in csp
    assert "Cross-Origin-Opener-Policy" not in headers  # Perfetto: it breaks the handshake


def test_trace_is_served_byte_for_byte_with_its_length(trace):
    with serving(trace) as server:
        status, length, digest, total = download_sha256(server)
        head_status, head_headers, head_body = get(server, "/trace", method="HEAD")
    assert status == 200
    assert digest == hashlib.sha256(TRACE_BYTES).hexdigest()
    assert int(length) == total == len(TRACE_BYTES)
    assert (head_status, head_body) == (200, b"")
    assert int(head_headers["Content-Length"]) == len(TRACE_BYTES)
    assert head_headers["Content-Type"] == "application/octet-stream"
    assert head_headers["X-Content-Type-Options"] == "nosniff"


def test_query_string_on_the_two_real_paths_is_ignored(trace):
    with serving(trace) as server:
        assert get(server, "/?reload=1")[0] == 200
        assert get(server, "/trace?x=1")[2] == TRACE_BYTES


def test_gzip_trace_is_sent_compressed_because_perfetto_unpacks_it(tmp_path):
    path = tmp_path / "trace.json.gz"
    path.write_bytes(gzip.compress(TRACE_BYTES * 1000))
    with serving(path) as server:
        status, length, digest, _ = download_sha256(server)
        page = get(server, "/")[2].decode()
    assert status == 200
    assert digest == sha256_file(path)  # the .gz bytes themselves
    assert int(length) == path.stat().st_size
    assert config_from_page(page)["fileName"] == "trace.json.gz"


def test_zstd_trace_is_decompressed_on_the_fly_and_sent_gzip_encoded(tmp_path):
    """The browser undoes `Content-Encoding: gzip`, so the UI gets the exact text, and the
    wire (an ssh tunnel, say) carries a fraction of it."""
    zstandard = pytest.importorskip("zstandard")
    raw = TRACE_BYTES * 50_000
    path = tmp_path / "trace.json.zst"
    compressor = zstandard.ZstdCompressor()
    path.write_bytes(compressor.compress(raw[: len(raw) // 3]) + compressor.compress(
        raw[len(raw) // 3 :]))  # two frames
    with serving(path) as server:
        status, headers, body = get(server, "/trace")
        config = config_from_page(get(server, "/")[2].decode())
    assert status == 200
    assert "Content-Length" not in headers  # unknown in advance: chunked, or ends with the close
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body) == raw
    assert len(body) < len(raw) / 5
    assert config["title"] == "trace.json.zst"
    assert config["fileName"] == "trace.json"


def test_zstd_is_recognised_by_content_not_name(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    path = tmp_path / "trace.bin"
    path.write_bytes(zstandard.ZstdCompressor().compress(TRACE_BYTES))
    assert view.describe_trace(path).zstd
    (tmp_path / "fake.zst").write_bytes(TRACE_BYTES)
    assert not view.describe_trace(tmp_path / "fake.zst").zstd


def make_big_trace(path: Path, size: int) -> None:
    """A sparse file with a few distinct 8 MiB blocks: big on paper, quick to write."""
    pattern = hashlib.sha256(b"seed").digest() * (8 * MB // 32)
    with path.open("wb") as fh:
        for i, offset in enumerate((0, size // 3, size // 2, size - 8 * MB)):
            fh.seek(offset)
            fh.write(bytes([i]) + pattern[1:])
        fh.truncate(size)


def test_200_mb_trace_streams_in_bounded_memory(tmp_path):
    size = 200 * MB
    path = tmp_path / "big.json"
    make_big_trace(path, size)
    expected = sha256_file(path)

    with serving(path) as server:
        tracemalloc.start()
        try:
            started = time.perf_counter()
            status, length, digest, total = download_sha256(server)
            seconds = time.perf_counter() - started
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()

    print(f"200 MB served in {seconds:.2f} s; traced peak {peak / MB:.1f} MiB "
          "(server thread and client together)")
    assert status == 200
    assert (digest, total, int(length)) == (expected, size, size)
    assert peak < 20 * MB, f"serving 200 MB peaked at {peak / MB:.1f} MiB"


def test_copy_blocks_stops_at_the_length_already_announced():
    import io

    sink = io.BytesIO()
    assert view.copy_blocks(io.BytesIO(b"x" * 10), sink, limit=4, block_size=3) == 4
    assert sink.getvalue() == b"xxxx"


# --- nothing else is served ---------------------------------------------------------------

NOT_SERVED = [
    "/..", "/../", "/../../etc/passwd", "/%2e%2e/", "/%2E%2E/%2E%2E/etc/passwd", "/.%2e/",
    "/trace/x", "/trace/", "//trace", "/./trace", "/trace/..", "/%74race", "/trace%00",
    "/index.html", "/favicon.ico", "/nope?x=1", "/..?x=1", "/trace.json", "*",
    "http://127.0.0.1/", "/%20", "/%2Ftrace",
]


@pytest.mark.parametrize("target", NOT_SERVED)
def test_everything_else_is_404(shared_server, target):
    status, body = raw_request(shared_server.port, f"GET {target} HTTP/1.0\r\n\r\n".encode())
    assert status == 404, target
    assert TRACE_BYTES not in body


def test_the_trace_file_name_and_folder_are_not_paths(trace):
    with serving(trace) as server:
        for target in (f"/{trace.name}", f"{trace.parent}/", str(trace), "/tmp/"):
            assert raw_request(server.port, f"GET {target} HTTP/1.0\r\n\r\n".encode())[0] == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE"])
def test_only_get_and_head_exist(shared_server, method):
    status, _ = raw_request(shared_server.port, f"{method} /trace HTTP/1.0\r\n\r\n".encode())
    assert status == 501


@pytest.mark.parametrize("host, allowed", [
    ("127.0.0.1:8000", True), ("localhost:8000", True), ("LOCALHOST", True),
    ("[::1]:8000", True), ("127.0.0.1", True),
    ("attacker.example:8000", False), ("attacker.example", False), ("192.0.2.7:80", False),
    ("localhost.attacker.example", False), ("", False),
])
def test_foreign_host_header_is_refused_against_dns_rebinding(shared_server, host, allowed):
    assert view_page.is_loopback_host(host) is allowed
    target = with_token(shared_server, "/trace")
    request = f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    assert raw_request(shared_server.port, request)[0] == (200 if allowed else 403)


# --- loopback only -------------------------------------------------------------------------


def non_loopback_ipv4_addresses() -> list[str]:
    """This machine's interface addresses other than 127.x (Linux SIOCGIFADDR)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), 0x8915,
                                     struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address on this interface
            address = socket.inet_ntoa(packed[20:24])
            if not address.startswith("127."):
                found.append(address)
    return found


def test_binds_loopback_only(trace):
    addresses = non_loopback_ipv4_addresses()
    with serving(trace) as server:
        assert server._httpd.server_address[0] == "127.0.0.1"
        assert server.url == f"http://127.0.0.1:{server.port}/?token={server.token}"
        assert get(server, "/")[0] == 200
        for address in addresses:
            with pytest.raises(OSError):
                socket.create_connection((address, server.port), timeout=2).close()
    if not addresses:
        pytest.skip("no non-loopback interface here to try the port from")


def test_port_zero_picks_a_free_port_and_a_taken_port_is_a_trace_error(trace):
    with ViewServer(trace) as first:
        assert first.port > 0
        with pytest.raises(TraceError, match=f"cannot listen on 127.0.0.1:{first.port}"):
            ViewServer(trace, port=first.port)


# --- escaping -------------------------------------------------------------------------------

HOSTILE_TITLE = """</script><script>alert(1)</script>"'&amp;<!--.json"""


def test_hostile_name_is_escaped_in_html_and_in_the_script_block():
    hostile = TraceFile(path=Path("x"), title=HOSTILE_TITLE, file_name=HOSTILE_TITLE, zstd=False)
    page = view_page.render_page(hostile, "https://ui.perfetto.dev", nonce="n0nce", token="t0ken")
    template_scripts = view_page.render_page(
        TraceFile(Path("x"), "plain", "plain", False), "https://ui.perfetto.dev", "n0nce",
        "t0ken")

    # Nothing from the name can open or close an element or a comment.
    assert page.count("</script>") == template_scripts.count("</script>")
    assert page.count("<script") == template_scripts.count("<script")
    assert "<!--" not in page and "alert(1)</" not in page
    # HTML context: entity-escaped, and it reads back as the exact name.
    title_text = re.search(r"<title>(.*?) - tracestream view</title>", page).group(1)
    assert html.unescape(title_text) == HOSTILE_TITLE
    name_text = re.search(r'<span id="trace-name">(.*?)</span>', page).group(1)
    assert html.unescape(name_text) == HOSTILE_TITLE
    assert not re.search(r"[<>\"']", name_text)
    # Script context: no '<', '>' or '&' at all, and JSON gives back the exact name.
    block = re.search(r'id="view-config">(.*?)</script>', page).group(1)
    assert not re.search(r"[<>&]", block)
    assert json.loads(block)["title"] == json.loads(block)["fileName"] == HOSTILE_TITLE


def test_real_file_with_markup_and_quotes_in_its_name_is_escaped(tmp_path):
    name = """<script>alert("1")</script>'&<!--.json""".replace("/", "")  # no '/' in names
    path = tmp_path / name
    path.write_bytes(TRACE_BYTES)
    with serving(path) as server:
        page = get(server, "/")[2].decode()
    assert "<script>alert" not in page and "<!--" not in page
    assert config_from_page(page)["title"] == name


def test_json_for_script_escapes_separators_and_non_ascii():
    text = view_page.json_for_script({"t": "a\u2028b\u2029c<é>&"})
    assert text == '{"t": "a\\u2028b\\u2029c\\u003c\\u00e9\\u003e\\u0026"}'
    assert json.loads(text) == {"t": "a\u2028b\u2029c<é>&"}


def test_name_that_is_not_utf8_still_renders(tmp_path):
    path = tmp_path / os.fsdecode(b"bad-\xff.json")
    path.write_bytes(TRACE_BYTES)
    with serving(path) as server:
        status, _, body = get(server, "/")
    assert status == 200
    assert config_from_page(body.decode())["title"] == "bad-\ufffd.json"


# --- refusals -------------------------------------------------------------------------------


def test_missing_trace_is_one_clear_trace_error(tmp_path):
    with pytest.raises(TraceError, match="trace not found: .*nope.json"):
        ViewServer(tmp_path / "nope.json")


def test_folder_and_empty_file_are_refused(tmp_path):
    with pytest.raises(TraceError, match="not a regular file"):
        ViewServer(tmp_path)
    (tmp_path / "empty.json").write_bytes(b"")
    with pytest.raises(TraceError, match="trace is empty"):
        ViewServer(tmp_path / "empty.json")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read a file whatever its mode")
def test_unreadable_trace_is_a_trace_error(trace):
    trace.chmod(0)
    try:
        with pytest.raises(TraceError, match="cannot read trace"):
            ViewServer(trace)
    finally:
        trace.chmod(0o644)


@pytest.mark.parametrize("ui_url", [
    "file:///tmp/ui.html", "javascript:alert(1)", "ftp://ui.perfetto.dev", "https://",
    "ui.perfetto.dev", "https://evil;script-src *", "http://host:99999/", "https://a b/",
    "data:text/html,<script>alert(1)</script>",
])
def test_ui_url_must_be_http_or_https(trace, ui_url):
    with pytest.raises(TraceError, match="--ui-url"):
        ViewServer(trace, ui_url=ui_url)


@pytest.mark.parametrize("ui_url, origin", [
    ("https://ui.perfetto.dev", "https://ui.perfetto.dev"),
    ("https://ui.perfetto.dev/#!/viewer", "https://ui.perfetto.dev"),
    ("HTTPS://UI.Perfetto.dev:443/v1/", "https://ui.perfetto.dev"),
    ("http://127.0.0.1:10000/", "http://127.0.0.1:10000"),
    ("http://[::1]:8080", "http://[::1]:8080"),
])
def test_ui_origin_is_what_postmessage_targets(ui_url, origin):
    assert view_page.ui_origin(ui_url) == origin


# --- lifecycle and view_trace ---------------------------------------------------------------


def test_shutdown_frees_the_port_and_is_idempotent(trace):
    server = ViewServer(trace)
    server.start()
    assert get(server, "/")[0] == 200
    server.shutdown()
    server.shutdown()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    ViewServer(trace).shutdown()  # never started: must not hang


def test_serve_forever_returns_when_shut_down_from_another_thread(trace):
    server = ViewServer(trace)
    threading.Timer(0.3, server.shutdown).start()
    started = time.monotonic()
    server.serve_forever()
    assert time.monotonic() - started < 5


def test_view_trace_prints_address_and_tunnel_then_returns_on_ctrl_c(trace, monkeypatch):
    lines: list[str] = []
    fetched: list[int] = []
    opened: list[str] = []
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.setattr(webbrowser, "open", lambda url, new=0: opened.append(url) or True)

    def user_then_ctrl_c():
        try:
            deadline = time.monotonic() + 10
            while not lines and time.monotonic() < deadline:
                time.sleep(0.05)
            port = int(re.search(r"127\.0\.0\.1:(\d+)/", lines[0]).group(1))
            token = re.search(r"token=([\w-]+)", lines[0]).group(1)
            fetched.append(raw_request(port, f"GET /?token={token} HTTP/1.0\r\n\r\n".encode())[0])
        finally:
            _thread.interrupt_main()  # always, so a failure here cannot hang the test

    # a shell's background job starts with SIGINT ignored, and interrupt_main() then does
    # nothing: the test gets Python's own Ctrl-C handler, as an interactive run has
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        helper = threading.Thread(target=user_then_ctrl_c)
        helper.start()
        # returns normally: Ctrl-C is the way to stop
        view_trace(trace, port=0, ui_url=DEFAULT_UI_URL, open_browser=True, echo=lines.append)
        helper.join()
    finally:
        signal.signal(signal.SIGINT, previous)

    port = int(re.search(r"127\.0\.0\.1:(\d+)/", lines[0]).group(1))
    token = re.search(r"token=([\w-]+)", lines[0]).group(1)
    assert len(token) >= 32  # 24 random bytes
    assert fetched == [200]
    assert opened == [f"http://127.0.0.1:{port}/?token={token}"]
    assert str(trace) in lines[0]
    assert any(f"ssh -L {port}:127.0.0.1:{port} host" in line for line in lines)
    assert any("Nothing is uploaded" in line for line in lines)
    assert lines[-1] == "Stopped."


def test_view_trace_without_browser_never_opens_one(trace, monkeypatch):
    monkeypatch.setattr(webbrowser, "open", lambda *a, **k: pytest.fail("opened"))
    monkeypatch.setattr(ViewServer, "serve_forever", lambda self: None)
    lines: list[str] = []
    view_trace(trace, port=0, ui_url=DEFAULT_UI_URL, open_browser=False,
               echo=lines.append)
    assert not any("No desktop browser" in line for line in lines)


def test_no_display_means_no_console_browser_takeover(trace, monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(cli_view.sys, "platform", "linux")
    monkeypatch.setattr(webbrowser, "open", lambda *a, **k: pytest.fail("opened"))
    monkeypatch.setattr(ViewServer, "serve_forever", lambda self: None)
    lines: list[str] = []
    view_trace(trace, port=0, ui_url=DEFAULT_UI_URL, open_browser=True, echo=lines.append)
    assert any("No desktop browser found here" in line for line in lines)


def test_has_desktop():
    assert cli_view.has_desktop({}, "darwin")
    assert cli_view.has_desktop({"DISPLAY": ":0"}, "linux")
    assert cli_view.has_desktop({"WAYLAND_DISPLAY": "wayland-0"}, "linux")
    assert not cli_view.has_desktop({"SSH_CONNECTION": "x"}, "linux")


# --- shared machines: a per-run token, header timeouts, broken zstd ------------------------


@pytest.mark.parametrize("path", ["/", "/trace", "/?reload=1", "/trace?x=1"])
@pytest.mark.parametrize("token", [None, "", "wrong", "token"])
def test_page_and_trace_need_this_runs_token(shared_server, path, token):
    """Another user of the machine can reach 127.0.0.1 too: without the printed token the
    trace is not theirs to download."""
    if token == "token":
        token = shared_server.token[:-1]  # all but one character right
    target = path if token is None else f"{path}{'&' if '?' in path else '?'}token={token}"
    status, body = raw_request(shared_server.port, f"GET {target} HTTP/1.0\r\n\r\n".encode())
    assert status == 403
    assert TRACE_BYTES not in body
    assert shared_server.token.encode() not in body
    assert get(shared_server, path)[0] == 200


def test_each_run_has_its_own_token(trace):
    with serving(trace) as first, serving(trace) as second:
        assert first.token != second.token
        assert get(first, "/", token=False)[0] == 403
        status, _, body = get(second, f"/trace?token={first.token}", token=False)
    assert (status, TRACE_BYTES in body) == (403, False)


def test_a_client_that_never_finishes_its_headers_is_dropped(trace, monkeypatch):
    monkeypatch.setattr(view, "HEADER_TIMEOUT", 0.5)
    with serving(trace) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and nothing more
            started = time.monotonic()
            assert sock.recv(65536) == b""  # closed by the server, not by our timeout
            assert time.monotonic() - started < 5
        assert get(server, "/")[0] == 200  # others are still served


@pytest.fixture
def reported(monkeypatch):
    """The lines the server reports for the terminal."""
    lines: list[str] = []
    monkeypatch.setattr(view, "_report", lines.append)
    return lines


def test_a_file_that_is_not_zstd_after_its_magic_is_a_502_with_the_reason(tmp_path, reported,
                                                                       capfd):
    path = tmp_path / "broken.json.zst"
    path.write_bytes(ZSTD_MAGIC + b"\xff" * 64)
    with serving(path) as server:
        status, headers, body = get(server, "/trace")
    assert status == 502
    assert b"broken.json.zst: corrupt zstd data near compressed byte 0" in body
    assert len(reported) == 1
    assert "broken.json.zst: corrupt zstd data near compressed byte 0" in reported[0]
    assert "Traceback" not in capfd.readouterr().err


def test_a_truncated_zstd_file_breaks_the_transfer_instead_of_a_short_200(tmp_path, reported,
                                                                          capfd):
    zstandard = pytest.importorskip("zstandard")
    raw = os.urandom(3 * MB).hex().encode()  # 6 MB that compress only 2:1
    whole = zstandard.ZstdCompressor().compress(raw)
    path = tmp_path / "cut.json.zst"
    path.write_bytes(whole[: len(whole) // 2])
    with serving(path) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            conn.request("GET", with_token(server, "/trace"))
            response = conn.getresponse()
            assert response.getheader("Transfer-Encoding") == "chunked"
            with pytest.raises(http.client.IncompleteRead):
                response.read()
        finally:
            conn.close()
        deadline = time.monotonic() + 5
        while not reported and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(reported) == 1
    assert "cut.json.zst: zstd data is truncated (ends at byte" in reported[0]
    assert "\n" not in reported[0]
    assert "Traceback" not in capfd.readouterr().err


def test_a_pzstd_file_is_zstd(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    path = tmp_path / "trace.json.zst"
    skippable = b"\x50\x2a\x4d\x18" + struct.pack("<I", 4) + b"pzst"
    path.write_bytes(skippable + zstandard.ZstdCompressor().compress(TRACE_BYTES))
    assert view.describe_trace(path).zstd
    with serving(path) as server:
        assert gzip.decompress(get(server, "/trace")[2]) == TRACE_BYTES


def test_a_broken_zstd_file_with_a_non_ascii_name_is_still_one_line(tmp_path, reported):
    path = tmp_path / "层 — trace.json.zst"
    path.write_bytes(ZSTD_MAGIC + b"\xff" * 64)
    with serving(path) as server:
        status, headers, body = get(server, "/trace")
    assert status == 502
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert body.decode().startswith("层 — trace.json.zst: corrupt zstd data near compressed byte")
    assert len(reported) == 1 and "\n" not in reported[0]


def test_a_client_trickling_its_headers_is_dropped_on_time(trace, monkeypatch):
    """The header timeout holds for the whole request: a byte every 0.2 s, each read well
    inside the limit, still ends at the limit."""
    monkeypatch.setattr(view, "HEADER_TIMEOUT", 1.0)
    with serving(trace) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            started = time.monotonic()
            closed = False
            for byte in b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100:
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    closed = True
                    break
                time.sleep(0.2)
                if time.monotonic() - started > 3:
                    break
            if not closed:
                sock.settimeout(5)
                try:
                    closed = sock.recv(65536) == b""
                except ConnectionResetError:
                    closed = True
            assert closed
            assert time.monotonic() - started < 3
        assert get(server, "/")[0] == 200


def test_connections_beyond_the_limit_are_closed(trace, monkeypatch):
    monkeypatch.setattr(view, "MAX_CONNECTIONS", 2)
    with serving(trace) as server:
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10)
                for _ in range(2)]
        try:
            assert _wait_until(lambda: server._httpd._slots._value == 0)  # both are served
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as extra:
                extra.sendall(b"GET / HTTP/1.0\r\n\r\n")
                try:
                    assert extra.recv(65536) == b""
                except ConnectionResetError:
                    pass
        finally:
            for sock in idle:
                sock.close()
        # Their threads end and free the slots. A thread lets its slot go only after its
        # client has read the reply, so the answer is awaited, not taken from one request.
        assert _wait_until(lambda: _status_or_none(server) == 200)


def _wait_until(condition, seconds: float = 10.0) -> bool:
    """Whether `condition()` held within `seconds`: a loaded machine schedules the server's
    threads late, and a fixed sleep would make the test depend on that."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _status_or_none(server):
    try:
        return get(server, "/")[0]
    except OSError:
        return None


def test_other_commands_do_not_import_the_view_server():
    """Registering `view` on the CLI costs no HTTP server imports: every command would pay
    them at start-up (~20 ms). Its default UI address is still shown."""
    import subprocess
    import sys

    probe = ("import sys, tracestream.cli, tracestream.commands.evidence; "
             "print(sorted(m for m in ('tracestream.commands.view.server', 'http.server') "
             "if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"
    from click.testing import CliRunner

    from tracestream.cli import main
    assert view.DEFAULT_UI_URL in CliRunner().invoke(main, ["view", "--help"]).output
