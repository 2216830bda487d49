"""The command's output on its way to corral's caller, under a byte cap.

Guarantees (``--max-output``, the library's capture):
- corral never waits on its caller's reading while the run goes on: output
  is written without blocking (``FdSink``) and what the reader has not taken
  yet waits in memory — at most the cap, since nothing beyond it is kept. A
  caller that does not read cannot delay the deadline or any limit.
- The command never blocks on a full pipe either: its pipes are read at
  once, and bytes beyond the cap are read and dropped (``exceeded`` set).
- Once the run is over, every byte read (up to the cap) reaches the sink:
  ``OutputPump.flush`` writes what is still buffered, waiting for the reader
  as long as it takes (unless asked to give up), and drops it only if the
  reader is gone (EPIPE).
"""

import errno
import os
import select
import stat
import time

from ..common import baton
from ..common.errors import SetupError

_READ_CHUNK = 65536
#: Most bytes handed to one non-blocking write.
_WRITE_CHUNK = 1 << 20


class FdSink:
    """One descriptor of corral's caller, written to without ever blocking.

    Pipes, FIFOs and terminals are reopened through /proc/self/fd with
    O_NONBLOCK: a new open file description, so the caller's own
    descriptor (shared with its shell, its terminal) keeps its flags.
    Sockets are written with MSG_DONTWAIT. Regular files and block devices
    never wait on a reader and are written as they are. Anything that
    cannot be reopened is written only after poll() says it is writable,
    at most PIPE_BUF bytes at a time.
    """

    def __init__(self, fd: int):
        self.fd = fd
        self.pending = bytearray()
        #: The reader is gone (EPIPE, EIO): further output is dropped.
        self.broken = False
        self._sock = None
        self._own_fd = None
        self._careful = False
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            self.broken = True
            return
        if stat.S_ISSOCK(mode):
            import socket

            self._sock = socket.socket(fileno=os.dup(fd))
        elif stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            try:
                self._own_fd = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
            except OSError:
                self._careful = True
        elif not (stat.S_ISREG(mode) or stat.S_ISBLK(mode)):
            self._careful = True

    @property
    def poll_fd(self) -> int:
        """The descriptor to poll for POLLOUT while output is pending."""
        return self._own_fd if self._own_fd is not None else self.fd

    def wants_write(self) -> bool:
        return bool(self.pending) and not self.broken

    def write(self, data: bytes) -> None:
        """Queue ``data`` and write what the reader takes now; never waits."""
        if not self.broken:
            self.pending += data
            self.push()

    def push(self) -> None:
        """Write as much pending output as goes without waiting."""
        while self.pending and not self.broken:
            try:
                # Views released before ``pending`` changes size (a live export forbids it).
                with memoryview(self.pending) as whole, whole[:_WRITE_CHUNK] as view:
                    written = self._write_nowait(view)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EPIPE, EIO (a hung-up terminal), ENOSPC...: the reader is gone
                self.broken = True
                self.pending.clear()
                return
            if not written:
                return
            del self.pending[:written]

    def _write_nowait(self, view) -> int:
        if self._sock is not None:
            import socket

            return self._sock.send(view, socket.MSG_DONTWAIT)
        if self._own_fd is not None:
            return os.write(self._own_fd, view)
        if self._careful:
            poller = select.poll()
            poller.register(self.fd, select.POLLOUT)
            if not poller.poll(0):
                raise BlockingIOError
            return os.write(self.fd, view[: select.PIPE_BUF])
        return os.write(self.fd, view)

    def close(self) -> None:
        """Release corral's own descriptors (pending output is dropped)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._own_fd is not None:
            os.close(self._own_fd)
            self._own_fd = None
        self.pending.clear()


def _sink_key(fd: int):
    """Two descriptors of one pipe, socket or terminal share a sink (and so keep their order)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return ("fd", fd)
    if stat.S_ISREG(st.st_mode):
        return ("fd", fd)  # separate descriptions of a file have separate offsets
    return ("file", st.st_dev, st.st_ino, st.st_rdev)


def omission_marker(omitted: int, after_newline: bool) -> bytes:
    """The line that stands for the middle ``--output-limit`` left out (on a
    line of its own: a newline first unless the head ended with one)."""
    return (b"" if after_newline else b"\n") + f"[corral: {omitted} bytes of output left out]\n".encode()


class HeadTail:
    """``--output-limit``: the first ``head`` bytes of the stream pass at
    once; after them, only the last ``tail`` bytes are kept (each chunk with
    its sink, so stdout and stderr keep their order), and ``finish`` delivers
    them after one marker line that says how many bytes were left out --
    none when the stream fit. Byte-exact: the head and tail are the stream's
    own bytes; only the marker is corral's."""

    def __init__(self, limit: int):
        self.head = limit - limit // 2
        self.tail = limit // 2
        self.held: list[tuple[object, bytes]] = []
        self.held_bytes = 0
        #: Bytes left out of the middle; the sink of the first one gets the marker.
        self.omitted = 0
        self.cut_sink: object = None
        self.last_byte = b"\n"

    def take(self, sink, data: bytes, deliver) -> None:
        passing = min(len(data), self.head)
        if passing:
            self.head -= passing
            self.last_byte = data[passing - 1 : passing]
            deliver(sink, data[:passing])
        rest = data[passing:]
        if not rest:
            return
        self.held.append((sink, rest))
        self.held_bytes += len(rest)
        while self.held_bytes > self.tail:
            first_sink, first = self.held[0]
            excess = self.held_bytes - self.tail
            if self.cut_sink is None:
                self.cut_sink = first_sink
            if len(first) <= excess:
                self.held.pop(0)
                dropped = len(first)
            else:
                self.held[0] = (first_sink, first[excess:])
                dropped = excess
            self.held_bytes -= dropped
            self.omitted += dropped

    def finish(self, deliver) -> None:
        """Deliver the marker (if anything was left out) and the kept tail."""
        if self.omitted:
            deliver(self.cut_sink, omission_marker(self.omitted, self.last_byte == b"\n"))
        for sink, data in self.held:
            deliver(sink, data)
        self.held.clear()
        self.held_bytes = 0


class OutputPump:
    """Copies the command's stdout/stderr pipes to their sinks, under a byte cap.

    A sink is a file descriptor (wrapped in an ``FdSink``: written without
    blocking) or a callable taking each chunk (the library's capture and
    streaming). Output beyond the cap is read and dropped (so writers never
    block on a full pipe) and ``exceeded`` is set. ``total`` counts every
    byte read, kept or not. With ``keep`` (``--output-limit``) what is shown
    is the stream's head and tail (``HeadTail``; ``finish`` delivers the
    tail); with ``copy_fd`` (``--output-file``) every byte read is also
    written there, in the order read, whatever the cap or ``keep`` show.
    """

    def __init__(self, routes: dict, cap: int | None, *, keep: int | None = None, copy_fd: int | None = None):
        self.cap = cap
        self.total = 0
        self.exceeded = False
        self.head_tail = HeadTail(keep) if keep is not None else None
        self.copy_fd = copy_fd
        self.copy_error: str | None = None
        self.sinks: list[FdSink] = []
        by_key = {}
        self.routes = {}  # read fd -> callable or FdSink
        for read_fd, sink in routes.items():
            if not callable(sink):
                key = _sink_key(sink)
                if key not in by_key:
                    by_key[key] = FdSink(sink)
                    self.sinks.append(by_key[key])
                sink = by_key[key]
            self.routes[read_fd] = sink

    def fds(self) -> list[int]:
        """Pipes to poll for input."""
        return list(self.routes)

    def write_fds(self) -> list[int]:
        """Sinks with output waiting: poll them for POLLOUT, then call ``writable``."""
        return [s.poll_fd for s in self.sinks if s.wants_write()]

    def writable(self, fd: int) -> bool:
        """Push pending output to the sink polled on ``fd``; False if ``fd`` is no sink's."""
        found = False
        for sink in self.sinks:
            if sink.poll_fd == fd:
                sink.push()
                found = True
        return found

    def pump(self, fd: int) -> None:
        try:
            data = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise
            data = b""  # a pty's master once no process holds its terminal side: the end
        if not data:
            os.close(fd)
            del self.routes[fd]
            return
        if self.copy_fd is not None:
            try:
                write_all(self.copy_fd, data)  # a regular file: never waits on a reader
            except OSError as exc:  # ENOSPC, EIO: the copy is incomplete, and says so
                self.copy_error = f"--output-file: {exc.strerror or exc}; the file holds the first {self.total} bytes"
                self.copy_fd = None
        allowed = len(data)
        if self.cap is not None and self.total + len(data) > self.cap:
            allowed = max(0, self.cap - self.total)
            self.exceeded = True
        self.total += len(data)
        if allowed:
            if self.head_tail is not None:
                self.head_tail.take(self.routes[fd], data[:allowed], _deliver)
            else:
                _deliver(self.routes[fd], data[:allowed])

    def finish(self) -> None:
        """Every pipe is read: deliver the kept tail of ``--output-limit``."""
        if self.head_tail is not None:
            self.head_tail.finish(_deliver)

    @property
    def omitted(self) -> int | None:
        """Bytes ``--output-limit`` left out (None: no limit)."""
        return self.head_tail.omitted if self.head_tail is not None else None

    def drain(self, limit: float | None) -> None:
        """Read every pipe to EOF, or for ``limit`` seconds (None: no limit); then close them.

        Reading never waits on a sink (writes do not block), so the limit
        bounds only how long corral waits for a pipe that an outside
        process may hold open, never the delivery of what was read.
        """
        end = None if limit is None else time.monotonic() + limit
        while self.routes:
            timeout = None
            if end is not None:
                timeout = (end - time.monotonic()) * 1000
                if timeout <= 0:
                    break
            poller = select.poll()
            for fd in self.routes:
                poller.register(fd, select.POLLIN)
            for fd in self.write_fds():
                poller.register(fd, select.POLLOUT)
            for fd, _ in baton.poll(poller, timeout):
                if fd in self.routes:
                    self.pump(fd)
                else:
                    self.writable(fd)
        self.close_pipes()

    def flush(self, abort_fds=(), should_abort=lambda fd: True) -> None:
        """Deliver every buffered byte, waiting for the readers as long as it takes.

        Returns early only when a reader is gone (its output is dropped) or
        one of ``abort_fds`` turns readable and ``should_abort(fd)`` says so
        (a stop signal: give up).
        """
        while True:
            waiting = self.write_fds()
            if not waiting:
                return
            poller = select.poll()
            for fd in waiting:
                poller.register(fd, select.POLLOUT)
            for fd in abort_fds:
                poller.register(fd, select.POLLIN)
            for fd, _ in baton.poll(poller, None):
                if fd in abort_fds:
                    if should_abort(fd):
                        return
                    continue
                self.writable(fd)

    def close_pipes(self) -> None:
        for fd in self.routes:
            os.close(fd)
        self.routes.clear()

    def close(self) -> None:
        """Close the pipes and corral's sink descriptors (unflushed output is dropped)."""
        self.close_pipes()
        for sink in self.sinks:
            sink.close()
        self.sinks.clear()


def _deliver(sink, data: bytes) -> None:
    if isinstance(sink, FdSink):
        sink.write(data)
    else:
        sink(data)


def write_all(fd: int, data: bytes, raise_broken: bool = False) -> None:
    """Blocking write of all of ``data``; a reader gone (EPIPE) ends it quietly unless ``raise_broken``."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BrokenPipeError:
            if raise_broken:
                raise
            return  # our reader went away; keep draining the command
        except InterruptedError:
            continue


def open_output_file(path: str | None) -> int | None:
    """--output-file's descriptor, created 0600 (replacing a regular file;
    never following a symlink or writing into anything else): SetupError, 125."""
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise SetupError(f"--output-file {path!r}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SetupError(f"--output-file {path!r} exists and is not a regular file")
        os.set_blocking(fd, True)
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd
