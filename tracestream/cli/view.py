"""Click command for `view` (registered on the main group by tracestream.cli): the server
of tracestream.commands.view, its address printed, a desktop browser opened where there is
one, Ctrl-C to stop."""

import os
import sys
from pathlib import Path

import click


def register(main) -> None:
    """Add `view` to the `tracestream` group."""
    from tracestream.cli.options import examples
    from tracestream.commands.view import (
        DEFAULT_UI_URL,  # not tracestream.commands.view.server: its imports are heavy
    )

    @main.command("view", epilog=examples(
        "tracestream view --trace TP-0.layers.trace.json.gz",
        "tracestream view --trace TP-0.layers.trace.json.gz --port 9001 --no-browser",
        "tracestream view --trace TP-0.layers.trace.json.pieces.json"))
    @click.option("--trace", "trace_path", required=True, type=click.Path(path_type=Path),
                  help="Trace file to open (.json, .json.gz or .json.zst), or the "
                       "OUTPUT.pieces.json manifest a --split-mb run wrote: a page then "
                       "lists its pieces, each opened with one click.")
    @click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
                  help="Port on 127.0.0.1; 0 picks a free one. Fix it to reuse an ssh tunnel.")
    @click.option("--ui-url", default=DEFAULT_UI_URL, show_default=True,
                  help="Perfetto UI to hand the trace to, e.g. a self-hosted copy.")
    @click.option("--no-browser", is_flag=True, help="Only print the address; open no browser.")
    def view(trace_path, port, ui_url, no_browser):
        """Open a trace in the Perfetto UI, served from this machine only. Ctrl-C stops.

        Given a pieces manifest (--split-mb of layers/compact), the page lists the pieces
        (time range, passes, events, size) and opens the one you click."""
        view_trace(trace_path, port=port, ui_url=ui_url, open_browser=not no_browser,
                   echo=click.echo)


def _report_on_stderr(line: str) -> None:
    """A serving error, one line on stderr while the server goes on."""
    print(f"tracestream view: error: {line}", file=sys.stderr, flush=True)


def has_desktop(environ=None, platform: str | None = None) -> bool:
    """Whether a graphical browser can open here.

    Without a display, webbrowser falls back to a console browser such as lynx. That
    browser cannot run the page, and it takes over the terminal until it quits.
    """
    environ = os.environ if environ is None else environ
    if (platform or sys.platform) in ("darwin", "win32"):
        return True
    return bool(environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"))


def view_trace(trace_path, *, port: int, ui_url: str, open_browser: bool, echo) -> None:
    """Serves the trace, opens the browser if there is one, and blocks until Ctrl-C.

    Ctrl-C is the normal way to stop, so it returns normally instead of raising.
    """
    from tracestream.commands.view.server import ViewServer, address_lines

    try:
        with ViewServer(trace_path, port=port, ui_url=ui_url,
                        report=_report_on_stderr) as server:
            for line in address_lines(server):
                echo(line)
            if open_browser and not (has_desktop() and _open_in_browser(server.url)):
                echo("No desktop browser found here; open the address above yourself.")
            server.serve_forever()
    except KeyboardInterrupt:
        pass
    echo("Stopped.")


def _open_in_browser(url: str) -> bool:
    import webbrowser

    try:
        return webbrowser.open(url, new=2)
    except webbrowser.Error:
        return False
