"""``--pty``: the command on a pseudo-terminal of its own, relayed to corral's stdio.

Guarantees:
- the command's stdin, stdout and stderr are the pty's terminal side, and it
  is the controlling terminal of the command's session (a forked child calls
  TIOCSCTTY; a service's manager does the same for a terminal passed as its
  stdio), so ``/dev/tty``, ``isatty`` and job control work as on a terminal;
- what the command writes is read from the pty's master side by the
  supervisor's ``OutputPump`` (``--max-output``, ``--output-limit`` and
  ``--output-file`` apply to it) and reaches corral's stdout;
- what arrives on corral's stdin is written to the pty without ever blocking
  corral (bytes the command has not read yet wait in memory); EOF on corral's
  stdin ends the relay, not the pty;
- a terminal on corral's stdin is put in raw mode, so ^C, ^Z and ^D reach the
  command's terminal, whose line discipline acts on them (^C is a SIGINT to
  the command's foreground process group, not to corral), and its settings
  are restored by ``close()`` on every exit path that runs Python (not after
  a SIGKILL of corral);
- the pty's window size starts as corral's terminal's and follows it
  (``resize`` on SIGWINCH).

Failure modes: no pty can be allocated (``os.openpty``): SetupError, 125.
"""

import errno
import fcntl
import os
import termios

from ..common.errors import SetupError

_READ_CHUNK = 65536


class Pty:
    def __init__(self, stdin_fd: int | None = 0, typed: bytes = b"", size_from: tuple[int, ...] = (0, 1, 2)):
        """``stdin_fd``: what to relay to the terminal (None: nothing);
        ``typed``: bytes typed into it first (the library's ``stdin=bytes``)."""
        try:
            self.master, self.slave = os.openpty()
        except OSError as exc:
            raise SetupError(f"--pty: no pseudo-terminal ({exc.strerror or exc})") from None
        os.set_inheritable(self.master, False)
        os.set_inheritable(self.slave, False)
        os.set_blocking(self.master, False)
        #: The descriptor the input relay writes to (the master's read side
        #: belongs to the OutputPump, which closes it at EOF).
        self._write_fd = os.dup(self.master)
        os.set_inheritable(self._write_fd, False)
        self._stdin = stdin_fd
        self._relaying = stdin_fd is not None
        self._pending = bytearray(typed)
        self._size_from = next((fd for fd in size_from if _isatty(fd)), None)
        self._saved: list | None = None
        self.resize()

    # -- the terminal corral runs on -------------------------------------
    def raw(self) -> None:
        """Put corral's terminal stdin in raw mode (restored by ``close``)."""
        if self._saved is None and self._stdin is not None and _isatty(self._stdin):
            import tty

            self._saved = termios.tcgetattr(self._stdin)
            tty.setraw(self._stdin, termios.TCSANOW)

    def resize(self) -> None:
        """Give the pty the window size of corral's terminal (none: leave it)."""
        if self._size_from is None:
            return
        try:
            size = fcntl.ioctl(self._size_from, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, size)
        except OSError:
            pass

    # -- the input relay ---------------------------------------------------
    def input_fds(self) -> list[int]:
        """corral's stdin, while there is input to relay: poll it for POLLIN."""
        return [self._stdin] if self._relaying and self._stdin is not None else []

    def write_fds(self) -> list[int]:
        """The pty, while input waits for the command: poll it for POLLOUT."""
        return [self._write_fd] if self._pending else []

    def on_input(self) -> None:
        if self._stdin is None:
            return
        try:
            data = os.read(self._stdin, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""  # EIO: corral's own terminal hung up
        if not data:
            self._relaying = False
            return
        self._pending += data
        self.push()

    def push(self) -> None:
        while self._pending:
            try:
                written = os.write(self._write_fd, self._pending)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EIO, errno.EPIPE):
                    self._pending.clear()  # nothing reads the terminal any more
                    self._relaying = False
                    return
                raise
            del self._pending[:written]

    def close_slave(self) -> None:
        """corral's copy of the terminal side, once the command has its own."""
        if self.slave >= 0:
            os.close(self.slave)
            self.slave = -1

    def close(self) -> None:
        """Restore corral's terminal and release corral's descriptors (the
        master's read side is the OutputPump's)."""
        if self._saved is not None and self._stdin is not None:
            try:
                termios.tcsetattr(self._stdin, termios.TCSADRAIN, self._saved)
            except termios.error:
                pass
            self._saved = None
        self.close_slave()
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False
