"""A growing window over the decompressed blocks of a trace, read ahead as far as a scan
needs and dropped behind it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from tracestream.errors import TraceError
from tracestream.jsontext import SKIP_WS


class Buffer:
    """A sliding window over the decompressed stream with absolute offsets.

    The window is a bytearray: a block is appended in place and the consumed front
    is dropped without moving the rest, so each byte is copied once into the
    window (and once out, by `take`) instead of once per block that follows it.
    Values that leave the scanner are `take`n as bytes.

    Blocks can also be held *ahead* of the window without copying them into it
    (`lookahead`): a speculative cut of a compressed stream reads only the bytes
    around the cut and the chunk itself (`read`), then `skip_to` passes them.
    """

    def __init__(self, blocks: Iterable[bytes]):
        self._blocks = iter(blocks)
        self.data = bytearray()
        self.base = 0
        self._exhausted = False  # every block has been read (some may still be held ahead)
        self._ahead: deque = deque()  # blocks (or their unread rest) after the window, in order
        self._ahead_bytes = 0

    def take(self, start: int, end: int) -> bytes:
        """data[start:end] as bytes (one copy)."""
        with memoryview(self.data) as view:
            return bytes(view[start:end])

    def _next_block(self):
        """The next block after the window (held ahead, else read), or None at the end."""
        if self._ahead:
            block = self._ahead.popleft()
            self._ahead_bytes -= len(block)
            return block
        return self._read_block()

    def _read_block(self):
        """The next non-empty block of the input, or None (then it is exhausted)."""
        if not self._exhausted:
            for block in self._blocks:
                if block:
                    return block
            self._exhausted = True
        return None

    @property
    def eof(self) -> bool:
        """The window holds the rest of the input."""
        return self._exhausted and not self._ahead

    def more(self) -> bool:
        block = self._next_block()
        if block is None:
            return False
        self.data += block
        return True

    def ensure(self, pos: int, count: int) -> bool:
        """Make data[pos:pos+count] available if the input has it; False at EOF."""
        while len(self.data) < pos + count:
            if not self.more():
                return False
        return True

    def lookahead(self, pos: int, count: int) -> int:
        """Hold blocks ahead until `count` bytes from `pos` are there (or the input ends);
        return how many there are, up to that point."""
        while len(self.data) + self._ahead_bytes < pos + count:
            block = self._read_block()
            if block is None:
                break
            self._ahead.append(block)
            self._ahead_bytes += len(block)
        return len(self.data) + self._ahead_bytes - pos

    def read(self, offset: int, length: int) -> bytes:
        """`length` bytes from absolute `offset`, in the window or the blocks held ahead of
        it (one copy; the same call as FilePeek.read)."""
        pieces = self.pieces(offset, length)
        return pieces[0] if len(pieces) == 1 and isinstance(pieces[0], bytes) else b"".join(
            pieces)

    def pieces(self, offset: int, length: int) -> list:
        """`read(offset, length)` as pieces: the part in the window copied as bytes (the
        window is resized later), the rest as memoryviews of the blocks held ahead (each
        keeps its block alive, however far the window moves on)."""
        start = offset - self.base
        end = start + length
        size = len(self.data)
        if end <= size:
            return [self.take(start, end)]
        parts = [self.take(start, size)] if start < size else []
        at = size
        for block in self._ahead:
            if at >= end:
                break
            lo, hi = max(start - at, 0), min(end - at, len(block))
            if lo < hi:
                parts.append(memoryview(block)[lo:hi])
            at += len(block)
        return parts

    def discard(self, pos: int) -> int:
        """Drop data before `pos` (relative); return the new relative position 0."""
        if pos:
            del self.data[:pos]
            self.base += pos
        return 0

    def skip_to(self, offset: int) -> int:
        """Drop everything before absolute `offset`, reading past it without copying it;
        return its relative position (0). The input must reach `offset`."""
        if offset - self.base <= len(self.data):
            return self.discard(offset - self.base)
        self.base += len(self.data)
        self.data = bytearray()
        if not self._ahead and hasattr(self._blocks, "skip_to"):  # source.SkippingBlocks
            self._blocks.skip_to(offset)
            self.base = offset
            return 0
        while (block := self._next_block()) is not None:
            if offset - self.base < len(block):
                rest = memoryview(block)[offset - self.base:]  # appended by more()
                self._ahead.appendleft(rest)
                self._ahead_bytes += len(rest)
                self.base = offset
                return 0
            self.base += len(block)
        raise TraceError(f"input ended at byte {self.base}, before byte {offset}: it changed "
                         "while being read")

    def skip_ws(self, pos: int) -> int:
        while True:
            pos = SKIP_WS.match(self.data, pos).end()
            if pos < len(self.data) or not self.more():
                return pos


def grow_window(buf: Buffer, pos: int) -> bool:
    """Read until the data from `pos` has doubled (or the input ends); False if nothing came.

    A value that is rescanned from its start after each read costs linear time
    overall only when each read at least doubles what the rescan covers.
    """
    size = len(buf.data)
    buf.ensure(pos, 2 * (size - pos) + 1)
    return len(buf.data) > size
