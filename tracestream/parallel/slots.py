"""Shared memory for the chunks passed between the parent and its workers, by slot.

Only slot numbers and lengths go through the pipes; a chunk that does not fit a slot
goes through the pipe as bytes.
"""

from __future__ import annotations

import mmap


class ChunkSlots:
    """Shared memory for the chunks passed between the parent and its workers, by slot.

    Mapped before the workers are forked, so they share it. The parent puts a
    chunk of decompressed input in a slot for the index pass; a worker puts its
    rewritten chunk in the slot it was given. Only slot numbers and lengths go
    through the pipes, instead of megabytes pickled on one side and unpickled on
    the other.
    """

    def __init__(self, count: int, size: int):
        self.size = size
        self.memory = mmap.mmap(-1, count * size)  # anonymous and shared with children
        self._free = list(range(count))

    @property
    def free(self) -> int:
        """How many slots no chunk holds."""
        return len(self._free)

    def acquire(self) -> int | None:
        """A free slot, or None when all are taken (the chunk then goes as bytes)."""
        return self._free.pop() if self._free else None

    def put(self, slot: int, data: bytes) -> bool:
        """Copy `data` into `slot` (for the other side); False if it does not fit."""
        return self.put_pieces(slot, (data,))

    def put_pieces(self, slot: int, pieces) -> bool:
        """Copy the bytes-like `pieces` one after the other into `slot`; False if they do
        not fit."""
        if sum(map(len, pieces)) > self.size:
            return False
        at = slot * self.size
        for piece in pieces:
            self.memory[at : at + len(piece)] = piece
            at += len(piece)
        return True

    def read(self, slot: int, length: int) -> bytes:
        """The `length` bytes in `slot` (copied out)."""
        start = slot * self.size
        return self.memory[start : start + length]

    def view(self, slot: int, length: int) -> memoryview:
        """The `length` bytes in `slot`, not copied (valid until the slot is released)."""
        start = slot * self.size
        return memoryview(self.memory)[start : start + length]

    def release(self, slot: int | None) -> None:
        if slot is not None:
            self._free.append(slot)

    def close(self) -> None:
        try:
            self.memory.close()
        except BufferError:  # a failed write's traceback still holds a view: unmapped with it
            pass


WRITER_HOLDS = 3
"""Blocks an output file holds at once (those queued for its writer thread and the one
being written): their slots stay taken until written, so a pool has this many more."""

_SLOTS: ChunkSlots | None = None  # the slots of the pool that forked this worker


def attach(slots: ChunkSlots | None) -> None:
    """In a worker, at start: the pool's shared memory, mapped before it was forked."""
    global _SLOTS
    _SLOTS = slots


def received(slot: int, length: int) -> bytes:
    """In a worker: the chunk the parent `put` in `slot` (copied out)."""
    return _SLOTS.read(slot, length)


def received_view(slot: int, length: int) -> memoryview:
    """In a worker: the `length` bytes the parent `put` in `slot`, not copied (the parent
    leaves the slot alone until the task's result is back)."""
    return _SLOTS.view(slot, length)


def slot_buffer(slot: int | None) -> memoryview | None:
    """In a worker: all of shared slot `slot` to write a result into (None without one)."""
    if slot is None or _SLOTS is None:
        return None
    return _SLOTS.view(slot, _SLOTS.size)


def deliver(data: bytes, slot: int | None) -> bytes | int:
    """In a worker: `data` put in its slot (its length returned), or `data` itself if it
    has no slot or does not fit."""
    if slot is not None and _SLOTS is not None and _SLOTS.put(slot, data):
        return len(data)
    return data


def write_result(out, result: bytes | int, slot: int | None, slots: ChunkSlots | None) -> None:
    """In the parent: write what `deliver` handed back to `out` (an OutputFile).

    A result in a slot is written from the shared memory itself; the writer frees
    the slot once the bytes are out, so no copy is made of a GB of rewritten chunks.
    """
    if isinstance(result, int):
        out.write_then(slots.view(slot, result), lambda: slots.release(slot))
        return
    if slots is not None:
        slots.release(slot)
    out.write(result)
