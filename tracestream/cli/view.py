"""Click command for `view` (registered on the main group by tracestream.cli)."""

from pathlib import Path

import click


def register(main) -> None:
    """Add `view` to the `tracestream` group."""
    from tracestream.commands.view import (
        DEFAULT_UI_URL,  # not tracestream.commands.view.server: its imports are heavy
    )

    @main.command("view")
    @click.option("--trace", "trace_path", required=True, type=click.Path(path_type=Path),
                  help="Trace file to open (.json, .json.gz or .json.zst).")
    @click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
                  help="Port on 127.0.0.1; 0 picks a free one. Fix it to reuse an ssh tunnel.")
    @click.option("--ui-url", default=DEFAULT_UI_URL, show_default=True,
                  help="Perfetto UI to hand the trace to, e.g. a self-hosted copy.")
    @click.option("--no-browser", is_flag=True, help="Only print the address; open no browser.")
    def view(trace_path, port, ui_url, no_browser):
        """Open a trace in the Perfetto UI, served from this machine only. Ctrl-C stops."""
        from tracestream.commands.view.server import view_trace

        view_trace(trace_path, port=port, ui_url=ui_url, open_browser=not no_browser,
                   echo=click.echo)
