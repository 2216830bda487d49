"""The holder's side of a session's background runs: each one's corral is the holder's child.

``corral --background`` in a session (the *front*, ``core/background.py``)
asks the holder over ``<state dir>/sessions/<id>.sock`` (Varlink,
``io.corral.SessionHolder.Spawn``) to start the run's own corral, giving its
command line, its process context (``kernel.context``) and two descriptors:
the run's log and its working directory. The holder forks, the child
becomes that context (its own session, stdin /dev/null, stdout and stderr
the log) and execs corral as the detached run of that id
(``cli.detached_main``); the holder answers at once with the child's pid
and a pidfd of it (``continues``), and once it has reaped the child, its
exit code.

Why the holder: it is a child subreaper, so every process of the session's
background runs stays below it, whatever befalls their corrals (a SIGKILLed
corral's orphans come to the holder, not to init), and at the session's end
the holder stops what is still below it (``sweep``). In systemd mode the
holder is a unit of the manager: the background runs' corrals live in it,
not in the caller's login session or the corral service.

Trust: the socket is in the user's private state directory; the holder
serves only its own uid (``SO_PEERCRED``). A front believes the socket only
when its peer is the process the holder's sealed token names.
"""

import os
import socket
import sys

from ..kernel.context import ProcessContext
from ..state import sessions as S
from ..varlink.wire import Channel, ProtocolError, close_fds, peer_credentials

#: How long a connection may take to send its call (the holder waits for nothing else meanwhile).
CALL_TIMEOUT = 2.0


class Spawner:
    def __init__(self, directory: str, session_id: str):
        from ..kernel.prctl import set_child_subreaper

        set_child_subreaper()
        self.directory, self.session_id = directory, session_id
        self.sock, self._dirfd, self._bound = self._listen()
        #: The background runs' corrals this holder started, and the fronts waiting for their end.
        self.children: dict[int, Channel | None] = {}

    def _listen(self) -> tuple[socket.socket, int, os.stat_result]:
        """(the listening socket, the sessions directory it is in, what it is there)."""
        dirfd = os.open(S.sessions_dir(self.directory), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            path = S.socket_address(dirfd, self.session_id)
            try:
                os.unlink(path)  # a restarted holder's, or anything the uid put there
            except FileNotFoundError:
                pass
            sock.bind(path)
            sock.listen(16)
            sock.setblocking(False)
            return sock, dirfd, os.stat(path)
        except BaseException:
            sock.close()
            os.close(dirfd)
            raise

    def stop_listening(self) -> None:
        """No more runs: the socket closed and removed (a front connecting now is refused)."""
        try:
            os.unlink(S.socket_address(self._dirfd, self.session_id))
        except OSError:
            pass
        self.sock.close()

    def keep_listening(self) -> None:
        """Bind again where the socket was removed (the state directory damaged and made again)."""
        import stat

        try:
            st = os.stat(os.path.join(S.sessions_dir(self.directory), f"{self.session_id}.sock"))
            if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == (self._bound.st_dev, self._bound.st_ino):
                return
        except OSError:
            pass
        try:
            listening = self._listen()
        except OSError:
            return  # no sessions directory to bind in (yet): the next look tries again
        self.sock.close()
        os.close(self._dirfd)
        self.sock, self._dirfd, self._bound = listening

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        for channel in self.children.values():
            if channel is not None:
                channel.sock.close()
        self.children.clear()
        self.sock.close()
        if self._dirfd >= 0:
            os.close(self._dirfd)
            self._dirfd = -1

    # -- a front's call ---------------------------------------------------------------------
    def accept(self, open_: bool) -> None:
        """Serve one waiting connection (``open_``: the session takes runs)."""
        try:
            conn, _ = self.sock.accept()
        except BlockingIOError:
            return
        conn.settimeout(CALL_TIMEOUT)
        channel = Channel(conn)
        fds: list[int] = []
        try:
            _pid, uid, _gid = peer_credentials(conn)
            got = channel.receive()
            if got is None:
                raise ProtocolError("no call")
            call, fds = got
            if uid != os.geteuid():
                raise _Refused("PermissionDenied", {"uid": uid})
            if call.get("method") != S.SPAWN_METHOD:
                raise _Refused("MethodNotFound", {"method": str(call.get("method"))})
            if not open_:
                raise _Refused("SessionEnding", {})
            params = call.get("parameters") or {}
            pid, pidfd = self._spawn(params, fds)
        except _Refused as exc:
            _reply_error(channel, exc.args[0], exc.args[1])
            conn.close()
            return
        except (OSError, ProtocolError, ValueError, KeyError, TypeError) as exc:
            _reply_error(channel, "InvalidParameter", {"why": str(exc)})
            conn.close()
            return
        finally:
            close_fds(fds)
        try:
            channel.send({"parameters": {"pid": pid, "pidfd": 0}, "continues": True}, [pidfd])
            self.children[pid] = channel
        except OSError:
            conn.close()
            self.children[pid] = None  # the front is gone: the run goes on, reaped here
        finally:
            os.close(pidfd)

    def _spawn(self, params: dict, fds: list[int]) -> tuple[int, int]:
        """Fork the run's corral; (its pid, a pidfd of it)."""
        from ..core.spec import CGROUP_MODES

        default_mode, run_id, argv = params["default_mode"], params["run_id"], params["argv"]
        if default_mode not in CGROUP_MODES or not S.valid_session_id(run_id):
            raise ValueError("default_mode or run_id")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv")
        ctx = ProcessContext.from_json(params["context"])
        log_fd, cwd_fd = fds[params["log"]], fds[params["cwd"]]
        # -P: the caller's working directory is not on the exec'd corral's module path.
        exe = [sys.executable, "-P", "-c", _DETACHED, default_mode, run_id, *argv]
        env = dict(ctx.env)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the run's corral, from here to exec
            try:
                os.setsid()
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(log_fd, 1)
                os.dup2(log_fd, 2)
                ctx.apply(cwd_fd)
                os.closerange(3, _fd_limit())
                os.execve(exe[0], exe, env)
            except BaseException as exc:
                try:
                    os.write(2, f"corral: the session's holder could not start the run: {exc}\n".encode())
                finally:
                    os._exit(125)
        return pid, os.pidfd_open(pid)

    # -- the children -----------------------------------------------------------------------
    def reap(self) -> None:
        """Reap every child that has exited (the runs' corrals, and orphans of
        their runs re-parented here); tell a waiting front its run's exit code."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            channel = self.children.pop(pid, None)
            if channel is not None:
                code = os.waitstatus_to_exitcode(status)
                try:
                    channel.send({"parameters": {"exit_code": code if code >= 0 else 128 - code}})
                except OSError:
                    pass
                channel.sock.close()

    def descendants(self) -> list[int]:
        """Every process below the holder (its children and theirs): the session's,
        once its runs are ended (a background run's corral still finishing, an orphan)."""
        from ..kernel import procfs

        return [p.pid for p in procfs.descendants(procfs.scan(), os.getpid()) if p.alive]

    def sweep(self, grace: float) -> list[int]:
        """At the session's end: give the runs' corrals ``grace`` to finish (their
        runs are stopped: they write their records and exit), then SIGKILL
        whatever is below the holder (through pidfds); what is left."""
        import signal
        import time

        from ..kernel import procfs
        from ..kernel.pidfd import signal_process

        end = time.monotonic() + grace
        while self.children and time.monotonic() < end:
            self.reap()
            time.sleep(0.05)
        for _ in range(50):  # no process can leave a subreaper's subtree: a few rounds end it
            self.reap()
            below = [p for p in procfs.descendants(procfs.scan(), os.getpid()) if p.alive]
            if not below:
                return []
            for info in below:  # the same process (its start time), through a pidfd
                signal_process(info, signal.SIGKILL, lambda _current: True)
            time.sleep(0.05)
        self.reap()
        return self.descendants()


class _Refused(Exception):
    pass


def _reply_error(channel: Channel, name: str, parameters: dict) -> None:
    try:
        channel.send({"error": f"io.corral.SessionHolder.{name}", "parameters": parameters})
    except OSError:
        pass


def _fd_limit() -> int:
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if 0 < soft < (1 << 20) else 1 << 20


#: The exec'd corral: ``cli.detached_main([default_mode, run_id, *argv])``.
_DETACHED = "import sys; from corral_systemd.cli import detached_main; sys.exit(detached_main(sys.argv[1:]))"
