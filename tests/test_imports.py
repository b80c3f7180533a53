"""What a command imports before it reads a byte: serial start-up time of every run."""

import subprocess
import sys

import pytest

import tracestream

WRITING_STAGES = ("tracestream.engine", "tracestream.plan.planner", "tracestream.write.rewrite",
                  "tracestream.write.relocate", "tracestream.plan.guidetext",
                  "tracestream.plan.report")
"""What only `layers`, `compact`, `verify` and `restore` run: planning and writing."""


def _loaded_after(statement: str) -> list[str]:
    probe = (f"import sys; {statement}; "
             f"print(sorted(m for m in {WRITING_STAGES!r} if m in sys.modules))")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_read_only_commands_do_not_import_the_writing_stages():
    """`inspect` and `anchors` (the CLI, their commands' modules, the worker pool) load no
    planning or rewriting module: ~10 ms of start-up before any worker starts."""
    assert _loaded_after("import tracestream.cli, tracestream.cli.guard, "
                         "tracestream.commands.evidence.anchors, "
                         "tracestream.commands.evidence.inspect, tracestream.read.sizing, "
                         "tracestream.jsontext") == "[]"
    assert _loaded_after("import tracestream") == "[]"


@pytest.mark.parametrize("name, module", [
    ("add_layer_guides", "tracestream.engine"), ("compact", "tracestream.engine"),
    ("Report", "tracestream.engine"), ("LayerSpec", "tracestream.plan.specs"),
    ("CompactSpec", "tracestream.plan.specs"), ("TraceError", "tracestream.errors"),
    ("verify", "tracestream.commands.verify"), ("Verdict", "tracestream.commands.verify"),
    ("restore", "tracestream.commands.restore"),
    ("inspect_trace", "tracestream.commands.evidence.inspect"),
    ("find_anchors", "tracestream.commands.evidence.anchors"),
    ("run_batch", "tracestream.commands.batch"),
])
def test_the_public_names_are_there_as_before(name, module):
    """`from tracestream import add_layer_guides` (and the rest of __all__) still works: the
    library's names load with their modules on first use."""
    import importlib

    assert getattr(tracestream, name) is getattr(importlib.import_module(module), name)
    assert name in tracestream.__all__ and name in dir(tracestream)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'add_guides'"):
        tracestream.add_guides  # noqa: B018
    with pytest.raises(ImportError):
        from tracestream import add_guides  # noqa: F401
