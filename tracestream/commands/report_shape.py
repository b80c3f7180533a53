"""The shape of a report as `verify` reads it: an edited or damaged report is refused in one
line ("the report is incomplete or malformed"), as `restore` refuses it, instead of failing
deep in the checks with a KeyError or a TypeError.

Only the members verify reads are described, each with the type tracestream writes; any
other member may hold anything.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from tracestream.errors import SpecError, malformed_report


class _LaneGroupRow(msgspec.Struct):
    group: str
    lanes: int
    lane_tids: list[Any] = []


class _Group(msgspec.Struct):
    display_pid: Any = None
    lanes: Any = None
    lane_tids: list[Any] = []
    lane_groups: list[_LaneGroupRow] = []  # (--lane-groups: a device's lanes per group)


class _Compaction(msgspec.Struct):
    groups: list[_Group] = []


class _Gpu(msgspec.Struct):
    pid: Any
    device: Any
    kernel_count: int
    streams: Any


class _Guides(msgspec.Struct):
    """Read only when the report's options have layers."""

    pid: Any
    guide_tid: Any
    num_layers: int
    passes: int


class _Report(msgspec.Struct):
    options: dict = {}
    gpus: list[_Gpu] = []
    compaction: _Compaction | None = None
    groups: list[_Group] = []
    output_file: str = ""
    report_file: str = ""
    command: str = ""
    source_file: str | None = None


def report_specs(data: dict):
    """(LayerSpec | None, CompactSpec | None) the report records, once every member verify
    reads has the type tracestream writes; else the one-line refusal."""
    from tracestream.engine import specs_from_options

    try:
        members = {k: v for k, v in data.items() if k != "layers"}  # rows: see LayerRows
        report = msgspec.convert(members, _Report)
        guides = msgspec.convert(members, _Guides) if report.options.get("layers") else None
        specs = specs_from_options(report.options)
        for name, spec in zip(("layers", "compact"), specs):
            if spec is not None:
                try:  # each field's type, as the option's annotation says it
                    msgspec.convert(dataclasses.asdict(spec), type(spec))
                except msgspec.ValidationError as exc:
                    raise malformed_report(str(exc).replace("`$.", f"`$.options.{name}.")) from None
                spec.validate()
    except msgspec.ValidationError as exc:
        raise malformed_report(str(exc)) from None
    except SpecError as exc:
        raise malformed_report(f"options: {exc.render(lambda field: field)}") from None
    except (TypeError, ValueError, AttributeError) as exc:  # unknown option names
        raise malformed_report(f"options: {exc}") from None
    _require_hashable(report, guides)
    return specs


def _require_hashable(report: _Report, guides: _Guides | None) -> None:
    """pids, devices and tids are looked up as keys: numbers or strings, never objects."""
    values = [] if guides is None else [("pid", guides.pid), ("guide_tid", guides.guide_tid)]
    values += [(f"gpus[{k}].{name}", getattr(gpu, name)) for k, gpu in enumerate(report.gpus)
              for name in ("pid", "device")]
    groups = report.groups + (report.compaction.groups if report.compaction else [])
    values += [("groups[].display_pid", g.display_pid) for g in groups]
    values += [("groups[].lane_tids[]", tid) for g in groups for tid in g.lane_tids]
    values += [("groups[].lane_groups[].lane_tids[]", tid) for g in groups
               for row in g.lane_groups for tid in row.lane_tids]
    for where, value in values:
        if isinstance(value, (dict, list)):
            raise malformed_report(f"{where} must be a number or a string")
