"""The rewrite pass: the plan's edits spliced into the source's bytes, written safely."""
