"""Output compression: `OutputFile` writing ~100 MB of trace JSON.

Measured per setting: no compression, gzip by default (ISA-L's level 1), zlib's
level 1 and 6 (what `--compress-level` gives, for the default's choice) and zstd
level 3. The output ratio is
recorded next to the time. The file is never committed: leaving the context
discards it, so the temp directory stays small.
"""

import pytest

from tracestream.write.sink import OutputFile

BLOCK = 4 << 20
TARGET = 100 << 20


@pytest.fixture(scope="module")
def payload(trace_path):
    """~100 MB of real trace bytes, as the rewrite hands them over (4 MB blocks)."""
    data = trace_path.read_bytes()
    blocks = []
    size = 0
    while size < TARGET:
        for start in range(0, len(data), BLOCK):
            blocks.append(data[start : start + BLOCK])
            size += len(blocks[-1])
            if size >= TARGET:
                break
    return blocks


def _write(folder, compression, level, blocks) -> int:
    with OutputFile(str(folder / "out.bin"), compression=compression, level=level) as out:
        for block in blocks:
            out.write(block)
        out.close_stream()
        return out.bytes_written


@pytest.mark.parametrize(("compression", "level"),
                         [("none", None), ("gzip", None), ("gzip", 1), ("gzip", 6), ("zstd", 3)])
def test_output_compression(benchmark, tmp_path, payload, compression, level,
                            record_throughput):
    size = sum(map(len, payload))
    record_throughput(size)
    written = benchmark.pedantic(_write, args=(tmp_path, compression, level, payload),
                                 rounds=2, iterations=1, warmup_rounds=0)
    benchmark.extra_info["ratio"] = size / written
    assert 0 < written <= size
