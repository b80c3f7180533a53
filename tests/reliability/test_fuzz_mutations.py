"""Mutated trace bytes through `layers` and `compact`: exit 0 and verified, or exit 2, one line.

Mutations of a small generated trace and of the hand-built base trace: bit
flips, byte insertions and deletions, truncations, splices of the trace into
itself, structural characters swapped; plain, or wrapped in gzip/zstd before or
after mutating. Never exit 70 (internal error), never a traceback, never a hang.

The hypothesis loop drives the CLI in-process (click's runner, with a 60 s
alarm); a few seeded mutants also go through a fresh `python -m tracestream`.
"""

from __future__ import annotations

import gzip
import random
import signal
import tempfile
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samples.generate import TraceConfig, generate
from tracestream.cli import main

from .support import (
    FUZZ_EXAMPLES,
    LAYERS_ARGS,
    TALLY,
    base_events,
    document,
    examples,
    exec_cli,
    leftovers,
)

GENERATED_LAYERS = ["--anchor-regex", "^_q_rope_store$", "--num-layers", "2", "--anchor-offset",
                    "0", "--extra-anchors-per-pass", "1", "--phase", "target-verify",
                    "--evidence", "generator"]
STRUCTURAL = b'{}[]:,"\\0123456789.-eE \n'
ALARM = 60


def _bases() -> list[tuple[bytes, list]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "small.json"
        generate(path, TraceConfig(layers=2, iterations=1, graphs=2, streams_per_graph=3,
                                   draft_passes=1, seed=3))
        generated = path.read_bytes()
    return [(generated, GENERATED_LAYERS), (document(base_events()), LAYERS_ARGS)]


BASES = _bases()

mutation = st.one_of(
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(0, 7)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("structural"), st.floats(0, 1), st.sampled_from(list(STRUCTURAL))),
    st.tuples(st.just("delete"), st.floats(0, 1), st.integers(1, 64)),
    st.tuples(st.just("truncate"), st.floats(0, 1), st.just(0)),
    st.tuples(st.just("splice"), st.floats(0, 1), st.tuples(st.floats(0, 1), st.integers(1, 400))),
)


def mutate(data: bytes, mutations) -> bytes:
    out = bytearray(data)
    for kind, where, arg in mutations:
        pos = min(int(where * len(out)), max(len(out) - 1, 0))
        if kind == "flip" and out:
            out[pos] ^= 1 << arg
        elif kind == "insert":
            out[pos:pos] = arg
        elif kind == "structural" and out:
            out[pos] = arg
        elif kind == "delete":
            del out[pos : pos + arg]
        elif kind == "truncate":
            del out[pos:]
        elif kind == "splice":
            start = int(arg[0] * len(data))
            out[pos:pos] = data[start : start + arg[1]]
    return bytes(out)


def wrap(data: bytes, how: str) -> bytes:
    if how == "gzip":
        return gzip.compress(data, compresslevel=1, mtime=0)
    if how == "zstd":
        return zstandard.ZstdCompressor(write_checksum=bool(len(data) % 2)).compress(data)
    return data


class _Alarm(BaseException):
    """A run took longer than ALARM seconds: a hang (not catchable as an Exception)."""


def _invoke(args: list[str]):
    """The CLI in-process, with the process's signal handlers put back afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE,
                                              signal.SIGXFSZ, signal.SIGALRM)}

    def alarm(signum, frame):
        raise _Alarm(f"no answer after {ALARM}s: {args}")

    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(ALARM)
    try:
        return CliRunner().invoke(main, args, catch_exceptions=False)
    finally:
        signal.alarm(0)
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def check_mutant(data: bytes, layers_args: list, folder: Path, run=None) -> None:
    """Both commands: exit 0 with an output `verify` accepts, or exit 2 with one line."""
    from tracestream.commands.verify import verify

    source = folder / "mutant.json"
    source.write_bytes(data)
    for command in ("layers", "compact"):
        out_dir = folder / f"out-{command}"
        out_dir.mkdir()
        output = out_dir / "out.json"
        args = [command, "--trace", str(source), "--output", str(output), "--quiet",
                "--workers", "0"]
        if command == "layers":
            args += layers_args
        if run is None:
            result = _invoke(args)
            code, stderr = result.exit_code, result.stderr
        else:
            outcome = run(args)
            code, stderr = outcome.rc, outcome.stderr
        assert code in (0, 2), (code, stderr)
        assert "Traceback" not in stderr, stderr
        if code == 0:
            assert verify(source, output, workers=0).ok
            TALLY["fuzz: mutants accepted (exit 0, verified)"] += 1
        else:
            lines = [line for line in stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and lines[0].startswith("tracestream: error: "), stderr
            assert leftovers(out_dir) == []
            TALLY["fuzz: mutants refused (exit 2, one line)"] += 1
    assert source.read_bytes() == data


@settings(max_examples=examples(60), deadline=None, derandomize=not FUZZ_EXAMPLES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
          **({} if FUZZ_EXAMPLES else {"database": None}))
@given(base=st.sampled_from(range(len(BASES))), mutations=st.lists(mutation, min_size=1,
                                                                     max_size=6),
       wrapper=st.sampled_from(["none", "gzip", "zstd"]), after=st.booleans())
def test_fuzz_mutated_bytes(base, mutations, wrapper, after):
    """`after`: mutate the compressed bytes (corrupt gzip/zstd) rather than the JSON."""
    data, layers_args = BASES[base]
    mutant = mutate(wrap(data, wrapper), mutations) if after else wrap(mutate(data, mutations),
                                                                        wrapper)
    with tempfile.TemporaryDirectory(prefix="tracestream-fuzz-") as tmp:
        check_mutant(mutant, layers_args, Path(tmp))
    TALLY["fuzz: mutated inputs tried (in-process CLI)"] += 1


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_mutated_bytes_in_fresh_processes(tmp_path, seed):
    """A few seeded mutants through `python -m tracestream` (start-up, exit codes, stderr)."""
    rng = random.Random(seed)
    data, layers_args = BASES[seed % len(BASES)]
    mutations = [(rng.choice(["flip", "delete", "structural", "truncate"]), rng.random(),
                  rng.choice([1, 3, STRUCTURAL[rng.randrange(len(STRUCTURAL))]]))
                 for _ in range(rng.randrange(1, 4))]
    mutations = [(k, w, a if k != "flip" else a % 8) for k, w, a in mutations]
    mutant = wrap(mutate(data, mutations), ["none", "gzip", "zstd"][seed % 3])
    check_mutant(mutant, layers_args, tmp_path, run=lambda args: exec_cli(args))
    TALLY["fuzz: mutated inputs tried (fresh process)"] += 1


def compact_in_small_chunks(source: Path, output: Path, chunk_bytes: int) -> None:
    """`compact` as api._run does it, but with chunks of `chunk_bytes` (the speculative
    cutting, its rewinds and the chunk-wise rewrite all run on a small input)."""
    from tracestream.engine import spec_options, write_report
    from tracestream.index.builder import IndexOptions, run_index
    from tracestream.plan.planner import Planner
    from tracestream.plan.specs import CompactSpec
    from tracestream.read.source import TraceSource
    from tracestream.write.rewrite import rewrite
    from tracestream.write.sink import OutputFile, commit_together

    spec = CompactSpec()
    report = Path(f"{output}.compact.json")
    with TraceSource(str(source)) as src:
        index = run_index(src, IndexOptions(chunk_bytes=chunk_bytes, moves_gpu=True))
        try:
            planner = Planner(index, output_name=output.name, report_name=report.name)
            compaction = planner.plan_compaction(spec)
            plan = planner.finish("compact", None, compaction,
                                  options=spec_options(None, spec))
            plan.report["output_compression"] = "none"
            with OutputFile(str(output)) as out, OutputFile(str(report), what="report") as rep:
                rewrite(src, index, plan, out)
                write_report(rep, plan, src)
                commit_together([out, rep])
        finally:
            index.close()


@settings(max_examples=examples(30), deadline=None, derandomize=not FUZZ_EXAMPLES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
          **({} if FUZZ_EXAMPLES else {"database": None}))
@given(base=st.sampled_from(range(len(BASES))), mutations=st.lists(mutation, max_size=3),
       chunk_bytes=st.sampled_from([64, 300, 1000, 5000]))
def test_fuzz_small_chunks(base, mutations, chunk_bytes):
    """Cut into chunks of a few hundred bytes the result is the same: a refusal, or an
    output that `verify` (which re-plans with the normal chunk size) accepts."""
    from tracestream.commands.verify import verify
    from tracestream.errors import TraceError

    data = mutate(BASES[base][0], mutations)
    with tempfile.TemporaryDirectory(prefix="tracestream-fuzz-") as tmp:
        source, output = Path(tmp) / "mutant.json", Path(tmp) / "out" / "out.json"
        output.parent.mkdir()
        source.write_bytes(data)
        signal.signal(signal.SIGALRM, _raise_alarm)
        signal.alarm(ALARM)
        try:
            compact_in_small_chunks(source, output, chunk_bytes)
        except TraceError as exc:
            assert "\n" not in str(exc)
            assert leftovers(output.parent) == []
            TALLY["fuzz: small-chunk runs refused"] += 1
        else:
            assert verify(source, output, workers=0).ok
            TALLY["fuzz: small-chunk runs verified"] += 1
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)


def _raise_alarm(signum, frame):
    raise _Alarm(f"no answer after {ALARM}s")
