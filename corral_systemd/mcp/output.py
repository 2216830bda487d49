"""A run's output as the MCP tools hand it out: a cursor-based read of the run's log.

Every run of the server is a background run of its session, so its output
is its log on disk (``<state dir>/<run id>.out``, held to ``--log-max`` by
its corral: head and tail). Guarantees:

- A cursor is an absolute byte offset in the log (0 = its first byte).
  ``read_log(path, cursor, ...)`` returns the bytes from ``cursor`` and the
  cursor to read on from: a caller that always passes the cursor it was
  given reads nothing twice and skips nothing.
- Where corral cut the log back (past ``--log-max``) to an end before the
  cursor, the read goes on from the new end and says so (``log_cut``).
- ``window``: all of it from the cursor, cut to its head and tail
  (``core.output.HeadTail``: the stream's own bytes, one marker line
  between; ``output_cut_bytes`` counts the middle, ``output_from`` is where
  to read the whole of it); else a page of at most ``limit`` bytes. Memory
  is bounded by ``limit``, whatever the log's size.
- A UTF-8 character cut by the end of a read (the command still writing,
  or a page's end) waits for the next read.

Failure mode: ``OSError`` if the log cannot be read (the caller says it in one line).
"""

import os

_CHUNK = 1 << 16


def read_log(path: str, cursor: int, limit: int, *, window: bool, running: bool) -> dict:
    """The log from ``cursor``: ``output``, the next ``cursor``, and ``log_cut``,
    ``output_cut_bytes`` / ``output_from``, ``more`` where they apply (see the module)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        facts: dict = {}
        if cursor > size:  # corral cut the log back past --log-max: read on from its end
            facts["log_cut"] = True
            cursor = size
        omitted = 0
        if window:
            data, omitted = _head_and_tail(fd, cursor, size, limit)
            end = size
        else:
            data = os.pread(fd, limit, cursor)
            end = cursor + len(data)
    finally:
        os.close(fd)
    if (running or end < size) and not omitted:
        keep = complete_utf8(data)
        end -= len(data) - keep
        data = data[:keep]
    facts.update(output=data.decode("utf-8", "replace"), cursor=end)
    if omitted:
        facts.update(output_cut_bytes=omitted, output_from=cursor)
    if end < size:
        facts["more"] = True
    return facts


def _head_and_tail(fd: int, start: int, end: int, limit: int) -> tuple[bytes, int]:
    """Bytes ``start`` to ``end`` of ``fd``, cut to ``limit`` (head, marker, tail); the bytes left out."""
    from ..core.output import HeadTail

    parts: list[bytes] = []
    cut = HeadTail(limit)
    offset = start
    while offset < end:
        chunk = os.pread(fd, min(_CHUNK, end - offset), offset)
        if not chunk:
            break
        offset += len(chunk)
        cut.take(None, chunk, lambda _sink, data: parts.append(data))
    omitted = cut.omitted
    cut.finish(lambda _sink, data: parts.append(data))
    return b"".join(parts), omitted


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
