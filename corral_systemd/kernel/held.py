"""The corral service's side of a caller's held process (``kernel.gate``).

``HeldProcess`` takes the three descriptors of a Run call (the process's
pidfd, the service's end of the gate, the exit pipe), checks that they are
what they must be, and gives the engine the same protocol as
``kernel.spawn.Child``: ``prepare``/``release`` (the gate opens with the
command), ``exited`` (the caller's report, taken only once the kernel says
the process has exited), ``session_pinned``, ``abandon``, ``close``.
"""

import os

from .gate import READY, encode_request
from .pidfd import exited, pid_of


class Refused(ValueError):
    """The descriptors are not a held child of the caller's: the run is not served."""


#: How long the held child may take to read its request, and then to exec
#: (it is the caller's own code, waiting for exactly this).
RELEASE_TIMEOUT = 30.0
#: How long a report is waited for once the process has exited.
REPORT_WAIT = 2.0


class HeldProcess:
    """The service's side of a caller's held child (see the module docstring).

    Made from the three descriptors of a Run call (``pidfd``, ``gate``,
    ``exit_pipe``; this object owns them from then on) and the caller's pid
    (``parent``, as this process's pid namespace numbers it).

    Guarantees:

    - ``pid`` is the number of the process ``pidfd`` names, in this process's
      pid namespace (what the manager's ``PIDs=`` takes; the manager and the
      service share it): read from the pidfd's fdinfo, then the process is
      checked to be ``parent``'s child, a session leader, alive, and the
      pidfd checked again, so a recycled number is never taken for it;
    - no flag of a descriptor the caller may share is changed: the exit pipe
      is read through an open file of this process's own (reopened through
      /proc/self/fd), the gate only with MSG_DONTWAIT;
    - a reported status is taken only once the kernel says the process has
      exited (its pidfd polls readable); a report before that, or garbage,
      is ``lied``, and the run's end cannot be known.

    Failure modes: ``Refused`` when the descriptors are not what they must
    be (the service then does not serve the run); ``release()`` raises
    ExecError (the command could not be executed) or SetupError.
    """

    def __init__(self, pidfd: int, gate: int, exit_pipe: int, parent: int):
        import stat

        self.pidfd = pidfd
        #: The caller: the command's parent, and (a client sets it) a child
        #: subreaper, so the run's orphans become its children.
        self.parent = parent
        self._gate = gate
        self._exit = -1
        self._report = b""
        self._request: tuple | None = None
        self.status: int | None = None
        #: Why a report could not be believed (the engine's lost_track says it).
        self.lied: str | None = None
        #: The caller closed its exit pipe before reporting (it died).
        self.caller_gone = False
        #: (user, system) CPU ns of the process and what it waited for, as the caller's waitid gave them.
        self.usage: tuple[int, int] | None = None
        self._waited = False
        try:
            self.pid = _pidfd_pid(pidfd)
            _check_unix_stream(gate)
            st = os.fstat(exit_pipe)
            if not stat.S_ISFIFO(st.st_mode) or _access_mode(exit_pipe) != os.O_RDONLY:
                raise Refused("the exit descriptor is not the read end of a pipe")
            self._exit = reopen_pipe(exit_pipe)
            try:
                ready = read_gate(gate, want=len(READY))
            except (OSError, TimeoutError) as exc:
                raise Refused(f"the caller's process did not say it waits at its gate ({exc})") from None
            if ready != READY:
                raise Refused("the caller's process did not say it waits at its gate")
            _check_held(self.pid, pidfd, parent)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(exit_pipe)

    # -- the engine's child protocol (as kernel.spawn.Child) --------------
    def prepare(self, argv, env: dict, cwd: str | None, umask: int | None, stdio: tuple[int, int, int]) -> None:
        """What ``release()`` sends: the command, and its stdin, stdout, stderr."""
        self._request = (encode_request(list(argv), dict(env), cwd, umask), stdio)

    def release(self) -> None:
        """Send the request, wait for the exec. ExecError with the child's errno;
        SetupError if it did not take its command in time (it is killed then)."""
        from ..common.errors import SetupError
        from .spawn import ExecError

        assert self._request is not None, "prepare() first"
        payload, stdio = self._request
        self._request = None
        try:
            report = release(self._gate, payload, stdio)
        except (OSError, TimeoutError) as exc:
            self._kill()
            raise SetupError(f"the caller's held process did not take its command ({exc})") from None
        finally:
            os.close(self._gate)
            self._gate = -1
        if report:
            raise ExecError(report_errno(report), os.fsdecode(payload.split(b"\0")[3]))

    def abandon(self) -> None:
        """It will never run: kill it (the caller reaps it) and close the descriptors."""
        self._kill()
        self.close()

    def exited(self, hold: bool) -> int | None:
        """Its wait status once the caller has reported it (the caller always
        holds it: ``hold`` is moot). The first time the kernel says it has
        exited but no report is here yet, the report is waited for, up to
        ``REPORT_WAIT``: the caller reports as soon as it sees the exit."""
        if self.status is not None or self.lied is not None or self._exit < 0:
            return self.status
        self._read_exit_pipe()
        if self.status is None and self.lied is None and self._exit >= 0 and not self._waited and exited(self.pidfd):
            self._waited = True
            import select

            from ..common import baton

            poller = select.poll()
            poller.register(self._exit, select.POLLIN)
            with baton.released():
                poller.poll(REPORT_WAIT * 1000)
            self._read_exit_pipe()
        return self.status

    def _read_exit_pipe(self) -> None:
        while True:
            try:
                chunk = os.read(self._exit, 64)
            except BlockingIOError:
                break
            if not chunk:
                self.caller_gone = True
                os.close(self._exit)
                self._exit = -1
                break
            self._report += chunk
            if len(self._report) > 80:
                break
        line, newline, _ = self._report.partition(b"\n")
        if newline or len(self._report) > 80:
            status = _parse_status(line.split(b" ")[0]) if newline else None
            self.usage = _parse_usage(line.split(b" ")[1:])
            if status is None:
                self.lied = f"the caller reported {self._report[:80]!r}, not a wait status"
            elif not exited(self.pidfd):
                self.lied = "the caller reported an exit of a process that had not exited"
            else:
                self.status = status

    def wait_fd(self) -> int | None:
        """Readable when the caller reports (or closes its exit pipe)."""
        return self._exit if self._exit >= 0 and self.status is None and self.lied is None else None

    def session_pinned(self) -> bool:
        """Its session id cannot have been reused: it is not reaped (the caller holds it)."""
        return self.pidfd >= 0 and _unreaped(self.pidfd)

    def reap(self, exited: bool) -> None:
        """The caller reaps it, once it has the run's reply."""

    def lost(self) -> str | None:
        """Why its exit status cannot be known (the caller lied, or is gone), else None."""
        if self.status is not None:
            return None
        if self.lied is not None:
            return self.lied
        if self.caller_gone:
            return "the caller closed its exit pipe before it reported how the command's process ended"
        return None

    def close(self) -> None:
        for name in ("_gate", "_exit", "pidfd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def _kill(self) -> None:
        import signal

        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except OSError:
            pass


def reopen_pipe(fd: int) -> int:
    """A non-blocking, close-on-exec open file of this process's own on the
    pipe ``fd`` reads: its flags are ours to set, never the sender's."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise Refused(f"the pipe cannot be reopened ({exc.strerror})") from None


def _access_mode(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE


def _pidfd_pid(pidfd: int) -> int:
    try:
        link = os.readlink(f"/proc/self/fd/{pidfd}")
        if link != "anon_inode:[pidfd]" and not link.startswith("pidfd:"):  # pidfs since Linux 6.9
            raise Refused("the process descriptor is not a pidfd")
    except OSError as exc:
        raise Refused(f"the process descriptor cannot be read ({exc})") from None
    pid = pid_of(pidfd)
    if pid is None:
        raise Refused("the caller's process is not visible in the service's pid namespace, or has ended")
    return pid


def _check_unix_stream(fd: int) -> None:
    import socket
    import stat

    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        raise Refused("the gate descriptor is not a socket")
    probe = socket.socket(fileno=os.dup(fd))
    try:
        if probe.family != socket.AF_UNIX or probe.type != socket.SOCK_STREAM:
            raise Refused("the gate is not a unix stream socket")
    finally:
        probe.close()


def _check_held(pid: int, pidfd: int, parent: int) -> None:
    from .procfs import read_stat

    info = read_stat(pid)
    if info is None or not info.alive:
        raise Refused("the caller's process has ended")
    if info.ppid != parent:
        raise Refused("the process descriptor names a process that is not the caller's child")
    if info.sid != pid:
        raise Refused("the caller's process is not in a session of its own")
    if not _unreaped(pidfd) or exited(pidfd):
        raise Refused("the caller's process has ended")


def _unreaped(pidfd: int) -> bool:
    import signal

    try:
        signal.pidfd_send_signal(pidfd, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists (another uid's now: a setuid exec); not reaped


def _parse_usage(fields: list[bytes]) -> tuple[int, int] | None:
    """The report's (user, system) CPU ns, if it gave them (else None: unknown)."""
    try:
        user, system = (int(f) for f in fields)
    except ValueError:
        return None
    return (user, system) if user >= 0 and system >= 0 else None


def _parse_status(line: bytes) -> int | None:
    try:
        status = int(line)
    except ValueError:
        return None
    if not 0 <= status <= 0xFFFF or not (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
        return None
    return status


def release(gate: int, payload: bytes, stdio: tuple[int, int, int], ready_first: bool = False) -> bytes:
    """Send a held child its request (``gate.encode_request``'s payload, its
    stdio) and wait for its exec: b"" once it has exec'd (or died), else its
    report (``report_errno``). ``ready_first``: its READY is read here first.
    A Runner's other runs go on meanwhile (the baton is given up). OSError or
    TimeoutError as ``send_request`` and ``read_gate`` raise them."""
    import errno

    from ..common import baton

    with baton.released():
        if ready_first and read_gate(gate, want=len(READY)) != READY:
            raise OSError(errno.EPIPE, "it ended before it waited at its gate")
        send_request(gate, payload, stdio)
        return read_gate(gate)


def report_errno(report: bytes) -> int:
    """The errno a held child reported (EIO for anything else)."""
    try:
        return int(report)
    except ValueError:
        return 5  # EIO: not an errno


def send_request(gate: int, payload: bytes, stdio: tuple[int, int, int]) -> None:
    import socket
    import time

    from .fdpass import rights

    sock = socket.socket(fileno=os.dup(gate))
    try:
        data = b"%d\n" % len(payload) + payload
        ancillary = rights(stdio)
        deadline = time.monotonic() + RELEASE_TIMEOUT
        while data:
            _await(sock, "out", deadline)
            try:
                sent = sock.sendmsg([data], ancillary, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            except BlockingIOError:
                continue
            ancillary = []  # the descriptors went with the first bytes
            data = data[sent:]
    finally:
        sock.close()


def read_gate(gate: int, want: int = 16) -> bytes:
    """What the child says: after its request, b"" (it exec'd, or died) or
    an errno; before, READY. At most ``want`` bytes, waiting at most
    RELEASE_TIMEOUT (TimeoutError) for end of file or that many."""
    import socket
    import time

    sock = socket.socket(fileno=os.dup(gate))
    try:
        report = b""
        deadline = time.monotonic() + RELEASE_TIMEOUT
        while len(report) < want:
            _await(sock, "in", deadline)
            try:
                chunk = sock.recv(want - len(report), socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                return report
            if not chunk:
                return report
            report += chunk
        return report
    finally:
        sock.close()


def _await(sock, direction: str, deadline: float) -> None:
    """Until ``sock`` is readable ("in") or writable ("out"); TimeoutError at ``deadline``."""
    import select
    import time

    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN if direction == "in" else select.POLLOUT)
    while not poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
        if time.monotonic() >= deadline:
            raise TimeoutError("timed out")
