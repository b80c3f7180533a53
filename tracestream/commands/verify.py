"""`verify`: prove that an annotated trace is its source plus tracestream's additions.

Both files are streamed side by side, never held in memory. The source is
indexed and re-planned with the options the report recorded, so every output
event can be compared with what it must be: the source event unchanged, the
source event relocated to the planned lane, or a planned addition (byte for
byte: a key spelled twice may be read either way). The output is also restored
by `restore`'s own splice (output and report alone, no plan) and the sha256 of
the restored bytes compared with the source's, hashed as the index pass read
it. Independent checks then look only at the output, by Perfetto's import rules:
every synthetic lane and the guide track import at depth zero (slices starting
together nest longest first), every relocated flow binds on its lane to the
activity it binds to on its original stream, the guides are complete, ordered
and as the report's rows say, and the per-GPU kernel and stream counts and the
lanes match the report. An output event that differs from the plan is named
once; those checks see the planned event in its place, so one tampered value
brings no follow-on failures.

An output that is exactly as planned is settled a chunk at a time
(`_fast_compare`): the planned chunks are made again by the splice's numpy twin in
the workers, which also run the output-only checks on the events of the chunk they
made; the main process compares the output with those bytes, and restore's splice
runs meanwhile. The output is read once there (and once by restore), never decoded:
where it is byte for byte the planned chunks, their events are its events. Anything
that differs sends verify to the event-by-event comparison, which names it.
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from operator import attrgetter, is_not
from typing import Any

import msgspec
import numpy as np

from tracestream import _native
from tracestream.commands.report_shape import report_specs
from tracestream.commands.restore import HashingWriter, Undo, splice_back
from tracestream.engine import build_plan
from tracestream.errors import TraceError
from tracestream.index.builder import TraceIndex, timebase
from tracestream.index.extract import (
    SHAPE_DECIMAL,
    SHAPE_INTEGER,
    binds_next,
    double_values,
    duplicate_key,
    kineto_column,
    llround_column,
    read_span,
)
from tracestream.index.records import RecordStore, concat_rows, same_rows, take_rows
from tracestream.model import (
    ACTIVITY_KINDS,
    GUIDE_CATEGORY,
    KERNEL,
    LAYER_GUIDE,
    PROVENANCE_KEY,
    TIMING,
    CategoryKinds,
    decode_head,
)
from tracestream.parallel.memory import release_memory
from tracestream.parallel.pool import outcome
from tracestream.parallel.slots import deliver, received
from tracestream.plan.planner import DELETE, KEEP, Plan
from tracestream.plan.report import find_report, load_report
from tracestream.read.document import SETTLE, DocumentScanner, Layout, iter_events
from tracestream.read.sizing import pool_for
from tracestream.read.source import FileComparison, ReadStats, TraceSource
from tracestream.write.relocate import provenance_match, provenance_of, relocate, unrelocate
from tracestream.write.rewrite import StreamCursor, chunk_edits, dropped_last, edits, rewrite_chunk

_MAX_LISTED = 5
# Chunks between heap trims (workers.release_memory). Each trim hands freed pages back
# and the next chunk's buffers fault them in again (page faults were most of verify's
# system time); these counts keep a 1 GB run's tree PSS under its 250 MiB target.
_TRIM_EVERY = 32  # output chunks between the main process's trims: each trim made it fault its
# buffers in again (while it compares the nightly output: ~300k faults at 8, ~130k at 32;
# tree PSS +5-10 MiB)
_WORKER_TRIM_EVERY = 32  # in a worker, whose heap keeps freed memory (keep_freed_memory): at
# 8, with restore's trims at 8 too, ~0.6 s more system time a nightly run for ~6 MiB less PSS
_ROWS_HELD = 1 << 11  # check records held as tuples before they go to their store
_CHECK_BUDGET = 4 << 20  # per store of output-only check records; the rest spills to disk


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Verdict:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def add(self, name: str, problems: list[str], passed: str, *, total: int | None = None
            ) -> None:
        """A check: failed with `problems` (the first few of `total`, when given), else
        passed."""
        total = len(problems) if total is None else total
        if problems:
            more = f" (+{total - _MAX_LISTED} more)" if total > _MAX_LISTED else ""
            self.checks.append(Check(name, False, "; ".join(problems[:_MAX_LISTED]) + more))
        else:
            self.checks.append(Check(name, True, passed))

    def summary(self) -> str:
        head = "verified: all checks hold" if self.ok else (
            f"NOT verified: {sum(not c.ok for c in self.checks)} check(s) failed")
        lines = [head]
        for c in self.checks:
            lines.append(f"  [{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"verdict": "ok" if self.ok else "failed",
                "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks]}


_TEXT_VALUES = msgspec.json.Decoder(float_hook=lambda text: _Num(text))


class _Num(str):
    """A float kept as its text, so comparisons are digit for digit."""

    def __repr__(self) -> str:
        return str(self)


def first_difference(a: bytes, b: bytes) -> str:
    """'field ts: 1.5 vs 1.6' for the first value that differs between two events."""
    try:
        x, y = _TEXT_VALUES.decode(a), _TEXT_VALUES.decode(b)
    except msgspec.DecodeError:
        return "not comparable JSON"
    path = _diff(x, y, "")
    return path or "same values, different bytes"


def _diff(x: Any, y: Any, path: str) -> str | None:
    if isinstance(x, dict) and isinstance(y, dict):
        for key in list(x) + [k for k in y if k not in x]:
            if key not in y:
                return f"field {path}{key}: {_show(x[key])} vs missing"
            if key not in x:
                return f"field {path}{key}: missing vs {_show(y[key])}"
            found = _diff(x[key], y[key], f"{path}{key}.")
            if found:
                return found
        if list(x) != list(y):
            return f"field order of {path or 'event'} differs"
        return None
    if isinstance(x, list) and isinstance(y, list):
        if len(x) != len(y):
            return f"field {path.rstrip('.')}: {len(x)} items vs {len(y)}"
        for i, (a, b) in enumerate(zip(x, y)):
            found = _diff(a, b, f"{path}{i}.")
            if found:
                return found
        return None
    if type(x) is not type(y) or x != y:
        return f"field {path.rstrip('.')}: {_show(x)} vs {_show(y)}"
    return None


def _show(value: Any) -> str:
    text = msgspec.json.encode(value).decode() if not isinstance(value, _Num) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _events(source: TraceSource, stats: ReadStats) -> tuple[DocumentScanner, Iterator]:
    scanner = DocumentScanner(source.read(stats))
    return scanner, iter_events(scanner.chunks())


def _short(raw: bytes) -> str:
    try:
        head = decode_head(raw)
        return f"{head.ph} {head.name!r} pid {head.pid} tid {head.tid} ts {head.ts}"
    except msgspec.MsgspecError:
        return raw[:60].decode(errors="replace")


class _OutputChecks:
    """Checks that look at the output alone, fed one event at a time."""

    def __init__(self, report: dict, tmpdir: str | None):
        self.synthetic: dict[tuple, str] = {}
        groups = report.get("compaction", report).get("groups", []) if "options" in report else []
        for g in groups:
            for tid in g.get("lane_tids", []):
                self.synthetic[(g["display_pid"], tid)] = (
                    f"lane tid {tid} of pid {g['display_pid']}"
                )
        if "guide_tid" in report:
            self.synthetic[(report["pid"], report["guide_tid"])] = "the guide track"
        self.track_ids: dict[tuple, int] = {}
        dtype = np.dtype([("track", "<i8"), ("start", "<i8"), ("end", "<i8")])
        self.depth = {v: RecordStore(dtype, sort_keys=("track", "start"), tmpdir=tmpdir,
                                     budget=_CHECK_BUDGET)
                      for v in ("exact", "round", "trunc")}
        # relocated activities and flows, once by their original track, once by their lane
        self.binding = {side: RecordStore(_BIND_DTYPE, sort_keys=("track", "key"),
                                          tmpdir=tmpdir, budget=_CHECK_BUDGET)
                        for side in ("source", "lane")}
        # Perfetto's two imports of a number through a double agree wherever ×1000 lands on
        # an integer (every epoch-µs value): while each batch's truncating rows are its
        # rounding rows, they are held once, in the `round` store (see `_append_depth`)
        self.trunc_is_round = True
        # original tracks whose moved activities the binding check keeps (None: all; see
        # `bind_only_on`), and whether every relocated flow came from one of them
        self._flow_sources: set | None = None
        self.sources_complete = True
        self._tmpdir = tmpdir
        self._rows: dict[str, list] = {v: [] for v in self.depth}
        self._bind_rows: list = []
        self.guides = GuideOrder(report.get("layers"))
        self.kinds = CategoryKinds()
        self.kernels: dict[tuple, int] = {}
        self.streams: dict[tuple, set] = {}
        self.problems: list[str] = []
        self.lane_slices: dict[tuple, int] = {}  # slices per synthetic track
        self.relocated_events = 0
        self.relocated_flows = 0

    @classmethod
    def of_chunk(cls, synthetic: dict[tuple, str]) -> _OutputChecks:
        """Checks that keep what one chunk's events give (in a worker, for `merge`)."""
        checks = cls({}, None)
        checks.synthetic = synthetic
        checks.depth = {v: _Kept(store.dtype) for v, store in checks.depth.items()}
        checks.trunc_is_round = False  # a chunk's facts carry every variant
        checks.binding = {v: _Kept(store.dtype) for v, store in checks.binding.items()}
        checks.guides = _GuidesSeen()
        return checks

    def facts(self) -> tuple:
        """What `of_chunk` checks saw, for `merge` (each store's batches joined in order:
        a chunk whose events went one at a time through `observe` made many small ones)."""
        self._flush()
        return (list(self.track_ids), {v: kept.joined() for v, kept in self.depth.items()},
                {v: kept.joined() for v, kept in self.binding.items()}, self.guides.columns(),
                self.kernels, self.streams, self.lane_slices, self.problems,
                self.relocated_events, self.relocated_flows)

    def merge(self, facts: tuple) -> None:
        """Take a chunk's `facts` as if its events were observed here, in order."""
        (tracks, depth, binding, guides, kernels, streams, lane_slices, problems, moved,
         flows) = facts
        self._flush()
        if self._flow_sources is not None:
            binding = {**binding, "source": self._on_flow_sources(tracks, binding["source"])}
        ids = np.array([self._track(key) for key in tracks] + [0], np.int64)  # (never empty)
        for kept in (depth, binding):
            for batches in kept.values():
                for batch in batches:
                    batch["track"] = ids[batch["track"]]
        self._append_depth({v: concat_rows(batches) if len(batches) > 1 else batches[0]
                            for v, batches in depth.items() if batches})
        for name, batches in binding.items():
            for batch in batches:
                self.binding[name].append(batch)
        self.guides.observe_many(*guides)
        for key, count in kernels.items():
            self.kernels[key] = self.kernels.get(key, 0) + count
        for key, tids in streams.items():
            self.streams.setdefault(key, set()).update(tids)
        for key, count in lane_slices.items():
            self.lane_slices[key] = self.lane_slices.get(key, 0) + count
        self.problems.extend(problems)
        self.relocated_events += moved
        self.relocated_flows += flows

    def bind_only_on(self, sources: set) -> None:
        """Keep moved activities for the binding check only on these original tracks (a
        superset of those the relocated flows come from, e.g. every source track with GPU
        flows): an activity on a track without flows binds nothing, and its rows would be
        stored, sorted and swept for nothing. A relocated flow from another track clears
        `sources_complete`: that flow's activities may be gone, and the caller must not
        trust the binding check then."""
        self._flow_sources = sources

    def _on_flow_sources(self, tracks: list, batches: list) -> list:
        """A chunk's source-side binding rows (`tracks` its track keys) less the moved
        activities on tracks outside `bind_only_on`'s."""
        kept = np.array([key in self._flow_sources for key in tracks] + [False])
        out = []
        for batch in batches:
            flows = batch["mode"] != _ACTIVITY
            if not kept[batch["track"][flows]].all():
                self.sources_complete = False
            out.append(take_rows(batch, flows | kept[batch["track"]]))
        return out

    def _track(self, key: tuple) -> int:
        tid = self.track_ids.get(key)
        if tid is None:
            tid = self.track_ids[key] = len(self.track_ids)
        return tid

    def observe(self, ordinal: int, raw: bytes) -> None:
        head = decode_head(raw)
        prov = provenance_of(raw) if b"_compact_gpu_track" in raw else None
        if prov is not None:
            self.relocated_events += 1
        if head.ph in ("s", "t", "f") and prov is not None:
            self.relocated_flows += 1
            ts = timebase.parse_decimal(bytes(TIMING.decode(raw).ts)).floor_ns()
            orig = (msgspec.json.decode(prov[0]), msgspec.json.decode(prov[1]))
            mode = _NEXT_FLOW if binds_next(head.ph, head.bp) else _FLOW
            self._bind_rows.append((self._track(orig), self._track((head.pid, head.tid)),
                                    ts, ts, mode, ordinal))
            return
        if head.ph != "X":
            return
        kind = self.kinds[head.cat]
        if kind in ACTIVITY_KINDS:
            orig = (head.pid, head.tid) if prov is None else (
                msgspec.json.decode(prov[0]), msgspec.json.decode(prov[1]))
            device = head.args.device if head.args is not None else None
            key = (orig[0], device)
            self.streams.setdefault(key, set()).add(orig[1])
            if kind == KERNEL:
                self.kernels[key] = self.kernels.get(key, 0) + 1
        key = (head.pid, head.tid)
        on_synthetic = key in self.synthetic
        if not on_synthetic and prov is None:
            return
        timing = TIMING.decode(raw)
        ts_text, dur_text = bytes(timing.ts), bytes(timing.dur)
        if on_synthetic:
            if not ts_text or not dur_text:
                self.problems.append(f"event {ordinal} on {self.synthetic[key]} has no ts/dur")
                return
            self.lane_slices[key] = self.lane_slices.get(key, 0) + 1
            track = self._track(key)
            ts = timebase.parse_decimal(ts_text)
            end = (ts + timebase.parse_decimal(dur_text)).ceil_ns()
            ts_r, ts_t = timebase.imported_ns(ts_text)
            dur_r, dur_t = timebase.imported_ns(dur_text)
            self._rows["exact"].append((track, ts.floor_ns(), end))
            self._rows["round"].append((track, ts_r, ts_r + dur_r))
            self._rows["trunc"].append((track, ts_t, ts_t + dur_t))
            if head.cat == GUIDE_CATEGORY:
                self.guides.observe(ts_r, ts_r + dur_r, head.name)
        if prov is not None and kind in ACTIVITY_KINDS:
            ts = timebase.parse_decimal(ts_text)
            end = (ts + timebase.parse_decimal(dur_text)).ceil_ns()
            orig = (msgspec.json.decode(prov[0]), msgspec.json.decode(prov[1]))
            self._bind_rows.append((self._track(orig), self._track((head.pid, head.tid)),
                                    ts.floor_ns(), end, _ACTIVITY, ordinal))
        if len(self._bind_rows) > _ROWS_HELD or len(self._rows["exact"]) > _ROWS_HELD:
            self._flush()

    def observe_chunk(self, first: int, raws: list | None, content: bytes) -> None:
        """`observe` of a whole chunk of output events (`raws`, the first numbered `first`;
        `content` their bytes): decoded at once, their ts/dur texts parsed as columns.

        Only for an output whose source holds no provenance key (so an event carries
        provenance exactly when its `args` hold the key, see `_fast_compare`). A chunk
        whose numbers are not all written in Kineto's shapes goes an event at a time
        (`_observe_events`). (`raws` None: read from `content`.)
        """
        document = None
        events = _scanned(content)
        if events is None:
            document = b"".join((b"[", content, b"]"))  # one copy (a + b + c copies twice)
            try:
                events = _CHECK_EVENTS.decode(document)
            except msgspec.ValidationError:
                events = None
        if events is None or (raws is not None and len(events) != len(raws)):
            for i, raw in enumerate(_raws(content, document) if raws is None else raws):
                self.observe(first + i, bytes(raw))
            return
        timed = _Timed(events)
        if not self._observe_columns(first, events, timed):
            if document is None:  # a scan: its events one by one are msgspec's, all at once
                document = b"".join((b"[", content, b"]"))
                events = _CHECK_EVENTS.decode(document)
            self._observe_events(first, _raws(content, document) if raws is None else raws,
                                 events, timed)

    def _observe_columns(self, first: int, events, timed: _Timed) -> bool:
        """`observe_chunk` a column at a time; False (nothing observed) when the chunk has
        numbers `NumberColumn` leaves to timebase.

        This runs on every event of the output, so each event's fields are read once, by
        one C pass where the extension is built (`_check_columns`), and its track (pid,
        tid) becomes one integer (`_TrackCodes`); the rest is numpy, a few sorts a chunk."""
        ts, dur = timed
        codes, devices = _TrackCodes(), _Interned()
        phase, kind, track, origin, moved, device = _check_columns(events, self.kinds, codes,
                                                                   devices)
        is_x, is_flow = phase == _PH_X, phase == _PH_FLOW
        flows = np.flatnonzero(moved & is_flow)
        on_synthetic = is_x & np.isin(track, codes.known(self.synthetic))
        timed_ok = ts.regular & dur.regular
        if (~timed_ok[on_synthetic | (is_x & moved)]).any() or (~ts.regular[flows]).any():
            return False
        is_activity = is_x & _IS_ACTIVITY[kind.view(np.uint8)]
        synthetic = np.flatnonzero(on_synthetic)
        # flows and moved activities, in event order
        at = np.flatnonzero(moved & (is_flow | is_activity))
        # tracks are numbered as `observe` meets them: per event, its synthetic track,
        # then (moved) its original track and its lane (codes are never negative)
        met = np.full((len(events), 3), -1, np.int64)
        met[synthetic, 0] = track[synthetic]
        met[at, 1], met[at, 2] = origin[at], track[at]
        in_order = np.fromiter(dict.fromkeys(met[met >= 0].tolist()), np.int64)
        by_code = np.argsort(in_order)
        distinct = in_order[by_code]
        numbered = np.array(list(map(self._track, codes.keys(in_order))), np.int64)[by_code]
        self.relocated_events += int(moved.sum())
        self.relocated_flows += len(flows)
        activity = np.flatnonzero(is_activity)
        self._count_streams(codes, devices, origin[activity], device[activity],
                            kind[activity] == KERNEL)
        lanes, first_slice, slices = np.unique(track[synthetic], return_index=True,
                                               return_counts=True)
        for k in np.argsort(first_slice).tolist():
            key = codes.key(int(lanes[k]))
            self.lane_slices[key] = self.lane_slices.get(key, 0) + int(slices[k])
        # (a category of GUIDE_CATEGORY is of kind LAYER_GUIDE: only those events are read)
        maybe_guides = synthetic[kind[synthetic] == LAYER_GUIDE].tolist()
        guides = [(i, _decoded_name(name)) for i, cat, name in zip(
            maybe_guides, _values(events, maybe_guides, "cat"),
            _values(events, maybe_guides, "name")) if cat == GUIDE_CATEGORY]
        mode = np.full(len(at), _ACTIVITY, np.int64)
        flow_list = flows.tolist()
        mode[np.searchsorted(at, flows)] = [
            _NEXT_FLOW if binds_next(ph, bp) else _FLOW
            for ph, bp in zip(_values(events, flow_list, "ph"), _values(events, flow_list, "bp"))]
        ids = partial(_numbered, distinct, numbered)
        self._emit(first, timed, synthetic.tolist(), ids(track[synthetic]).tolist(), [],
                   guides)
        self._emit_binds(first, timed, at, ids(origin[at]), ids(track[at]), mode)
        return True

    def _count_streams(self, codes: _TrackCodes, devices: _Interned, streams: np.ndarray,
                       device: np.ndarray, is_kernel: np.ndarray) -> None:
        """`observe`'s per-GPU stream sets and kernel counts of a chunk's activities (their
        original tracks, device numbers and whether each is a kernel), a GPU (pid, device)
        at a time: a chunk holds activities of a few GPUs and of hundreds of streams."""
        if not len(streams):
            return
        gpu = (streams >> 32) * len(devices) + device  # the pid's number and the device's
        gpus, first_at = np.unique(gpu, return_index=True)
        tids = streams & 0xFFFFFFFF
        keys = {}
        for k in np.argsort(first_at).tolist():
            at = int(first_at[k])
            key = keys[int(gpus[k])] = (codes.pids.value(int(streams[at]) >> 32),
                                        devices.value(int(device[at])))
            at_gpu = tids if len(gpus) == 1 else tids[gpu == gpus[k]]
            self.streams.setdefault(key, set()).update(
                map(codes.tids.value, np.unique(at_gpu).tolist()))
        if len(gpus) == 1:
            found = [(int(gpus[0]), int(is_kernel.sum()))] if is_kernel.any() else []
        else:
            kernel_gpus, first_kernel, kernels = np.unique(gpu[is_kernel], return_index=True,
                                                           return_counts=True)
            in_order = np.argsort(first_kernel)
            found = zip(kernel_gpus[in_order].tolist(), kernels[in_order].tolist())
        for at_gpu, count in found:
            self.kernels[keys[at_gpu]] = self.kernels.get(keys[at_gpu], 0) + count

    def _observe_events(self, first: int, raws: list, events: list, timed: _Timed) -> None:
        """`observe_chunk` an event at a time, in the order `observe` numbers new tracks;
        events with numbers timebase must read go through `observe`."""
        ts, dur = timed
        ts_ok, both_ok = ts.regular.tolist(), (ts.regular & dur.regular).tolist()
        depth: list[int] = []  # events on synthetic tracks
        tracks: list[int] = []  # ... and their tracks
        binds: list[tuple[int, int, int, int]] = []  # (event, source track, lane track, mode)
        guides: list[tuple[int, Any]] = []  # (event, name)
        synthetic, kinds, track = self.synthetic, self.kinds, self._track
        streams, kernels, lane_slices = self.streams, self.kernels, self.lane_slices
        for k, e in enumerate(events):
            args = e.args
            origin = None if args is None else args.origin
            ph = e.ph
            key = (e.pid, e.tid)
            on_synthetic = ph == "X" and key in synthetic
            if (not both_ok[k] and (on_synthetic or (ph == "X" and origin is not None))) or (
                    not ts_ok[k] and origin is not None and ph in _FLOW_PHASES):
                self._emit(first, timed, depth, tracks, binds, guides)
                self.observe(first + k, bytes(raws[k]))
                continue
            if origin is not None:
                self.relocated_events += 1
                if ph in _FLOW_PHASES:
                    self.relocated_flows += 1
                    mode = _NEXT_FLOW if binds_next(ph, e.bp) else _FLOW
                    binds.append((k, track((origin.pid, origin.tid)), track(key), mode))
                    continue
            if ph != "X":
                continue
            kind = kinds[e.cat]
            activity = kind in ACTIVITY_KINDS
            if activity:
                orig = key if origin is None else (origin.pid, origin.tid)
                group = (orig[0], args.device if args is not None else None)
                streams.setdefault(group, set()).add(orig[1])
                if kind == KERNEL:
                    kernels[group] = kernels.get(group, 0) + 1
            if on_synthetic:
                lane_slices[key] = lane_slices.get(key, 0) + 1
                depth.append(k)
                tracks.append(track(key))
                if e.cat == GUIDE_CATEGORY:
                    guides.append((k, _name(e)))
            if origin is not None and activity:
                binds.append((k, track((origin.pid, origin.tid)), track(key), _ACTIVITY))
        self._emit(first, timed, depth, tracks, binds, guides)

    def _emit(self, first: int, timed: _Timed, depth: list[int], tracks: list[int],
              binds: list, guides: list) -> None:
        """The rows gathered for a chunk (the lists are emptied), after what `observe`
        holds, so the stores get them in event order: slices on synthetic tracks (event,
        track), flows and moved activities (event, source track, lane track, mode), guides
        (event, name)."""
        self._flush()
        ts, dur = timed
        if depth:
            at = np.array(depth, np.int64)
            batches = {}
            for variant, start, length in (("exact", ts.exact, dur.exact),
                                           ("round", ts.rounded, dur.rounded),
                                           ("trunc", ts.truncated, dur.truncated)):
                rows = batches[variant] = np.empty(len(at), self.depth[variant].dtype)
                rows["track"], rows["start"] = tracks, start[at]
                rows["end"] = rows["start"] + length[at]
            self._append_depth(batches)
            depth.clear()
            tracks.clear()
        if guides:
            at = np.array([k for k, _ in guides], np.int64)
            starts = ts.rounded[at]
            self.guides.observe_many(starts, starts + dur.rounded[at],
                                     [name for _, name in guides])
            guides.clear()
        if binds:
            self._emit_binds(first, timed, *(np.array(column, np.int64)
                                             for column in zip(*binds)))
            binds.clear()

    def _emit_binds(self, first: int, timed: _Timed, at: np.ndarray, source: np.ndarray,
                    lane: np.ndarray, mode: np.ndarray) -> None:
        """`_emit`'s flows and moved activities, as columns (event, source track, lane
        track, mode)."""
        if not len(at):
            return
        ts, dur = timed
        start = ts.exact[at]
        end = np.where(mode == _ACTIVITY, start + dur.exact[at], start)
        for side, sides in (("source", source), ("lane", lane)):
            records = np.empty(len(at), _BIND_DTYPE)
            records["track"], records["key"], records["end"] = sides, start, end
            records["mode"], records["ordinal"] = mode, at + first
            self.binding[side].append(records)

    def _append_depth(self, batches: dict[str, np.ndarray]) -> None:
        """One batch of depth rows per variant (the same slices, in order) to their stores;
        the truncating rows only once they differ from the rounding ones (from then on the
        `trunc` store holds every row, the `round` store's earlier ones copied first)."""
        if self.trunc_is_round and "trunc" in batches:
            if same_rows(batches["round"], batches["trunc"]):
                batches = {v: rows for v, rows in batches.items() if v != "trunc"}
            else:
                self.trunc_is_round = False
                for block in self.depth["round"].sorted_blocks():
                    self.depth["trunc"].append(block.copy())
        for variant, rows in batches.items():
            self.depth[variant].append(rows)

    def depth_stores(self) -> dict:
        """The depth rows' store of each variant (`trunc` the `round` one while they agree)."""
        self._flush()
        return {**self.depth, "trunc": self.depth["round"]} if self.trunc_is_round else dict(
            self.depth)

    def _flush(self) -> None:
        if self._rows["exact"]:
            self._append_depth({v: np.array(rows, dtype=self.depth[v].dtype)
                                for v, rows in self._rows.items()})
            for rows in self._rows.values():
                rows.clear()
        if self._bind_rows:
            rows = np.array(self._bind_rows, dtype=_BIND_ROW_DTYPE)
            for side, store in self.binding.items():
                records = np.empty(len(rows), _BIND_DTYPE)
                records["track"] = rows[side]
                for name in ("key", "end", "mode", "ordinal"):
                    records[name] = rows[name]
                store.append(records)
            self._bind_rows.clear()

    def close(self) -> None:
        for store in list(self.depth.values()) + list(self.binding.values()):
            store.close()

    def depth_problems(self) -> list[str]:
        """Slices on a synthetic track that Perfetto would import below depth zero.

        Perfetto sorts a track's slices by start, those starting together longest first,
        and closes a slice only when its end <= the next start: a slice nests when it
        starts before an earlier one ends, and slices that start at the same nanosecond
        nest unless all of them are zero-length. The sorted records are read a block at a
        time (`nesting_in_block`).
        """
        names = {v: k for k, v in self.track_ids.items()}
        problems = list(self.problems)  # slices on a synthetic track without ts or dur
        rounding: list = []  # the rounding import's findings, the truncating one's too
        for variant, store in self.depth_stores().items():
            if variant == "trunc" and self.trunc_is_round:
                found = rounding
            else:
                state = _NestState()
                found = [nested for block in store.sorted_blocks()
                         for nested in nesting_in_block(block, state)]
            if variant == "round":
                rounding = found
            for track, start, before in found:
                where = f"{self.synthetic[names[track]]}: a slice starting at {start} ns"
                if before is None:
                    problems.append(
                        f"{where} starts with another there, one of them longer: "
                        f"Perfetto nests the shorter ({variant} import) -> depth 1")
                else:
                    problems.append(f"{where} overlaps one ending at {before} ns "
                                    f"({variant} import) -> depth 1")
        return problems

    def binding_problems(self) -> list[str]:
        """Each relocated flow binds on its lane, under Perfetto's rules, to the activity it
        binds to on its original stream (see `perfetto_bindings`)."""
        self._flush()
        found = {}
        for side, store in self.binding.items():
            found[side] = RecordStore(_BOUND_DTYPE, sort_keys=("flow", "bound"),
                                      tmpdir=self._tmpdir, budget=_CHECK_BUDGET)
            for rows in perfetto_bindings(store.sorted_blocks()):
                found[side].append(rows)
        problems = []
        try:
            for (flow, source), (_, lane) in zip(_rows(found["source"].sorted_blocks()),
                                                 _rows(found["lane"].sorted_blocks())):
                if source < 0:
                    problems.append(f"flow event {flow} binds to "
                                    f"{0 if source == _NONE else 'several'} activities")
                elif lane == _NONE:
                    problems.append(
                        f"flow event {flow} is not on the lane of the activity it binds to")
                elif lane != source:
                    what = "several activities" if lane == _MANY else f"output event {lane}"
                    problems.append(
                        f"flow event {flow} binds on its lane to {what}, not to event {source} "
                        "it binds to on its original stream")
        finally:
            for store in found.values():
                store.close()
        return problems


@dataclass
class _NestState:
    """Where `nesting_in_block` left off: the last record's track and start, the latest end
    of the slices that started before that start on the track (or the track's first start),
    and the latest end of those that start there."""

    track: int | None = None
    before: int = 0
    together: int = 0
    together_end: int = 0


def nesting_in_block(block: np.ndarray, state: _NestState) -> list[tuple[int, int, int | None]]:
    """(track, start, before) of each slice in `block` (records in (track, start) order,
    following those `state` saw) that Perfetto nests: `before` the end of an earlier slice
    it starts before, or None for a slice starting with others, one of them longer than
    zero (at or before it in the block's order). Updates `state` for the next block.

    The per-slice rule in columns: a slice starting a group (its start differs from the
    previous record's) nests when its start is before the latest end of the track's
    earlier groups (or the track's first start); any other one when some slice of its
    group, up to it, ends after the start.
    """
    track, start, end = block["track"], block["start"], block["end"]
    n = len(track)
    if n == 0:
        return []
    new_track = np.empty(n, bool)
    new_track[0] = int(track[0]) != state.track
    np.not_equal(track[1:], track[:-1], out=new_track[1:])
    new_group = new_track.copy()
    new_group[0] |= int(start[0]) != state.together
    new_group[1:] |= start[1:] != start[:-1]
    continues = not new_group[0]  # the first record joins the group `state` ends in
    # slices starting together: one of the group up to this slice ends after its start
    longer = end > start
    if continues:
        longer[0] |= state.together_end > int(start[0])
    seen = np.cumsum(longer)
    groups = np.flatnonzero(new_group)
    group_of = np.cumsum(new_group) - 1 + (1 if continues else 0)
    group_starts = np.concatenate(([0], groups)) if continues else groups
    seen_before = (seen - longer)[group_starts]
    together = ~new_group & (seen - seen_before[group_of] > 0)
    # the latest end of each group, then per track the latest end of its earlier groups
    group_end = np.maximum.reduceat(end, group_starts)
    if continues:
        group_end[0] = max(int(group_end[0]), state.together_end)
    group_track = track[group_starts]
    group_first = start[group_starts]
    before = np.empty(len(group_starts), np.int64)
    track_bounds = np.flatnonzero(np.concatenate(([True], group_track[1:] != group_track[:-1],
                                                  [True])))
    for lo, hi in zip(track_bounds[:-1].tolist(), track_bounds[1:].tolist()):
        if lo == 0 and not new_track[0]:  # the track `state` was on goes on
            base = state.before if continues else max(state.before, state.together_end)
        else:
            base = int(group_first[lo])
        before[lo] = base
        if hi - lo > 1:
            np.maximum.accumulate(np.maximum(group_end[lo:hi - 1], base), out=before[lo + 1:hi])
    overlaps = new_group & (start < before[group_of])
    state.track, state.together = int(track[-1]), int(start[-1])
    state.before, state.together_end = int(before[-1]), int(group_end[-1])
    found = []
    rows = np.flatnonzero(overlaps | together)
    for t, s, b, o in zip(track[rows].tolist(), start[rows].tolist(),
                          before[group_of[rows]].tolist(), overlaps[rows].tolist()):
        found.append((t, s, b if o else None))
    return found


class _Kept:
    """Record batches as a chunk's checks made them (a RecordStore's `append`)."""

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.batches: list[np.ndarray] = []

    def append(self, batch: np.ndarray) -> None:
        self.batches.append(batch)

    def joined(self) -> list[np.ndarray]:
        """The batches as one, in order (none if there are none)."""
        if len(self.batches) > 1:
            self.batches = [np.concatenate(self.batches)]
        return self.batches


class _GuidesSeen:
    """A chunk's guides as `GuideOrder` would get them, in order: their start and end
    (ns) and names, handed to `GuideOrder.observe_many` as columns."""

    def __init__(self):
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.names: list = []

    def observe(self, start: int, end: int, name: Any) -> None:
        self.starts.append(start)
        self.ends.append(end)
        self.names.append(name)

    def observe_many(self, starts: np.ndarray, ends: np.ndarray, names: list) -> None:
        self.starts.extend(starts.tolist())
        self.ends.extend(ends.tolist())
        self.names.extend(names)

    def columns(self) -> tuple:
        try:
            return np.array(self.starts, np.int64), np.array(self.ends, np.int64), self.names
        except OverflowError:  # a value timebase read past int64: checked one at a time
            return self.starts, self.ends, self.names


class _Interned:
    """Values (decoded JSON scalars) numbered in the order first met: equal values (as a
    dict's keys are equal) share a number."""

    def __init__(self):
        self._numbers: dict = {}
        self._values: list = []

    def of(self, values: list) -> np.ndarray:
        """The numbers of `values`, as a column."""
        numbers = self._numbers
        for value in dict.fromkeys(values):  # the distinct values, a few
            if value not in numbers:
                numbers[value] = len(self._values)
                self._values.append(value)
        return np.fromiter(map(numbers.__getitem__, values), np.int64, len(values))

    @property
    def table(self) -> tuple[dict, list]:
        """(value -> number, values by number), for the C extension to extend in place."""
        return self._numbers, self._values

    def __len__(self) -> int:
        return len(self._values)

    def number(self, value) -> int | None:
        return self._numbers.get(value)

    def value(self, number: int):
        return self._values[number]


class _TrackCodes:
    """Tracks (pid, tid) as one int64 each: the pid's number in the high half, the tid's
    in the low one (`_Interned`), so a chunk's tracks are compared, grouped and counted
    in numpy, each event's pid and tid hashed once."""

    def __init__(self):
        self.pids, self.tids = _Interned(), _Interned()

    def of(self, pids: list, tids: list) -> np.ndarray:
        return (self.pids.of(pids) << 32) | self.tids.of(tids)

    def key(self, code: int) -> tuple:
        return self.pids.value(code >> 32), self.tids.value(code & 0xFFFFFFFF)

    def keys(self, codes: np.ndarray) -> list[tuple]:
        """`key` of each of `codes`."""
        return list(zip(map(self.pids.value, (codes >> 32).tolist()),
                        map(self.tids.value, (codes & 0xFFFFFFFF).tolist())))

    def known(self, keys: Iterable[tuple]) -> np.ndarray:
        """The codes of those `keys` whose pid and tid were both met."""
        codes = []
        for pid, tid in keys:
            p, t = self.pids.number(pid), self.tids.number(tid)
            if p is not None and t is not None:
                codes.append((p << 32) | t)
        return np.array(codes, np.int64)


_PH_OTHER, _PH_X, _PH_FLOW = range(3)  # `_check_columns`' phase codes
_IS_ACTIVITY = np.zeros(256, bool)  # by kind (as uint8)
_IS_ACTIVITY[list(ACTIVITY_KINDS)] = True
_ACTIVITY_MASK = _IS_ACTIVITY.tobytes()  # the same, for the C extension


def _check_columns(events, kinds: CategoryKinds, codes: _TrackCodes, devices: _Interned
                   ) -> tuple[np.ndarray, ...]:
    """What the output-only checks read of a chunk's events (a list of `_CheckEvent`, or
    their scan where the extension is built, see `_scanned`), as columns:
    (phase: _PH_X, _PH_FLOW for s/t/f, else _PH_OTHER; kind: kinds[cat] of X events, else
    0; track code; original track code: the provenance's for a moved flow or activity,
    else the track; moved: has provenance; device number of activities, else -1).

    One pass of the C extension's check_columns where it is built; this Python is its
    tested twin. Both number the values in the same order: every event's pid and tid,
    then the moved flows' and activities' provenance pid and tid, then the activities'
    devices."""
    if _native.native is not None:
        columns = _native.native.check_columns(
            events, kinds, _ACTIVITY_MASK, codes.pids.table, codes.tids.table, devices.table)
        return tuple(np.frombuffer(column, dtype) for column, dtype in zip(
            columns, (np.int8, np.int8, np.int64, np.int64, bool, np.int64)))
    count = len(events)
    phases = np.array(list(map(_PHASE, events)), object)
    phase = np.full(count, _PH_OTHER, np.int8)
    phase[(phases == "s") | (phases == "t") | (phases == "f")] = _PH_FLOW
    phase[phases == "X"] = _PH_X
    args = list(map(_ARGS, events))
    origins = list(map(getattr, args, repeat("origin"), repeat(None)))
    moved = np.fromiter(map(is_not, origins, repeat(None)), bool, count)
    track = codes.of(list(map(_PID, events)), list(map(_TID, events)))
    xs = np.flatnonzero(phase == _PH_X).tolist()
    kind = np.zeros(count, np.int8)
    kind[xs] = list(map(kinds.__getitem__, map(_CAT, map(events.__getitem__, xs))))
    is_activity = (phase == _PH_X) & np.isin(kind, ACTIVITY_KINDS)
    bound_at = np.flatnonzero(moved & (is_activity | (phase == _PH_FLOW)))
    bound = list(map(origins.__getitem__, bound_at.tolist()))
    origin = track.copy()
    origin[bound_at] = codes.of(list(map(_PID, bound)), list(map(_TID, bound)))
    activity = np.flatnonzero(is_activity).tolist()
    device = np.full(count, -1, np.int64)
    device[activity] = devices.of(list(map(getattr, map(args.__getitem__, activity),
                                           repeat("device"), repeat(None))))
    return phase, kind, track, origin, moved, device


def _numbered(distinct: np.ndarray, numbered: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """The track numbers of track `codes`, each one of the sorted `distinct`."""
    return numbered[np.searchsorted(distinct, codes)]


def observed_file_chunk(path: str, offset: int, length: int, first: int,
                        synthetic: dict[tuple, str]) -> tuple | None:
    """`observed_chunk` of a span of a plain file, read by the worker itself."""
    return observed_chunk(read_span(path, offset, length), first, synthetic)


def observed_chunk(content: bytes, first: int, synthetic: dict[tuple, str]) -> tuple | None:
    """The output-only checks' facts of a run of events (`content`, the first numbered
    `first` in the output), in a worker; None when they are not JSON (the per-event
    comparison then names what is wrong)."""
    facts = _facts_of(content, first, synthetic)
    _worker_trim()
    return facts


def _facts_of(content: bytes, first: int, synthetic: dict[tuple, str]) -> tuple | None:
    """What `observed_chunk` says, in the calling process. The decode and the UTF-8 check
    are those the output's scan would make: an output that is these bytes is valid where
    they are."""
    checks = _OutputChecks.of_chunk(synthetic)
    try:
        if not content.isascii():
            content.decode("utf-8")
        checks.observe_chunk(first, None, content)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    return checks.facts()


# gc=False: values decoded from JSON hold no cycles, and untracked structs are quicker to
# make (a chunk's thousands of events are decoded at once)
class _Origin(msgspec.Struct, gc=False):
    pid: Any = None
    tid: Any = None


class _CheckArgs(msgspec.Struct, gc=False):
    device: Any = None
    origin: _Origin | None = msgspec.field(default=None, name=PROVENANCE_KEY)


class _CheckEvent(msgspec.Struct, gc=False):
    """What the output-only checks read of an event (`Head`'s fields, the exact ts/dur
    texts and the provenance's pid and tid), for a chunk at a time. The name is kept as
    its JSON text: only guides' names are read (`_name`)."""

    ph: str | None = None
    cat: Any = None
    name: msgspec.Raw = msgspec.Raw()
    pid: int | str | None = None
    tid: int | str | None = None
    ts: msgspec.Raw = msgspec.Raw()
    dur: msgspec.Raw = msgspec.Raw()
    bp: Any = None
    args: _CheckArgs | None = None


_CHECK_EVENTS = msgspec.json.Decoder(list[_CheckEvent])


def _name(event: _CheckEvent) -> Any:
    """An event's name as `decode_head` reads it (None when it has none)."""
    return _decoded_name(event.name)


def _decoded_name(name: Any) -> Any:
    """A name as `decode_head` reads it: `_CheckEvent`'s text (None when empty), or the
    value a scan gives."""
    if not isinstance(name, msgspec.Raw):
        return name
    return msgspec.json.decode(name) if len(name) else None


_CHECK_EVENT = msgspec.json.Decoder(_CheckEvent)


def _scanned(content: bytes):
    """A chunk's events as the C extension's scan reads them (`_CheckEvent`s one by one,
    the provenance as `_Origin`), or None where it declines them (or is not built): the
    caller then decodes them with msgspec, which decides what is valid. The scan accepts
    only what msgspec accepts with the same values (see `_speedups.scan_events`); it is
    the index pass's, run in the mode that reads a provenance's pid and tid, and its
    answers are held to msgspec's by tests (`tests/test_scan.py`)."""
    if _native.native is None:
        return None
    return _native.native.scan_events(content, msgspec.json.decode, _CHECK_EVENT.decode, None,
                                       False, True)


def _raws(content: bytes, document: bytes | None) -> list:
    """The chunk's events as exact texts (msgspec.Raw)."""
    if document is None:
        document = b"".join((b"[", content, b"]"))
    return _RAW_EVENTS.decode(document)


def _values(events, indices: list[int], key: str) -> list:
    """events[i].<key> for each of the indices (their texts where `_CheckEvent` keeps one)."""
    if _native.native is not None:
        return _native.native.event_values(events, indices, key)
    return [getattr(events[i], key) for i in indices]


_RAW_EVENTS = msgspec.json.Decoder(list[msgspec.Raw])
_PHASE, _ARGS, _PID, _TID, _CAT = (attrgetter(name)
                                   for name in ("ph", "args", "pid", "tid", "cat"))
_FLOW_PHASES = frozenset(("s", "t", "f"))


@dataclass
class NumberColumn:
    """ts or dur texts as Perfetto imports them, a column at a time: the exact value in ns
    (floor and ceil agree on these shapes), llround(double(text) * 1000) and its truncated
    variant (integer literals are exact), and which texts are in Kineto's shapes (integer
    or one to three decimals, see observe.kineto_shapes); the others are left to timebase."""

    exact: np.ndarray
    rounded: np.ndarray
    truncated: np.ndarray
    regular: np.ndarray

    @classmethod
    def parse(cls, texts: list) -> NumberColumn:
        return cls._of(*kineto_column(texts, signed=True), texts)

    @classmethod
    def of_events(cls, events: list, key: str) -> NumberColumn:
        """`parse` of the events' `key` texts (msgspec.Raw), read by the C extension's
        decimal_column where it is built (kineto_column is its tested numpy twin)."""
        if _native.native is None:
            return cls.parse(list(map(attrgetter(key), events)))
        exact, shapes = _native.native.decimal_column(events, key, True)
        return cls._of(np.frombuffer(exact, np.int64), np.frombuffer(shapes, np.int8),
                       _FieldTexts(events, key))

    @classmethod
    def _of(cls, exact: np.ndarray, shapes: np.ndarray, texts) -> NumberColumn:
        integer = shapes == SHAPE_INTEGER
        regular = integer | (shapes == SHAPE_DECIMAL)
        product = double_values(np.where(regular, exact, 0), texts) * 1000.0
        return cls(exact, np.where(integer, exact, llround_column(product)),
                   np.where(integer, exact, np.trunc(product).astype(np.int64)), regular)


class _Timed(tuple):
    """(ts, dur) NumberColumns of a chunk's events."""

    def __new__(cls, events: list) -> _Timed:
        return super().__new__(cls, (NumberColumn.of_events(events, "ts"),
                                     NumberColumn.of_events(events, "dur")))


class _FieldTexts:
    """The `key` texts of `events`, read one at a time (double_values reads the few it
    cannot compute from the exact ns)."""

    def __init__(self, events: list, key: str):
        self._events, self._key = events, key

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, k: int):
        return getattr(self._events[k], self._key)


_ACTIVITY, _FLOW, _NEXT_FLOW = range(3)
_NONE, _MANY = -1, -2  # a flow bound to no activity, or to several
_BIND_ROW_DTYPE = np.dtype([("source", "<i8"), ("lane", "<i8"), ("key", "<i8"), ("end", "<i8"),
                            ("mode", "i1"), ("ordinal", "<i8")])
_BIND_DTYPE = np.dtype([("track", "<i8"), ("key", "<i8"), ("end", "<i8"), ("mode", "i1"),
                        ("ordinal", "<i8")])
"""An activity (key: its start, ns) or a flow (key: its ts, ns) on a track."""
_BOUND_DTYPE = np.dtype([("flow", "<i8"), ("bound", "<i8")])


def _rows(blocks) -> Iterator[tuple[int, int]]:
    for block in blocks:
        yield from zip(block["flow"].tolist(), block["bound"].tolist())


def perfetto_bindings(blocks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """(flow ordinal, ordinal of the activity it binds to, or _NONE/_MANY) for every flow of
    `_BIND_DTYPE` records in (track, key) order, as Perfetto binds v1 flows on a track.

    `s`, `t` and `f` with `"bp": "e"` bind to the slice that starts exactly at them,
    else to the one that encloses them, its end included (a slice ending there has not
    been closed yet). An `f` without `"bp": "e"` binds to the next slice that begins
    at or after it. Records come in start order per track; those of one (track, start)
    are taken together, activities before flows (the key is the start itself, so that
    every timestamp the index accepts fits). The records are taken a block at a time,
    each cut after its last whole (track, key): in columns where a track's activities
    follow one another without overlap (`_bind_in_columns`), else a record at a time
    (`_TrackBindings`), both sharing one state.
    """
    out: list[tuple[int, int]] = []
    state = _TrackBindings(out)
    held = None
    for block in blocks:
        if held is not None and len(held):
            block = np.concatenate((held, block))
        if not len(block):
            continue
        track, key = block["track"], block["key"]
        differ = np.flatnonzero((track != track[-1]) | (key != key[-1]))
        cut = int(differ[-1]) + 1 if len(differ) else 0
        held, block = block[cut:], block[:cut]
        yield from _bind_block(block, state)
        if len(out) > 65536:
            yield np.array(out, _BOUND_DTYPE)
            out.clear()
    if held is not None:
        yield from _bind_block(held, state)
    state.end_track()
    if out:
        yield np.array(out, _BOUND_DTYPE)


def _bind_block(block: np.ndarray, state: _TrackBindings) -> list[np.ndarray]:
    """The bindings of a block of whole (track, key) groups, in columns when they can be."""
    if not len(block):
        return []
    bound = _bind_in_columns(block, state)
    if bound is not None:
        return [bound]
    track, key = block["track"].tolist(), block["key"].tolist()
    end, mode, ordinal = block["end"].tolist(), block["mode"].tolist(), block["ordinal"].tolist()
    lo = 0
    for hi in range(1, len(track) + 1):
        if hi == len(track) or track[hi] != track[lo] or key[hi] != key[lo]:
            state.take((track[lo], key[lo]),
                       [(end[i], ordinal[i]) for i in range(lo, hi) if mode[i] == _ACTIVITY],
                       [(ordinal[i], mode[i]) for i in range(lo, hi) if mode[i] != _ACTIVITY])
            lo = hi
    return []


def _bind_in_columns(block: np.ndarray, state: _TrackBindings) -> np.ndarray | None:
    """`_TrackBindings.take` of every (track, key) group of `block` at once, when each
    track's activities there start one after another, none before its predecessor ends
    (the carried open one included) nor ends before it starts: then a flow binds to the
    activity starting at it, else to the last one started if that encloses it (an `f`
    without `"bp": "e"` to the next one on its track). None (and `state` untouched)
    otherwise. Returns the (flow, bound) rows; flows still waiting stay in `state`."""
    track, key, end = block["track"], block["key"], block["end"]
    mode, ordinal = block["mode"], block["ordinal"]
    is_act = mode == _ACTIVITY
    acts = np.flatnonzero(is_act)
    a_track, a_key, a_end, a_ord = track[acts], key[acts], end[acts], ordinal[acts]
    follows = a_track[1:] == a_track[:-1]
    if np.any(a_end < a_key) or np.any(follows & ((a_key[1:] <= a_key[:-1])
                                                 | (a_end[:-1] > a_key[1:]))):
        return None
    first, last = int(track[0]), int(track[-1])
    carried = None
    if first == state.track:
        still_open = [e for e in state.open if e[0] >= int(key[0])]  # the others have ended
        if len(still_open) > 1 or any(e[0] < e[1] for e in still_open):
            return None
        if still_open:
            carried = still_open[0]
            if len(acts) and int(a_track[0]) == first and carried[0] > int(a_key[0]):
                return None
        waiting, state.open = state.waiting, still_open
    else:
        state.end_track()
        waiting = []
    rows = []
    # flows waiting from the block before bind to the track's next activity
    if waiting:
        if len(acts) and int(a_track[0]) == first:
            rows.append((waiting, int(a_ord[0])))
            waiting = []
        elif last != first:
            rows.append((waiting, _NONE))
            waiting = []
    flows = np.flatnonzero(~is_act)
    f_track, f_key, f_mode = track[flows], key[flows], mode[flows]
    new_group = np.concatenate(((track[1:] != track[:-1]) | (key[1:] != key[:-1]), [True]))
    group_last = np.flatnonzero(new_group)
    group_of = np.cumsum(np.concatenate(([False], new_group[:-1])))
    latest = np.cumsum(is_act)[group_last[group_of[flows]]] - 1  # last activity at or before
    if len(acts):
        at = np.clip(latest, 0, None)
        found = (latest >= 0) & (a_track[at] == f_track)
        c_key, c_end, c_ord = a_key[at], a_end[at], a_ord[at]
    else:
        found = np.zeros(len(flows), bool)
        c_key = c_end = c_ord = np.zeros(len(flows), np.int64)
    if carried is not None:
        from_before = ~found & (f_track == first)
        carried_end, carried_key, carried_ord = carried
        c_key = np.where(from_before, carried_key, c_key)
        c_end = np.where(from_before, carried_end, c_end)
        c_ord = np.where(from_before, carried_ord, c_ord)
        found |= from_before
    exact = found & (c_key == f_key)
    encloses = found & (c_end >= f_key)
    bound = np.where(encloses, c_ord, _NONE)
    following = np.flatnonzero((f_mode == _NEXT_FLOW) & ~exact)
    if len(following):
        after = latest[following] + 1
        has_next = after < len(acts)
        nxt = np.clip(after, 0, max(len(acts) - 1, 0))
        if len(acts):
            has_next &= a_track[nxt] == f_track[following]
        bound[following] = np.where(has_next, a_ord[nxt] if len(acts) else _NONE, _NONE)
        stays = following[~has_next & (f_track[following] == last)]
        waiting = waiting + ordinal[flows[stays]].tolist()
        keep = np.ones(len(flows), bool)
        keep[stays] = False
        flows, bound = flows[keep], bound[keep]
    state.track, state.waiting = last, waiting
    if len(acts) and int(a_track[-1]) == last:
        state.open = [(int(a_end[-1]), int(a_key[-1]), int(a_ord[-1]))]
    elif last != first:
        state.open = []
    result = np.empty(len(flows) + sum(len(w) for w, _ in rows), _BOUND_DTYPE)
    result["flow"][:len(flows)], result["bound"][:len(flows)] = ordinal[flows], bound
    at = len(flows)
    for flows_waiting, to in rows:
        result["flow"][at:at + len(flows_waiting)] = flows_waiting
        result["bound"][at:at + len(flows_waiting)] = to
        at += len(flows_waiting)
    return result


class _TrackBindings:
    """The binding state of one track at a time, for `perfetto_bindings`."""

    def __init__(self, out: list):
        self.out = out
        self.track = None
        self.open: list = []  # (end, start, ordinal) of the track's activities not yet ended
        self.waiting: list[int] = []  # flows binding to the next activity to start

    def end_track(self) -> None:
        self.out.extend((flow, _NONE) for flow in self.waiting)
        self.open, self.waiting = [], []

    def take(self, at: tuple[int, int], activities: list, flows: list) -> None:
        """The activities starting at `at` (track, start ns), then the flows there."""
        track, t = at
        if track != self.track:
            self.end_track()
            self.track = track
        if activities and self.waiting:  # the next slice after them starts here
            bound = activities[0][1] if len(activities) == 1 else _MANY
            self.out.extend((flow, bound) for flow in self.waiting)
            self.waiting = []
        for end, ordinal in activities:
            heapq.heappush(self.open, (end, t, ordinal))
        if not flows:
            return
        while self.open and self.open[0][0] < t:  # ended before these flows (and later ones)
            heapq.heappop(self.open)
        exact = [e for e in self.open if e[1] == t]
        hits = exact or self.open  # every open activity started at or before the flows
        bound = hits[0][2] if len(hits) == 1 else _NONE if not hits else _MANY
        for ordinal, mode in flows:
            if mode == _NEXT_FLOW and not exact:
                self.waiting.append(ordinal)
            else:
                self.out.append((ordinal, bound))


def verify(trace, output, report: str | None = None, *, tmpdir: str | None = None,
           workers: int | None = None) -> Verdict:
    """Check `output` against its source `trace`; TraceError if either cannot be read."""
    trace, output = str(trace), str(output)
    report_path = find_report(output, report)
    data, retired = load_report(report_path)
    verdict = Verdict()
    layer_spec, compact_spec = report_specs(data)
    # workers fork before the reader threads start
    with pool_for(trace, workers) as pool, TraceSource(trace) as source, \
            TraceSource(output, hashes_data=False) as annotated:
        restoring = _Restoring(data, retired, annotated, source, pool)
        try:
            index, plan = build_plan(
                source, layer_spec, compact_spec, output_name=data.get("output_file", ""),
                report_name=data.get("report_file", report_path.name),
                command=data.get("command", ""), tmpdir=tmpdir, pool=pool,
                source_name=data.get("source_file"), after_index=restoring.start,
                hashes_source=not restoring.hashes_source,
            )
        except TraceError as exc:
            if source.first_stats is None:
                raise
            verdict.add("source sha256", _sha_problem(source, data), "matches the report")
            verdict.add("re-plan from the source", [str(exc)], "")
            return verdict
        try:
            # the source's sha256 is asked for last (and listed first): its thread goes on
            # hashing while the output is compared, where waiting for it left the cores idle
            compared = Verdict()
            if not _fast_compare(source, annotated, index, plan, data, retired, compared,
                                 tmpdir, pool, restoring):
                source.start_hashing()  # (where restore's check was to hash the source)
                _compare(source, annotated, index, plan, data, retired, compared, tmpdir)
            verdict.add("source sha256", _sha_problem(source, data),
                        f"{str(data.get('source_sha256', ''))[:16]}… matches the report")
            verdict.checks.extend(compared.checks)
        finally:
            index.close()
    return verdict


def _sha_problem(source: TraceSource, data: dict) -> list[str]:
    actual = source.sha256()
    expected = data.get("source_sha256")
    if actual == expected:
        return []
    return [f"source sha256 {actual[:16]}… differs from the report's {str(expected)[:16]}… "
            "(a report from another source?)"]


class _Restoring:
    """Restore's quick splice of the output file, in a worker, started (`start`) once the
    index pass is done: it needs no plan, and the plan is made on one core.

    For a plain source file the restored bytes are compared with the file's as they are
    made (`restored_matches`), and the file's hash made on the way is the source's
    (`hashes_source`: the main process does not hash it too); else they are hashed, for
    the hash of the source's decompressed bytes its index pass made."""

    def __init__(self, data: dict, retired, annotated: TraceSource, source: TraceSource, pool):
        try:
            self.undo = Undo.from_report(data, retired, annotated.name)
        except TraceError:  # `_compare` says why
            self.undo = None
        self._annotated, self._source, self._pool = annotated, source, pool
        self.hashes_source = (self.undo is not None and annotated.path is not None
                              and source.plain_path is not None)
        self.task = None

    def start(self) -> None:
        if self.hashes_source:
            self.task = self._pool.submit(restored_matches, self._annotated.path, self.undo,
                                          self._source.plain_path)
        elif self.undo is not None and self._annotated.path is not None:
            self.task = self._pool.submit(restored_sha256, self._annotated.path, self.undo)

    def outcome(self) -> tuple[str, str] | None:
        """(why restore's splice failed, "") or ("", the sha256 of the bytes it restores;
        "" where they are not the source file's), or None if it was not started."""
        if self.task is None:
            return None
        if not self.hashes_source:
            return outcome(self.task)
        problem, digest, size, crc32 = outcome(self.task)
        if digest:
            self._source.adopt_sha256(digest, size, crc32)
        return problem, digest


def _fast_compare(source, annotated, index: TraceIndex, plan: Plan, data: dict, retired,
                  verdict: Verdict, tmpdir, pool, restoring: _Restoring) -> bool:
    """Every check, when the output is byte for byte what the plan makes of the source
    (True); else False with nothing added to `verdict`, and `_compare` names what differs.

    The planned output is made again a chunk at a time by the rewrite's splice, its
    numpy twin rather than the C extension the rewrite used (in the workers), and
    compared with the output's chunks as they are read; the output-only checks read
    each planned chunk's events at once, in the worker that made it
    (`_OutputChecks.observe_chunk`): the output is those bytes wherever this returns
    True. Restore's splice has been running since the index pass (`restoring`). A
    source event with provenance in its `args` (the plan refuses those when it
    relocates) leaves this to `_compare`, which locates provenance the exact way.
    """
    undo = restoring.undo
    if index.provenance_ordinal is not None or undo is None:
        return False
    checks = _OutputChecks(data, tmpdir)
    checks.bind_only_on({index.tracks[track] for track in index.flow_tracks})
    planned = _PlannedStream(source, index, plan, dict(retired), pool, checks)
    try:
        # cut where events seem to end, not decoded: each chunk is compared with the
        # planned bytes, which the workers decode (see `_PlannedStream`)
        out_scan = DocumentScanner(annotated.read(ReadStats()), speculative=True)
        if not _as_planned(out_scan, planned) or not checks.sources_complete:
            return False
        # restore's splice ran in a worker meanwhile (it reads the output file itself)
        restored = restoring.outcome()
        if restored is None:
            restored = outcome(pool.submit(partial(_restored_from, quick=True), annotated,
                                           undo))
        problem, digest = restored
        if problem or not digest or _digest_problems(digest, source, undo):
            return False
        _add_checks(verdict, [], digest, [], True, index.layout, out_scan.layout, plan, checks,
                    data)
        return True
    finally:
        planned.close()
        checks.close()


def _as_planned(out_scan: DocumentScanner, planned: _PlannedStream) -> bool:
    """Whether the output's events and the separators between them are the planned bytes
    (whose events the output-only checks observe as they are made, see `_PlannedStream`)."""
    expected = _Sequential(planned.pieces())
    base = None
    end = 0  # where the last chunk ended, from the first event on
    try:
        for number, chunk in enumerate(out_scan.chunks()):
            if chunk is SETTLE:  # every speculative chunk is confirmed as it is compared
                continue
            if number % _TRIM_EVERY == 0:
                release_memory()  # chunk buffers come and go: give their pages back
            if not _chunk_as_planned(chunk, base, end, expected):
                return False
            if base is None:
                base = chunk.offset
            end = chunk.offset - base + chunk.length
            if chunk.events is None:
                out_scan.confirm(chunk)
    except TraceError:  # a cut inside a string, or a malformed output: `_compare` says which
        return False
    return (base is not None and expected.ended() and planned.retired_ok
            and planned.observed_ok)


def _chunk_as_planned(chunk, base: int | None, end: int, expected: _Sequential) -> bool:
    """Whether an output chunk, and the separator before it (after `end`, from the first
    event at `base`), are the next planned bytes."""
    start = 0 if base is None else chunk.offset - base
    if start < end:
        return False
    gap = expected.take(start - end)
    if gap is None or (gap and not _SEPARATOR.fullmatch(gap)):
        return False
    # a speculative chunk's pieces are compared where they lie, never joined (a copy of
    # every output byte)
    return all(map(expected.matches, chunk.pieces if chunk.data is None else (chunk.data,)))


_SEPARATOR = re.compile(rb"[ \t\r\n]*,[ \t\r\n]*")
_TRAILING_SEPARATOR = re.compile(rb"(?:[ \t\r\n]*,[ \t\r\n]*)?\Z")


class _Sequential:
    """Bytes handed out in order from an iterator of pieces."""

    def __init__(self, pieces: Iterator[bytes]):
        self._pieces = pieces
        self._data = b""
        self._pos = 0

    def _left(self) -> int:
        """Bytes left in the current piece, moving on to the next non-empty one (0: none)."""
        while self._pos >= len(self._data):
            piece = next(self._pieces, None)
            if piece is None:
                return 0
            # (bytes, whose `startswith` `matches` compares with)
            self._data, self._pos = bytes(piece) if type(piece) is not bytes else piece, 0
        return len(self._data) - self._pos

    def take(self, length: int) -> bytes | None:
        """The next `length` bytes, or None when fewer are left."""
        parts = []
        while length:
            left = self._left()
            if not left:
                return None
            n = min(left, length)
            parts.append(self._data[self._pos : self._pos + n])
            self._pos += n
            length -= n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def matches(self, data: bytes | memoryview) -> bool:
        """Whether the next len(data) bytes are `data`, compared where both lie: no copy of
        a 16 MB chunk's worth of planned or output bytes (whose pages would be faulted in)
        to compare them. (The caller stops at the first chunk that differs.)"""
        at = 0
        with memoryview(data) as view:
            while at < len(view):
                left = self._left()
                if not left:
                    return False
                length = min(left, len(view) - at)
                if not self._data.startswith(view[at : at + length], self._pos):
                    return False
                self._pos += length
                at += length
        return True

    def ended(self) -> bool:
        """Whether every byte was taken."""
        return self._pos >= len(self._data) and not any(self._pieces)


class _PlannedStream:
    """The rewrite's output from the first event to the end of the added events, made again
    a chunk at a time (as `rewrite._rewrite` does) with the splice's numpy twin; the report's
    retired events are compared with the source's on the way (`retired_ok`).

    The output-only checks (`checks`) observe the planned events in the workers, as each
    chunk is made: where the output is byte for byte these pieces, they are its events,
    numbered as in the output, so the output is never decoded (`observed_ok` is False when
    a piece is not JSON: the per-event comparison then says what is wrong)."""

    def __init__(self, source: TraceSource, index: TraceIndex, plan: Plan, retired_map: dict,
                 pool, checks: _OutputChecks):
        self._source, self._index, self._plan = source, index, plan
        self._retired = retired_map
        self._pool = pool
        self._checks = checks
        self._pending: deque = deque()
        self.retired_ok = True
        self.observed_ok = True

    def pieces(self) -> Iterator[bytes]:
        index, plan, pool, pending = self._index, self._plan, self._pool, self._pending
        cursor = StreamCursor(self._source.read(ReadStats()))
        window = 2 * max(pool.workers, 1)
        by_path = self._source.plain_path if pool.workers else None
        synthetic = self._checks.synthetic
        ends_dropped = False
        first = True
        dropped_before = 0  # retired events before this chunk: output ordinals lag by them
        for chunk, rows, actions in chunk_edits(index, plan):
            separator = cursor.take(chunk.offset - cursor.pos)
            dropping = int((actions == DELETE).sum()) if len(rows) else 0
            out_first = chunk.first_ordinal - dropped_before
            dropped_before += dropping
            # a worker hands its chunk back in a shared slot when one is free
            slot = pool.slots.acquire() if len(rows) and pool.slots is not None else None
            if len(rows) and by_path is not None and not dropping:
                cursor.skip(chunk.length)
                payload = pool.submit(planned_file_chunk, by_path, chunk.offset, chunk.length,
                                      rows, actions, plan.targets, slot, out_first, synthetic)
            elif len(rows):
                data = cursor.take(chunk.length)
                if dropping:
                    self._check_retired(data, chunk.offset, rows, actions)
                if slot is not None and pool.slots.put(slot, data):  # no pickle, no pipe
                    payload = pool.submit(planned_slot_chunk, slot, len(data), chunk.offset,
                                          rows, actions, plan.targets, out_first, synthetic)
                else:
                    payload = pool.submit(planned_chunk, data, chunk.offset, rows, actions,
                                          plan.targets, slot, out_first, synthetic)
            else:
                data = cursor.take(chunk.length)
                observing = (pool.submit(observed_file_chunk, by_path, chunk.offset,
                                         chunk.length, out_first, synthetic)
                             if by_path is not None else
                             pool.submit(observed_chunk, data, out_first, synthetic))
                payload = (data, observing)
            pending.append((b"" if first else separator, payload, not first, slot))
            first = False
            while len(pending) > window:
                piece, ends_dropped = self._next(ends_dropped)
                yield from piece
        while pending:
            piece, ends_dropped = self._next(ends_dropped)
            yield from piece
        if plan.appended:
            yield from self._appended(index.layout.event_count - dropped_before, ends_dropped,
                                      window)

    def _appended(self, out_first: int, ends_dropped: bool, window: int) -> Iterator[bytes]:
        """The plan's added events, a block at a time, observed in the workers meanwhile."""
        lead = b"" if (not self._index.layout.event_count or ends_dropped) else b",\n"
        observing: deque = deque()
        for content in self._plan.appended.texts():
            observing.append(self._pool.submit(observed_chunk, content, out_first,
                                               self._checks.synthetic))
            out_first += content.count(b",\n") + 1  # (no raw newline inside a JSON string)
            yield lead + content
            lead = b",\n"
            while len(observing) > window:
                self._merge(outcome(observing.popleft()))
        while observing:
            self._merge(outcome(observing.popleft()))

    def _merge(self, facts: tuple | None) -> None:
        if facts is None:
            self.observed_ok = False
        elif self.observed_ok:
            self._checks.merge(facts)

    def _next(self, ends_dropped: bool) -> tuple[tuple[bytes, ...], bool]:
        """The next chunk's separator and bytes, and whether its last event was dropped
        (its checks' facts merged on the way)."""
        separator, payload, conditional, slot = self._pending.popleft()
        lead = b"" if conditional and ends_dropped else separator
        if isinstance(payload, tuple):
            data, observing = payload
            self._merge(outcome(observing))
            return (lead, data), False
        spliced, dropped, facts = outcome(payload)
        self._merge(facts)
        if isinstance(spliced, int):  # its length, in the slot
            spliced = self._pool.slots.read(slot, spliced)
        if slot is not None:
            self._pool.slots.release(slot)
        return (lead, spliced), dropped_last(dropped)

    def _check_retired(self, data: bytes, offset: int, rows: np.ndarray,
                       actions: np.ndarray) -> None:
        for ordinal, start, length, action in zip(rows["ordinal"].tolist(),
                                                  rows["offset"].tolist(),
                                                  rows["length"].tolist(), actions.tolist()):
            start -= offset
            if action == DELETE and self._retired.get(ordinal) != data[start : start + length]:
                self.retired_ok = False

    def close(self) -> None:
        """Drop the chunks still being made (the comparison stopped early; their slots stay
        taken, a worker may still write in them)."""
        for _, payload, _, _ in self._pending:
            (payload[1] if isinstance(payload, tuple) else payload).cancel()
        self._pending.clear()


def planned_file_chunk(path: str, offset: int, length: int, rows: np.ndarray,
                       actions: np.ndarray, targets: dict, slot: int | None, first: int,
                       synthetic: dict[tuple, str]
                       ) -> tuple[bytes | int, tuple[bytes, ...], tuple | None]:
    """`planned_chunk` of a span of a plain file, read by the worker itself."""
    return planned_chunk(read_span(path, offset, length), offset, rows, actions, targets, slot,
                         first, synthetic)


def planned_slot_chunk(slot: int, length: int, offset: int, rows: np.ndarray,
                       actions: np.ndarray, targets: dict, first: int,
                       synthetic: dict[tuple, str]
                       ) -> tuple[bytes | int, tuple[bytes, ...], tuple | None]:
    """`planned_chunk` of the source bytes the parent put in `slot` (copied out first: the
    planned bytes go back in the same slot)."""
    return planned_chunk(received(slot, length), offset, rows, actions, targets, slot, first,
                         synthetic)


def planned_chunk(data: bytes, offset: int, rows: np.ndarray, actions: np.ndarray,
                  targets: dict, slot: int | None, first: int, synthetic: dict[tuple, str]
                  ) -> tuple[bytes | int, tuple[bytes, ...], tuple | None]:
    """A source chunk as the plan makes it, spliced without the C extension (in a worker:
    handed back in `slot` if it has one, see workers.deliver), the separators its dropped
    events took, and the output-only checks' facts of its events (the first numbered
    `first` in the output; see `observed_chunk`)."""
    spliced, dropped = rewrite_chunk(data, offset, rows, actions, targets, native=False)
    result = deliver(spliced, slot)
    del data
    if dropped_last(dropped):  # it ends with the separator before its dropped last event
        spliced = spliced[: _TRAILING_SEPARATOR.search(spliced).start()]
    facts = _facts_of(spliced, first, synthetic)
    del spliced
    _worker_trim()
    return result, dropped, facts


_worker_tasks = itertools.count(1)


def _worker_trim() -> None:
    """In a worker, after every few chunks: give the pages of their buffers back."""
    if next(_worker_tasks) % _WORKER_TRIM_EVERY == 0:
        release_memory()


def _compare(source, annotated, index: TraceIndex, plan: Plan, data: dict, retired,
             verdict: Verdict, tmpdir) -> None:
    src_stats, out_stats = ReadStats(), ReadStats()
    src_scan, src_events = _events(source, src_stats)
    out_scan, out_events = _events(annotated, out_stats)
    checks = _OutputChecks(data, tmpdir)
    try:
        event_problems, in_step = _lockstep(src_events, out_events, index, plan, retired,
                                            checks)
        restore_problems, digest = _restore_problems(source, annotated, data, retired)
        _add_checks(verdict, restore_problems, digest, event_problems, in_step,
                    src_scan.layout, out_scan.layout, plan, checks, data)
    finally:
        checks.close()


def _add_checks(verdict: Verdict, restore_problems: list[str], digest: str,
                event_problems: list[str], in_step: bool, source_layout, output_layout,
                plan: Plan, checks: _OutputChecks, data: dict) -> None:
    """The verdict's checks after the comparison (the output-only ones when it stayed in
    step)."""
    verdict.add("restored events equal the source", restore_problems,
                f"restore gives back the source byte for byte (sha256 {digest[:16]}…)")
    verdict.add("output equals the plan", event_problems,
                f"{len(plan.appended):,} added events, every relocation on its planned lane")
    if in_step:  # else the output-only checks would report what the lost step left out
        verdict.add("top-level metadata",
                    _top_level_problems(source_layout, output_layout, plan),
                    f"{len(source_layout.values)} top-level keys equal and in order")
        verdict.add("depth zero on synthetic tracks", checks.depth_problems(),
                    f"{len(checks.synthetic)} synthetic tracks import at depth zero")
        verdict.add("flows on their activity's lane", checks.binding_problems(),
                    "every relocated flow binds on its lane to the activity it binds to "
                    "on its original stream (Perfetto's rules)")
        problems, total = _guide_problems(checks.guides, data)
        verdict.add("guides", problems, _guide_text(data), total=total)
        verdict.add("kernel and stream counts", _count_problems(checks, data),
                    "per-GPU kernel and stream counts equal the report's")
        verdict.add("lanes", _lane_problems(checks, data),
                    "the report's lanes and relocation counts are the output's"
                    if "groups" in data.get("compaction", data) else "no lanes expected")


def _lockstep(src_events, out_events, index, plan, retired, checks) -> tuple[list[str], bool]:
    """(plan problems, whether source and output stayed in step).

    An output event that is not what the plan makes of its source event is reported
    once, and the output-only checks see the planned event instead, so one tampered
    value is named once. After _MAX_LISTED such events in a row (an event dropped or
    added) the two are out of step, and comparing stops.
    """
    event_problems: list[str] = []
    planned = edits(index, plan)
    next_edit = next(planned, None)
    retired_map = dict(retired)
    targets = plan.targets
    out_ordinal = -1
    amiss = 0  # output events in a row that differ from the plan
    for ordinal, raw in src_events:
        if not ordinal & 0xFFFF:
            release_memory()  # chunk buffers come and go: give their pages back
        raw = bytes(raw)
        action = KEEP
        if next_edit is not None and next_edit[0] == ordinal:
            action = next_edit[3]
            next_edit = next(planned, None)
        if action == DELETE:
            if retired_map.get(ordinal) != raw:
                event_problems.append(
                    f"retired event {ordinal} in the report differs from the source event")
            continue
        out = next(out_events, None)
        if out is None:
            event_problems.append(f"output ends early: source event {ordinal} ({_short(raw)}) "
                                  "and later ones are missing")
            return event_problems, False
        out_ordinal, out_raw = out[0], bytes(out[1])
        expected = raw if action == KEEP else relocate(raw, targets[action][0], ordinal,
                                                       targets[action][1])
        if out_raw == expected:
            checks.observe(out_ordinal, out_raw)
            amiss = 0
            continue
        checks.observe(out_ordinal, expected)
        amiss += 1
        if amiss > _MAX_LISTED:
            event_problems.insert(0, f"the output is out of step with the source from output "
                                     f"event {out_ordinal - _MAX_LISTED} on (an event dropped "
                                     "or added?); stopped comparing")
            return event_problems, False
        restored = out_raw
        if provenance_match(out_raw) is not None:
            try:
                restored, _ = unrelocate(out_raw)
            except TraceError as exc:
                event_problems.append(f"output event {out_ordinal}: {exc}")
                continue
        if restored != raw:
            event_problems.append(
                f"source event {ordinal} ({_short(raw)}) != output event {out_ordinal} "
                f"restored: {first_difference(raw, restored)}")
        elif action == KEEP:
            event_problems.append(
                f"event {ordinal} ({_short(raw)}) was moved but the plan keeps it"
            )
        else:
            event_problems.append(
                f"event {ordinal} ({_short(raw)}) is at {_where(out_raw)}, "
                f"the plan puts it at {_where(expected)}")
    for k, added in enumerate(plan.appended):
        out = next(out_events, None)
        if out is None:
            event_problems.append(f"added event {k} of {len(plan.appended)} is missing")
            return event_problems, False
        out_ordinal, out_raw = out[0], bytes(out[1])
        checks.observe(out_ordinal, added)
        if out_raw != added:
            event_problems.append(f"added event {k} (output event {out_ordinal}): "
                                  f"{_added_difference(added, out_raw)}")
    extra = sum(1 for _ in out_events)
    if extra:
        event_problems.append(f"the output has {extra} events more than the source and plan")
        return event_problems, False
    return event_problems, True


def _added_difference(added: bytes, out_raw: bytes) -> str:
    """What differs in an added event, read as Perfetto reads it: a key spelled twice (or
    once escaped, once not) first, since a reader may take either value."""
    duplicate = duplicate_key(out_raw)
    if duplicate is not None:
        return f"duplicate key `{duplicate}`"
    return first_difference(added, out_raw)


def _restore_problems(source: TraceSource, annotated: TraceSource, data: dict,
                      retired) -> tuple[list[str], str]:
    """`restore`'s own splice of the output (the output and report alone, no plan), its
    bytes compared with the source's by sha256; (problems, the hash)."""
    try:
        undo = Undo.from_report(data, retired, annotated.name)
    except TraceError as exc:
        return [str(exc)], ""
    problem, restored = _restored_from(annotated, undo)
    if problem:
        return [problem], ""
    return _digest_problems(restored, source, undo), restored


def _digest_problems(restored: str, source: TraceSource, undo: Undo) -> list[str]:
    """The restored bytes' sha256 against the source's and the report's."""
    actual = source.data_sha256()
    if restored != actual:
        return [f"the restored bytes differ from the source's (sha256 {restored[:16]}… vs "
                f"{actual[:16]}…)"]
    if undo.sha256 != actual:
        return [f"the report's source_data_sha256 {undo.sha256[:16]}… is not the source's "
                f"{actual[:16]}…"]
    return []


def restored_sha256(path: str, undo: Undo) -> tuple[str, str]:
    """`_restored_from` the output file at `path` (in a worker process), the quick way: a
    digest that is not the source's sends verify to the exact one.

    The output is first cut where its events seem to end, not decoded (`splice_back`'s
    `speculative`); where that does not give the report's source digest back (an output
    whose events hold `}, {` in a string, or one that differs), its events are cut
    exactly, as before, and that digest is the answer."""
    with TraceSource(path, hashes_data=False) as annotated:
        problem, digest = _restored_from(annotated, undo, quick=True, speculative=True)
    if not problem and digest == undo.sha256:
        return problem, digest
    with TraceSource(path, hashes_data=False) as annotated:
        return _restored_from(annotated, undo, quick=True)


def restored_matches(path: str, undo: Undo, source_path: str) -> tuple[str, str, int, int]:
    """`restored_sha256`'s check against the plain source file at `source_path` (in a
    worker): the restored bytes compared with the file's as they are made, the quick way
    first, then exactly. ("", the file's sha256, size, CRC-32) when they are its bytes
    (for `TraceSource.adopt_sha256`), else (why restore's splice failed or "", "", 0, 0)."""
    for speculative in (True, False):
        problem = ""  # (the exact splice's answer is the one given)
        comparison = None
        try:
            comparison = FileComparison(source_path)
            with TraceSource(path, hashes_data=False) as annotated:
                splice_back(annotated, undo, comparison, quick=True, speculative=speculative)
            if comparison.ended():
                return "", comparison.hexdigest(), comparison.size, comparison.crc32
        except TraceError as exc:
            problem = str(exc)
        finally:
            if comparison is not None:
                comparison.close()
    return problem, "", 0, 0


def _restored_from(annotated: TraceSource, undo: Undo, *, quick: bool = False,
                   speculative: bool = False) -> tuple[str, str]:
    """(why restore's splice failed, "") or ("", the sha256 of the bytes it restores)."""
    writer = HashingWriter()
    try:
        splice_back(annotated, undo, writer, quick=quick, speculative=speculative)
    except TraceError as exc:
        return str(exc), ""
    return "", writer.hexdigest()


def _where(raw: bytes) -> str:
    head = decode_head(raw)
    return f"pid {head.pid} tid {head.tid}"


def _top_level_problems(src: Layout, out: Layout, plan: Plan) -> list[str]:
    if src.shape != out.shape:
        return [f"top level is {out.shape} in the output, {src.shape} in the source"]
    ours = [v for v in out.values if v.key == "tracestream"]
    theirs = [v for v in out.values if v.key != "tracestream"]
    source = [v for v in src.values if v.key != "tracestream"]
    problems = []
    if [v.key for v in theirs] != [v.key for v in source]:
        problems.append(f"top-level keys differ: {[v.key for v in source]} vs "
                        f"{[v.key for v in theirs]}")
    for a, b in zip(source, theirs):
        if a.key == b.key and a.raw != b.raw:
            problems.append(f"top-level {a.key!r}: {first_difference(a.raw, b.raw)}")
    if src.events_key_index - (len(src.values[: src.events_key_index]) - len(
            [v for v in src.values[: src.events_key_index] if v.key != "tracestream"])) != (
            out.events_key_index - (len(out.values[: out.events_key_index]) - len(
                [v for v in out.values[: out.events_key_index] if v.key != "tracestream"]))):
        problems.append("traceEvents moved among the top-level keys")
    if plan.top_level_member is not None:
        expected = plan.top_level_member.split(b": ", 1)[1]
        if len(ours) != 1 or _TEXT_VALUES.decode(ours[0].raw) != _TEXT_VALUES.decode(expected):
            problems.append("the top-level `tracestream` member is missing or differs")
    elif ours:
        problems.append("unexpected top-level `tracestream` member")
    return problems


class GuideOrder:
    """The output's guides, checked as they stream by: their count, each one against the
    one before (in time order, no overlap) and against the report's next `layers` row
    (read from the report file alongside); only the first few problems are kept.

    A chunk's guides come as columns (`observe_many`): a nightly output has 10^5-10^6 of
    them, and the main process checked each one in Python."""

    def __init__(self, rows: Iterable[dict] | None = None):
        self.count = 0
        self.problems: list[str] = []
        self.problem_count = 0
        self.row_problems: list[str] = []
        self.row_problem_count = 0
        self._rows = iter(rows) if rows is not None else None
        self._last: tuple[int, int, str] | None = None

    def observe(self, start: int, end: int, name: str) -> None:
        self.count += 1
        last, self._last = self._last, (start, end, name)
        self._compare_row(start, end, name)
        if last is None:
            return
        if start < last[0]:
            self._problem(_order_problem(name, last[2], before=True))
        elif start < last[1]:
            self._problem(_order_problem(name, last[2], before=False))

    def observe_many(self, starts: np.ndarray, ends: np.ndarray, names: list) -> None:
        """`observe` of each guide in turn (int64 start and end columns in ns, their names),
        a column at a time (lists: one at a time)."""
        if not (isinstance(starts, np.ndarray) and isinstance(ends, np.ndarray)) or (
                self._last is not None
                and not _INT64_MIN <= min(self._last[:2]) <= max(self._last[:2]) <= _INT64_MAX):
            for guide in zip(starts, ends, names):
                self.observe(*guide)
            return
        count = len(names)
        if not count:
            return
        self.count += count
        previous_starts, previous_ends = np.empty(count, np.int64), np.empty(count, np.int64)
        previous_starts[1:], previous_ends[1:] = starts[:-1], ends[:-1]
        if self._last is not None:
            previous_starts[0], previous_ends[0] = self._last[0], self._last[1]
        before = starts < previous_starts
        overlaps = ~before & (starts < previous_ends)
        if self._last is None:
            before[0] = overlaps[0] = False
        last = self._last
        for k in np.flatnonzero(before | overlaps).tolist():
            self._problem(_order_problem(names[k], names[k - 1] if k else last[2],
                                         before=bool(before[k])))
        self._last = (int(starts[-1]), int(ends[-1]), names[-1])
        rows = list(itertools.islice(self._rows, count)) if self._rows is not None else []
        if not rows:
            return
        said_starts, starts_ok = _whole_us_in_ns([row.get("guide_start_us") for row in rows])
        said_ends, ends_ok = _whole_us_in_ns([row.get("guide_end_us") for row in rows])
        described = (starts_ok & ends_ok & (said_starts == starts[: len(rows)])
                     & (said_ends == ends[: len(rows)]))
        for k in np.flatnonzero(described).tolist():
            described[k] = names[k] == f"L{rows[k].get('layer_id')}"
        for k in np.flatnonzero(~described).tolist():
            self._row_problem(rows[k], int(starts[k]), int(ends[k]), names[k])

    def _problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) <= _MAX_LISTED:
            self.problems.append(text)

    def _compare_row(self, start: int, end: int, name: str) -> None:
        """The report's row of this guide must describe it (whole µs, in order)."""
        row = next(self._rows, None) if self._rows is not None else None
        if row is None:
            return
        said = (row.get("guide_start_us"), row.get("guide_end_us"), f"L{row.get('layer_id')}")
        if (start, end, name) == (said[0] * 1000 if isinstance(said[0], int) else None,
                                  said[1] * 1000 if isinstance(said[1], int) else None, said[2]):
            return
        self._row_problem(row, start, end, name)

    def _row_problem(self, row: dict, start: int, end: int, name: str) -> None:
        self.row_problem_count += 1
        if len(self.row_problems) <= _MAX_LISTED:
            self.row_problems.append(
                f"the report's row L{row.get('layer_id')} (pass {row.get('pass_index')}) says "
                f"[{row.get('guide_start_us')}, {row.get('guide_end_us')}] µs, the output's "
                f"guide {name} is [{start / 1000:g}, {end / 1000:g}] µs")


def _order_problem(name: str, previous: str, *, before: bool) -> str:
    return f"guide {name} {'starts before' if before else 'overlaps'} {previous}"


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_NS_LIMIT = ((1 << 63) - 1) // 1000  # whole µs whose ns fit in int64 (either sign)


def _whole_us_in_ns(values: list) -> tuple[np.ndarray, np.ndarray]:
    """The report's whole-µs values in ns as int64, and which are ints (`observe`'s
    isinstance: a bool is one) whose ns fit; the others (absent, floats, text) match no
    guide, as a Python int out of int64 range matches none."""
    try:
        column = np.array(values) if values else np.zeros(0, np.int64)
    except (ValueError, TypeError, OverflowError):  # (ragged arrays)
        column = np.zeros((0, 0))
    if column.ndim == 1 and column.dtype.kind in "biu" and (
            (column <= _NS_LIMIT) & (column >= -_NS_LIMIT)).all():
        return column.astype(np.int64) * 1000, np.ones(len(values), bool)
    ns, ok = np.zeros(len(values), np.int64), np.zeros(len(values), bool)
    for k, value in enumerate(values):
        if isinstance(value, int) and -_NS_LIMIT <= value <= _NS_LIMIT:
            ns[k], ok[k] = value * 1000, True
    return ns, ok


def _guide_problems(guides: GuideOrder, data: dict) -> tuple[list[str], int]:
    """(the first problems, how many) of the guide check."""
    if "num_layers" not in data:
        return ([], 0) if not guides.count else (
            [f"{guides.count} unexpected guide events"], 1)
    expected = data["num_layers"] * data["passes"]
    problems = []
    if guides.count != expected:
        problems.append(f"{guides.count} guides, expected {data['num_layers']} layers x "
                        f"{data['passes']} passes = {expected}")
    if problems or guides.problem_count:
        return problems + guides.problems, len(problems) + guides.problem_count
    rows = list(guides.row_problems)
    total = guides.row_problem_count
    if "layers" in data and len(data["layers"]) != guides.count:
        rows.append(f"the report has {len(data['layers'])} guide rows, the output "
                    f"{guides.count} guides")
        total += 1
    return rows, total


def _lane_problems(checks: _OutputChecks, data: dict) -> list[str]:
    """The report's lanes and relocation counts must be the output's: every lane it lists
    holds slices, and it counts the relocated events and flows the output holds."""
    section = data.get("compaction", data)
    if "groups" not in section:
        return []
    problems = []
    for g in section["groups"]:
        tids = g.get("lane_tids", [])
        used = [t for t in tids if checks.lane_slices.get((g.get("display_pid"), t))]
        if g.get("lanes") != len(tids) or len(used) != len(tids):
            problems.append(
                f"pid {g.get('pid')} {g.get('kind')}: the report says {g.get('lanes')} lanes "
                f"(tids {tids}), the output has slices on {len(used)} of them")
    for key, found in (("relocated_events", checks.relocated_events),
                       ("relocated_flows", checks.relocated_flows)):
        if section.get(key) != found:
            problems.append(f"the report's {key} is {section.get(key)}, the output holds {found}")
    return problems


def _guide_text(data: dict) -> str:
    if "num_layers" not in data:
        return "no guides expected, none found"
    return (f"{data['num_layers'] * data['passes']} guides ({data['num_layers']} layers x "
            f"{data['passes']} passes) in time order, no overlap, as the report's rows say")


def _count_problems(checks: _OutputChecks, data: dict) -> list[str]:
    problems = []
    for gpu in data.get("gpus", []):
        key = (gpu["pid"], gpu["device"])
        kernels = checks.kernels.get(key, 0)
        streams = len(checks.streams.get(key, ()))
        if kernels != gpu["kernel_count"]:
            problems.append(f"pid {key[0]} device {key[1]}: {kernels} kernels in the output, "
                            f"report says {gpu['kernel_count']}")
        if streams != gpu["streams"]:
            problems.append(f"pid {key[0]} device {key[1]}: {streams} original streams in the "
                            f"output, report says {gpu['streams']}")
    return problems
