"""Reading a trace: the source (file, pipe, compression) and its chunks of events."""
