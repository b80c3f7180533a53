"""tracestream: stream Kineto Chrome-JSON traces of any size and write a new, annotated trace."""

from tracestream._version import __version__
from tracestream.errors import TraceError

_LAZY = {
    "Report": "tracestream.engine",
    "add_layer_guides": "tracestream.engine",
    "compact": "tracestream.engine",
    "LayerSpec": "tracestream.plan.specs",
    "CompactSpec": "tracestream.plan.specs",
    "verify": "tracestream.commands.verify",
    "Verdict": "tracestream.commands.verify",
    "restore": "tracestream.commands.restore",
    "inspect_trace": "tracestream.commands.evidence.inspect",
    "find_anchors": "tracestream.commands.evidence.anchors",
    "run_batch": "tracestream.commands.batch",
    "pass_window": "tracestream.plan.window",
    "time_window": "tracestream.plan.window",
    "split_mb": "tracestream.plan.window",
}
"""The public names whose modules load on first use: `import tracestream` (which every
command runs, for its version) would otherwise import every stage of the engine, ~10 ms
the read-only commands never use."""

__all__ = [
    "CompactSpec",
    "LayerSpec",
    "Report",
    "TraceError",
    "Verdict",
    "__version__",
    "add_layer_guides",
    "compact",
    "find_anchors",
    "inspect_trace",
    "pass_window",
    "restore",
    "run_batch",
    "split_mb",
    "time_window",
    "verify",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tracestream' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
