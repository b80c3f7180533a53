"""The small pure helpers behind issue 24's guards: sort-index clamping, compression
levels, zstd skippable frames, UTF-8 text, the one-event limit and view's token."""

from __future__ import annotations

import pytest

from tracestream.commands.view import page as view_page
from tracestream.errors import TraceError, require_utf8
from tracestream.plan.planner import INT64_MAX, INT64_MIN, clamp_sort_index
from tracestream.read.compression import detect_compression, is_zstd_skippable
from tracestream.write.sink import check_compress_level


@pytest.mark.parametrize("value, expected", [
    (0, 0), (-5, -5), (INT64_MAX, INT64_MAX), (INT64_MAX + 1, INT64_MAX),
    (2**64 - 1, INT64_MAX), (INT64_MIN, INT64_MIN), (INT64_MIN - 2, INT64_MIN),
])
def test_clamp_sort_index_keeps_int64(value, expected):
    assert clamp_sort_index(value) == expected


@pytest.mark.parametrize("compression, level, ok", [
    ("gzip", 1, True), ("gzip", 9, True), ("gzip", 0, False), ("gzip", 10, False),
    ("zstd", 1, True), ("zstd", 22, True), ("zstd", 0, False), ("zstd", 23, False),
    ("zstd", -1, False), ("zstd", 10**20, False), ("none", 99, True), ("gzip", None, True),
])
def test_compress_levels(compression, level, ok):
    if ok:
        check_compress_level(compression, level)
    else:
        with pytest.raises(TraceError, match=f"--compress-level {level} is out of range"):
            check_compress_level(compression, level)


@pytest.mark.parametrize("head, skippable", [
    (b"\x50\x2a\x4d\x18", True), (b"\x5f\x2a\x4d\x18", True), (b"\x5a\x2a\x4d\x18rest", True),
    (b"\x4f\x2a\x4d\x18", False), (b"\x60\x2a\x4d\x18", False), (b"\x28\xb5\x2f\xfd", False),
    (b"\x50\x2a\x4d", False), (b"", False),
])
def test_zstd_skippable_frames(head, skippable):
    assert is_zstd_skippable(head) is skippable
    if skippable:
        assert detect_compression(head) == "zstd"


def test_require_utf8_names_the_option():
    require_utf8("café", "--phase")
    require_utf8(None, "--pid")
    require_utf8(7, "--device")
    with pytest.raises(TraceError, match=r"--phase is not valid UTF-8 text \(character 2 of"):
        require_utf8("ab\udcff", "--phase")


@pytest.mark.parametrize("setting, expected", [
    (None, None), ("", None), ("1", 1 << 20), ("0.5", 1 << 19), ("1e-9", 1),
    ("1e308", 1 << 60),
])
def test_the_cli_reads_the_event_limit_from_the_environment(setting, expected):
    """TRACESTREAM_MAX_EVENT_MB, read by the CLI (the library reads no environment): unset or
    empty leaves the library's default of 64 MiB."""
    from tracestream.cli.options import max_event_bytes_from

    environ = {} if setting is None else {"TRACESTREAM_MAX_EVENT_MB": setting}
    assert max_event_bytes_from(environ) == expected


@pytest.mark.parametrize("setting", ["not a number", "0", "-1", "inf", "nan", "-inf", "1e400"])
def test_an_event_limit_that_is_not_a_positive_number_is_refused(setting):
    from tracestream.cli.options import max_event_bytes_from

    with pytest.raises(TraceError, match="TRACESTREAM_MAX_EVENT_MB=.* takes a positive number"):
        max_event_bytes_from({"TRACESTREAM_MAX_EVENT_MB": setting})


def test_the_library_takes_the_event_limit_as_an_argument(tmp_path, monkeypatch):
    """An event longer than a chunk and `max_event_bytes` is refused by the library call that
    was given that limit, whatever the environment says (the CLI reads it, not the library)."""
    from tracestream.commands.evidence.inspect import inspect_trace

    monkeypatch.setenv("TRACESTREAM_MAX_EVENT_MB", "0.001")
    path = tmp_path / "t.json"
    name = "k" * (3 << 20)  # longer than a 2 MB chunk and the limit below
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "' + name
                    + '", "pid": 0, "tid": 1, "ts": 1, "dur": 1}]}')
    assert inspect_trace(path, workers=0)["events"] == 1  # the default: 64 MiB
    with pytest.raises(TraceError, match="longer than 1 MiB, the limit for one event"):
        inspect_trace(path, workers=0, max_event_bytes=1 << 20)


@pytest.mark.parametrize("target, ok", [
    ("/?token=s3cret", True), ("/trace?token=s3cret", True), ("/?a=1&token=s3cret", True),
    ("/", False), ("/?token=", False), ("/?token=s3cre", False), ("/?token=s3cretx", False),
    ("/?TOKEN=s3cret", False), ("/?token=%73%33cret", True),
])
def test_token_matches(target, ok):
    assert view_page.token_matches(target, "s3cret") is ok
