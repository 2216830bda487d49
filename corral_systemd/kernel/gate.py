"""A command's process forked by its caller and held at a gate until the corral service releases it.

A served scope is made the way ``systemd-run --scope`` makes one: of the
caller's own process. The caller (``client.py``, ``packaging/client/corral.c``,
or ``service/holder.py`` for a caller that cannot pass descriptors) forks the
command's process, which waits at a gate, and hands the service three
descriptors with the Run call: the process's pidfd, the service's end of the
gate, and the read end of an *exit pipe*. The service makes the scope around
the process (``PIDs=``, the number the pidfd names in the service's own pid
namespace), then releases it with what to execute; the caller waits for its
own child and reports the wait status on the exit pipe. So whatever
``execve`` inherits (rlimits, descriptors 3 and up, namespaces, credentials,
no-new-privs, a seccomp filter, nice, CPU affinity, oom_score_adj) is the
caller's by construction, and the command's parent is the caller, as when
corral runs in-process.

The gate is a unix stream socket pair; the child holds one end (close-on-exec):

- child -> service: ``r`` once it waits at the gate (its session made, its
  signals set), which the service waits for before it checks the process;
- service -> child, once: the payload's length in decimal and ``\\n``, sent
  with the command's stdin, stdout and stderr (SCM_RIGHTS, in that order),
  then the payload: NUL-terminated fields: cwd (empty: stay), umask (octal;
  empty: keep), argc, the arguments, the number of environment entries, the
  entries (``NAME=VALUE``);
- child -> service: end of file once the exec succeeded (the child's end is
  close-on-exec); else the errno of the failed exec in decimal, and the child
  exits 127. End of file before a request: the child exits 125, having run
  nothing.

Before it waits, the child calls setsid(), puts every signal in
``kernel.signals.CHILD_DEFAULTS`` at its default action and unblocks every
signal: what the in-process child does (``kernel.spawn.fork_command``).

The exit pipe: the caller writes its child's wait status in decimal, then
its user and system CPU time in ns (``exited_with_usage``; both may be left
out), and ``\\n`` once the child has exited, read with ``waitid(WNOWAIT)``: the child
stays a zombie, its pid and so its session id not reusable, until the
caller has the run's last reply; then it reaps it.

Imports only ``os`` and ``_socket`` for the caller's side (``fork_held``):
the Python client runs it on every served corral start.
"""

import os
import sys

#: The request's payload may hold an argv and an environment: as large as exec takes.
MAX_REQUEST = 8 << 20
#: What a held child says once it waits at its gate.
READY = b"r"
#: Exit of a held child whose gate closed before any request (nothing ran).
EXIT_NOT_RELEASED = 125
#: Exit of a held child whose exec failed (the errno went to the service).
EXIT_EXEC_FAILED = 127


# -- the request ------------------------------------------------------------------


def encode_request(argv: list[str], env: dict[str, str], cwd: str | None, umask: int | None) -> bytes:
    """The payload (see the module docstring); strings as os.fsencode gives them."""
    fields = [
        os.fsencode(cwd or ""),
        b"" if umask is None else b"%o" % umask,
        b"%d" % len(argv),
        *map(os.fsencode, argv),
        b"%d" % len(env),
        *(os.fsencode(f"{name}={value}") for name, value in env.items()),
    ]
    if any(b"\0" in field for field in fields):
        raise ValueError("a NUL byte in the command line or environment")
    return b"".join(field + b"\0" for field in fields)


def decode_request(payload: bytes) -> tuple[list[bytes], dict[bytes, bytes], bytes, int | None]:
    """(argv, env, cwd, umask) from a payload; ValueError if malformed."""
    fields = payload.split(b"\0")
    if fields.pop() != b"":
        raise ValueError("the request does not end in NUL")
    cwd, umask_text = fields[0], fields[1]
    argc = int(fields[2])
    argv = fields[3 : 3 + argc]
    envc = int(fields[3 + argc])
    entries = fields[4 + argc :]
    if argc < 1 or len(argv) != argc or len(entries) != envc:
        raise ValueError("the request's counts do not match its fields")
    env = {}
    for entry in entries:
        name, sep, value = entry.partition(b"=")
        if not sep or not name:
            raise ValueError("an environment entry that is not NAME=VALUE")
        env[name] = value
    return argv, env, cwd, int(umask_text, 8) if umask_text else None


# -- the caller's side: fork the held child ------------------------------------------


class Forked:
    """The caller's held child: ``pid``, ``pidfd`` (this process's), and
    ``gate``, the service's end of the gate, to send with the Run call."""

    def __init__(self, pid: int, pidfd: int, gate: int):
        self.pid = pid
        self.pidfd = pidfd
        self.gate = gate
        self.status: int | None = None
        self.usage: tuple[int | None, int | None] = (None, None)

    def exited(self) -> int | None:
        """Its wait status once it has exited, leaving it a zombie (WNOWAIT); else None."""
        if self.status is None:
            got = exited_with_usage(self.pid)
            if got is not None:
                self.status, *usage = got
                self.usage = (usage[0], usage[1])
        return self.status

    def report(self) -> bytes:
        """The exit pipe's line: the wait status, then (when known) its user and system CPU ns."""
        user, system = self.usage
        if user is None or system is None:
            return b"%d\n" % self.status
        return b"%d %d %d\n" % (self.status, user, system)

    def discard(self) -> None:
        """Kill it (it never ran, or must not run on) and reap it; close the descriptors."""
        import _signal

        try:
            _signal.pidfd_send_signal(self.pidfd, _signal.SIGKILL)
        except OSError:
            pass
        self.reap()

    def reap(self) -> None:
        """Reap it for good (blocking: it has exited, or was just killed); close the descriptors."""
        if self.pidfd >= 0:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            os.close(self.pidfd)
            self.pidfd = -1
        if self.gate >= 0:
            os.close(self.gate)
            self.gate = -1


def fork_held(close_in_child: tuple[int, ...] = ()) -> Forked:
    """Fork the command's process held at a gate (see the module docstring).

    ``close_in_child``: this process's descriptors the child must not keep
    while it waits (its connection to the service, its pipes); they are
    close-on-exec, so the command never has them either way."""
    import _socket

    service_end, child_end = (
        s.detach() for s in _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    )
    pid = os.fork()
    if pid == 0:  # pragma: no cover  (the child; its behaviour is tested through the runs)
        try:
            for fd in (*close_in_child, service_end):
                try:
                    os.close(fd)
                except OSError:
                    pass
            _held_child(child_end)
        finally:
            os._exit(EXIT_EXEC_FAILED)
    os.close(child_end)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        os.close(service_end)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise
    return Forked(pid, pidfd, service_end)


def _held_child(gate: int) -> None:  # pragma: no cover  (runs in the forked child)
    import _signal

    from .signals import CHILD_DEFAULTS

    os.setsid()
    for sig in CHILD_DEFAULTS:
        _signal.signal(sig, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
    os.write(gate, READY)
    got = _receive_request(gate)
    if got is None:
        os._exit(EXIT_NOT_RELEASED)
    payload, fds = got
    try:
        argv, env, cwd, umask = decode_request(payload)
    except (ValueError, IndexError):
        os._exit(EXIT_NOT_RELEASED)
    for target, fd in enumerate(fds[:3]):
        if fd != target:
            os.dup2(fd, target)  # dup2 clears close-on-exec on the target
        else:
            os.set_inheritable(fd, True)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    try:
        if cwd:
            os.chdir(cwd)
        if umask is not None:
            os.umask(umask)
        os.execvpe(argv[0], argv, env)  # bytes: exactly as sent
    except OSError as exc:
        from .spawn import exec_errno

        err = exec_errno(os.fsdecode(argv[0]), exc.errno or 5, {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()})
        try:
            os.write(gate, b"%d" % err)
        except OSError:
            pass
    os._exit(EXIT_EXEC_FAILED)


def _receive_request(gate: int) -> tuple[bytes, list[int]] | None:  # pragma: no cover  (the child)
    """The request's payload and descriptors, or None at end of file (or anything malformed)."""
    import _socket
    import sys

    sock = _socket.socket(fileno=gate)
    fds: list[int] = []
    data = b""
    while b"\n" not in data:
        chunk, ancillary, flags, _ = sock.recvmsg(65536, _socket.CMSG_SPACE(3 * 4), _socket.MSG_CMSG_CLOEXEC)
        for level, kind, raw in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds += [int.from_bytes(raw[i : i + 4], sys.byteorder) for i in range(0, len(raw) - len(raw) % 4, 4)]
        if not chunk or len(data) > 32:
            return None
        data += chunk
    head, _, payload = data.partition(b"\n")
    length = int(head)
    if len(fds) != 3 or not 0 < length <= MAX_REQUEST:
        return None
    while len(payload) < length:
        chunk = sock.recv(min(1 << 20, length - len(payload)))
        if not chunk:
            return None
        payload += chunk
    sock.detach()
    return payload, fds


#: waitid(2)'s number, for the call with a rusage (glibc's waitid has none), per machine.
_SYS_WAITID = {"x86_64": 247, "aarch64": 95, "riscv64": 95, "ppc64le": 272, "s390x": 281}


def exited_with_usage(pid: int) -> tuple[int, int | None, int | None] | None:
    """(wait status, user CPU ns, system CPU ns) once our child ``pid`` has
    exited, leaving it a zombie (WNOWAIT); None while it runs. The CPU is
    the kernel's getrusage(RUSAGE_BOTH) of the zombie: it and every
    descendant it waited for, in microseconds, final (what wait4 would give
    at reaping, what a benchmark runner reports). ``None`` figures where the
    raw call is not to be had (another machine), with the status from os.waitid."""
    import ctypes
    import platform

    number = _SYS_WAITID.get(platform.machine())
    if number is None:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return None if info is None else (wait_status(info), None, None)
    libc = ctypes.CDLL(None, use_errno=True)
    siginfo = ctypes.create_string_buffer(128)  # zeroed: si_pid stays 0 while the child runs
    rusage = ctypes.create_string_buffer(144)
    if libc.syscall(number, os.P_PID, pid, siginfo, os.WEXITED | os.WNOHANG | os.WNOWAIT, rusage) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    code, child, status = (int.from_bytes(siginfo.raw[at : at + 4], sys.byteorder, signed=True) for at in (8, 16, 24))
    if child == 0:
        return None
    wait = (status & 0xFF) << 8 if code == os.CLD_EXITED else (status & 0x7F) | (0x80 if code == os.CLD_DUMPED else 0)
    sec_u, usec_u, sec_s, usec_s = (int.from_bytes(rusage.raw[at : at + 8], sys.byteorder) for at in (0, 8, 16, 24))
    return wait, sec_u * 1_000_000_000 + usec_u * 1000, sec_s * 1_000_000_000 + usec_s * 1000


def wait_status(info) -> int:
    """A waitid() siginfo as the wait status waitpid() would have given."""
    if info.si_code == os.CLD_EXITED:
        return (info.si_status & 0xFF) << 8
    return (info.si_status & 0x7F) | (0x80 if info.si_code == os.CLD_DUMPED else 0)


# -- the service's side ------------------------------------------------------------


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
                ready = _read_gate(gate, want=len(READY))
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
        from ..common import baton

        try:
            with baton.released():  # a Runner's other runs go on meanwhile
                _send_request(self._gate, payload, stdio)
                report = _read_gate(self._gate)
        except (OSError, TimeoutError) as exc:
            self._kill()
            raise SetupError(f"the caller's held process did not take its command ({exc})") from None
        finally:
            os.close(self._gate)
            self._gate = -1
        if report:
            try:
                err = int(report)
            except ValueError:
                err = 5  # EIO: not an errno
            raise ExecError(err, os.fsdecode(payload.split(b"\0")[3]))

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
        if self.status is None and self.lied is None and self._exit >= 0 and not self._waited and _exited(self.pidfd):
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
            elif not _exited(self.pidfd):
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
        with open(f"/proc/self/fdinfo/{pidfd}") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        pid = int(fields["Pid"])
    except (OSError, KeyError, ValueError) as exc:
        raise Refused(f"the process descriptor cannot be read ({exc})") from None
    if pid <= 0:
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
    if not _unreaped(pidfd) or _exited(pidfd):
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


def _exited(pidfd: int) -> bool:
    import select

    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


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


def _send_request(gate: int, payload: bytes, stdio: tuple[int, int, int]) -> None:
    import socket
    import sys
    import time

    sock = socket.socket(fileno=os.dup(gate))
    try:
        data = b"%d\n" % len(payload) + payload
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, b"".join(fd.to_bytes(4, sys.byteorder) for fd in stdio))]
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


def _read_gate(gate: int, want: int = 16) -> bytes:
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
