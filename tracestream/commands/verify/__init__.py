"""`verify`: prove that an annotated trace is its source plus tracestream's additions."""

from tracestream.commands.verify.run import verify
from tracestream.commands.verify.verdict import Check, Verdict

__all__ = ["Check", "Verdict", "verify"]
