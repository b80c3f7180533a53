"""The plan: every decision and every refusal, before a byte of output exists.

Input is the index of one trace and what the user asked for (layer guides,
compaction, or both); output is a `Plan`: one action per rewrite candidate
(keep, move to a lane, delete), the events to append, the top-level member to
add, and the report.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from tracestream._version import __version__
from tracestream.errors import Option, SpecError, TraceError
from tracestream.index.builder import FLOW, META, SCOPES, TraceIndex
from tracestream.index.timebase import relative_ms, us_text
from tracestream.jsontext import RawJSON, RawNumber, dumps
from tracestream.model import KERNEL, MEMCPY, MEMSET, SYNC
from tracestream.plan.anchors import (
    anchor_names,
    cadence,
    check_anchor_names,
    check_cadence,
    match_starts,
)
from tracestream.plan.guides import build_guides
from tracestream.plan.guidetext import GuideEvents, GuideRows
from tracestream.plan.hints import no_match
from tracestream.plan.lanes import GroupLanes, Sweep
from tracestream.plan.selection import (
    gpu_counts,
    gpu_listing,
    id_text,
    on_gpu,
    same_id_filter,
    select_gpu,
)
from tracestream.plan.specs import (
    MAX_LANES_LIMIT,
    NAMES_IN_REPORT,
    CompactSpec,
    LayerSpec,
    coverage,
    required_matches,
    with_passes,
)
from tracestream.plan.window import WindowPlan

KEEP = 0
DELETE = 0xFFFF
_LANE_SLOTS = 64  # lane codes: slot * 64 + lane + 1
SCHEMA_VERSION = 1
FIRST_SYNTHETIC_TID = 1_000_000
FIRST_SYNTHETIC_PID = 1_000_000

VIEW_NOTICE = "compact view — synthetic GPU display lanes, not CUDA streams"
COMPACT_NOTICE = (
    "Compact view: GPU activity is packed into synthetic display lanes. Lanes are not CUDA "
    "streams; args.stream and args._compact_gpu_track keep the original stream of every "
    "event. The lane count is the peak overlap of activity, not a count of runtime streams, "
    "and empty lane time says nothing about GPU idle time."
)
LAYERS_NOTICE = (
    "Layer guides are anchor-to-anchor navigation intervals (zero-based: L2 is the third "
    "layer), derived from a kernel the user verified to run once per layer. They are not "
    "layer latencies and do not assign kernels to layers."
)


class AppendedEvents:
    """The events a plan appends: new tracks' metadata, then the guide events, which are
    written from the guide columns a block at a time (never all held at once)."""

    def __init__(self, metadata: list[bytes], guides: GuideEvents | None = None):
        self.metadata = metadata
        self.guides = guides

    def __len__(self) -> int:
        return len(self.metadata) + (len(self.guides) if self.guides is not None else 0)

    def blocks(self) -> Iterator[list[bytes]]:
        """The events in order, in non-empty lists."""
        if self.metadata:
            yield self.metadata
        if self.guides is not None:
            yield from self.guides.blocks()

    def texts(self, rows: tuple[GuideRows, Callable[[bytes], None]] | None = None
              ) -> Iterator[bytes]:
        """The events in order, a non-empty block at a time, joined by ",\\n" as the trace
        holds them (the guides' never split into one object each).

        `rows`: (the report's guide rows, where its blocks go): each block of guides' report
        rows is made with its events and handed over as they are (see GuideEvents
        .texts_with_rows)."""
        if self.metadata:
            yield b",\n".join(self.metadata)
        if self.guides is None:
            return
        if rows is None:
            yield from self.guides.texts()
            return
        table, write = rows
        for events, row_text in self.guides.texts_with_rows(table):
            write(row_text)
            yield events

    def __iter__(self) -> Iterator[bytes]:
        for block in self.blocks():
            yield from block


@dataclass
class Plan:
    actions: np.ndarray  # uint16 per span candidate
    targets: dict[int, tuple[bytes, bytes | None, bytes | None]]
    """lane code -> (tid json, new pid json or None, the provenance's group member or None)"""
    appended: AppendedEvents
    top_level_member: bytes | None
    report: dict  # its `layers` rows (GuideRows) are made as the report is written
    summary: dict = field(default_factory=dict)
    window: WindowPlan | None = None  # the output holds a window of the trace (plan.window)


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def clamp_sort_index(value: int) -> int:
    """A sort index Perfetto can hold (int64): one next to an existing index at the int64 or
    uint64 extremes ties with it instead of overflowing (the rows still come first/next)."""
    return min(max(value, INT64_MIN), INT64_MAX)


def json_value(value: Any) -> bytes:
    return orjson.dumps(value)


def _free_ids(used: set, count: int, start: int) -> list[int]:
    taken = {u for u in used if isinstance(u, int)} | {
        int(u) for u in used if isinstance(u, str) and re.fullmatch(r"-?\d+", u)
    }
    ids: list[int] = []
    candidate = start
    while len(ids) < count:
        if candidate not in taken:
            ids.append(candidate)
        candidate += 1
    return ids


def _meta_event(name: str, pid: Any, tid: Any, args: dict) -> bytes:
    return dumps({"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args})


class Planner:
    """Builds a Plan from an index; one instance per command run."""

    def __init__(self, index: TraceIndex, *, output_name: str, report_name: str,
                 source_name: str | None = None):
        self.index = index
        self.source_name = index.source_name if source_name is None else source_name
        self.output_name = output_name
        self.report_name = report_name
        self.origin_ns = index.origin.floor_ns() if index.origin is not None else 0
        self.actions = np.zeros(len(index.spans), dtype=np.uint16)
        self.targets: dict[int, tuple[bytes, bytes | None, bytes | None]] = {}
        self.reserved_tids: dict[Any, set] = {}
        self.guide_track: tuple[Any, int, str] | None = None
        self.guide_events: GuideEvents | None = None
        self.lane_tracks: list[dict] = []  # display pid, tid, name per synthetic lane
        self.new_processes: list[bytes] = []

    # -- shared -------------------------------------------------------------

    def relative_ms(self, ns: int) -> float:
        return relative_ms(ns, self.origin_ns)

    def _refuse_reannotation(self, what: str) -> None:
        index = self.index
        if index.provenance_ordinal is not None:
            raise TraceError(
                f"event {index.provenance_ordinal} already carries `_compact_gpu_track` "
                f"provenance: this trace was already compacted by tracestream ({what} needs "
                "the original); start from the source trace"
            )

    def _tids(self, pid: Any, count: int) -> list[int]:
        used = self.index.tids_of(pid) | self.reserved_tids.setdefault(pid, set())
        tids = _free_ids(used, count, FIRST_SYNTHETIC_TID)
        self.reserved_tids[pid].update(tids)
        return tids

    def _existing_sort_indices(self, pid: Any) -> list[int]:
        return [m.value for m in self.index.thread_meta
                if m.pid == pid and m.name == "thread_sort_index" and isinstance(m.value, int)]

    # -- layer guides -------------------------------------------------------

    def plan_layers(self, spec: LayerSpec) -> dict:
        """Guides on a new track in the anchors' GPU process; returns the report part."""
        spec.validate()
        index = self.index
        if index.guides:
            g = index.guides[0]
            raise TraceError(
                f"the trace already contains layer guides (event {g.ordinal}, pid {g.pid}, "
                f"tid {g.tid}); start from the original trace"
            )
        self._refuse_reannotation("layers")
        anchors_all = index.matches.get("anchor", [])
        pid, device = select_gpu(anchors_all, spec.pid, spec.device, "anchor_regex",
                                 spec.anchor_regex, index.kernel_vocabulary)
        anchors = on_gpu(anchors_all, pid, device)
        names = anchor_names(anchors)
        check_anchor_names(names, spec, pid, device)
        spec = with_passes(spec, len(anchors))
        checks = {"anchor_names": dict(list(names.items())[:NAMES_IN_REPORT]),
                  "distinct_anchor_names": len(names),
                  "allow_several_anchor_names": spec.allow_several_anchor_names}
        if len(anchors) - spec.anchor_offset >= required_matches(spec):
            starts = match_starts(anchors)
            evidence = cadence(starts, spec)
            check_cadence(anchors, starts, spec, evidence)
            checks["cadence"] = {**evidence, "allow_gaps": spec.allow_gaps}
        terminals = None
        if spec.end_anchor_regex is not None:
            everywhere = index.matches.get("terminal", [])
            terminals = on_gpu(everywhere, pid, device)
            if not len(terminals):  # else every layer's window is refused, naming the first
                where = (f" on device {id_text(device)} of pid {id_text(pid)} (the anchors' "
                         "GPU)")
                if len(everywhere):  # the name is right, the GPU is not
                    raise SpecError("no kernel matches ", Option("end_anchor_regex"),
                                    f" {spec.end_anchor_regex!r}{where}; it matches on "
                                    f"{gpu_listing(gpu_counts(everywhere))}")
                raise no_match("end_anchor_regex", spec.end_anchor_regex,
                               index.kernel_vocabulary, None, where)
        guides = build_guides(anchors, terminals, spec)
        checks["selection"] = coverage(spec, len(anchors))
        (guide_tid,) = self._tids(pid, 1)
        track_name = f"Layer guide ({spec.phase}) — anchor intervals"
        self.guide_track = (pid, guide_tid, track_name)
        self.guide_events = GuideEvents(guides, pid, guide_tid, spec)
        return {
            "phase": spec.phase,
            "evidence": spec.evidence,
            "pid": pid,
            "device": device,
            "guide_tid": guide_tid,
            "track_name": track_name,
            "anchor_regex": spec.anchor_regex,
            "end_anchor_regex": spec.end_anchor_regex,
            "anchor_offset": spec.anchor_offset,
            "anchor_stride": spec.anchor_stride,
            "extra_anchors_per_pass": spec.extra_anchors_per_pass,
            "matching_anchor_count": len(anchors),
            "num_layers": spec.num_layers,
            "first_layer": spec.first_layer,
            "passes": spec.passes,
            **checks,
            "layers": GuideRows(guides, self.origin_ns),
        }

    # -- compaction -----------------------------------------------------------

    def plan_compaction(self, spec: CompactSpec) -> dict:
        spec.validate()
        index = self.index
        self._refuse_reannotation("compact")
        activity_groups = [
            g for g, (pid, device) in enumerate(index.groups)
            if device != SCOPES and index.group_stats[g].kinds
        ]
        if not activity_groups:
            raise TraceError(
                "no GPU activity in this trace (no kernel, gpu_memcpy, gpu_memset or "
                "cuda_sync events): nothing to compact"
            )
        if spec.pid is not None:
            activity_groups = same_id_filter(activity_groups, spec.pid,
                                             lambda g: index.groups[g][0])
            if not activity_groups:
                pids = sorted({str(index.groups[g][0]) for g in range(len(index.groups))})
                raise TraceError(
                    f"no GPU activity in pid {spec.pid} (GPU pids: {', '.join(pids)})"
                )
        pids = []
        for g in activity_groups:
            if index.groups[g][0] not in pids:
                pids.append(index.groups[g][0])
        scope_groups = [
            g for g, (pid, device) in enumerate(index.groups) if device == SCOPES and pid in pids
        ]
        self._check_guides(pids)
        compacted = activity_groups + scope_groups
        lane_groups = spec.lane_group_set()
        names = lane_groups.names if lane_groups is not None else (None,)
        # the sweep packs each (device, lane group) apart: its key is group * k + lane group
        # (k = 1 without lane groups: the device's group itself, as before)
        k = len(names)
        keys = [g * k + s for g in activity_groups for s in range(k)] + [
            g * k for g in scope_groups]
        if len(keys) * _LANE_SLOTS >= DELETE:
            raise TraceError(f"too many GPU groups to compact ({len(compacted)}"
                             + (f" devices and scopes, {k} lane groups each)" if k > 1 else ")"))
        slot = {key: i for i, key in enumerate(keys)}
        relocated = set()
        for g in compacted:
            relocated |= index.group_stats[g].tracks
        self._check_other_events(relocated)
        self._check_flow_duplicates(relocated)

        sweep = Sweep(set(keys))
        base_code = {key: s * _LANE_SLOTS + 1 for key, s in slot.items()}
        sweep.run(_by_lane_group(index.sweep.sorted_blocks(), k), self.actions, base_code,
                  index.flow_tracks & relocated)
        if k == 1:
            self._check_lanes(sweep.groups, spec.max_lanes)
        else:
            self._check_lane_groups(sweep.groups, spec.max_lanes, compacted, names)
        sweep.at_ends(index.sweep.sorted_blocks(), self.actions)
        self._check_flows(sweep)
        retired = self._retire_metadata(relocated)
        return self._lane_tracks(spec, activity_groups, scope_groups, sweep.groups, slot, retired,
                                 names)

    def _check_guides(self, pids: list) -> None:
        required = {"pass_index", "layer_id", "boundary_kind", "start_us", "end_us"}
        for g in self.index.guides:
            if g.pid not in pids or not required <= set(g.args):
                raise TraceError(
                    f"layer guide event {g.ordinal} (pid {g.pid}, tid {g.tid}) is not one "
                    "tracestream wrote for a compacted GPU process; regenerate the guides from "
                    "the original trace with `tracestream layers ... --max-gpu-lanes`"
                )

    def _check_other_events(self, relocated: set) -> None:
        index = self.index
        for track in sorted(relocated):
            other = index.other_on_track.get(track)
            if other is not None:
                pid, tid = index.tracks[track]
                what = {
                    "B": "a begin (B)", "E": "an end (E)", "i": "an instant", "I": "an instant",
                    "C": "a counter", "X": "a non-GPU slice",
                }.get(other.ph, f"a ph={other.ph!r}")
                raise TraceError(
                    f"event {other.ordinal} ({what} event {other.name!r}, ts {other.ts}) sits on "
                    f"GPU stream pid {pid} tid {tid}, which compaction would empty; tracestream "
                    "does not move or drop such events. Omit compaction or remove them first"
                )

    def _check_flow_duplicates(self, relocated: set) -> None:
        """A flow compaction moves is read by its pid and tid: a key spelled twice is refused
        (which value would Perfetto take?), as for the GPU events themselves."""
        index = self.index
        for track in sorted(relocated):
            found = index.duplicate_flows.get(track)
            if found is not None:
                pid, tid = index.tracks[track]
                raise TraceError(
                    f"event {found.ordinal}: duplicate key `{found.key}` in a flow event on GPU "
                    f"stream pid {pid} tid {tid} (which value would a reader take?)"
                )

    def _check_lanes(self, groups: dict[int, GroupLanes], max_lanes: int) -> None:
        index = self.index
        for g, state in groups.items():
            if state.lanes > max_lanes:
                pid, device = index.groups[g]
                where = (
                    f"pid {pid} device {device}" if device != SCOPES
                    else f"GPU scopes of pid {pid}"
                )
                at = state.peak_at_ns
                raise TraceError(
                    f"{where} needs {state.lanes} display lanes (peak overlap {state.lanes} at "
                    f"{self.relative_ms(at):.3f} ms, ts {us_text(at)} µs) but --max-gpu-lanes is "
                    f"{max_lanes}; capture a narrower window or omit compaction"
                )

    def _check_lane_groups(self, states: dict[int, GroupLanes], max_lanes: int,
                           compacted: list[int], names: tuple[str, ...]) -> None:
        """With lane groups, a device's lanes are the sum of its groups' peaks: refused above
        `max_lanes`, naming each group's peak and where it happens, so the user sees which
        group to fold back (scopes are one group, checked as before)."""
        k = len(names)
        for g in compacted:
            pid, device = self.index.groups[g]
            if device == SCOPES:  # (`_check_lanes` names a group by its index, g)
                self._check_lanes({g: states[g * k]} if g * k in states else {}, max_lanes)
                continue
            parts = [(name, states[g * k + s]) for s, name in enumerate(names)
                     if g * k + s in states]
            total = sum(state.lanes for _, state in parts)
            if total <= max_lanes:
                continue
            peaks = "; ".join(
                f"{name} {state.lanes} (peak at {self.relative_ms(state.peak_at_ns):.3f} ms, "
                f"ts {us_text(state.peak_at_ns)} µs)" for name, state in parts)
            remedies = (["use fewer groups (fewer --lane-group, or no --lane-groups auto)"]
                        if len(parts) > 1 else [])
            if max_lanes < MAX_LANES_LIMIT:
                remedies.append(f"raise --max-gpu-lanes (up to {MAX_LANES_LIMIT})")
            remedies.append("capture a narrower window")
            raise TraceError(
                f"pid {pid} device {device} needs {total} display lanes with its lane groups "
                f"apart ({peaks}) but --max-gpu-lanes is {max_lanes}; "
                + ", ".join(remedies[:-1]) + (" or " if len(remedies) > 1 else "")
                + remedies[-1]
            )

    def _check_flows(self, sweep: Sweep) -> None:
        if not sweep.flow_problems:
            return
        problem = min(sweep.flow_problems, key=lambda p: p.cand)
        index = self.index
        span = _span_row(index, problem.cand)
        flow_id = index.flow_id(problem.cand)
        raise TraceError(
            f"flow event {int(span['ordinal'])} (id {flow_id}, ts {us_text(problem.ts_ns)} µs) on "
            f"a GPU stream {problem.reason}; cannot place it on a lane "
            f"({len(sweep.flow_problems)} such flow(s))"
        )

    def _retire_metadata(self, relocated: set) -> list[dict]:
        index = self.index
        pairs = {index.tracks[t] for t in relocated}
        meta_cands = _candidates_of_kind(index, META)
        retired = []
        for meta, cand in zip(index.thread_meta, meta_cands.tolist()):
            if (meta.pid, meta.tid) in pairs:
                self.actions[cand] = DELETE
                retired.append({"source_event_index": meta.ordinal, "event": RawJSON(meta.raw)})
        return retired

    def _lane_tracks(self, spec, activity_groups, scope_groups, states, slot, retired,
                     group_names: tuple) -> dict:
        index = self.index
        group_rows = []
        used_pids = set(index.pids)
        k = len(group_names)
        for g in activity_groups + scope_groups:
            pid, device = index.groups[g]
            stats = index.group_stats[g]
            is_scope = device == SCOPES
            # (key, lane group name, allocator state) of each lane group with lanes, in order
            parts = [(g * k + s, name, states[g * k + s])
                     for s, name in enumerate((None,) if is_scope else group_names)
                     if g * k + s in states]
            lanes = sum(state.lanes for _, _, state in parts)
            if is_scope:
                (display_pid,) = _free_ids(used_pids, 1, FIRST_SYNTHETIC_PID)
                used_pids.add(display_pid)
                self._scope_process(display_pid, pid)
                tids = _free_ids(set(), lanes, 1)
                names = [f"GPU scope lane {i} (synthetic; original PID {pid})"
                         for i in range(lanes)]
            else:
                display_pid = pid
                tids = self._tids(pid, lanes)
                labels = [name for _, name, state in parts for _ in range(state.lanes)]
                names = [f"GPU lane {i} (synthetic; device {device}"
                         + (f"; {label})" if label is not None else ")")
                         for i, label in enumerate(labels)]
            pid_json = json_value(display_pid)
            first = 0
            lane_group_rows = []
            for key, name, state in parts:
                group_text = (b', "group": "' + name.encode() + b'"') if name is not None else None
                for lane in range(state.lanes):
                    tid = tids[first + lane]
                    self.lane_tracks.append({"pid": display_pid, "tid": tid,
                                             "name": names[first + lane]})
                    code = slot[key] * _LANE_SLOTS + lane + 1
                    self.targets[code] = (json_value(tid), pid_json if is_scope else None,
                                          group_text)
                if name is not None:
                    at = state.peak_at_ns
                    lane_group_rows.append({
                        "group": name, "lanes": state.lanes,
                        "lane_tids": tids[first : first + state.lanes],
                        "peak_overlap_at_us": RawNumber(us_text(at)) if at is not None else None,
                    })
                first += state.lanes
            state = parts[0][2] if len(parts) == 1 else GroupLanes()
            at = state.peak_at_ns
            group_rows.append({
                "pid": pid,
                "device": None if is_scope else device,
                "kind": "scopes" if is_scope else "activity",
                "display_pid": display_pid,
                "original_streams": len(stats.tracks),
                "original_kernel_streams": len(stats.kernel_tracks),
                "kernel_count": stats.kinds.get(KERNEL, 0),
                "activity_count": sum(stats.kinds.values()),
                "memcpy_count": stats.kinds.get(MEMCPY, 0),
                "memset_count": stats.kinds.get(MEMSET, 0),
                "sync_count": stats.kinds.get(SYNC, 0),
                "lanes": lanes,
                "lane_tids": tids,
                "peak_overlap_at_us": RawNumber(us_text(at)) if at is not None else None,
                **({"lane_groups": lane_group_rows} if k > 1 and not is_scope else {}),
            })
        events, flows = self._relocated_counts()
        return {
            "max_lanes": spec.max_lanes,
            "relocated_events": events,
            "relocated_flows": flows,
            "groups": group_rows,
            "retired_track_metadata": retired,
        }

    def _relocated_counts(self) -> tuple[int, int]:
        """(events, flows) given a lane, a spill block at a time (no mask of every event)."""
        events = flows = 0
        for start, batch in _batches_with_start(self.index):
            part = self.actions[start : start + len(batch)]
            moved = (part != KEEP) & (part != DELETE)
            events += int(np.count_nonzero(moved))
            flows += int(np.count_nonzero(moved & (batch["kind"] == FLOW)))
        return events, flows

    def _scope_process(self, display_pid: int, pid: Any) -> None:
        events = [
            _meta_event(
                "process_name", display_pid, 0, {"name": f"GPU scopes (original PID {pid})"}
            ),
            _meta_event("process_labels", display_pid, 0, {"labels": VIEW_NOTICE}),
        ]
        gpu_sort = self.index.process_meta.get(pid, {}).get("sort_index")
        if isinstance(gpu_sort, int):
            events.append(_meta_event("process_sort_index", display_pid, 0,
                                      {"sort_index": clamp_sort_index(gpu_sort + 1)}))
        self.new_processes.extend(events)

    def new_track_bytes(self) -> int:
        """The bytes of the metadata the plan adds for its new tracks (every piece has it)."""
        return sum(len(event) + 2 for event in self._appended_events().metadata)

    def _appended_events(self) -> AppendedEvents:
        """New tracks first in their process: the guide, then the lanes, in that order."""
        rows: dict[Any, list[tuple[int, str]]] = {}
        if self.guide_track is not None:
            pid, tid, name = self.guide_track
            rows.setdefault(pid, []).append((tid, name))
        for lane in self.lane_tracks:
            rows.setdefault(lane["pid"], []).append((lane["tid"], lane["name"]))
        events = list(self.new_processes)
        for pid, tracks in rows.items():
            first = min(self._existing_sort_indices(pid) + [0]) - len(tracks)
            for i, (tid, name) in enumerate(tracks):
                events.append(_meta_event("thread_name", pid, tid, {"name": name}))
                events.append(_meta_event("thread_sort_index", pid, tid,
                                          {"sort_index": clamp_sort_index(first + i)}))
        return AppendedEvents(events, self.guide_events)

    # -- assembling -----------------------------------------------------------

    def finish(self, command: str, layers: dict | None, compaction: dict | None,
               options: dict | None = None, window: WindowPlan | None = None) -> Plan:
        index = self.index
        appended = self._appended_events()
        retired = len(compaction["retired_track_metadata"]) if compaction else 0
        report: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "tool": "tracestream",
            "tool_version": __version__,
            "command": command,
            "options": options or {},
            "notice": LAYERS_NOTICE if layers is not None else COMPACT_NOTICE,
        }
        if layers is not None:
            report.update(layers)
        report.update({
            "original_event_count": index.event_count,
            "added_event_count": len(appended),
            "output_event_count": index.event_count - retired + len(appended),
            "trace_origin_us": RawNumber(index.origin_text) if index.origin_text else None,
            "gpus": gpu_summary(index),
            "source_file": self.source_name,
            "source_sha256": None,  # filled in by the run: TraceSource.sha256
            "source_data_sha256": None,  # what restore gives back: TraceSource.data_sha256
            "source_compression": index.compression,
            "source_top_level": index.layout.shape,
            "output_file": self.output_name,
            "report_file": self.report_name,
        })
        previous = [v for v in index.layout.values if v.key == "tracestream"]
        if previous:
            report["source_tracestream"] = RawJSON(previous[0].raw)
        if window is not None:
            report["window"] = window.report
        if compaction is not None:
            compaction = {"notice": COMPACT_NOTICE, **compaction}
            if layers is None:
                report.update(compaction)
            else:
                report["compaction"] = compaction
        member = None
        if index.layout.shape == "object":
            view = VIEW_NOTICE if compaction is not None else (
                "layer guides — anchor-to-anchor navigation intervals")
            member = {"tool": "tracestream", "version": __version__, "view": view,
                      "report": self.report_name}
            if window is not None:  # not the whole trace: restore refuses it
                member["window"] = window.spec.text
            member = b'"tracestream": ' + dumps(member)
        return Plan(self.actions, self.targets, appended, member, report, window=window)


def gpu_summary(index: TraceIndex) -> list[dict]:
    """Per GPU (pid, device): what the source holds, for the report and `verify`."""
    rows = []
    for g, (pid, device) in enumerate(index.groups):
        if device == SCOPES:
            continue
        stats = index.group_stats[g]
        rows.append({
            "pid": pid,
            "device": device,
            "kernel_count": stats.kinds.get(KERNEL, 0),
            "activity_count": sum(stats.kinds.values()),
            "streams": len(stats.tracks),
            "kernel_streams": len(stats.kernel_tracks),
        })
    return rows


def _by_lane_group(blocks: Iterator[np.ndarray], k: int) -> Iterator[np.ndarray]:
    """The sweep's blocks with each slice's group the key of its (device group, lane group):
    group * k + its lane group (flows keep -1). With k = 1 the blocks are as they were."""
    if k == 1:
        yield from blocks
        return
    for block in blocks:
        block = block.copy()  # the store's own rows are read again (`at_ends`)
        slices = block["group"] >= 0
        block["group"][slices] = block["group"][slices] * k + block["lane_group"][slices]
        yield block


def _span_row(index: TraceIndex, cand: int):
    for batch_start, batch in _batches_with_start(index):
        if batch_start <= cand < batch_start + len(batch):
            return batch[cand - batch_start]
    raise IndexError(cand)


def _candidates_of_kind(index: TraceIndex, kind: int) -> np.ndarray:
    """Candidate numbers of one kind, a spill block at a time (no column of all kinds)."""
    parts = [start + np.flatnonzero(batch["kind"] == kind)
             for start, batch in _batches_with_start(index)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _batches_with_start(index: TraceIndex) -> Iterator[tuple[int, np.ndarray]]:
    start = 0
    for batch in index.spans.batches():
        yield start, batch
        start += len(batch)
