"""The index pass: every chunk reduced to packed facts, merged into one index."""
