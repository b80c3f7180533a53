"""Flow events, thread metadata, guides and provenance of a chunk: the observer's last steps."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import orjson

from tracestream import _native
from tracestream._native.reference.events import category_counts
from tracestream.index.facts import (
    FLOW_DTYPE,
    NO_ID,
    GuideEvent,
    MetaEvent,
)


class FlowsAndMetadata:
    """Methods of the chunk observer (`extract._Observer`), which holds the state they read."""

    def _flows(self, flows, ts_ns, cand_of) -> tuple:
        if not flows:
            return np.zeros(0, FLOW_DTYPE), {}, Counter()
        if cand_of is None:  # no rewrite: only `inspect` reports the categories (and the
            # read-only decode has no `id` or `bp` to bind by)
            categories = (category_counts([self.events[i].cat for i in flows])
                          if self.ctx.count_names else Counter())
            return np.zeros(0, FLOW_DTYPE), {}, categories
        columns = self._flow_columns(flows)
        rows = np.empty(len(flows), FLOW_DTYPE)
        at = np.array(flows, np.int64)  # converted once, not by each index below
        rows["cand"] = cand_of[at]
        tracks = np.array([self.track(*key) for key in columns.track_keys], np.int64)
        rows["track"] = tracks[columns.track_codes]  # numbered as _intern numbers them
        rows["ts"] = ts_ns[at]
        rows["binds_next"] = columns.binds_next
        rows["id"] = columns.ids
        ids: dict[int, Any] = {}  # candidate -> id, for ids that are no such integer
        for k in np.flatnonzero(rows["id"] == NO_ID).tolist():
            ids[int(rows["cand"][k])] = self.events[flows[k]].id
        return rows, ids, columns.categories

    def _flow_columns(self, flows: list[int]) -> FlowColumns:
        """The flows' (pid, tid) keys, whether each binds to the next slice, their ids
        packed and their category counts (see FlowColumns)."""
        codes, keys, binds, packed, categories = _native.flow_columns(self.events, flows, NO_ID)
        return FlowColumns(keys, np.frombuffer(codes, np.int32), np.frombuffer(binds, bool),
                           np.frombuffer(packed, np.int64), Counter(categories))

    def _metadata(self, metas: list[int]) -> tuple[list, list, list]:
        thread_meta = []
        process_meta = []
        cands = []
        for i in metas:
            e = self.events[i]
            name = e.name
            if not isinstance(name, str):
                continue
            if name.startswith("thread_"):
                s, end = self.span(i)
                raw = self.data[s:end]
                args = orjson.loads(raw).get("args")
                args = args if isinstance(args, dict) else {}
                value = args.get("name", args.get("sort_index"))
                thread_meta.append(
                    MetaEvent(i, self.offset + s, end - s, e.pid, e.tid, name, value, raw))
                self.track(e.pid, e.tid)
                cands.append(i)
            elif name in ("process_name", "process_labels", "process_sort_index"):
                args = orjson.loads(self.raw(i)).get("args")
                args = args if isinstance(args, dict) else {}
                key = {"process_name": "name", "process_labels": "labels",
                       "process_sort_index": "sort_index"}[name]
                process_meta.append((e.pid, key, args.get(key)))
        return thread_meta, process_meta, cands

    def _guide(self, i: int) -> GuideEvent:
        e = self.events[i]
        self.track(e.pid, e.tid)
        args = orjson.loads(self.raw(i)).get("args")
        return GuideEvent(i, e.pid, e.tid, args if isinstance(args, dict) else {})

    def _provenance(self) -> int | None:
        """The first event whose args hold the provenance key (whatever its value)."""
        unset = msgspec.UNSET
        return _native.first_set(self.events, "args", "provenance", unset)


@dataclass
class FlowColumns:
    """What the index keeps of a chunk's flow events, a column each (`_Observer._flows`)."""

    track_keys: list  # the distinct (pid, tid), in order of first appearance
    track_codes: np.ndarray  # int32 per flow: its key's position in track_keys
    binds_next: np.ndarray  # bool: an `f` without "bp": "e" (see binds_next)
    ids: np.ndarray  # int64, NO_ID where the id is no integer within +-2**62
    categories: Counter  # how often each category (its str when no string) occurs
