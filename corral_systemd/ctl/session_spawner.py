"""The holder's side of a session's background runs: each one's corral is the holder's child.

``corral --background`` in a session (the *front*, ``core/background.py``)
asks the holder over the session's abstract address (Varlink,
``io.corral.SessionHolder.Spawn``) to start the run's own corral, giving its
command line, its process context (``kernel.context``) and three descriptors:
the run's log, its working directory and the write end of the front's ready
pipe (``core.background``: the front's one source for the command's start).
The holder forks (``core.background.fork_run_corral``, the front's own way
to start a run's corral), and the child becomes that context (its own
session, stdin /dev/null, stdout and stderr the log, the ready pipe kept for
it alone; ``ProcessContext.apply``, the caller's environment as
``os.environ``) and is the detached run of that id (``cli.detached_run``,
the command line read there, as the front read it); the holder closes its
copy of the pipe and answers at once with the child's pid and a pidfd of it
(``continues``), and once it has reaped the child, its exit code.

A fork, not an exec: the holder has loaded what a run's corral loads
(``_warm``, once), so a run's corral starts without an interpreter's start
or its imports, and its pages stay shared with the holder's until written.
What a fork would carry that exec would not is put right in the child: the
holder's signal handlers (at their default), its descriptors (closed: only
the log, the working directory and the ready pipe are kept; the tokens it
holds and cached sockets are forgotten at the fork, ``os.register_at_fork``),
its environment (the caller's), its dumpability (not dumpable, as every
corral), its place on the module path (``Holder``: no caller's directory on
it). A session's verdict secrets are in memory a fork wipes
(``common.verdict``): no run's corral holds them. Not put right: the run's
corral's /proc/PID/environ and cmdline read as the holder's (the kernel's
copy of what exec gave; the run's command gets the caller's, as exec gives
it); a locale the caller's environment names is not loaded again (Python's
own encodings are the holder's).

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
import time

from ..kernel import procfs
from ..kernel.context import ProcessContext
from ..kernel.pidfd import signal_process
from ..state import sessions as S
from ..varlink.wire import Channel


class Spawner:
    def __init__(self, directory: str, session_id: str, systemd: bool = False):
        from ..kernel.prctl import set_child_subreaper

        set_child_subreaper()
        self.directory, self.session_id = directory, session_id
        #: The background runs' corrals this holder started, and the fronts waiting for their end.
        self.children: dict[int, Channel | None] = {}
        #: The session's runs are the manager's (``_warm`` loads the systemd engine too).
        self.systemd = systemd
        self._warmed = False

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
        from ..core.background import fork_run_corral
        from ..core.spec import CGROUP_MODES

        default_mode, run_id, argv = params["default_mode"], params["run_id"], params["argv"]
        if default_mode not in CGROUP_MODES or not S.valid_session_id(run_id):
            raise ValueError("default_mode or run_id")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv")
        ctx = ProcessContext.from_json(params["context"])
        log_fd, cwd_fd = fds[params["log"]], fds[params["cwd"]]
        started_fd = fds[params["started"]] if type(params.get("started")) is int else None
        self._warm()

        def become() -> int:  # in the child: the caller's context, then the run's corral
            from ..cli import detached_run
            from ..kernel.prctl import set_dumpable

            set_dumpable(False)  # inherited from the holder; said again: the command is of this uid
            ctx.apply(cwd_fd)
            os.close(cwd_fd)
            os.environ.clear()  # the caller's environment, exactly: what exec would have given
            os.environ.update(ctx.env)
            return detached_run(default_mode, run_id, started_fd, argv)

        keep = (cwd_fd, *([] if started_fd is None else [started_fd]))
        pid = fork_run_corral(log_fd, keep, become)
        return pid, os.pidfd_open(pid)

    def _warm(self) -> None:
        """Load, once, the modules a run's corral loads, before the first fork: each
        run's corral is then a fork of a loaded one (no interpreter start, no
        imports, its pages shared with this holder until written). Frozen for the
        collector (``gc.freeze``), so a child's collections do not write to them."""
        if self._warmed:
            return
        self._warmed = True
        import gc
        import importlib

        from .. import dbus

        dbus.light_import = True  # the holder's own process, as the CLI's: see dbus/_dbus_fast.py
        for name in (*WARM_MODULES, *(WARM_SYSTEMD if self.systemd else ())):
            try:
                importlib.import_module(name, __package__)
            except ImportError:
                pass  # that engine's run imports it itself (or says why not)
        gc.freeze()

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


def own_descendants(root: int | None = None) -> list[int]:
    """Every process below this one (or ``root``), from the kernel's children lists
    of each of its threads and theirs (its own tree only: nothing else is read)."""
    found: list[int] = []
    stack = [os.getpid() if root is None else root]
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


#: What a background run's corral loads (``_warm``): the CLI's run, the
#: supervisor and the in-process engines; with a manager, the systemd engine
#: too. A module missing here is only imported later, by the child itself.
WARM_MODULES = (
    "..cli",
    "..core.assemble",
    "..core.background",
    "..core.logkeeper",
    "..core.record_fd",
    "..core.signalwatch",
    "..core.supervisor",
    "..core.runguard",
    "..engines.fallback",
    "..engines.fallback_tether",
    "..engines.pidns",
    "..engines.pidns_init",
    "..engines.tether",
    "..kernel.inotify",
    "..kernel.spawn",
)
WARM_SYSTEMD = ("..engines.systemd", "..engines.systemd.engine", "..dbus.connection", "..dbus.systemd1")
