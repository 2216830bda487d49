"""A run's output as the MCP tools hand it out: absolute byte offsets, bounded memory.

Guarantees:
- Every byte the run printed has one absolute offset (0 = its first byte).
  ``read(cursor)`` returns the bytes from ``cursor`` to the end and the new
  cursor: reading again from that cursor returns only what came after, so a
  caller that always passes the cursor it was given reads nothing twice and
  skips nothing -- as long as it reads before the bytes leave the buffer.
- Memory is bounded: only the last ``keep`` bytes are held. A read from a
  cursor older than that says how many bytes it could not return
  (``lost``) instead of pretending they never existed.
- ``window`` cuts a long stretch to its head and tail (``core.output.HeadTail``:
  the stream's own bytes, one marker line between) and says how much it left out.
"""

from dataclasses import dataclass

#: Bytes of a run's output held in memory (older bytes are dropped, and counted).
KEEP = 8 << 20


@dataclass
class Slice:
    """Bytes of the output from ``start`` (after ``lost`` unreadable ones) to ``cursor``."""

    data: bytes
    start: int
    cursor: int
    #: Bytes between the asked cursor and ``start`` that had left the buffer.
    lost: int = 0
    #: Bytes ``window`` left out of the middle (a marker line stands for them).
    omitted: int = 0


class OutputBuffer:
    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self._data = bytearray()
        #: Absolute offset of ``_data[0]``.
        self._base = 0

    @property
    def end(self) -> int:
        """The absolute offset just past the last byte received."""
        return self._base + len(self._data)

    def append(self, chunk: bytes) -> None:
        self._data += chunk
        excess = len(self._data) - self.keep
        if excess > 0:
            del self._data[:excess]
            self._base += excess

    def read(self, cursor: int, end: int | None = None) -> Slice:
        """The bytes from ``cursor`` to ``end`` (default: all received). A cursor
        past the end reads nothing; one before the buffer reads from its start."""
        end = self.end if end is None else min(end, self.end)
        cursor = max(0, min(cursor, end))
        start = max(cursor, self._base)
        return Slice(bytes(self._data[start - self._base : end - self._base]), start, end, lost=start - cursor)

    def window(self, cursor: int, limit: int, end: int | None = None) -> Slice:
        """``read``, cut to at most ``limit`` bytes of the stream: its first and
        last halves, one marker line between (``omitted`` counts the middle)."""
        from ..core.output import HeadTail

        whole = self.read(cursor, end)
        if len(whole.data) <= limit:
            return whole
        parts: list[bytes] = []
        cut = HeadTail(limit)
        cut.take(None, whole.data, lambda _sink, data: parts.append(data))
        omitted = cut.omitted
        cut.finish(lambda _sink, data: parts.append(data))
        return Slice(b"".join(parts), whole.start, whole.cursor, lost=whole.lost, omitted=omitted)


def complete_utf8(data: bytes) -> int:
    """How many bytes of ``data`` to hand out now so that a UTF-8 character
    split by the pipe is not cut in two (the rest waits for the next read)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:  # ASCII: nothing open
            return len(data)
        if byte >= 0xC0:  # a lead byte: is its sequence whole?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)
