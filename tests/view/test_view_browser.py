"""End to end in headless Chromium: the handshake page really delivers the trace bytes.

A stub "Perfetto UI" on a second loopback port (so a second origin) answers PING with
PONG, as post_message_handler.ts does, and POSTs the ArrayBuffer it receives back to its
own server. Chromium is driven over --remote-debugging-pipe: the DevTools protocol as
NUL-separated JSON on fds 3 and 4. So there is no websocket client, no npm and no
network beyond loopback.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import select
import shutil
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tracestream.commands.view.server import ViewServer

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed (Debian package `chromium`); run scripts/ensure-chromium",
)

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
DELIVERY_TIMEOUT = 60.0
SHOWN_NAME_JS = "document.getElementById('trace-name').textContent"

STUB_PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>stub Perfetto UI</title></head>
<body style="font: 20px sans-serif; padding: 1em">
<p id="state">stub Perfetto UI: waiting for PING</p>
<script>
let pings = 0;
window.addEventListener("message", async (event) => {
  // Like Perfetto: only the embedding page counts, and only once the page is complete.
  if (event.source !== window.parent || document.readyState !== "complete") return;
  if (event.data === "PING") {
    pings += 1;
    event.source.postMessage("PONG", event.origin);
    return;
  }
  const posted = event.data && event.data.perfetto;
  if (!posted || !(posted.buffer instanceof ArrayBuffer)) return;
  const meta = {title: posted.title, fileName: posted.fileName, origin: event.origin, pings};
  // Text first: once /meta arrives the screenshot may be taken.
  document.getElementById("state").textContent =
    "stub Perfetto UI: received " + posted.buffer.byteLength + " bytes of " + posted.title;
  await fetch("/received", {method: "POST", body: posted.buffer});
  await fetch("/meta", {method: "POST", body: JSON.stringify(meta)});
});
</script>
</body></html>
"""


class StubPerfetto(ThreadingHTTPServer):
    """Serves the stub UI and keeps what the page posts back to it."""

    daemon_threads = True

    def __init__(self):
        self.received: bytes | None = None
        self.meta: dict | None = None
        self.done = threading.Event()
        super().__init__(("127.0.0.1", 0), _StubHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


class _StubHandler(BaseHTTPRequestHandler):
    server: StubPerfetto

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        if self.path != "/":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(STUB_PAGE)))
        self.end_headers()
        self.wfile.write(STUB_PAGE)

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/received":
            self.server.received = body
        elif self.path == "/meta":
            self.server.meta = json.loads(body)
            self.server.done.set()
        self.send_response(204)
        self.end_headers()


def _high_fd(fd: int) -> int:
    """Moves fd to 10 or above, so dup2 onto 3 and 4 in the child cannot clobber it."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Chromium:
    """Headless Chromium in its own process group, spoken to over --remote-debugging-pipe."""

    FLAGS = [
        "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-quic", "--disable-dev-shm-usage", "--hide-scrollbars",
        "--window-size=1280,720", "--remote-debugging-pipe",
        # Belt and braces for "loopback only": no host name resolves at all.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    ]

    def __init__(self, url: str, workdir: Path):
        to_chrome_r, self._to_chrome = map(_high_fd, os.pipe())
        self._from_chrome, from_chrome_w = map(_high_fd, os.pipe())
        (workdir / "home").mkdir(parents=True, exist_ok=True)
        argv = [CHROMIUM, *self.FLAGS, f"--user-data-dir={workdir / 'profile'}", url]
        env = {**os.environ, "HOME": str(workdir / "home")}
        self.log_path = workdir / "chromium.log"
        self.pid = os.posix_spawn(
            CHROMIUM, argv, env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, str(self.log_path), os.O_WRONLY | os.O_CREAT, 0o644),
                (os.POSIX_SPAWN_DUP2, 1, 2),
                (os.POSIX_SPAWN_DUP2, to_chrome_r, 3),
                (os.POSIX_SPAWN_DUP2, from_chrome_w, 4),
            ],
            setsid=True,  # its own process group, so close() can kill every helper process
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:
        """Sends one DevTools command and returns its result, skipping events meanwhile."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method} failed: {reply['error']}")
                return reply["result"]

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._from_chrome], [], [], remaining)[0]:
                raise TimeoutError(f"Chromium did not answer; log: {self.log_path}")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed the pipe; log: {self.log_path}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def page_session(self) -> str:
        """Attaches to the tab that Chromium opened with our URL."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            targets = self.call("Target.getTargets")["targetInfos"]
            pages = [t for t in targets if t["type"] == "page"]
            if pages:
                attached = self.call("Target.attachToTarget",
                                     {"targetId": pages[0]["targetId"], "flatten": True})
                return attached["sessionId"]
            time.sleep(0.1)
        raise TimeoutError("Chromium opened no page")

    def evaluate(self, session: str, expression: str):
        result = self.call("Runtime.evaluate",
                           {"expression": expression, "returnByValue": True}, session)
        return result["result"].get("value")

    def screenshot(self, session: str, path: Path) -> None:
        data = self.call("Page.captureScreenshot", {"format": "png"}, session)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        """Asks Chromium to quit, then kills what is left of its group, and waits until none
        of it exists (helpers that were reparented are reaped by init shortly after)."""
        try:
            self.call("Browser.close", timeout=5)
        except (OSError, RuntimeError, TimeoutError):
            pass
        _wait_for_exit(self.pid, timeout=10)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _wait_for_exit(self.pid, timeout=5)
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        deadline = time.monotonic() + 10
        while group_alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)


def _wait_for_exit(pid: int, timeout: float) -> None:
    """Reaps pid if it exits within timeout; returns either way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            return  # already reaped
        time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """Whether any process (zombies included) is still in the process group."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _wait_for_status(browser: Chromium, session: str, wanted: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        status = browser.evaluate(session, "document.getElementById('status').textContent") or ""
        if wanted in status:
            return status
        time.sleep(0.1)
    raise AssertionError(f"status line never said {wanted!r}; last: {status!r}")


@pytest.fixture
def stub_ui():
    stub = StubPerfetto()
    thread = threading.Thread(target=stub.serve_forever, daemon=True)
    thread.start()
    yield stub
    stub.shutdown()
    stub.server_close()


def _chrome_trace_bytes() -> bytes:
    events = b'{"ph": "X", "name": "step", "ts": 1, "dur": 2},' * 50_000
    return b'{"traceEvents": [' + events + b"{}]}\n" + bytes(range(256))


def _deliver(tmp_path: Path, stub_ui: StubPerfetto, trace: Path, screenshot: str) -> dict:
    """Opens view's page for `trace` in Chromium; returns what the page showed and did."""
    with ViewServer(trace, ui_url=stub_ui.url) as server:
        server.start()
        browser = Chromium(server.url, tmp_path / "chromium")
        try:
            session = browser.page_session()
            assert stub_ui.done.wait(DELIVERY_TIMEOUT), (
                f"the stub UI received nothing within {DELIVERY_TIMEOUT:.0f} s; "
                f"page says: {browser.evaluate(session, 'document.body.innerText')!r}"
            )
            status = _wait_for_status(browser, session, "Trace sent", timeout=10)
            shown_name = browser.evaluate(session, SHOWN_NAME_JS)
            injected = browser.evaluate(session, "window.pwned === undefined ? null : 'yes'")
            ARTIFACTS.mkdir(exist_ok=True)
            browser.screenshot(session, ARTIFACTS / screenshot)
        finally:
            browser.close()
    assert not group_alive(browser.pid), "a Chromium process outlived the test"
    return {"status": status, "shown_name": shown_name, "injected": injected,
            "origin": f"http://127.0.0.1:{server.port}"}


def test_chromium_delivers_exact_trace_bytes_to_the_ui(tmp_path, stub_ui):
    # Quotes, ampersand and markup in the name: it must arrive as text, never as code.
    trace = tmp_path / """step '7' & "<img src=x onerror=window.pwned=1>".json"""
    trace.write_bytes(_chrome_trace_bytes())

    seen = _deliver(tmp_path, stub_ui, trace, "view_handshake.png")

    assert hashlib.sha256(stub_ui.received).hexdigest() == hashlib.sha256(
        trace.read_bytes()).hexdigest()
    assert seen["status"] == "Trace sent \u2014 check the timeline"
    assert stub_ui.meta == {"title": trace.name, "fileName": trace.name,
                            "origin": seen["origin"], "pings": stub_ui.meta["pings"]}
    assert stub_ui.meta["pings"] >= 1
    assert seen["shown_name"] == trace.name
    assert seen["injected"] is None
    assert (ARTIFACTS / "view_handshake.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_chromium_receives_zstd_trace_decompressed(tmp_path, stub_ui):
    zstandard = pytest.importorskip("zstandard")
    raw = _chrome_trace_bytes()
    trace = tmp_path / "run.json.zst"
    # Two frames, as `zstd` writes for concatenated or appended output.
    compressor = zstandard.ZstdCompressor()
    trace.write_bytes(compressor.compress(raw[:400_000]) + compressor.compress(raw[400_000:]))

    seen = _deliver(tmp_path, stub_ui, trace, "view_handshake_zstd.png")

    assert hashlib.sha256(stub_ui.received).hexdigest() == hashlib.sha256(raw).hexdigest()
    assert stub_ui.meta["title"] == "run.json.zst"
    assert stub_ui.meta["fileName"] == "run.json"
    assert seen["status"] == "Trace sent \u2014 check the timeline"


@pytest.mark.parametrize("damage, wanted", [
    ("truncated", "the trace broke off while it was read"),
    ("corrupt", "the server answered 502: run.json.zst: corrupt zstd data near compressed byte"),
])
def test_chromium_page_shows_a_broken_zstd_trace_as_an_error(tmp_path, stub_ui, damage, wanted):
    """A zstd file that is cut short or corrupt never reaches the UI as a short trace: the
    page says what went wrong and the terminal gets one line."""
    zstandard = pytest.importorskip("zstandard")
    whole = zstandard.ZstdCompressor().compress(os.urandom(3 << 20).hex().encode())
    trace = tmp_path / "run.json.zst"
    trace.write_bytes(whole[: len(whole) // 2] if damage == "truncated"
                      else whole[:4] + b"\xff" * 64)
    lines: list[str] = []
    with ViewServer(trace, ui_url=stub_ui.url, report=lines.append) as server:
        server.start()
        browser = Chromium(server.url, tmp_path / "chromium")
        try:
            session = browser.page_session()
            status = _wait_for_status(browser, session, "Could not send the trace",
                                      timeout=DELIVERY_TIMEOUT)
        finally:
            browser.close()
    assert wanted in status
    assert stub_ui.received is None
    assert len(lines) == 1 and "run.json.zst" in lines[0]
