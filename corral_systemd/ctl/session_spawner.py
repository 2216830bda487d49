"""The holder's side of a session's background runs: each one's corral is the holder's child.

``corral --background`` in a session (the *front*, ``core/background.py``)
asks the holder over the session's abstract address (Varlink,
``io.corral.SessionHolder.Spawn``) to start the run's own corral, giving its
command line, its process context (``kernel.context``) and three descriptors:
the run's log, its working directory and the write end of the front's ready
pipe (``core.background``: the front's one source for the command's start).
The holder forks, the child becomes that context (its own session, stdin
/dev/null, stdout and stderr the log, the ready pipe kept for it alone) and
execs corral as the detached run of that id (``cli.detached_main``); the
holder closes its copy of the pipe and answers at once with the child's pid
and a pidfd of it (``continues``), and once it has reaped the child, its
exit code.

Why the holder: it is a child subreaper, so every process of the session's
background runs stays below it, whatever befalls their corrals (a SIGKILLed
corral's orphans come to the holder, not to init), and at the session's end
the holder stops what is still below it (``sweep``). In systemd mode the
holder is a unit of the manager: the background runs' corrals live in it,
not in the caller's login session or the corral service.

Trust: the holder serves only its own uid, from its own user namespace
(``session_holder.Holder._check_caller``). A front connects to the session's
abstract address, whose holder the kernel names (``state.sessions.connect_holder``).
"""

import os
import signal
import sys
import time

from ..kernel import procfs
from ..kernel.context import ProcessContext
from ..kernel.pidfd import signal_process
from ..state import sessions as S
from ..varlink.wire import Channel


class Spawner:
    def __init__(self, directory: str, session_id: str):
        from ..kernel.prctl import set_child_subreaper

        set_child_subreaper()
        self.directory, self.session_id = directory, session_id
        #: The background runs' corrals this holder started, and the fronts waiting for their end.
        self.children: dict[int, Channel | None] = {}

    def close(self) -> None:
        for channel in self.children.values():
            if channel is not None:
                channel.sock.close()
        self.children.clear()

    # -- a front's call ---------------------------------------------------------------------
    def spawn(self, channel: Channel, params: dict, fds: list[int]) -> bool:
        """Start the run's corral (``Spawn``), answer with its pid and a pidfd
        (``continues``); True if ``channel`` is kept to tell the front its exit code."""
        pid, pidfd = self._spawn(params, fds)
        try:
            channel.send({"parameters": {"pid": pid, "pidfd": 0}, "continues": True}, [pidfd])
            self.children[pid] = channel
            return True
        except OSError:
            self.children[pid] = None  # the front is gone: the run goes on, reaped here
            return False
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
        started_fd = fds[params["started"]] if type(params.get("started")) is int else None
        # -P: the caller's working directory is not on the exec'd corral's module path.
        started = "-" if started_fd is None else str(started_fd)
        exe = [sys.executable, "-P", "-c", _DETACHED, default_mode, run_id, started, *argv]
        env = dict(ctx.env)
        from ..kernel.detach import fork_detached

        pid = fork_detached(stdout=log_fd, stderr=log_fd, keep=(cwd_fd, *([] if started_fd is None else [started_fd])))
        if pid == 0:  # the run's corral, from here to exec
            try:
                from ..kernel.prctl import set_dumpable

                set_dumpable(True)  # its own /proc/self files (oom_score_adj) are its to write only so
                ctx.apply(cwd_fd)
                os.close(cwd_fd)
                if started_fd is not None:
                    os.set_inheritable(started_fd, True)  # for the exec'd corral only: it makes it close-on-exec again
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

    def sweep(self, grace: float, bound: float = 10.0) -> list[int]:
        """At the session's end: give the runs' corrals ``grace`` to finish (their
        runs are stopped: they write their records and exit), then SIGKILL every
        process below the holder (found through the kernel's children lists of
        its own tree, signalled through pidfds) until ``waitpid`` reports no
        child left. That is the proof: the holder is a child subreaper, so
        whatever lives below it is its child or a child's descendant -- however
        it forked, detached or cleared its environment. [] when proven; else
        (after ``bound`` seconds) the pids still below."""
        end = time.monotonic() + grace
        while self.children and time.monotonic() < end:
            self.reap()
            time.sleep(min(0.25, max(0.0, end - time.monotonic())))  # a child's SIGCHLD does not cut it short
        end = time.monotonic() + bound
        while True:
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                self.reap()  # the fronts still waiting are told
                return []
            below = own_descendants()
            if time.monotonic() >= end:
                return below
            for pid in below:
                info = procfs.read_stat(pid)
                if info is not None:
                    signal_process(info, signal.SIGKILL, lambda _current: True)
            time.sleep(0.05)


def own_descendants() -> list[int]:
    """Every process below this one, from the kernel's children lists of each
    of its threads and theirs (its own tree only: nothing else is read)."""
    found: list[int] = []
    stack = [os.getpid()]
    while stack:
        pid = stack.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(p) for p in f.read().split()]
            except OSError:
                continue
            for kid in kids:
                if kid not in found:
                    found.append(kid)
                    stack.append(kid)
    return found


#: The exec'd corral: ``cli.detached_main([default_mode, run_id, started_fd or "-", *argv])``.
_DETACHED = "import sys; from corral_systemd.cli import detached_main; sys.exit(detached_main(sys.argv[1:]))"
