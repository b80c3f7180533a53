"""A corpus of bad (and strange but valid) inputs, each driven through `layers` and `compact`.

Every input runs through the CLI in its own process. A refusal must be exit 2
with one stderr line naming the problem and where it is, no traceback, and an
output directory left empty (no output, report or hidden temporary file); a
success must verify and restore exactly. The source is never changed.

Events of the base trace (support.base_events), by index:
0-3 metadata, 4 CPU op, 5 flow start, 6 anchor a@100 (tid 7), 7 b@115 (tid 8),
8 anchor a@200, 9 flow finish @200, 10 b@215 (tid 8), 11 anchor a@300.
"""

from __future__ import annotations

import gzip
import random
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import zstandard

from samples.generate import TraceConfig, generate

from .checks import assert_verified, assert_written
from .support import (
    LAYERS_ARGS,
    TALLY,
    Raw,
    assert_refused,
    base_events,
    document,
    kernel,
    sha256,
)

BIG = 50 << 20


@dataclass(frozen=True)
class Ok:
    """The run succeeds, verifies, and restores to the source's bytes."""


@dataclass(frozen=True)
class Refuse:
    fragments: tuple = ()
    place: bool = True


def refuse(*fragments: str, place: bool = True) -> Refuse:
    return Refuse(fragments, place)


@dataclass
class Case:
    name: str
    data: bytes
    layers: Ok | Refuse
    compact: Ok | Refuse
    lanes: Ok | Refuse | None = None  # `layers --max-gpu-lanes 10`, where it differs from layers
    suffix: str = ".json"
    layers_args: list = field(default_factory=lambda: list(LAYERS_ARGS))

    def runs(self):
        yield "layers", self.layers, []
        yield "compact", self.compact, []
        if self.lanes is not None:
            yield "layers", self.lanes, ["--max-gpu-lanes", "10"]


def both(name, data, expect, **kw) -> Case:
    return Case(name, data, expect, expect, **kw)


def sub(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1, (old, data.count(old))
    return data.replace(old, new)


def with_events(*extra, at: int | None = None) -> bytes:
    events = base_events()
    if at is None:
        events += list(extra)
    else:
        events[at:at] = list(extra)
    return document(events)


D = document(base_events())
ANCHOR_200 = b'"name": "a", "pid": 0, "tid": 7, "ts": 200, "dur": 10'
B_215 = b'"name": "b", "pid": 0, "tid": 8, "ts": 215, "dur": 10'
CPU_OP = b'"name": "op", "pid": 1, "tid": 1, "ts": 190, "dur": 15'
SCHEMA = b'"schemaVersion": 1'
DEEP = 200_000


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _cases() -> list[Case]:
    rng = random.Random(7)
    cases = [
        both("control", D, Ok()),
        # -- not a trace at all ------------------------------------------------------------
        both("empty", b"", refuse("input is empty", place=False)),
        both("whitespace", b" \n\t\r\n ", refuse("input is empty", place=False)),
        *[both(f"random_bytes_{i}", rng.randbytes(4096), refuse()) for i in range(3)],
        both("random_after_bracket", b"[" + rng.randbytes(4096), refuse()),
        both("random_after_trace_events", b'{"traceEvents": [' + rng.randbytes(4096), refuse()),
        both("random_inside_events", sub(D, b'{"ph": "X", "cat": "cpu_op"',
                                          rng.randbytes(64) + b'{"ph": "X", "cat": "cpu_op"'),
             refuse()),
        both("top_level_number", b"42", refuse("top level is a number")),
        both("top_level_string", b'"a trace"', refuse("top level is a string")),
        both("top_level_null", b"null", refuse("top level is null")),
        both("top_level_true", b"true", refuse("top level is a boolean")),
        both("byte_order_mark", b"\xef\xbb\xbf" + D, refuse("top level is")),
        both("object_without_trace_events", b'{"schemaVersion": 1, "traceName": "x"}\n',
             refuse('no "traceEvents" array', place=False)),
        both("trace_events_object", b'{"traceEvents": {}}', refuse('"traceEvents" is an object')),
        both("trace_events_number", b'{"traceEvents": 5}', refuse('"traceEvents" is a number')),
        both("trace_events_string", b'{"traceEvents": "[]"}', refuse('"traceEvents" is a string')),
        both("trace_events_null", b'{"traceEvents": null}', refuse('"traceEvents" is null')),
        both("duplicate_top_level_key", sub(D, SCHEMA, SCHEMA + b', "schemaVersion": 2'),
             refuse("appears twice")),
        both("trace_events_twice", sub(D, SCHEMA, SCHEMA + b', "traceEvents": []'),
             refuse("'traceEvents' appears twice")),
        # -- an event that is not an object ---------------------------------------------------
        both("event_number", with_events(Raw("5"), at=7), refuse("event 7", "must be object")),
        both("event_string", with_events("X", at=7), refuse("event 7", "must be object")),
        both("event_null", with_events(None, at=7), refuse("event 7", "must be object")),
        both("event_array", with_events([1, 2], at=7), refuse("event 7", "must be object")),
        both("event_number_last", with_events(Raw("5")), refuse("expected an event object")),
        both("bare_array_of_numbers", b"[1, 2, 3]", refuse("expected an event object")),
        both("bare_array_of_arrays", b'[[{"ph": "X"}]]', refuse("expected an event object")),
        # -- ts and dur that are not usable numbers -----------------------------------------
        both("ts_word_gpu", sub(D, ANCHOR_200, ANCHOR_200.replace(b"200", b'"abc"')),
             refuse("event 8", "`ts` must be a number")),
        both("ts_word_cpu", sub(D, CPU_OP, CPU_OP.replace(b"190", b'"soon"')),
             Ok()),  # a CPU op's ts/dur is never read: passed through (issue 24)
        both("ts_numeric_string", sub(D, ANCHOR_200, ANCHOR_200.replace(b"200", b'"200"')),
             refuse("event 8", "`ts` must be a number")),
        both("ts_bare_word", sub(D, ANCHOR_200, ANCHOR_200.replace(b"200", b"soon")),
             refuse("malformed JSON")),
        both("ts_nan", sub(D, ANCHOR_200, ANCHOR_200.replace(b"200", b"NaN")),
             refuse("malformed JSON")),
        both("ts_infinity", sub(D, ANCHOR_200, ANCHOR_200.replace(b"200", b"Infinity")),
             refuse("malformed JSON")),
        both("ts_minus_infinity", sub(D, CPU_OP, CPU_OP.replace(b"190", b"-Infinity")),
             refuse("malformed JSON")),
        both("ts_nan_string", sub(D, ANCHOR_200, ANCHOR_200.replace(b"200", b'"NaN"')),
             refuse("`ts` must be a number")),
        both("ts_null", sub(D, ANCHOR_200, ANCHOR_200.replace(b"200", b"null")),
             refuse("`ts` must be a number, not null")),
        both("ts_true", sub(D, CPU_OP, CPU_OP.replace(b"190", b"true")),
             Ok()),  # a CPU op's ts/dur is never read: passed through (issue 24)
        both("ts_object", sub(D, CPU_OP, CPU_OP.replace(b"190", b'{"us": 190}')),
             Ok()),  # a CPU op's ts/dur is never read: passed through (issue 24)
        both("ts_multiline_object", sub(D, CPU_OP, CPU_OP.replace(b"190", b'{\n  "us": 190\n}')),
             Ok()),  # a CPU op's ts/dur is never read: passed through (issue 24)
        Case("newline_in_a_quoted_pid",
             document([_renamed(e, {0: "GPU\n0"}) for e in base_events()]
                      + [{"ph": "i", "name": "mark", "s": "t", "pid": "GPU\n0", "tid": 8,
                          "ts": Raw("230")}]),
             layers=Ok(), compact=refuse("an instant event", "tid 8")),
        both("dur_word", sub(D, B_215, B_215.replace(b'"dur": 10', b'"dur": "long"')),
             refuse("event 10", "`dur` must be a number")),
        both("dur_negative_gpu", sub(D, B_215, B_215.replace(b'"dur": 10', b'"dur": -10')),
             refuse("event 10", "dur -10 is negative")),
        both("dur_negative_cpu", sub(D, CPU_OP, CPU_OP.replace(b'"dur": 15', b'"dur": -0.5')),
             Ok()),  # a CPU op's ts/dur is never read: passed through (issue 24)
        both("ts_1e300", sub(D, ANCHOR_200, ANCHOR_200.replace(b"200", b"1e300")),
             refuse("event 8", "out of range")),
        both("ts_minus_1e300", sub(D, CPU_OP, CPU_OP.replace(b"190", b"-1e300")),
             Ok()),  # a CPU op's ts/dur is never read: passed through (issue 24)
        both("ts_1e16", sub(D, B_215, B_215.replace(b"215", b"1e16")),
             refuse("event 10", "out of range")),
        both("ts_1e308_digits", sub(D, B_215, B_215.replace(b"215", b"9" * 309)),
             refuse("event 10", "out of range")),
        both("dur_1e16", sub(D, B_215, B_215.replace(b'"dur": 10', b'"dur": 1e16')),
             refuse("event 10", "out of range")),
        both("dur_1e300", sub(D, CPU_OP, CPU_OP.replace(b'"dur": 15', b'"dur": 1E+300')),
             Ok()),  # a CPU op's ts/dur is never read: passed through (issue 24)
        # exact arithmetic on these would need a 10**99999996: refused, never a hang
        both("ts_tiny_exponent", sub(D, B_215, B_215.replace(b"215", b"1e-99999999")),
             refuse("event 10", "exponent out of range")),
        both("ts_zero_huge_exponent", sub(D, CPU_OP, CPU_OP.replace(b"190", b"0e99999999")),
             Ok()),  # a CPU op's ts/dur is never read: passed through (issue 24)
        both("ts_5000_digits", sub(D, B_215, B_215.replace(b"215", b"215." + b"0" * 5000 + b"1")),
             refuse("event 10", "more than 400 digits")),
        both("odd_but_valid_numbers",
             sub(D, CPU_OP, CPU_OP.replace(b"190", b"1.9E+2").replace(b"15", b"15.0000001")),
             Ok()),
        # -- after the document, and broken structure --------------------------------------
        both("trailing_word", D + b" xyz", refuse("trailing data")),
        both("trailing_object", D + b"{}", refuse("trailing data")),
        both("trailing_bracket", D.rstrip() + b"]", refuse("trailing data")),
        both("two_documents", D + D, refuse("trailing data")),
        both("trailing_comma_in_events", sub(D, b'"dur": 10, "args": {"device": 0, "stream": 7}}\n',
                                             b'"dur": 10, "args": {"device": 0, "stream": 7}},\n'),
             refuse("trailing comma")),
        both("missing_comma_between_events",
             sub(D, b'}},\n{"ph": "f"', b'}}\n{"ph": "f"'), refuse()),
        both("unclosed_event_array", sub(D, b"\n  ],\n", b"\n,\n"), refuse()),
        # -- text that is not valid UTF-8 or JSON strings ----------------------------------
        both("invalid_utf8_in_event", sub(D, b'"name": "op"', b'"name": "o\xff\xfep"'),
             refuse("invalid UTF-8")),
        both("overlong_utf8", sub(D, b'"name": "op"', b'"name": "o\xc0\xafp"'),
             refuse("invalid UTF-8")),
        both("cut_utf8_sequence", sub(D, b'"name": "op"', b'"name": "op\xe2\x82"'),
             refuse("invalid UTF-8")),
        both("invalid_utf8_in_anchor", sub(D, ANCHOR_200, ANCHOR_200.replace(b'"a"', b'"a\x80"')),
             refuse("invalid UTF-8")),
        both("invalid_utf8_top_level_value", sub(D, SCHEMA, b'"schemaVersion": "\xc3("'),
             refuse("invalid UTF-8", "top-level value")),
        both("invalid_utf8_top_level_key", sub(D, SCHEMA, b'"schema\xffVersion": 1'),
             refuse("invalid UTF-8", "top-level key")),
        both("lone_high_surrogate", sub(D, b'"name": "op"', b'"name": "o\\ud800p"'),
             refuse("surrogate")),
        both("lone_low_surrogate", sub(D, b'"name": "op"', b'"name": "o\\udc00p"'),
             refuse("surrogate")),
        both("high_surrogate_then_ascii", sub(D, b'"name": "op"', b'"name": "\\ud800\\u0041"'),
             refuse("surrogate")),
        both("high_surrogate_at_string_end", sub(D, b'"name": "op"', b'"name": "op\\ud800"'),
             refuse("surrogate")),
        both("lone_surrogate_in_anchor_name",
             sub(D, ANCHOR_200, ANCHOR_200.replace(b'"a"', b'"a\\udfff"')), refuse("surrogate")),
        both("control_character_in_string", sub(D, b'"name": "op"', b'"name": "o\x01p"'),
             refuse("control character")),
        both("valid_escapes",
             sub(D, b'"name": "op"', b'"name": "\\u00e9\\n\\"\\\\ \\ud83d\\ude00"'), Ok()),
        # -- nesting deeper than any parser's stack ------------------------------------------
        both("args_nested_200k_deep", sub(D, b'"args": {"External id": 1}',
                                          b'"args": {"x": ' + nested(DEEP) + b"}"), refuse()),
        both("event_nested_200k_deep", with_events(Raw(nested(DEEP).decode()), at=5), refuse()),
        both("top_level_value_nested_200k_deep",
             sub(D, SCHEMA, b'"schemaVersion": ' + nested(DEEP)), refuse("nested too deeply")),
        both("args_nested_1010_deep", sub(D, b'"args": {"External id": 1}',
                                          b'"args": {"x": ' + nested(1010) + b"}"), refuse()),
        both("args_nested_500_deep", sub(D, b'"args": {"External id": 1}',
                                         b'"args": {"x": ' + nested(500) + b"}"), Ok()),
        # -- a 50 MB string is not invalid JSON: copied through (or refused when unterminated)
        both("string_50mb_in_cpu_args", sub(D, b'"args": {"External id": 1}',
                                            b'"args": {"blob": "' + b"x" * BIG + b'"}'), Ok()),
        both("string_50mb_top_level", sub(D, SCHEMA, b'"schemaVersion": "' + b"y" * BIG + b'"'),
             Ok()),
        both("string_50mb_unterminated", sub(D, SCHEMA, b'"schemaVersion": "' + b"z" * BIG),
             refuse()),
        # -- duplicate keys in events tracestream interprets or moves -----------------------
        Case("duplicate_ts_in_anchor",
             sub(D, ANCHOR_200, ANCHOR_200.replace(b'"dur"', b'"ts": 250, "dur"')),
             layers=refuse("event 8", "duplicate key `ts`", "--anchor-regex"),
             compact=refuse("event 8", "duplicate key `ts`")),
        Case("duplicate_tid_in_moved_kernel",
             sub(D, B_215, B_215.replace(b'"ts"', b'"tid": 9, "ts"')),
             layers=Ok(), compact=refuse("event 10", "duplicate key `tid`"),
             lanes=refuse("event 10", "duplicate key `tid`")),
        Case("duplicate_dur_in_moved_kernel",
             sub(D, B_215, B_215 + b', "dur": 50'),
             layers=Ok(), compact=refuse("event 10", "duplicate key `dur`"),
             lanes=refuse("event 10", "duplicate key `dur`")),
        # a metadata event is not interpreted, so its duplicates pass; verify must cope too
        both("duplicate_ts_in_metadata_string_first",
             sub(D, b'"name": "thread_name", "ph": "M", "ts": 0, "pid": 1',
                 b'"name": "thread_name", "ph": "M", "ts": "x", "ts": 0, "pid": 1'), Ok()),
        both("duplicate_name_in_cpu_event", sub(D, CPU_OP, CPU_OP + b', "name": "op2"'), Ok()),
        # -- GPU activity tracestream cannot place --------------------------------------------
        both("gpu_kernel_without_pid", sub(D, B_215, B_215.replace(b'"pid": 0, ', b"")),
             refuse("event 10", "has no `pid`")),
        both("gpu_kernel_without_tid", sub(D, B_215, B_215.replace(b'"tid": 8, ', b"")),
             refuse("event 10", "has no `tid`")),
        both("gpu_kernel_without_ts", sub(D, B_215, B_215.replace(b'"ts": 215, ', b"")),
             refuse("event 10", "has no `ts`")),
        both("gpu_kernel_without_dur", sub(D, B_215, B_215.replace(b', "dur": 10', b"")),
             refuse("event 10", "has no `dur`")),
        both("pid_float", sub(D, B_215, B_215.replace(b'"pid": 0', b'"pid": 0.5')),
             refuse("event 10", "`[10].pid` must be an integer or a string")),
        both("tid_array", sub(D, B_215, B_215.replace(b'"tid": 8', b'"tid": [8]')),
             refuse("event 10", "must be an integer or a string")),
        both("ph_number", sub(D, b'{"ph": "X", "cat": "kernel", ' + B_215,
                              b'{"ph": 5, "cat": "kernel", ' + B_215),
             refuse("event 10", "must be a string")),
        both("gpu_args_not_object", sub(D, B_215 + b', "args": {"device": 0, "stream": 8}',
                                        B_215 + b', "args": [8]'),
             refuse("event 10", "`[10].args` must be an object")),
        both("gpu_device_object", sub(D, B_215 + b', "args": {"device": 0',
                                      B_215 + b', "args": {"device": {"id": 0}'),
             refuse("event 10", "`args.device`")),
        Case("anchor_stream_array",
             sub(D, ANCHOR_200 + b', "args": {"device": 0, "stream": 7',
                 ANCHOR_200 + b', "args": {"device": 0, "stream": [7]'),
             layers=refuse("event 8", "`args.stream`"), compact=Ok()),
        Case("kernel_name_array", sub(D, B_215, B_215.replace(b'"name": "b"', b'"name": ["b"]')),
             layers=refuse("event 10", "kernel `name` must be a string"), compact=Ok()),
        both("empty_object_event", with_events({}, at=5), Ok()),
        # Kineto's spelling for pid/tid but not for args: the relocated kernel must not get a
        # second "args" member (found by the fuzzer)
        both("args_spelled_without_space", sub(D, B_215 + b', "args": {', B_215 + b', "args":{'),
             Ok()),
        both("args_brace_on_next_line", sub(D, B_215 + b', "args": {', B_215 + b', "args":\n{'),
             Ok()),
        # -- events on a GPU stream that compaction would have to drop -----------------------
        Case("begin_end_on_gpu_stream",
             with_events({"ph": "B", "name": "phase", "pid": 0, "tid": 8, "ts": Raw("230")},
                         {"ph": "E", "pid": 0, "tid": 8, "ts": Raw("231")}),
             layers=Ok(), compact=refuse("a begin (B) event", "pid 0 tid 8"),
             lanes=refuse("a begin (B) event", "pid 0 tid 8")),
        Case("instant_on_gpu_stream",
             with_events({"ph": "i", "name": "mark", "s": "t", "pid": 0, "tid": 8,
                          "ts": Raw("230")}),
             layers=Ok(), compact=refuse("an instant event", "pid 0 tid 8"),
             lanes=refuse("an instant event")),
        Case("counter_on_gpu_stream",
             with_events({"ph": "C", "name": "mem", "pid": 0, "tid": 8, "ts": Raw("230"),
                          "args": {"bytes": 5}}),
             layers=Ok(), compact=refuse("a counter event", "pid 0 tid 8"),
             lanes=refuse("a counter event")),
        Case("flow_binds_to_nothing",
             with_events({"ph": "f", "id": 9, "pid": 0, "tid": 8, "ts": Raw("240"), "cat": "ac2g",
                          "name": "ac2g", "bp": "e"}),
             layers=Ok(), compact=refuse("flow event 12", "binds to no GPU activity"),
             lanes=refuse("binds to no GPU activity")),
        Case("flow_binds_to_two_kernels",
             with_events(kernel("c", 215, 4, tid=8),
                         {"ph": "f", "id": 9, "pid": 0, "tid": 8, "ts": Raw("215"), "cat": "ac2g",
                          "name": "ac2g", "bp": "e"}),
             layers=Ok(), compact=refuse("flow event 13", "starts exactly at 2 activities"),
             lanes=refuse("starts exactly at 2 activities")),
        Case("flow_inside_two_kernels",
             with_events(kernel("c", 212, 8, tid=8),
                         {"ph": "f", "id": 9, "pid": 0, "tid": 8, "ts": Raw("218"), "cat": "ac2g",
                          "name": "ac2g", "bp": "e"}),
             layers=Ok(), compact=refuse("flow event 13", "lies inside 2 activities"),
             lanes=refuse("lies inside 2 activities")),
        # -- strings where Kineto writes numbers: valid ---------------------------------------
        both("string_pids_and_tids", document([_stringly(e) for e in base_events()]), Ok()),
        # -- nothing to do -------------------------------------------------------------------
        Case("empty_event_array", b'{"traceEvents": []}',
             layers=refuse("no kernel matches", "the trace has no kernels", place=False),
             compact=refuse("no GPU activity", place=False)),
        Case("empty_bare_array", b"[]",
             layers=refuse("no kernel matches", "the trace has no kernels", place=False),
             compact=refuse("no GPU activity", place=False)),
        Case("cpu_only", document([e for e in base_events() if e.get("cat") != "kernel"]),
             layers=refuse("no kernel matches", "the trace has no kernels", place=False),
             compact=refuse("no GPU activity", place=False)),
    ]
    return cases


def _renamed(event, pids: dict):
    if isinstance(event, dict) and event.get("pid") in pids:
        return {**event, "pid": pids[event["pid"]]}
    return event


def _stringly(event):
    if not isinstance(event, dict):
        return event
    event = dict(event)
    for key in ("pid", "tid"):
        if key in event:
            event[key] = {0: "GPU 0", 1: "host"}.get(event[key], str(event[key])) if (
                key == "pid") else f"stream {event[key]}"
    if "args" in event and "stream" in event["args"]:
        event["args"] = {**event["args"], "stream": f"stream {event['args']['stream']}"}
    return event


def _compressed_cases() -> list[Case]:
    plain = D
    gz = gzip.compress(plain, mtime=0)
    zst = zstandard.ZstdCompressor(write_checksum=True).compress(plain)
    bare_zst = zstandard.ZstdCompressor(write_checksum=False).compress(plain)
    cases = [
        both("gzip_control", gz, Ok(), suffix=".json.gz"),
        both("zstd_control", zst, Ok(), suffix=".json.zst"),
        both("gzip_two_members", gzip.compress(plain[:300], mtime=0) + gzip.compress(plain[300:]),
             Ok(), suffix=".json.gz"),
        both("gzip_of_nothing", gzip.compress(b""), refuse("input is empty", place=False),
             suffix=".json.gz"),
        both("gzip_trailing_garbage", gz + b"garbage", refuse("trailing bytes after gzip"),
             suffix=".json.gz"),
        both("zstd_trailing_garbage", zst + b"garbage", refuse("zstd"), suffix=".json.zst"),
        both("gzip_of_truncated_json", gzip.compress(plain[: len(plain) // 2]), refuse(),
             suffix=".json.gz"),
    ]
    for cut in (2, 10, 30, len(gz) // 2, len(gz) - 9, len(gz) - 1):
        cases.append(both(f"gzip_cut_at_{cut}", gz[:cut], refuse("gzip"), suffix=".json.gz"))
    for cut in (5, len(zst) // 3, len(zst) // 2, len(zst) - 1):
        cases.append(both(f"zstd_cut_at_{cut}", zst[:cut], refuse("zstd"), suffix=".json.zst"))
    # a flipped byte: in the flags, the deflate stream, the CRC-32, the length
    for where in (3, len(gz) // 2, len(gz) - 6, len(gz) - 2):
        data = bytearray(gz)
        data[where] ^= 0xFF
        cases.append(both(f"gzip_flip_at_{where}", bytes(data), refuse("gzip"), suffix=".json.gz"))
    for where in (4, len(zst) // 2, len(zst) - 2):
        data = bytearray(zst)
        data[where] ^= 0xFF
        cases.append(both(f"zstd_flip_at_{where}", bytes(data), refuse("zstd"),
                          suffix=".json.zst"))
    # without a checksum a flip may decode to other, valid JSON: either outcome is fine
    for where in (len(bare_zst) // 3, len(bare_zst) // 2):
        data = bytearray(bare_zst)
        data[where] ^= 0x01
        cases.append(both(f"unchecked_zstd_flip_at_{where}", bytes(data), None,
                          suffix=".json.zst"))
    assert zlib.crc32(gz) != 0
    return cases


CASES = _cases() + _compressed_cases()


def _run_case(cli, tmp_path: Path, case: Case) -> None:
    source = tmp_path / f"{case.name}{case.suffix}"
    source.write_bytes(case.data)
    before = sha256(source)
    for n, (command, expect, extra) in enumerate(case.runs()):
        folder = tmp_path / f"out{n}"
        folder.mkdir()
        output = folder / "out.json"
        args = [command, "--trace", source, "--output", output, "--quiet", *extra]
        if command == "layers":
            args += case.layers_args
        out = cli(*args)
        kind = "layers" if command == "layers" else "compact"
        if expect is None:  # exit 0 with a verifiable output, or exit 2 with a message
            expect = Ok() if out.rc == 0 else Refuse()
        if isinstance(expect, Ok):
            assert out.rc == 0, out.describe()
            assert "Traceback" not in out.stderr
            assert_written(folder, output, kind)
            assert_verified(source, output)
        else:
            assert_refused(out, *expect.fragments, place=expect.place, empty=folder)
    assert sha256(source) == before, "the source changed"
    TALLY["corpus inputs tried (each through layers and compact)"] += 1


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus(cli, tmp_path, case):
    _run_case(cli, tmp_path, case)


# -- a generated trace cut at 30 places ---------------------------------------------------------

GENERATED_LAYERS = ["--anchor-regex", "^_q_rope_store$", "--num-layers", "2", "--anchor-offset",
                    "0", "--extra-anchors-per-pass", "1", "--phase", "target-verify",
                    "--evidence", "generator: one _q_rope_store per layer"]


@pytest.fixture(scope="module")
def small_generated(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("gen") / "small.json"
    generate(path, TraceConfig(layers=2, iterations=1, graphs=2, streams_per_graph=3,
                               draft_passes=1))
    return path.read_bytes()


def _cut_points(data: bytes, count: int = 30) -> list[int]:
    """`count` distinct cuts: landmarks (inside the header, a number, a name, the last byte),
    the rest spread evenly. A cut at or after the last byte would leave a valid document."""
    end = len(data.rstrip())
    points = {0, data.index(b'"traceEvents": [') + 16, data.index(b'"ts": ') + 8,
              data.index(b'"name": "') + 12, end - 1}
    spread = count - len(points)
    points.update((i + 1) * (end - 1) // (spread + 1) for i in range(spread))
    rng = random.Random(count)
    while len(points) < count:
        points.add(rng.randrange(1, end))
    return sorted(points)


def test_truncated_at_30_places(cli, tmp_path, small_generated):
    cuts = _cut_points(small_generated)
    assert len(cuts) == 30
    for cut in cuts:
        data = small_generated[:cut]
        case = both(f"cut_at_{cut}", data, refuse(place=bool(data.strip())),
                    layers_args=GENERATED_LAYERS)
        folder = tmp_path / case.name
        folder.mkdir()
        _run_case(cli, folder, case)


def test_truncated_on_stdin_leaves_no_spool(cli, tmp_path, small_generated):
    """`--trace -` spools stdin to a temporary file: refused or not, the spool is removed."""
    spool_dir = tmp_path / "tmp"
    spool_dir.mkdir()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    for cut in (len(small_generated) // 3, len(small_generated) - 3):
        out = cli("compact", "--trace", "-", "--output", out_dir / "o.json", "--quiet",
                  stdin=small_generated[:cut], env={"TMPDIR": str(spool_dir)})
        assert_refused(out, empty=out_dir)
        assert list(spool_dir.iterdir()) == []
        TALLY["corpus inputs tried (each through layers and compact)"] += 1
    out = cli("compact", "--trace", "-", "--output", out_dir / "o.json", "--quiet",
              stdin=small_generated, env={"TMPDIR": str(spool_dir)})
    assert out.rc == 0, out.describe()
    assert list(spool_dir.iterdir()) == []


def test_real_processes_agree(tmp_path):
    """A few corpus cases through a fresh `python -m tracestream` (start-up included)."""
    from .support import exec_cli

    chosen = {"control", "empty", "ts_tiny_exponent", "args_nested_200k_deep",
              "invalid_utf8_top_level_key", "duplicate_tid_in_moved_kernel", "gzip_cut_at_30"}
    picked = [c for c in CASES if c.name in chosen]
    assert len(picked) == len(chosen)

    class Fresh:
        def __call__(self, *args, **kw):
            return exec_cli(args, **kw)

    for case in picked:
        folder = tmp_path / case.name
        folder.mkdir()
        _run_case(Fresh(), folder, case)


def test_annotated_again_is_refused(cli, tmp_path):
    source = tmp_path / "t.json"
    source.write_bytes(D)
    (tmp_path / "a").mkdir()
    layered, compacted = tmp_path / "a" / "l.json", tmp_path / "a" / "c.json"
    assert cli("layers", "--trace", source, "--output", layered, *LAYERS_ARGS).rc == 0
    assert cli("compact", "--trace", source, "--output", compacted).rc == 0
    for trace, command, fragment in ((layered, "layers", "already contains layer guides"),
                                     (compacted, "layers", "already compacted"),
                                     (compacted, "compact", "already compacted")):
        folder = tmp_path / f"again-{command}-{trace.stem}"
        folder.mkdir()
        args = [command, "--trace", trace, "--output", folder / "o.json"]
        out = cli(*(args + LAYERS_ARGS if command == "layers" else args))
        assert_refused(out, fragment, empty=folder)
    TALLY["corpus inputs tried (each through layers and compact)"] += 2
