"""Batch tasks: output names derived from each input, manifests parsed and merged with the
command line's defaults, one small dict of absolute paths and options per trace."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tracestream.engine import default_report_path, spec_options
from tracestream.errors import SpecError, TraceError
from tracestream.plan.selection import id_from_text
from tracestream.plan.specs import ALL_PASSES, CompactSpec, LayerSpec, validate_specs
from tracestream.read.compression import SUFFIX_OF, SUFFIXES, compression_for

KINDS = ("compact", "layers")


def split_trace_name(name: str) -> tuple[str, str, str | None]:
    """(stem, compression suffix, compression) of a file name, without its `.json`.

    `TP-0.trace.json.gz` -> (`TP-0.trace`, `.gz`, `gzip`); `a.json` -> (`a`, ``, None);
    a name without `.json` keeps everything but a compression suffix as its stem.
    """
    stem, suffix, compression = name, "", None
    lower = name.lower()
    for ext, kind in SUFFIXES.items():
        if lower.endswith(ext) and len(name) > len(ext):
            stem, suffix, compression = name[: -len(ext)], name[-len(ext):], kind
            break
    if stem.lower().endswith(".json") and len(stem) > len(".json"):
        stem = stem[: -len(".json")]
    return stem, suffix, compression


def output_name(trace: str, kind: str, compress: str | None = None) -> str:
    """The output file name: `TP-0.trace.json.gz` -> `TP-0.trace.compact.json.gz`.

    `.compact` or `.layers` goes before the `.json` suffix; the compression suffix is
    the input's, or the one of `compress` (none, gzip, zstd) when given.
    """
    if kind not in KINDS:
        raise TraceError(f"unknown batch kind {kind!r} (compact, layers)")
    stem, suffix, compression = split_trace_name(os.path.basename(trace))
    if compress is not None and compress != (compression or "none"):
        if compress not in SUFFIX_OF:
            raise TraceError(f"unknown compression {compress!r} (none, gzip, zstd)")
        suffix = SUFFIX_OF[compress]
    return f"{stem}.{kind}.json{suffix}"


def output_path(trace: str, output_dir: str, kind: str, compress: str | None = None,
                folder: str = "") -> str:
    """`output_name` in `output_dir`, under `folder` (see `distinct_folders`)."""
    return os.path.join(os.path.abspath(output_dir), folder,
                        output_name(trace, kind, compress))


def distinct_folders(traces: Sequence[str]) -> list[str]:
    """Per trace: its folder relative to the folder all the traces share, so outputs mirror
    the part of the paths that differs (`r0/trace.json.gz`, `r1/trace.json.gz` -> `r0`, `r1`:
    the usual one folder per rank); all in one folder: "" each."""
    folders = [os.path.dirname(os.path.abspath(trace)) for trace in traces]
    if not folders:
        return []
    shared = os.path.commonpath(folders)
    return [os.path.relpath(folder, shared) if folder != shared else "" for folder in folders]


_LAYER_FIELDS = {f.name: f for f in dataclasses.fields(LayerSpec)}
_REQUIRED = [name for name, f in _LAYER_FIELDS.items()
             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
_STR_OPTIONS = {"anchor_regex", "phase", "evidence", "end_anchor_regex"}
_INT_OPTIONS = {"num_layers", "anchor_offset", "passes", "anchor_stride",
                "extra_anchors_per_pass", "first_layer", "max_gpu_lanes"}
_FLOAT_OPTIONS = {"gap_factor"}
_BOOL_OPTIONS = {"allow_gaps", "allow_several_anchor_names"}
_ID_OPTIONS = {"pid", "device"}
_NULLABLE = {"end_anchor_regex", "pid", "device", "max_gpu_lanes"}
LAYER_OPTIONS = tuple(_LAYER_FIELDS) + ("max_gpu_lanes",)
"""Per-trace options of `batch layers` (LayerSpec fields, plus the compact view's lanes)."""


@dataclass
class ManifestEntry:
    """One manifest line: the trace (absolute), its output if given, its own options."""

    line: int
    trace: str
    output: str | None
    options: dict


def _check_option(where: str, key: str, value: Any) -> Any:
    if value is None:
        if key in _NULLABLE:
            return None
        raise TraceError(f"{where}: {key} must not be null")
    if key in _STR_OPTIONS and not isinstance(value, str):
        raise TraceError(f"{where}: {key} must be a string, got {orjson.dumps(value).decode()}")
    if key == "passes" and value == ALL_PASSES:
        return value
    if key in _INT_OPTIONS and (isinstance(value, bool) or not isinstance(value, int)):
        also = " or \"all\"" if key == "passes" else ""
        raise TraceError(
            f"{where}: {key} must be an integer{also}, got {orjson.dumps(value).decode()}")
    if key in _FLOAT_OPTIONS and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise TraceError(f"{where}: {key} must be a number, got {orjson.dumps(value).decode()}")
    if key in _BOOL_OPTIONS and not isinstance(value, bool):
        raise TraceError(f"{where}: {key} must be true or false, "
                         f"got {orjson.dumps(value).decode()}")
    if key in _ID_OPTIONS:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise TraceError(f"{where}: {key} must be an integer or a string, "
                             f"got {orjson.dumps(value).decode()}")
        return id_from_text(value)
    return value


def parse_manifest(path: str) -> list[ManifestEntry]:
    """JSON lines: `trace`, optional `output`, and `layers` options with underscores.

    Relative `trace` paths are relative to the manifest's folder. Blank lines and
    lines starting with `#` are skipped. Errors name the manifest line.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read manifest {path}: {exc}") from None
    folder = os.path.dirname(os.path.abspath(path))
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"manifest {path} line {number}"
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise TraceError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(item, dict):
            raise TraceError(f"{where}: expected a JSON object with \"trace\"")
        trace = item.pop("trace", None)
        if not isinstance(trace, str) or not trace:
            raise TraceError(f"{where}: \"trace\" (a path) is missing")
        output = item.pop("output", None)
        if output is not None and (not isinstance(output, str) or not output):
            raise TraceError(f"{where}: \"output\" must be a path")
        unknown = sorted(set(item) - set(LAYER_OPTIONS))
        if unknown:
            raise TraceError(
                f"{where}: unknown option(s) {', '.join(unknown)} "
                f"(known: trace, output, {', '.join(LAYER_OPTIONS)})")
        options = {key: _check_option(where, key, value) for key, value in item.items()}
        entries.append(ManifestEntry(number, os.path.join(folder, trace), output, options))
    if not entries:
        raise TraceError(f"manifest {path} lists no traces")
    return entries


def merge_layer_options(defaults: dict, line: dict,
                        where: str) -> tuple[LayerSpec, CompactSpec | None]:
    """Command-line defaults overlaid by the manifest line: the line wins.

    Missing required options and invalid values are TraceErrors naming `where`.
    """
    merged = {k: v for k, v in defaults.items() if v is not None}
    merged.update(line)
    missing = [name for name in _REQUIRED if merged.get(name) is None]
    if missing:
        raise TraceError(
            f"{where}: missing {', '.join(missing)} (give it on the line or as "
            f"{', '.join('--' + m.replace('_', '-') for m in missing)})")
    lanes = merged.pop("max_gpu_lanes", None)
    spec = LayerSpec(**{k: v for k, v in merged.items() if k in _LAYER_FIELDS})
    compact_spec = CompactSpec(max_lanes=lanes, pid=spec.pid) if lanes is not None else None
    try:
        validate_specs(spec, compact_spec)
    except SpecError as exc:  # named as the manifest's keys
        raise TraceError(f"{where}: {exc.render(manifest_key)}") from None
    except TraceError as exc:
        raise TraceError(f"{where}: {exc}") from None
    return spec, compact_spec


def manifest_key(field: str) -> str:
    """The manifest key of a spec field (the compact view's lanes are `max_gpu_lanes`)."""
    return "max_gpu_lanes" if field == "max_lanes" else field


def _task(kind: str, trace: str, output: str, *, layers: LayerSpec | None,
          compact: CompactSpec | None, compress: str | None, compress_level: int | None,
          verify: bool, skip_existing: bool, max_event_bytes: int | None = None) -> dict:
    if trace == "-":
        raise TraceError("batch reads trace files; stdin (-) is for the single-trace commands")
    compression = compression_for(output, compress)  # the output's name carries the input's
    options = spec_options(layers, compact)  # as the report records them (a retry compares)
    return {
        "kind": kind,
        "trace": os.path.abspath(trace),
        "output": os.path.abspath(output),
        "report": default_report_path(os.path.abspath(output), kind),
        "layers": options.get("layers"),
        "compact": options.get("compact"),
        "compress": compression,
        "compress_level": compress_level,
        "verify": verify,
        "skip_existing": skip_existing,
        "max_event_bytes": max_event_bytes,
    }


def _refuse_duplicates(tasks: list[dict]) -> None:
    inputs = {task["trace"] for task in tasks}
    for task in tasks:
        for path in (task["output"], task["report"]):
            if path in inputs:
                raise TraceError(f"{task['trace']} would write {path}, which is an input trace")
    seen: dict[str, str] = {}
    for task in tasks:
        for path in (task["output"], task["report"]):
            if path in seen:
                raise TraceError(
                    f"{task['trace']} and {seen[path]} would both write {path}; "
                    "give the traces distinct names or folders")
            seen[path] = task["trace"]


def compact_tasks(traces: Sequence[str], output_dir: str, spec: CompactSpec | None = None, *,
                  compress: str | None = None, compress_level: int | None = None,
                  verify: bool = False, skip_existing: bool = False,
                  max_event_bytes: int | None = None) -> list[dict]:
    """One `compact` task per trace, the same options for each (`max_event_bytes`: the
    longest single event read, None: 64 MiB)."""
    spec = spec or CompactSpec()
    spec.validate()
    if not traces:
        raise TraceError("no traces given")
    tasks = [_task("compact", t, output_path(t, output_dir, "compact", compress, folder),
                   layers=None, compact=spec, compress=compress,
                   compress_level=compress_level, verify=verify, skip_existing=skip_existing,
                   max_event_bytes=max_event_bytes)
             for t, folder in zip(traces, distinct_folders(traces))]
    _refuse_duplicates(tasks)
    return tasks


def layers_tasks(manifest: str, output_dir: str, defaults: dict | None = None, *,
                 compress: str | None = None, compress_level: int | None = None,
                 verify: bool = False, skip_existing: bool = False,
                 max_event_bytes: int | None = None) -> list[dict]:
    """One `layers` task per manifest line; `defaults` are command-line options.

    A relative `output` on a line is relative to `output_dir`; the outputs named for the
    other lines mirror the folders of their traces (see `distinct_folders`).
    """
    defaults = {k: id_from_text(v) if k in _ID_OPTIONS else v for k, v in (defaults or {}).items()}
    unknown = sorted(set(defaults) - set(LAYER_OPTIONS))
    if unknown:
        raise TraceError(f"unknown layers option(s): {', '.join(unknown)}")
    tasks = []
    entries = parse_manifest(manifest)
    named = [entry for entry in entries if entry.output is None]  # outputs named for them
    folders = dict(zip(map(id, named), distinct_folders([entry.trace for entry in named])))
    for entry in entries:
        where = f"manifest {manifest} line {entry.line}"
        spec, compact_spec = merge_layer_options(defaults, entry.options, where)
        if entry.output is not None:  # its compression: --compress, else its own suffix
            output = os.path.join(os.path.abspath(output_dir), entry.output)
        else:
            output = output_path(entry.trace, output_dir, "layers", compress,
                                 folders[id(entry)])
        tasks.append(_task("layers", entry.trace, output, layers=spec, compact=compact_spec,
                           compress=compress, compress_level=compress_level, verify=verify,
                           skip_existing=skip_existing, max_event_bytes=max_event_bytes))
    _refuse_duplicates(tasks)
    return tasks
