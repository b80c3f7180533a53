"""Where `view` hands a trace to by default.

Apart from `tracestream.commands.view.server`, whose HTTP server modules would cost every other
command ~20 ms of imports when the CLI registers `view`'s options.
"""

DEFAULT_UI_URL = "https://ui.perfetto.dev"
