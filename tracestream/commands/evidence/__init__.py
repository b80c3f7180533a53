"""Evidence before labels: what a trace holds (`inspect`) and where an anchor runs (`anchors`).

Both are read-only and stream the trace once through the index pass. They
report counts, times and gaps so a user can verify an anchor, its layer count
and its first complete pass; they never pick an offset or a layer count.
"""
