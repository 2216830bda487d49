"""Starting the command: new session, exact stdio, exec errors reported.

The child is forked, not posix_spawn()ed, because the systemd scope engine
must hold it between fork and exec until the scope exists (the *gate*), so
that nothing the command runs can start outside its unit.

Exec failures travel back over a close-on-exec pipe as an errno, so the
caller can map them to 127 (not found) or 126 (cannot execute) without
guessing from an exit status.
"""

import errno
import os
import signal

_DEFAULT_IN_CHILD = ("SIGPIPE", "SIGXFSZ", "SIGINT", "SIGTERM", "SIGHUP", "SIGCHLD", "SIGQUIT")


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

    def __init__(self, pid: int, pidfd: int, gate_w: int | None, err_r: int, argv0: str):
        self.pid = pid
        self.pidfd = pidfd
        self._gate_w = gate_w
        self._err_r = err_r
        self._argv0 = argv0

    def release(self) -> None:
        """Open the gate and wait for exec. Raises ExecError if exec failed."""
        if self._gate_w is not None:
            os.write(self._gate_w, b"x")
            os.close(self._gate_w)
            self._gate_w = None
        try:
            data = b""
            while chunk := os.read(self._err_r, 8):  # EOF when exec closes the pipe
                data += chunk
        finally:
            os.close(self._err_r)
        if data:
            # The child reported an errno and exited 127; reap it here so the
            # caller sees a clean failure and no zombie.
            os.waitpid(self.pid, 0)
            os.close(self.pidfd)
            self.pidfd = -1
            raise ExecError(int(data), self._argv0)

    def abandon(self) -> None:
        """Kill a gated child that will never be released (setup failed)."""
        if self._gate_w is not None:
            os.close(self._gate_w)  # EOF on the gate makes the child exit
            self._gate_w = None
        from .pidfd import kill_and_reap

        kill_and_reap(self.pid, self.pidfd)
        self.pidfd = -1
        os.close(self._err_r)


def fork_command(
    argv: list[str],
    *,
    stdin: int,
    stdout: int,
    stderr: int,
    env: dict[str, str] | None,
    cwd: str | None,
    gated: bool,
) -> Child:
    """Fork the command in a new session; exec at once unless ``gated``.

    For an ungated child, call ``release()`` right away: it returns when the
    exec has happened (or raises ExecError).
    """
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    gate_r = gate_w = None
    if gated:
        gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
    env_items = None if env is None else dict(env)
    pid = os.fork()
    if pid == 0:  # child: only async-signal-safe-ish work, then exec or _exit
        code = 127
        try:
            os.setsid()
            for name in _DEFAULT_IN_CHILD:
                signal.signal(getattr(signal, name), signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            if gate_r is not None:
                os.close(gate_w)
                if os.read(gate_r, 1) != b"x":
                    os._exit(code)  # parent gave up on us
            for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
                if fd != target:
                    os.dup2(fd, target)  # dup2 clears close-on-exec on the target
                else:
                    os.set_inheritable(fd, True)
            if cwd is not None:
                os.chdir(cwd)
            if env_items is None:
                os.execvp(argv[0], argv)
            else:
                os.execvpe(argv[0], argv, env_items)
        except OSError as exc:
            try:
                os.write(err_w, str(exc.errno or errno.EIO).encode())
            except OSError:
                pass
        except BaseException:
            pass
        os._exit(code)
    os.close(err_w)
    if gate_r is not None:
        os.close(gate_r)
    pidfd = os.pidfd_open(pid)
    return Child(pid, pidfd, gate_w, err_r, argv[0])
