"""The checks of every output event against what the plan says it must be, one chunk at a time.

An output event is a source event unchanged, one relocated as planned, or one of
tracestream's additions (guides, lane metadata); nesting on each output track and the
Perfetto import rules are checked on the way."""

from __future__ import annotations

import re
from collections import Counter
from functools import partial
from typing import Any

import msgspec
import numpy as np

from tracestream._native import PH_FLOW, PH_X
from tracestream.commands.verify.bindings import (
    BIND_ACTIVITY,
    BIND_DTYPE,
    BIND_FLOW,
    BIND_NEXT_FLOW,
    BIND_ROW_DTYPE,
    BOUND_DTYPE,
    BOUND_MANY,
    BOUND_NONE,
    bound_rows,
    perfetto_bindings,
)
from tracestream.commands.verify.columns import (
    IS_ACTIVITY,
    GuidesSeen,
    Interned,
    Kept,
    TrackCodes,
    check_chunk_columns,
    numbered_tracks,
)
from tracestream.commands.verify.events import (
    CHECK_EVENTS,
    Timed,
    decoded_name,
    event_name,
    raw_events,
    scanned_chunk,
    values_of,
)
from tracestream.commands.verify.guides import GuideOrder
from tracestream.commands.verify.nesting import NestState, nesting_in_block
from tracestream.index.builder import timebase
from tracestream.index.records import RecordStore, concat_rows, same_rows, take_rows
from tracestream.model import (
    ACTIVITY_KINDS,
    FLOW_PHASES,
    GUIDE_CATEGORY,
    KERNEL,
    LAYER_GUIDE,
    PROVENANCE_MARK,
    TIMING,
    CategoryKinds,
    binds_next,
    decode_head,
)
from tracestream.write.relocate import provenance_match, provenance_of

# Chunks between heap trims (parallel.memory.release_memory). Each trim hands freed pages back
# and the next chunk's buffers fault them in again (page faults were most of verify's
# system time); these counts keep a 1 GB run's tree PSS under its 250 MiB target.
TRIM_EVERY = 32  # output chunks between the main process's trims: each trim made it fault its
# buffers in again (while it compares the nightly output: ~300k faults at 8, ~130k at 32;
# tree PSS +5-10 MiB)
WORKER_TRIM_EVERY = 32  # in a worker, whose heap keeps freed memory (keep_freed_memory): at
# 8, with restore's trims at 8 too, ~0.6 s more system time a nightly run for ~6 MiB less PSS
_ROWS_HELD = 1 << 11  # check records held as tuples before they go to their store
_CHECK_BUDGET = 4 << 20  # per store of output-only check records; the rest spills to disk
_GROUP_TEXT = b', "group": "'
_GROUP_MEMBER = re.compile(
    rb'"source_event_index": [0-9]+(?:, "group": "([^"\\]*)")?, "had_args": (?:true|false)\}')
"""A provenance member's end as the splice writes it, with its lane group, if any."""


class OutputChecks:
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
        self.binding = {side: RecordStore(BIND_DTYPE, sort_keys=("track", "key"),
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
        # per lane (pid, tid): how many relocated events name each lane group in their
        # provenance (--lane-groups; empty without): each lane must hold one group
        self.lane_groups: dict[tuple, dict[str, int]] = {}
        self.relocated_events = 0
        self.relocated_flows = 0

    @classmethod
    def of_chunk(cls, synthetic: dict[tuple, str]) -> OutputChecks:
        """Checks that keep what one chunk's events give (in a worker, for `merge`)."""
        checks = cls({}, None)
        checks.synthetic = synthetic
        checks.depth = {v: Kept(store.dtype) for v, store in checks.depth.items()}
        checks.trunc_is_round = False  # a chunk's facts carry every variant
        checks.binding = {v: Kept(store.dtype) for v, store in checks.binding.items()}
        checks.guides = GuidesSeen()
        return checks

    def facts(self) -> tuple:
        """What `of_chunk` checks saw, for `merge` (each store's batches joined in order:
        a chunk whose events went one at a time through `observe` made many small ones)."""
        self._flush()
        return (list(self.track_ids), {v: kept.joined() for v, kept in self.depth.items()},
                {v: kept.joined() for v, kept in self.binding.items()}, self.guides.columns(),
                self.kernels, self.streams, self.lane_slices, self.lane_groups, self.problems,
                self.relocated_events, self.relocated_flows)

    def merge(self, facts: tuple) -> None:
        """Take a chunk's `facts` as if its events were observed here, in order."""
        (tracks, depth, binding, guides, kernels, streams, lane_slices, lane_groups, problems,
         moved, flows) = facts
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
        for key, counts in lane_groups.items():
            for group, count in counts.items():
                self._lane_group(key, group, count)
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
            flows = batch["mode"] != BIND_ACTIVITY
            if not kept[batch["track"][flows]].all():
                self.sources_complete = False
            out.append(take_rows(batch, flows | kept[batch["track"]]))
        return out

    def _lane_group(self, lane: tuple, group, count: int = 1) -> None:
        """`count` relocated events on `lane` whose provenance names lane group `group`."""
        seen = self.lane_groups.setdefault(lane, {})
        seen[group] = seen.get(group, 0) + count

    def _track(self, key: tuple) -> int:
        tid = self.track_ids.get(key)
        if tid is None:
            tid = self.track_ids[key] = len(self.track_ids)
        return tid

    def observe(self, ordinal: int, raw: bytes) -> None:
        head = decode_head(raw)
        prov = provenance_of(raw) if PROVENANCE_MARK in raw else None
        if prov is not None:
            self.relocated_events += 1
            group = provenance_match(raw).group("group")
            if group is not None:
                self._lane_group((head.pid, head.tid), group.decode())
        if head.ph in FLOW_PHASES and prov is not None:
            self.relocated_flows += 1
            ts = timebase.parse_decimal(bytes(TIMING.decode(raw).ts)).floor_ns()
            orig = (msgspec.json.decode(prov[0]), msgspec.json.decode(prov[1]))
            mode = BIND_NEXT_FLOW if binds_next(head.ph, head.bp) else BIND_FLOW
            self._bind_rows.append((self._track(orig), self._track((head.pid, head.tid)),
                                    ts, ts, mode, ordinal))
            return
        if head.ph != "X":
            return
        kind = self.kinds.of(head.cat)
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
                                    ts.floor_ns(), end, BIND_ACTIVITY, ordinal))
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
        events = scanned_chunk(content)
        if events is None:
            document = b"".join((b"[", content, b"]"))  # one copy (a + b + c copies twice)
            try:
                events = CHECK_EVENTS.decode(document)
            except msgspec.ValidationError:
                events = None
        if events is None or (raws is not None and len(events) != len(raws)):
            for i, raw in enumerate(raw_events(content, document) if raws is None else raws):
                self.observe(first + i, bytes(raw))
            return
        timed = Timed(events)
        try:
            observed = self._observe_columns(first, events, timed, content)
        except TypeError:  # an object or array where a category, device or provenance pid or
            # tid is compared (`check_chunk_columns`): `observe` reads it, one event at a time
            for i, raw in enumerate(raw_events(content, document) if raws is None else raws):
                self.observe(first + i, bytes(raw))
            return
        if not observed:
            if document is None:  # a scan: its events one by one are msgspec's, all at once
                document = b"".join((b"[", content, b"]"))
                events = CHECK_EVENTS.decode(document)
            self._observe_events(first, raw_events(content, document) if raws is None else raws,
                                 events, timed)

    def _lane_groups_of(self, content: bytes, moved: np.ndarray) -> list | None:
        """The lane group each moved event's provenance names (None for none), in event order,
        read from the chunk's bytes at once; [] when the chunk holds no lane group; None when
        the members found are not one per moved event (a source's own text that looks like
        one, in a nested object): the caller reads the chunk an event at a time."""
        if _GROUP_TEXT not in content:
            return []
        found = [m.group(1) for m in _GROUP_MEMBER.finditer(content)]
        return found if len(found) == int(moved.sum()) else None

    def _observe_columns(self, first: int, events, timed: Timed, content: bytes) -> bool:
        """`observe_chunk` a column at a time; False (nothing observed) when the chunk has
        numbers `NumberColumn` leaves to timebase.

        This runs on every event of the output, so each event's fields are read once, by
        one pass (`check_chunk_columns`: C where the extension is built), and its track (pid,
        tid) becomes one integer (`TrackCodes`); the rest is numpy, a few sorts a chunk."""
        ts, dur = timed
        codes, devices = TrackCodes(), Interned()
        phase, kind, track, origin, moved, device = check_chunk_columns(events, self.kinds, codes,
                                                                   devices)
        groups = self._lane_groups_of(content, moved)
        if groups is None:
            return False
        is_x, is_flow = phase == PH_X, phase == PH_FLOW
        flows = np.flatnonzero(moved & is_flow)
        on_synthetic = is_x & np.isin(track, codes.known(self.synthetic))
        timed_ok = ts.regular & dur.regular
        if (~timed_ok[on_synthetic | (is_x & moved)]).any() or (~ts.regular[flows]).any():
            return False
        is_activity = is_x & IS_ACTIVITY[kind.view(np.uint8)]
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
        if groups:
            lanes_of_moved = track[moved]
            for (lane, group), count in Counter(zip(lanes_of_moved.tolist(), groups)).items():
                if group is not None:
                    self._lane_group(codes.key(lane), group.decode(), count)
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
        guides = [(i, decoded_name(name)) for i, cat, name in zip(
            maybe_guides, values_of(events, maybe_guides, "cat"),
            values_of(events, maybe_guides, "name")) if cat == GUIDE_CATEGORY]
        mode = np.full(len(at), BIND_ACTIVITY, np.int64)
        flow_list = flows.tolist()
        mode[np.searchsorted(at, flows)] = [
            BIND_NEXT_FLOW if binds_next(ph, bp) else BIND_FLOW
            for ph, bp in zip(values_of(events, flow_list, "ph"),
                              values_of(events, flow_list, "bp"))]
        ids = partial(numbered_tracks, distinct, numbered)
        self._emit(first, timed, synthetic.tolist(), ids(track[synthetic]).tolist(), [],
                   guides)
        self._emit_binds(first, timed, at, ids(origin[at]), ids(track[at]), mode)
        return True

    def _count_streams(self, codes: TrackCodes, devices: Interned, streams: np.ndarray,
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

    def _observe_events(self, first: int, raws: list, events: list, timed: Timed) -> None:
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
                    not ts_ok[k] and origin is not None and ph in FLOW_PHASES):
                self._emit(first, timed, depth, tracks, binds, guides)
                self.observe(first + k, bytes(raws[k]))
                continue
            if origin is not None:
                self.relocated_events += 1
                if origin.group is not None:
                    self._lane_group(key, origin.group)
                if ph in FLOW_PHASES:
                    self.relocated_flows += 1
                    mode = BIND_NEXT_FLOW if binds_next(ph, e.bp) else BIND_FLOW
                    binds.append((k, track((origin.pid, origin.tid)), track(key), mode))
                    continue
            if ph != "X":
                continue
            kind = kinds.of(e.cat)
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
                    guides.append((k, event_name(e)))
            if origin is not None and activity:
                binds.append((k, track((origin.pid, origin.tid)), track(key), BIND_ACTIVITY))
        self._emit(first, timed, depth, tracks, binds, guides)

    def _emit(self, first: int, timed: Timed, depth: list[int], tracks: list[int],
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

    def _emit_binds(self, first: int, timed: Timed, at: np.ndarray, source: np.ndarray,
                    lane: np.ndarray, mode: np.ndarray) -> None:
        """`_emit`'s flows and moved activities, as columns (event, source track, lane
        track, mode)."""
        if not len(at):
            return
        ts, dur = timed
        start = ts.exact[at]
        end = np.where(mode == BIND_ACTIVITY, start + dur.exact[at], start)
        for side, sides in (("source", source), ("lane", lane)):
            records = np.empty(len(at), BIND_DTYPE)
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
            rows = np.array(self._bind_rows, dtype=BIND_ROW_DTYPE)
            for side, store in self.binding.items():
                records = np.empty(len(rows), BIND_DTYPE)
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
                state = NestState()
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
            found[side] = RecordStore(BOUND_DTYPE, sort_keys=("flow", "bound"),
                                      tmpdir=self._tmpdir, budget=_CHECK_BUDGET)
            for rows in perfetto_bindings(store.sorted_blocks()):
                found[side].append(rows)
        problems = []
        try:
            for (flow, source), (_, lane) in zip(bound_rows(found["source"].sorted_blocks()),
                                                 bound_rows(found["lane"].sorted_blocks())):
                if source < 0:
                    problems.append(f"flow event {flow} binds to "
                                    f"{0 if source == BOUND_NONE else 'several'} activities")
                elif lane == BOUND_NONE:
                    problems.append(
                        f"flow event {flow} is not on the lane of the activity it binds to")
                elif lane != source:
                    what = "several activities" if lane == BOUND_MANY else f"output event {lane}"
                    problems.append(
                        f"flow event {flow} binds on its lane to {what}, not to event {source} "
                        "it binds to on its original stream")
        finally:
            for store in found.values():
                store.close()
        return problems
