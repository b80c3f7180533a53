"""`view` on a pieces manifest (`--split-mb`): reading and checking the manifest, the listing
page as a pure function, and the server's '/', '/piece/N' and '/trace/N'."""

from __future__ import annotations

import gzip
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.view.test_view_server import (
    TRACE_BYTES,
    config_from_page,
    get,
    raw_request,
    serving,
    with_token,
)
from tracestream.commands.view import page as view_page
from tracestream.commands.view.pieces import (
    Piece,
    PiecesManifest,
    listing_security_policy,
    read_manifest,
    render_listing,
)
from tracestream.commands.view.server import ViewServer, address_lines
from tracestream.errors import TraceError

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "decode_8layers.trace.json.gz"


def piece_row(number: int, file: str, **extra) -> dict:
    """A manifest row as `--split-mb` writes it (engine.pieces_manifest)."""
    row = {"piece": number, "file": file, "report": f"{file}.layers.json",
           "start_us": None if number == 1 else f"17644000000{number:05d}.5",
           "end_us": f"17644000000{number + 1:05d}.5",
           "start_ms": "0" if number == 1 else f"{number}.5", "end_ms": f"{number + 1}.5",
           "passes": [3 * (number - 1), 3 * number], "guides": 24,
           "first_guide": f"pass {3 * (number - 1)} L0", "last_guide": f"pass {3 * number - 1} L7",
           "source_events": 330, "output_events": 1369, "json_bytes": 182538,
           "flows_dropped": 2}
    row.update(extra)
    return row


def write_manifest(folder: Path, rows: list[dict], name: str = "o.json.pieces.json",
                   **top) -> Path:
    data = {"tool": "tracestream", "tool_version": "0.1.0", "kind": "pieces",
            "command": "layers", "split_mb": "0.3", "source_file": "decode.trace.json.gz",
            "pieces": rows, "flows_dropped": 8, **top}
    path = folder / name
    path.write_text(json.dumps(data, indent=2))
    return path


@pytest.fixture
def split(tmp_path) -> Path:
    """Three pieces: plain JSON, gzip (the shipped sample) and zstd when it is installed."""
    (tmp_path / "o.part-0001.json").write_bytes(TRACE_BYTES)
    shutil.copyfile(SAMPLE, tmp_path / "o.part-0002.json.gz")
    rows = [piece_row(1, "o.part-0001.json"), piece_row(2, "o.part-0002.json.gz")]
    try:
        import zstandard
    except ImportError:
        pass
    else:
        (tmp_path / "o.part-0003.json.zst").write_bytes(
            zstandard.ZstdCompressor().compress(TRACE_BYTES * 100))
        rows.append(piece_row(3, "o.part-0003.json.zst", end_us=None))
    return write_manifest(tmp_path, rows)


# --- reading the manifest -------------------------------------------------------------------


def test_a_manifest_is_read_with_each_piece_inside_its_folder(split):
    manifest = read_manifest(split)
    assert manifest is not None
    assert manifest.title == "o.json.pieces.json"
    assert [p.number for p in manifest.pieces][:2] == [1, 2]
    assert manifest.pieces[0].path == split.parent / "o.part-0001.json"
    assert manifest.pieces[0].file_bytes == len(TRACE_BYTES)
    assert manifest.pieces[1].file_bytes == SAMPLE.stat().st_size
    assert manifest.piece(2) is manifest.pieces[1]
    assert manifest.piece(99) is None


def test_a_manifest_is_recognised_by_content_whatever_its_name(split):
    renamed = split.with_name("listing.json")
    renamed.write_bytes(split.read_bytes())
    assert read_manifest(renamed) is not None


@pytest.mark.parametrize("content", [
    TRACE_BYTES,
    b'{"traceEvents": [], "pieces": "not a kind"}',
    b'{"kind": "trace", "pieces": []}',
    b'[{"ph": "X", "name": "pieces"}]',
    gzip.compress(b'{"kind": "pieces"}'),
    b'{"traceEvents": [{"name": "pieces"',  # a cut trace: still a trace, not a manifest
])
def test_traces_are_not_manifests(tmp_path, content):
    path = tmp_path / "t.json"
    path.write_bytes(content)
    assert read_manifest(path) is None


def test_a_file_above_the_manifest_limit_is_a_trace_unless_named_as_a_manifest(tmp_path):
    from tracestream.commands.view import pieces

    content = b'{"kind": "pieces", "pieces": [], "pad": "' + b"x" * pieces.MAX_MANIFEST_BYTES
    (tmp_path / "big.json").write_bytes(content + b'"}')
    assert read_manifest(tmp_path / "big.json") is None
    (tmp_path / "big.pieces.json").write_bytes(content + b'"}')
    with pytest.raises(TraceError, match="is too big for a manifest"):
        read_manifest(tmp_path / "big.pieces.json")


def test_the_sample_trace_is_not_a_manifest():
    assert read_manifest(SAMPLE) is None


@pytest.mark.parametrize("content, message", [
    (b"{not json", "not valid JSON"),
    (gzip.compress(b"{}"), "not a JSON object"),
    (b'{"kind": "trace"}', 'not a manifest (a JSON object with "kind": "pieces")'),
    (b'{"kind": "pieces"}', '"pieces" must be a non-empty list'),
    (b'{"kind": "pieces", "pieces": []}', '"pieces" must be a non-empty list'),
    (b'{"kind": "pieces", "pieces": [7]}', 'entry 1 of "pieces" is not an object'),
    (b'{"kind": "pieces", "pieces": [{"piece": true, "file": "a.json"}]}', "no piece number"),
    (b'{"kind": "pieces", "pieces": [{"piece": "1", "file": "a.json"}]}', "no piece number"),
    (b'{"kind": "pieces", "pieces": [{"piece": 0, "file": "a.json"}]}', "no piece number"),
    (b'{"kind": "pieces", "pieces": [{"piece": 1, "file": "a.json"}, '
     b'{"piece": 1, "file": "a.json"}]}', "piece 1 is listed twice"),
    (b'{"kind": "pieces", "pieces": [{"piece": 1}]}', "piece 1's file is not a file name"),
    (b'{"kind": "pieces", "pieces": [{"piece": 1, "file": ""}]}', "is not a file name"),
    (b'{"kind": "pieces", "pieces": [{"piece": 1, "file": ["a.json"]}]}', "is not a file name"),
    (b'{"kind": "pieces", "pieces": [{"piece": 1, "file": "a\\u0000.json"}]}',
     "is not a file name"),
])
def test_a_malformed_manifest_is_one_clear_line(tmp_path, content, message):
    (tmp_path / "a.json").write_bytes(TRACE_BYTES)
    path = tmp_path / "o.json.pieces.json"
    path.write_bytes(content)
    with pytest.raises(TraceError) as caught:
        read_manifest(path)
    assert message in str(caught.value)
    assert str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("file, message", [
    ("/etc/passwd", "is an absolute path"),
    ("../secret.json", "leaves the manifest's folder (..)"),
    ("sub/../../secret.json", "leaves the manifest's folder (..)"),
    ("sub/..", "leaves the manifest's folder (..)"),
    ("gone.json", "is missing (looked in"),
    ("sub", "is not a regular file"),
    ("out-link.json", "leads outside the manifest's folder through a symbolic link"),
    ("sub-link/secret.json", "leads outside the manifest's folder through a symbolic link"),
])
def test_a_piece_file_outside_the_folder_or_missing_is_refused(tmp_path, file, message):
    outside = tmp_path / "secret.json"
    outside.write_bytes(TRACE_BYTES)
    folder = tmp_path / "split"
    (folder / "sub").mkdir(parents=True)
    (folder / "out-link.json").symlink_to(outside)
    (folder / "sub-link").symlink_to(tmp_path)
    path = write_manifest(folder, [piece_row(1, file)])
    with pytest.raises(TraceError) as caught:
        read_manifest(path)
    assert f"pieces manifest {path}: piece 1's file {file!r} {message}" in str(caught.value)


def test_a_symlink_that_stays_inside_the_folder_is_a_piece(tmp_path):
    (tmp_path / "real.json").write_bytes(TRACE_BYTES)
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "p.json").write_bytes(TRACE_BYTES)
    manifest = read_manifest(write_manifest(
        tmp_path, [piece_row(1, "link.json"), piece_row(2, "sub/p.json"),
                   piece_row(3, "./real.json")]))
    assert [p.path.name for p in manifest.pieces] == ["link.json", "p.json", "real.json"]


def test_control_characters_in_a_refused_name_stay_escaped(tmp_path):
    path = write_manifest(tmp_path, [piece_row(1, "\x1b[31mred\n.json")])
    with pytest.raises(TraceError) as caught:
        read_manifest(path)
    assert "\x1b" not in str(caught.value) and "\n" not in str(caught.value)
    assert "'\\x1b[31mred\\n.json' is missing" in str(caught.value)


def test_an_empty_piece_is_refused_when_the_server_starts(tmp_path):
    (tmp_path / "o.part-0001.json").write_bytes(b"")
    path = write_manifest(tmp_path, [piece_row(1, "o.part-0001.json")])
    with pytest.raises(TraceError, match=r"pieces manifest .*: piece 1: trace is empty"):
        ViewServer(path)


@pytest.mark.parametrize("file, message", [
    ("../x.json", "leaves the manifest's folder (..)"),
    ("gone.json", "is missing"),
])
def test_the_cli_refuses_a_bad_manifest_with_one_line_and_exit_2(tmp_path, file, message):
    (tmp_path / "x.json").write_bytes(TRACE_BYTES)
    folder = tmp_path / "split"
    folder.mkdir()
    path = write_manifest(folder, [piece_row(1, file)])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-m", "tracestream", "view", "--trace", str(path),
                           "--no-browser"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"tracestream: error: pieces manifest {path}: piece 1's file")
    assert message in lines[0]
    assert "Traceback" not in done.stderr


# --- the listing page, without a server -----------------------------------------------------


def listing_of(rows: list[dict], **top) -> PiecesManifest:
    """A manifest as read_manifest returns it, with no files behind it."""
    data = {"kind": "pieces", "split_mb": "500", "source_file": "run.json.zst",
            "command": "layers", "flows_dropped": 8, "pieces": rows, **top}
    pieces = tuple(Piece(row["piece"], Path(f"/nowhere/{row['piece']}"),
                         row.get("json_bytes", 1_000_000), row) for row in rows)
    return PiecesManifest(path=Path("/nowhere/o.json.pieces.json"), title="o.json.pieces.json",
                          data=data, pieces=pieces)


def table_rows(page: str) -> list[list[str]]:
    body = re.search(r"<tbody>(.*?)</tbody>", page, re.S).group(1)
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", body)]


def test_listing_has_a_row_and_a_link_per_piece():
    manifest = listing_of([piece_row(1, "o.part-0001.json"),
                           piece_row(2, "o.part-0002.json", end_us=None, json_bytes=523_400_000),
                           piece_row(3, "o.part-0003.json", end_ms=None, passes=[6, 7])])
    page = render_listing(manifest, nonce="n0nce", token="t0ken")
    head = re.findall(r"<th>(.*?)</th>", page)
    assert head == ["piece", "ms from the trace origin", "passes", "guides", "events", "MB",
                    "flows left out"]
    rows = table_rows(page)
    assert len(rows) == 3
    assert rows[0][0] == ('<a href="/piece/1?token=t0ken">1</a> '
                          '<span class="dim">o.part-0001.json</span>')
    assert rows[0][1:] == ["0 &hellip; 2.5", "0 &hellip; 2",
                           '24 <span class="dim">(pass 0 L0 &hellip; pass 2 L7)</span>',
                           "1,369", "0.18", "2"]
    assert rows[1][1] == "2.5 &hellip; 3.5"
    assert rows[1][5] == "523.4"
    assert rows[2][1] == "3.5 &hellip; end"  # no end_ms: to the trace's end
    assert rows[2][2] == "6 &hellip; 6"
    summary = re.search(r'<p id="summary">(.*?)</p>', page).group(1)
    assert summary.startswith("3 pieces of at most 500 MB of JSON each from "
                              "<code>run.json.zst</code> (<code>layers</code>). 8 flows")
    assert '<style nonce="n0nce">' in page
    assert "<script" not in page  # the listing runs no script


def test_listing_without_guides_has_no_passes_or_guides_columns():
    rows = [{k: v for k, v in piece_row(n, f"p{n}.json").items()
             if k not in ("passes", "guides", "first_guide", "last_guide")} for n in (1, 2)]
    page = render_listing(listing_of(rows), "n", "t")
    head = re.findall(r"<th>(.*?)</th>", page)
    assert "passes" not in head and "guides" not in head
    assert all(len(row) == len(head) for row in table_rows(page))


def test_listing_with_only_the_required_fields_still_renders():
    page = render_listing(listing_of([{"piece": 4, "file": "x.json"}]), "n", "t")
    assert table_rows(page) == [['<a href="/piece/4?token=t">4</a> <span class="dim">x.json</span>',
                                 "start &hellip; end", "", "1.00"]]


def test_listing_shows_the_size_on_disk_of_a_compressed_piece():
    manifest = listing_of([piece_row(1, "p.json.gz", json_bytes=182_538)])
    manifest = PiecesManifest(manifest.path, manifest.title, manifest.data,
                              (Piece(1, Path("/nowhere/p.json.gz"), 20_000,
                                     manifest.pieces[0].row),))
    assert table_rows(render_listing(manifest, "n", "t"))[0][5] == (
        '0.18 <span class="dim">(0.02 on disk)</span>')


HOSTILE = """</td></tr></table><script>alert(1)</script>"'&amp;<!--@ROWS@"""


def test_every_manifest_value_is_escaped():
    hostile_values = {key: HOSTILE for key in (
        "start_ms", "end_ms", "first_guide", "last_guide", "guides", "output_events",
        "json_bytes", "flows_dropped")}
    rows = [piece_row(1, HOSTILE, **hostile_values, passes=[HOSTILE, {"<b>": HOSTILE}]),
            piece_row(2, "y", passes=HOSTILE, output_events=[HOSTILE], json_bytes={"a": HOSTILE})]
    manifest = listing_of(rows, split_mb=HOSTILE, source_file=HOSTILE, command=HOSTILE,
                          flows_dropped=HOSTILE)
    manifest = PiecesManifest(manifest.path, HOSTILE, manifest.data, manifest.pieces)
    page = render_listing(manifest, nonce="n0nce", token="t0ken")
    clean = render_listing(listing_of([piece_row(1, "x"), piece_row(2, "y")]), "n0nce", "t0ken")

    for markup in ("<script", "</script>", "<!--", "<table", "</table>", "<tr>", "</tr>",
                   "<td", "</td>", "<b>"):
        assert page.count(markup) == clean.count(markup), markup
    assert "alert(1)</" not in page
    assert len(table_rows(page)) == 2  # "@ROWS@" in a value is text, not a placeholder
    title = re.search(r"<title>(.*?) - tracestream view</title>", page).group(1)
    assert html.unescape(title) == HOSTILE
    assert html.unescape(re.search(r'class="dim">(.*?)</span>', page).group(1)) == HOSTILE


def test_the_token_in_the_links_is_escaped():
    page = render_listing(listing_of([piece_row(1, "x")]), "n", 'a"b<c')
    assert 'href="/piece/1?token=a&quot;b&lt;c"' in page


def test_listing_policy_allows_no_script_and_no_frame():
    policy = listing_security_policy("n0nce")
    assert policy.startswith("default-src 'none'; ")
    assert "style-src 'nonce-n0nce'" in policy
    assert "script-src" not in policy and "frame-src" not in policy
    assert "frame-ancestors 'none'" in policy


@pytest.mark.parametrize("target, route", [
    ("/", ("list", None)), ("/?token=x", ("list", None)),
    ("/piece/1", ("piece", 1)), ("/piece/12?token=x", ("piece", 12)),
    ("/trace/3", ("trace", 3)), ("/trace/999999", ("trace", 999999)),
    ("/trace", None), ("/piece", None), ("/piece/", None), ("/piece/0", None),
    ("/piece/01", None), ("/trace/1/", None), ("/trace/1/..", None), ("/trace/%31", None),
    ("/trace/1000000", None), ("/trace/-1", None), ("/trace/1.0", None), ("//trace/1", None),
    ("/trace/\u0661", None), ("/Piece/1", None), ("/trace/1%00", None),
])
def test_pieces_routes_are_exact(target, route):
    assert view_page.pieces_route_for(target) == route


def test_a_piece_page_fetches_its_own_trace_and_links_back():
    trace = view_page.TraceFile(Path("x"), "o.part-0002.json", "o.part-0002.json", False)
    page = view_page.render_page(trace, "https://ui.perfetto.dev", "n0nce", "t0ken",
                                 piece=(2, 5))
    assert config_from_page(page)["traceUrl"] == "/trace/2?token=t0ken"
    assert '<a id="back" href="/?token=t0ken">&larr; all pieces</a>' in page
    assert "piece 2 of 5" in page
    single = view_page.render_page(trace, "https://ui.perfetto.dev", "n0nce", "t0ken")
    assert 'id="back"' not in single and "#back" not in single
    assert config_from_page(single)["traceUrl"] == "/trace?token=t0ken"


# --- the server ------------------------------------------------------------------------------


def test_the_list_page_is_served_at_the_root_with_a_strict_policy(split):
    with serving(split) as server:
        status, headers, body = get(server, "/")
    page = body.decode()
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert int(headers["Content-Length"]) == len(body)
    assert headers["Referrer-Policy"] == "no-referrer"
    nonce = re.search(r'<style nonce="([^"]+)">', page).group(1)
    assert headers["Content-Security-Policy"] == listing_security_policy(nonce)
    assert f'<a href="/piece/1?token={server.token}">1</a>' in page
    assert f'<a href="/piece/2?token={server.token}">2</a>' in page


def test_each_piece_page_is_the_perfetto_page_for_that_piece(split):
    with serving(split) as server:
        count = len(server.pieces.pieces)
        status, headers, body = get(server, "/piece/2")
    page = body.decode()
    assert status == 200
    assert "frame-src https://ui.perfetto.dev;" in headers["Content-Security-Policy"]
    assert config_from_page(page) == {
        "uiUrl": "https://ui.perfetto.dev", "title": "o.part-0002.json.gz",
        "fileName": "o.part-0002.json.gz", "traceUrl": f"/trace/2?token={server.token}"}
    assert f'href="/?token={server.token}"' in page
    assert f"piece 2 of {count}" in page


def test_each_piece_is_served_as_a_single_trace_is(split):
    with serving(split) as server:
        plain = get(server, "/trace/1")
        gz = get(server, "/trace/2")
        head = get(server, "/trace/2", method="HEAD")
    assert plain[0] == 200 and plain[2] == TRACE_BYTES
    assert int(plain[1]["Content-Length"]) == len(TRACE_BYTES)
    assert gz[0] == 200 and gz[2] == SAMPLE.read_bytes()  # gzip: as it is
    assert "Content-Encoding" not in gz[1]
    assert (head[0], head[2]) == (200, b"")
    assert int(head[1]["Content-Length"]) == SAMPLE.stat().st_size


def test_a_zstd_piece_is_decompressed_on_the_fly(split):
    pytest.importorskip("zstandard")
    with serving(split) as server:
        status, headers, body = get(server, "/trace/3")
        config = config_from_page(get(server, "/piece/3")[2].decode())
    assert status == 200
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body) == TRACE_BYTES * 100
    assert (config["title"], config["fileName"]) == ("o.part-0003.json.zst", "o.part-0003.json")


PIECES_NOT_SERVED = [
    "/trace", "/trace/0", "/trace/4", "/trace/01", "/trace/1/", "/trace/%31", "/piece/9",
    "/piece/", "/piece/1/..", "/trace/1/../2", "/o.part-0001.json", "/o.json.pieces.json",
    "/..", "/%2e%2e/", "//trace/1", "/trace/1%00", "/index.html",
]


@pytest.mark.parametrize("target", PIECES_NOT_SERVED)
def test_everything_else_is_404_for_a_manifest(split, target):
    with serving(split) as server:
        status, body = raw_request(
            server.port, f"GET {with_token(server, target)} HTTP/1.0\r\n\r\n".encode())
    assert status == 404, target
    assert TRACE_BYTES not in body


@pytest.mark.parametrize("path", ["/", "/piece/1", "/trace/1", "/trace/2?x=1", "/piece/99"])
@pytest.mark.parametrize("token", [None, "", "wrong"])
def test_every_pieces_route_needs_this_runs_token(split, path, token):
    with serving(split) as server:
        target = path if token is None else f"{path}{'&' if '?' in path else '?'}token={token}"
        status, body = raw_request(server.port, f"GET {target} HTTP/1.0\r\n\r\n".encode())
        assert status == 403
        assert TRACE_BYTES not in body and server.token.encode() not in body
        assert get(server, path)[0] == (404 if path == "/piece/99" else 200)


def test_a_foreign_host_is_refused_on_the_pieces_routes_too(split):
    with serving(split) as server:
        target = with_token(server, "/trace/1")
        request = (f"GET {target} HTTP/1.1\r\nHost: attacker.example\r\n"
                   "Connection: close\r\n\r\n").encode()
        assert raw_request(server.port, request)[0] == 403


def test_the_manifest_is_served_on_loopback_only_and_says_so(split):
    with serving(split) as server:
        assert server._httpd.server_address[0] == "127.0.0.1"
        lines = address_lines(server)
    count = len(server.pieces.pieces)
    assert lines[0] == f"Serving the {count} pieces listed in {split} at {server.url}"
    assert "a click on one hands it to https://ui.perfetto.dev" in lines[1]
    assert any(f"ssh -L {server.port}:127.0.0.1:{server.port} host" in line for line in lines)


def test_a_piece_file_replaced_after_start_is_served_as_it_is_now(split):
    """Like a single trace: the file is opened per request (a piece that went away is a 500,
    not a crash)."""
    with serving(split) as server:
        (split.parent / "o.part-0001.json").unlink()
        status, _, body = get(server, "/trace/1")
        assert status == 500
        assert get(server, "/trace/2")[0] == 200


def test_the_real_split_output_is_listed(tmp_path):
    """Rows as `--split-mb` wrote them for the shipped sample (its first two pieces)."""
    rows = []
    for number, (start, end, events) in enumerate(
            [("0", "2.324107", 369), ("2.324107", "4.512925", 336)], start=1):
        name = f"o.part-{number:04d}.json.gz"
        shutil.copyfile(SAMPLE, tmp_path / name)
        rows.append(piece_row(number, name, start_ms=start, end_ms=end, output_events=events))
    path = write_manifest(tmp_path, rows)
    with serving(path) as server:
        page = get(server, "/")[2].decode()
        digest = hashlib.sha256(get(server, "/trace/2")[2]).hexdigest()
    assert "0 &hellip; 2.324107" in page and "2.324107 &hellip; 4.512925" in page
    assert digest == hashlib.sha256(SAMPLE.read_bytes()).hexdigest()


# --- hostile values an outside attack found ---------------------------------------------


def test_a_manifest_nested_too_deeply_is_one_clear_line(tmp_path):
    path = tmp_path / "o.json.pieces.json"
    path.write_bytes(b'{"kind": "pieces", "pieces": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    with pytest.raises(TraceError) as caught:
        read_manifest(path)
    assert "nested too deeply" in str(caught.value)


def test_a_lone_surrogate_and_a_huge_size_still_list(tmp_path):
    (tmp_path / "o.part-0001.json").write_bytes(TRACE_BYTES)
    path = write_manifest(tmp_path, [piece_row(1, "o.part-0001.json", json_bytes=10**400)],
                          source_file="\ud800")
    manifest = read_manifest(path)
    page = render_listing(manifest, "nonce", "token")
    assert f"{10**400:,}"[:20] in page
    page.encode("utf-8", "replace")  # what the server sends
