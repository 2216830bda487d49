"""A background run's kept stdin (``--stdin keep``; ``--pty`` in the background): a pipe its own corral keeps.

    the run's own corral (detached)                  corralctl send RUN TEXT / Session.exec(...).write_stdin
      fd 0: the pipe's read end (the command          connects to ``address(run id)``; the kernel names
        inherits it: --stdin inherit from here)        the process bound there, which must be the run's
      the write end: kept, close-on-exec               corral (the holder of the run's owner token)
      @corral-stdin/<uid>/<run id>, answered    <──    "w": a copy of the write end (SCM_RIGHTS): written, closed
        in the supervisor's own poll                   "e": the kept end closed: the command reads EOF

With ``--pty`` the pipe is the relay's input (``core.pty``): what is sent is
typed into the run's terminal; its end stops the relay (type ``\\x04``, ^D,
for the terminal's own end of file).

Guarantees:
- The write end lives in the run's corral and nowhere else for longer than a
  send: it is close-on-exec (the command and every other run never inherit
  it), and it goes with that corral -- when the run ends, when the session
  ends it, when the corral is killed (the abstract name is the kernel's and
  goes with the process: nothing is left on disk).
- Only a process of this uid is answered (``SO_PEERCRED``), and a sender
  writes only to the process the kernel names as the run's corral: a name
  squatted by another process of the user is refused.
- Answering never blocks the run's supervisor: one byte each way, 0.2 s at
  most per connection; the data never passes through the corral.

Failure modes: ``NotKept`` (a ``CorralError``, 125) for a run whose corral
keeps no stdin, whose stdin was already closed, or that is not running.
"""

import os
import socket

from ..common.errors import UsageError

ADDRESS_PREFIX = "corral-stdin/"
_WANT, _END, _YES, _NO = b"w", b"e", b"y", b"n"
#: How long one connection may take the supervisor's time, and a sender's wait for an answer.
_ANSWER_TIMEOUT = 0.2
_ASK_TIMEOUT = 5.0


class NotKept(UsageError):
    """The run has no kept stdin to write to (anymore), or is not running."""


def address(run_id: str, uid: int | None = None) -> str:
    """The keeper's socket: an abstract name per user and run (no file; the kernel
    refuses the name to anyone else while the run's corral is bound to it)."""
    return f"\0{ADDRESS_PREFIX}{os.geteuid() if uid is None else uid}/{run_id}"


class StdinKeeper:
    """The run's corral's side. Made before the run starts: fd 0 becomes the pipe's
    read end; OSError if the address is taken or no pipe can be had."""

    def __init__(self, run_id: str):
        read_end, write_end = os.pipe()  # both close-on-exec
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            sock.bind(address(run_id))
            sock.listen(16)
        except BaseException:
            sock.close()
            os.close(read_end)
            os.close(write_end)
            raise
        os.dup2(read_end, 0)  # inheritable: the command's stdin
        os.close(read_end)
        self.sock = sock
        self._write: int | None = write_end

    def fileno(self) -> int:
        return self.sock.fileno()

    def serve(self) -> None:
        """Answer every sender waiting (never blocks past ``_ANSWER_TIMEOUT`` each)."""
        from ..varlink.wire import peer_credentials

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # none waiting (EAGAIN), or gone
                return
            try:
                conn.settimeout(_ANSWER_TIMEOUT)
                if peer_credentials(conn)[1] != os.geteuid():
                    continue
                asked = conn.recv(1)
                if asked == _WANT and self._write is not None:
                    socket.send_fds(conn, [_YES], [self._write])
                elif asked == _END:
                    self._close_write()
                    conn.sendall(_YES)
                else:
                    conn.sendall(_NO)
            except OSError:
                pass
            finally:
                conn.close()

    def _close_write(self) -> None:
        if self._write is not None:
            os.close(self._write)
            self._write = None

    def close(self) -> None:
        self._close_write()
        self.sock.close()


# -- a sender's side -----------------------------------------------------------------------------
def _ask(run_id: str, what: bytes, corral_pid: int | None) -> tuple[bytes, list[int]]:
    """Ask the run's corral (``corral_pid``: the process the kernel names as its
    token's holder) for ``what``; its answer and the descriptors it sent."""
    from ..varlink.wire import connect_bound

    if corral_pid is None:
        raise NotKept(f"{run_id} is not running")
    connected = connect_bound(address(run_id), _ASK_TIMEOUT)
    if connected is None:
        raise NotKept(f"{run_id} keeps no stdin (it was not started with --stdin keep or --pty)")
    sock, pid = connected
    with sock:
        if pid != corral_pid:
            raise NotKept(f"{run_id}: its stdin's address is held by process {pid}, not by its corral ({corral_pid})")
        try:
            sock.sendall(what)
            answer, fds, _flags, _addr = socket.recv_fds(sock, 1, 1)
        except OSError as exc:
            raise NotKept(f"{run_id}: its corral did not answer: {exc}") from None
    return answer, fds


def corral_of(run_id: str) -> int | None:
    """The run's live corral: the process the kernel names as its owner token's holder."""
    from ..state import registry as REG

    return REG.token_holder(REG.TOKEN_PREFIX + run_id)


def open_stdin(run_id: str, corral_pid: int | None) -> int:
    """A copy of the run's kept stdin's write end (close-on-exec, the caller's to close)."""
    answer, fds = _ask(run_id, _WANT, corral_pid)
    if answer != _YES or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise NotKept(f"{run_id}: its stdin is closed (--eof was sent)")
    return fds[0]


def end_stdin(run_id: str, corral_pid: int | None) -> None:
    """Close the kept end: once no sender holds a copy, the command reads end of file."""
    answer, fds = _ask(run_id, _END, corral_pid)
    for fd in fds:
        os.close(fd)
    if answer != _YES:
        raise NotKept(f"{run_id}: its corral refused to close its stdin")


def send(run_id: str, data: bytes, eof: bool, timeout: float | None) -> int:
    """Write ``data`` to the run's kept stdin, then (``eof``) close it; the bytes
    written: fewer than ``data`` when the command did not read them within
    ``timeout`` (then nothing is closed). NotKept; BrokenPipeError when nothing
    reads it any more. The one sender of ``corralctl send`` and ``Session.exec``."""
    corral = corral_of(run_id)
    written = 0
    if data:
        fd = open_stdin(run_id, corral)
        try:
            written = write_all(fd, data, timeout)
        finally:
            os.close(fd)
        if written < len(data):
            return written
    if eof:
        end_stdin(run_id, corral)
    return written


def write_all(fd: int, data: bytes, timeout: float | None) -> int:
    """Write ``data`` to the pipe ``fd`` (blocking at most ``timeout`` seconds in
    all: a command that does not read); the bytes written. BrokenPipeError when
    nothing reads it any more."""
    import select
    import time

    os.set_blocking(fd, False)
    end = None if timeout is None else time.monotonic() + timeout
    done = 0
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while done < len(data):
        try:
            done += os.write(fd, data[done : done + 65536])
            continue
        except BlockingIOError:
            pass
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            break
        poller.poll(None if left is None else left * 1000 + 1)
    return done
