"""Starting the command: new session, exact stdio, exec errors reported.

The systemd scope engine must hold the command between its start and its
exec until the scope exists (the *gate*), so that nothing the command runs
can start outside its unit. The CLI forks and holds the child in Python
(``fork_command``); a library host, being multi-threaded, must not fork, and
posix_spawn()s corral-gate, the held child of ``kernel.gate`` (``spawn_held``).

Exec failures travel back over a close-on-exec channel as an errno, so the
caller can map them to 127 (not found) or 126 (cannot execute) without
guessing from an exit status. The channel is a socket pair, not a pipe: a
command running as root may open its parent's descriptors
(/proc/PPID/fd/N), which reopens a pipe but never a socket; and a report is
believed only from a child that then exited as the report's writer does
(127, or 125 for a failed setup), never from one that ran on.
"""

import _signal  # not signal: the same numbers without enum's start-up cost
import errno
import fcntl
import os

from ..common import baton
from ..common.errors import SetupError
from .pathexec import execvpe
from .signals import CHILD_DEFAULTS
from .wait import exited_with_usage

#: A child's report that starts with this is a failed setup, not an errno.
_SETUP_FAILED = b"setup:"

#: Reset before the command runs (the gate waits in corral's code, with its handlers).
_DEFAULT_IN_CHILD = CHILD_DEFAULTS


class ExecError(Exception):
    """The command could not be executed; ``errno`` says why."""

    def __init__(self, err: int, argv0: str):
        self.errno = err
        self.argv0 = argv0
        super().__init__(f"{argv0}: {os.strerror(err)}")

    @property
    def exit_code(self) -> int:
        return 127 if self.errno in (errno.ENOENT, errno.ENOTDIR) else 126


class Child:
    """A forked child; ``release()`` lets it exec (only when gated)."""

    def __init__(self, pid: int, pidfd: int, gate_w: int | None, err_r: int | None, argv0: str):
        self.pid = pid
        self.pidfd = pidfd
        self._gate_w = gate_w
        self._err_r = err_r
        self._argv0 = argv0

    def release(self) -> None:
        """Open the gate and wait for exec. Raises ExecError if exec failed,
        SetupError if the child could not be set up (a sealed run: ``kernel.seal``)."""
        if self._gate_w is not None:
            try:
                os.write(self._gate_w, b"x")
            except BrokenPipeError:
                pass  # the child gave up before the gate: its report says why
            os.close(self._gate_w)
            self._gate_w = None
        err_r, self._err_r = self._err_r, None
        if err_r is None:
            raise RuntimeError("release() called twice")
        try:
            data = b""
            while chunk := os.read(err_r, 8):  # EOF when exec closes the socket
                data += chunk
        finally:
            os.close(err_r)
        if data and self._reaped_after_report(125 if data.startswith(_SETUP_FAILED) else 127):
            if data.startswith(_SETUP_FAILED):
                raise SetupError(data[len(_SETUP_FAILED) :].decode(errors="replace"))
            raise ExecError(int(data), self._argv0)

    def _reaped_after_report(self, code: int) -> bool:
        """The child wrote its report and exited ``code`` (``_wrote_report``):
        then it is reaped here, so the caller sees a clean failure and no zombie."""
        if not self._wrote_report(code):
            return False
        os.waitpid(self.pid, 0)
        self.reaped = True
        os.close(self.pidfd)
        self.pidfd = -1
        return True

    def _wrote_report(self, code: int) -> bool:
        """The child exited with ``code`` (left unreaped), as it does once it
        has written its report: a report from anywhere else (a command that
        reached the channel some other way, pidfd_getfd(2)) is not believed,
        the command ran. Bounded: the child exits as soon as it has written."""
        import select

        if self.pidfd >= 0 and not select.select([self.pidfd], [], [], 10)[0]:
            return False
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        return info is not None and info.si_code == os.CLD_EXITED and info.si_status == code

    #: Reaped for good (its pid, and the session id it made, may be reused).
    reaped = False

    #: (user, system) CPU ns of it and the descendants it waited for, once it has exited and
    #: was held (``gate.exited_with_usage``: final, to the microsecond), else None.
    usage: tuple[int, int] | None = None

    def exited(self, hold: bool) -> int | None:
        """Its wait status once it has exited, else None. ``hold``: leave it
        a zombie (WNOWAIT) until ``reap()``, so its pid and session id stay
        its own; its CPU time is read then (``usage``)."""
        if hold:
            got = exited_with_usage(self.pid)
            if got is None:
                return None
            status, user, system = got
            if user is not None and system is not None:
                self.usage = (user, system)
            return status
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if not pid:
            return None
        self.reaped = True
        return status

    def reap(self, exited: bool) -> None:
        """Reap a held child for good (``exited``: it has, so wait for it)."""
        if self.reaped or self.pidfd < 0:
            return
        try:
            pid, _ = os.waitpid(self.pid, 0 if exited else os.WNOHANG)
            self.reaped = bool(pid)
        except ChildProcessError:
            self.reaped = True

    def wait_fd(self) -> int | None:
        """Readable once it has exited."""
        return self.pidfd if self.pidfd >= 0 else None

    def session_pinned(self) -> bool:
        """Its session id cannot have been reused: it is not reaped."""
        return not self.reaped

    def lost(self) -> str | None:
        """Why its exit status cannot be known: never, for our own child."""
        return None

    def close(self) -> None:
        """Close its pidfd (reap it first if it is to be reaped)."""
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1

    def abandon(self) -> None:
        """Kill a gated child that will never be released (setup failed)."""
        if self._gate_w is not None:
            os.close(self._gate_w)  # EOF on the gate makes the child exit
            self._gate_w = None
        from .pidfd import kill_and_reap

        kill_and_reap(self.pid, self.pidfd)
        self.pidfd = -1
        if self._err_r is not None:
            os.close(self._err_r)
            self._err_r = None


def fork_command(
    argv: list[str],
    *,
    stdin: int,
    stdout: int,
    stderr: int,
    env: dict[str, str] | None,
    cwd: str | None,
    gated: bool,
    seal=None,
    controlling_tty: bool = False,
    umask: int | None = None,
) -> Child:
    """Fork the command in a new session; exec at once unless ``gated``.

    For an ungated child, call ``release()`` right away: it returns when the
    exec has happened (or raises ExecError). With ``seal`` (a
    ``kernel.seal.Seal``: ``--network none``, ``--handoff deny``) the child
    first seals itself and checks it (``Seal.apply``); if that fails, it
    never execs and ``release()`` raises SetupError. With
    ``controlling_tty``, ``stdin`` is a terminal that becomes the controlling
    terminal of the child's new session (``--pty``). ``umask``: the child's
    (None: this process's).
    """
    err_r, err_w = _report_channel()
    gate_r = gate_w = None
    if gated:
        gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
    env_items = None if env is None else dict(env)
    if controlling_tty:
        import termios  # here, not in the child: only a --pty run needs it

        set_controlling_tty = termios.TIOCSCTTY
    pid = os.fork()
    if pid == 0:  # child: only async-signal-safe-ish work, then exec or _exit
        code = 127
        try:
            _dumpable_again()  # the command's process, as its exec would make it
            os.setsid()
            for sig in _DEFAULT_IN_CHILD:
                _signal.signal(sig, _signal.SIG_DFL)
            _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
            if seal is not None:
                try:
                    seal.apply()
                except (OSError, RuntimeError) as exc:
                    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                    os.write(
                        err_w, _SETUP_FAILED + f"{seal.what}: not in place ({why}); the command never ran".encode()
                    )
                    os._exit(125)
            if gate_r is not None and gate_w is not None:
                os.close(gate_w)
                if os.read(gate_r, 1) != b"x":
                    os._exit(code)  # parent gave up on us
            for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
                if fd != target:
                    os.dup2(fd, target)  # dup2 clears close-on-exec on the target
                else:
                    os.set_inheritable(fd, True)
            if controlling_tty:
                fcntl.ioctl(0, set_controlling_tty, 0)
            if cwd is not None:
                os.chdir(cwd)
            if umask is not None:
                os.umask(umask)
            execvpe(argv[0], argv, env_items)
        except OSError as exc:
            try:
                err = exec_errno(argv[0], exc.errno or errno.EIO, env_items)
                os.write(err_w, str(err).encode())
            except OSError:
                pass
        except BaseException:
            pass
        os._exit(code)
    os.close(err_w)
    if gate_r is not None:
        os.close(gate_r)
    return Child(pid, _pidfd_of_child(pid), gate_w, err_r, argv[0])


def _report_channel() -> tuple[int, int]:
    """The exec report's (read, write) ends, close-on-exec: a socket pair,
    which no process can reopen through /proc/PID/fd (see the module's docstring)."""
    import _socket  # not socket: its enums cost every start a few ms

    r, w = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    w.shutdown(_socket.SHUT_RD)
    r.shutdown(_socket.SHUT_WR)
    return r.detach(), w.detach()


def _pidfd_of_child(pid: int) -> int:
    """A pidfd for our child ``pid``, even when the ungated command already
    lowered our descriptor limit (``prlimit --pid $PPID --nofile=4``): the
    soft limit goes up to the hard one for this one descriptor and back down
    (the supervisor's ``OwnLimits`` then restores it and says so). A limit
    that cannot make room raises the EMFILE."""
    try:
        return os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno != errno.EMFILE:
            raise
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        return os.pidfd_open(pid)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def exec_errno(name: str, err: int, env: dict | None) -> int:
    """The errno to report for a failed exec of ``name``, as a shell reports it.

    exec() says EACCES for a directory: a path to one is EISDIR ("Is a
    directory", 126); a bare name that PATH finds only as directories is
    ENOENT (127), since PATH lookup skips directories. Relative paths are
    taken from the current directory (the command's, in the child).
    """
    if err != errno.EACCES:
        return err
    if "/" in name:
        return errno.EISDIR if os.path.isdir(name) else err
    path_env = (os.environ if env is None else env).get("PATH", os.defpath)
    candidates = [os.path.join(d or ".", name) for d in path_env.split(":")]
    if not any(os.path.isfile(c) for c in candidates):
        return errno.ENOENT
    return err


def resolve_executable(name: str, path_env: str, cwd: str | None) -> str:
    """PATH lookup as execvp does it; ExecError(ENOENT/EACCES/EISDIR) when it fails."""
    if "/" in name:
        candidates = [os.path.join(cwd or os.getcwd(), name)]
    else:
        candidates = [os.path.join(d or ".", name) for d in path_env.split(":")]
    denied = False
    for candidate in candidates:
        if os.path.isfile(candidate):
            if os.access(candidate, os.X_OK):
                return os.path.abspath(candidate)
            denied = True
        elif os.path.isdir(candidate) and "/" in name:
            raise ExecError(errno.EISDIR, name)
    raise ExecError(errno.EACCES if denied else errno.ENOENT, name)


def resolve_in_cwd(name: str, path_env: str, cwd: str | None) -> str:
    """The executable ``name`` as exec finds it *after* chdir to the
    command's ``cwd``: relative PATH entries (and empty ones, the current
    directory) are taken from ``cwd``, not from corral's own directory.
    ExecError(ENOENT) if ``cwd`` does not exist (as the command's chdir fails)."""
    directory = os.path.abspath(cwd or os.getcwd())
    if not os.path.isdir(directory):
        raise ExecError(errno.ENOENT, name)
    search = ":".join(os.path.join(directory, d) for d in path_env.split(":"))
    return resolve_executable(name, search, directory)


class GateChild(Child):
    """The command's process posix_spawn()ed held at its gate (``spawn_held``).

    It speaks ``kernel.gate``'s protocol, as a served run's held child does:
    ``release()`` waits for its "ready", sends the command, environment,
    working directory, umask and stdio, and returns once it has exec'd.
    ExecError with the errno it reports (and exited 127 after, as only the
    held child does: ``Child._wrote_report``); SetupError if it did not take
    its command (killed and reaped then: nothing ran)."""

    def __init__(self, pid: int, pidfd: int, gate: int, payload: bytes, stdio: tuple, argv0: str):
        super().__init__(pid, pidfd, None, None, argv0)
        self._gate = gate
        self._request: tuple | None = (payload, stdio)

    def release(self) -> None:
        from .gate import EXIT_EXEC_FAILED
        from .held import release, report_errno

        if self._request is None:
            raise RuntimeError("release() called twice")
        (payload, stdio), self._request = self._request, None
        try:
            report = release(self._gate, payload, stdio, ready_first=True)
        except (OSError, TimeoutError) as exc:
            self.abandon()
            raise SetupError(f"the command's gate did not take its command ({exc}); the command never ran") from None
        finally:
            self._close_gate()
        if report and self._reaped_after_report(EXIT_EXEC_FAILED):
            raise ExecError(report_errno(report), self._argv0)

    def abandon(self) -> None:
        """Kill it (it will never be released) and reap it."""
        self._close_gate()
        if self.pidfd >= 0:
            from .pidfd import kill_and_reap

            kill_and_reap(self.pid, self.pidfd)
            self.pidfd = -1
            self.reaped = True

    def close(self) -> None:
        self._close_gate()  # never released: EOF on its gate, it exits having run nothing
        super().close()

    def _close_gate(self) -> None:
        if self._gate >= 0:
            os.close(self._gate)
            self._gate = -1


def spawn_held(
    program: list[str],
    argv: list[str],
    *,
    stdin: int,
    stdout: int,
    stderr: int,
    env: dict[str, str] | None,
    cwd: str | None,
    umask: int | None = None,
) -> GateChild:
    """Start the command's process held at a gate, without fork()ing the caller.

    For a multi-threaded host (a library Runner: reader thread, supervisor
    threads, an event loop) fork() is both costly (page tables, copy-on-write
    faults while the child runs Python) and unsafe (locks held by other
    threads stay held in the child). ``posix_spawn`` (vfork-based) starts
    ``program`` (corral-gate, packaging/gate/gate.c, or its Python twin:
    ``engines.libexec.gate_program``) with its end of the gate as descriptor
    3; it is the held child every other path has (``kernel.gate``), so the
    command is executed, and its exec's failure reported, the one way:
    ``kernel.pathexec.execvpe`` after chdir to ``cwd``, never /bin/sh for a file
    the kernel will not execute.

    SetupError where ``program`` cannot be started (the command never ran).
    """
    import _socket

    from .gate import encode_request

    env = dict(os.environ if env is None else env)
    payload = encode_request(list(argv), env, cwd, umask)
    ours, theirs = (s.detach() for s in _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC))
    pid = None
    try:
        # A copy above 2 first: were it 3 already, dup2 onto itself would keep close-on-exec.
        source = fcntl.fcntl(theirs, fcntl.F_DUPFD_CLOEXEC, 10)
        try:
            # vfork: we are suspended until the gate has exec'd (about a
            # millisecond); a Runner's other runs need not wait for that.
            with baton.released():
                pid = os.posix_spawn(
                    program[0],
                    program,
                    {},
                    file_actions=[(os.POSIX_SPAWN_DUP2, source, 3)],
                    setsigmask=(),
                    setsigdef=_DEFAULT_IN_CHILD,
                )
        finally:
            os.close(source)
        pidfd = _pidfd_of_child(pid)
    except BaseException as exc:
        os.close(ours)
        if pid is not None:  # started, but no pidfd for it: it never runs the command
            os.kill(pid, _signal.SIGKILL)
            os.waitpid(pid, 0)
        if isinstance(exc, OSError):
            raise SetupError(f"{program[0]}: {exc.strerror or exc}: the command's gate did not start") from None
        raise
    finally:
        os.close(theirs)
    return GateChild(pid, pidfd, ours, payload, (stdin, stdout, stderr), argv[0])


def _dumpable_again() -> None:
    """The child that becomes the command: dumpable, as its execve makes it anyway
    (the manager and corral's own checks read its /proc files before that)."""
    from .prctl import set_dumpable

    set_dumpable(True)
