"""The command-line layer: click commands over the library, rendering and exit codes."""
