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

Imports only ``os``, ``_socket`` and ``kernel.pathexec`` for the caller's side (``fork_held``):
the Python client runs it on every served corral start.
"""

import os

from .pathexec import execvpe
from .wait import exited_with_usage

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
        assert self.status is not None, "exited() first"
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
            from .prctl import set_dumpable

            set_dumpable(True)  # the command's process: the service reads its /proc files
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


def held_on_fd3() -> None:  # pragma: no cover  (runs as corral-gate's Python twin)
    """corral-gate's Python twin (packaging/gate/gate.c, where it was not
    built): the held child, its gate on descriptor 3, which came by dup2
    (close-on-exec cleared: set again, so the command never holds it)."""
    try:
        from .signals import default_libc_signals

        os.set_inheritable(3, False)
        default_libc_signals()
        _held_child(3)
    finally:
        os._exit(EXIT_EXEC_FAILED)


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
        execvpe(argv[0], argv, env)  # bytes: exactly as sent
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

    from .fdpass import received  # here, while the service makes the scope: not in the client's start

    sock = _socket.socket(fileno=gate)
    fds: list[int] = []
    data = b""
    while b"\n" not in data:
        chunk, ancillary, flags, _ = sock.recvmsg(65536, _socket.CMSG_SPACE(3 * 4), _socket.MSG_CMSG_CLOEXEC)
        fds += received(ancillary)
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
