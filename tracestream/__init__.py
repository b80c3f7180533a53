"""tracestream: stream Kineto Chrome-JSON traces of any size and write a new, annotated trace."""

__version__ = "0.1.0"

from tracestream.api import Report, add_layer_guides, compact  # noqa: E402
from tracestream.errors import TraceError, VerificationFailed  # noqa: E402
from tracestream.guides import LayerSpec  # noqa: E402
from tracestream.plan import CompactSpec  # noqa: E402

__all__ = [
    "CompactSpec",
    "LayerSpec",
    "Report",
    "TraceError",
    "VerificationFailed",
    "__version__",
    "add_layer_guides",
    "compact",
]
