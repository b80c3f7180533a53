"""Click commands for `batch` (registered on the main group by tracestream.cli)."""


def register(main) -> None:
    """Add this module's commands to the `tracestream` group."""
