"""The numpy and Python twins of the C extension's functions: the same arguments, the same
results (arrays where C gives bytearrays of the same items), the same TypeError where a
value cannot be a key. They run where the extension is not built, and the tests hold the
two to each other. A module per concern, as the C files are split:

* `keys`: where separators and quoted keys lie in a chunk's bytes;
* `events`: fields of decoded events (msgspec structs) read, coded and counted;
* `columns`: ts/dur columns from their exact text, and verify's per-event columns;
* `splice`: relocated events spliced into a chunk, and undone;
* `rows`: rows of JSON text written from columns.

Two functions decline where C may: `scan_events` leaves every chunk to msgspec's decode
(the reference the scan is held to), and `json_rows` leaves SHORTEST columns to its
callers' Python rows.
"""

from tracestream._native.reference.columns import check_columns, decimal_column
from tracestream._native.reference.events import (
    classify,
    event_values,
    first_set,
    first_unhashable_device,
    flow_columns,
    match_keys,
    name_counts,
    named,
    scan_events,
    slice_keys,
    track_keys,
)
from tracestream._native.reference.keys import continues, event_keys, integer_ends, separators
from tracestream._native.reference.rows import CODED, FIXED, INTEGERS, SHORTEST, TEXTS, json_rows
from tracestream._native.reference.splice import splice, undo_relocations

__all__ = [
    "CODED", "FIXED", "INTEGERS", "SHORTEST", "TEXTS", "check_columns", "classify", "continues",
    "decimal_column", "event_keys", "event_values", "first_set", "first_unhashable_device",
    "flow_columns", "integer_ends", "json_rows", "match_keys", "name_counts", "named",
    "scan_events", "separators", "slice_keys", "splice", "track_keys", "undo_relocations",
]
