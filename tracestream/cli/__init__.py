"""The command-line layer: click commands over the library, rendering and exit codes.

No trace logic lives here: each command parses its options, calls the library (which
never prints or exits) and renders what it returns. `main` is the `tracestream` group.
"""

from tracestream.cli import annotate, batch, check, evidence, view
from tracestream.cli.app import main

for _module in (annotate, check, evidence, batch, view):
    _module.register(main)

__all__ = ["main"]
