"""`verify`: prove that an annotated trace is its source plus tracestream's additions.

Both files are streamed side by side, never held in memory. The source is
indexed and re-planned with the options the report recorded, so every output
event can be compared with what it must be: the source event unchanged, the
source event relocated to the planned lane, or a planned addition (byte for
byte: a key spelled twice may be read either way). The output is also restored
by `restore`'s own splice (output and report alone, no plan) and the sha256 of
the restored bytes compared with the source's, hashed as the index pass read
it. Independent checks then look only at the output, by Perfetto's import rules:
every synthetic lane and the guide track import at depth zero (slices starting
together nest longest first), every relocated flow binds on its lane to the
activity it binds to on its original stream, the guides are complete, ordered
and as the report's rows say, and the per-GPU kernel and stream counts and the
lanes match the report. An output event that differs from the plan is named
once; those checks see the planned event in its place, so one tampered value
brings no follow-on failures.

An output that is exactly as planned is settled a chunk at a time
(`run._fast_compare`): the planned chunks are made again by the splice's numpy twin in
the workers, which also run the output-only checks on the events of the chunk they
made; the main process compares the output with those bytes, and restore's splice
runs meanwhile. The output is read once there (and once by restore), never decoded:
where it is byte for byte the planned chunks, their events are its events. Anything
that differs sends verify to the event-by-event comparison, which names it.
"""

from tracestream.commands.verify.run import verify
from tracestream.commands.verify.verdict import Check, Verdict

__all__ = ["Check", "Verdict", "verify"]
