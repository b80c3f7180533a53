"""Worker processes and the shared memory that hands them chunks."""
