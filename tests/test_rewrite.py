"""rewrite_chunk splices whole chunks at once; every shape must give relocate()'s bytes.

The splice positions come from keyscan.splice_positions, as the index pass finds them.
"""

from __future__ import annotations

import numpy as np
import pytest

from tracestream.index.builder import SPAN_DTYPE
from tracestream.index.keyscan import SPLICE_KEYS, EventKeys, splice_positions
from tracestream.plan.planner import DELETE
from tracestream.write.relocate import relocate
from tracestream.write.rewrite import dropped_last, rewrite_chunk

pytestmark = pytest.mark.usefixtures("backend")  # the C extension, then numpy

KERNEL = (b'{\n    "ph": "X", "cat": "kernel", "name": "k%d", "pid": 0, "tid": %d,\n'
          b'    "ts": 1000.%03d, "dur": 1.500,\n    "args": {"stream": %d}\n  }')
SHAPES = {
    "args": KERNEL,
    "empty args": b'{"ph": "X", "cat": "kernel", "name": "k%d", "pid": 0, "tid": %d, '
                  b'"ts": 1000.%03d, "dur": 1, "args": {}%.0d}',
    "spaced empty args": b'{"ph": "X", "cat": "kernel", "name": "k%d", "pid": 0, "tid": %d, '
                         b'"ts": 1000.%03d, "dur": 1, "args": { }%.0d}',
    "no args": b'{"ph": "X", "cat": "kernel", "name": "k%d", "pid": 0, "tid": %d, '
               b'"ts": 1000.%03d, "dur": 1%.0d}',
    "args first": b'{"args": {"stream": %d}, "ph": "X", "name": "k", "pid": 0, "tid": %d, '
                  b'"ts": 1000.%03d, "dur": 1%.0d}',
    # pid and tid apart: the provenance member cannot take them as one piece
    "tid on its own line": b'{"ph": "X", "cat": "kernel", "name": "k%d", "pid": 0,\n    '
                           b'"tid": %d, "ts": 1000.%03d, "dur": 1, "args": {"stream": %d}}',
    "key between pid and tid": b'{"ph": "X", "cat": "kernel", "name": "k%d", "pid": 0, "x": 1, '
                               b'"tid": %d, "ts": 1000.%03d, "dur": 1, "args": {"stream": %d}}',
    # the top-level keys written without a space; Kineto's spelling only in a nested object
    "nested spaced keys": b'{"ph": "X", "cat": "kernel", "name": "k%d", "pid":0, "tid":%d, '
                          b'"meta": {"pid": 5, "tid": 6, "x": 1}, "ts": 1000.%03d, '
                          b'"args": {"stream": %d}}',
}
TARGETS = {1: (b"1000", None, None), 2: (b"1001", None, None), 3: (b"7", b"1000000", None),
           4: (b"1002", None, b', "group": "communication"'),
           5: (b"1003", None, b', "group": "compute"')}
"""lane code -> (tid, pid, lane group member), as the plan's targets: 4 and 5 with lane groups"""


def _chunk(shapes: list[str]) -> tuple[bytes, np.ndarray]:
    events = [SHAPES[s] % (k, 7 + k, k, 7 + k) for k, s in enumerate(shapes)]
    events.insert(1, b'{"ph": "X", "cat": "cpu_op", "name": "untouched", "pid": 1, "tid": 1}')
    data = b",\n  ".join(events)
    rows = np.zeros(len(shapes), SPAN_DTYPE)
    pos = 0
    k = 0
    for i, event in enumerate(events):
        pos = data.index(event, pos)
        if i != 1:
            rows[["ordinal", "offset", "length"]][k] = (100 + i, 5000 + pos, len(event))
            k += 1
        pos += len(event)
    starts = rows["offset"] - 5000
    where = splice_positions(EventKeys(data, starts, starts + rows["length"],
                                       SPLICE_KEYS))
    for name in where.dtype.names:
        rows[name] = where[name]
    return data, rows


def _one_by_one(data: bytes, rows: np.ndarray, actions: list[int]) -> bytes:
    out, pos = [], 0
    for row, action in zip(rows, actions):
        start = int(row["offset"]) - 5000
        end = start + int(row["length"])
        new_tid, new_pid, group = TARGETS[action]
        out += [data[pos:start], relocate(data[start:end], new_tid, int(row["ordinal"]),
                                          new_pid, group=group)]
        pos = end
    return b"".join(out + [data[pos:]])


@pytest.mark.parametrize("shapes", [
    ["args"] * 4,
    ["args", "empty args", "args", "no args"],
    ["spaced empty args", "args", "no args", "no args"],
    ["args", "args first", "args"],
    ["nested spaced keys"] * 2,
    ["args", "nested spaced keys", "args"],
    ["args", "tid on its own line", "args"],
    ["key between pid and tid"] * 2,
    # one event out of Kineto's order sends the whole chunk event by event: the others,
    # empty args and no args among them, go by the positions the index found
    ["empty args", "args first", "spaced empty args", "no args"],
])
@pytest.mark.parametrize("actions", [[1, 2, 1, 2], [3, 1, 3, 3], [4, 5, 5, 4]])
def test_chunk_rewrite_equals_relocating_each_event(shapes, actions):
    data, rows = _chunk(shapes)
    acts = np.array(actions[: len(shapes)], np.uint16)
    got, dropped = rewrite_chunk(data, 5000, rows, acts, TARGETS)
    assert dropped == ()
    assert got == _one_by_one(data, rows, acts.tolist())
    assert b'"name": "untouched", "pid": 1, "tid": 1}' in got


def test_chunk_rewrite_drops_a_retired_event_with_its_separator():
    data, rows = _chunk(["args", "args", "args"])
    got, dropped = rewrite_chunk(data, 5000, rows, np.array([1, DELETE, 2], np.uint16),
                                 TARGETS)
    assert got.count(b'"cat": "kernel"') == 2
    # the separator it took comes back for the report (restore puts both back)
    assert b'"name": "k1"' not in got and dropped == (b",\n  ",) and not dropped_last(dropped)
    got, dropped = rewrite_chunk(data, 5000, rows, np.array([1, 2, DELETE], np.uint16),
                                 TARGETS)
    # the separator before it stays; the caller leaves out the one after the chunk
    assert dropped == (b"",) and dropped_last(dropped)
    assert got.endswith(b"},\n  ") and b'"name": "k2"' not in got


@pytest.mark.parametrize("shapes", [["empty args", "no args", "spaced empty args", "args"]])
def test_a_chunk_with_a_retired_event_relocates_the_others_as_one_by_one(shapes):
    """A retired event sends the chunk event by event; each relocated one, empty args or
    none, is what relocating it alone gives."""
    data, rows = _chunk(shapes)
    got, dropped = rewrite_chunk(data, 5000, rows, np.array([1, 3, DELETE, 2], np.uint16),
                                 TARGETS)
    kept = [0, 1, 3]
    want = _one_by_one(data, rows[kept], [1, 3, 2])
    retired = data[int(rows["offset"][2]) - 5000:int(rows["offset"][3]) - 5000]
    assert got == want.replace(retired, b"", 1) and len(dropped) == 1
