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
(``continues``), and once it has reaped the child, its exit code. The child
waits at a gate (``_fork_answered``) whose only other end goes with that
answer: the front lets it go once it has read the answer. A holder killed
before answering, or a front that gave up waiting (its timeout: it starts
the run itself) as the answer landed, closes the gate unreleased, and the
child exits without a run: no run is started twice.

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
it): where the session was started inside a corral run, the holder's
environment names that run, so the runs' corrals, as the holder itself, read
as its members to a scan of the environment; a locale the caller's
environment names is not loaded again (Python's own encodings are the
holder's).

A compiled client's ``--background`` command line (``Front``) has its
front forked here too (``Spawner.front``): no interpreter starts for it at
all. The holder reads the line as corral does, with the client's environment
and working directory as the kernel shows them (``ProcessContext.of_process``:
the client waits, so they cannot change meanwhile), declines what would be
another run here (not a background run of this session; a context it cannot
give, as for ``Spawn``), and forks the front with the client's stdio; the
front is corral in the client's place (``cli.served_front``: it forks the
run's corral itself, with the request the holder read -- no ``Spawn``, no
second reading; below the holder all the same, whose child it becomes when
the front exits -- waits for readiness, prints the start record and the
messages), held at its gate until the client has read the answer (as a Spawned
corral until its front has); the client relays its stop signals through the
front's pidfd (held back until it has it) and exits with its code. The
client gone before the run is ready (its connection hung up) stops the run,
as a served caller's does. What the holder reads of the client is of the
process that connected (the connection's pidfd, ``SO_PEERPIDFD``, where the
kernel gives one, taken at once: ``session_holder._peer_pidfd``), alive
until after the last read.

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
import select
import signal
import time

from ..kernel import procfs
from ..kernel.context import ProcessContext
from ..kernel.pidfd import exited, signal_process
from ..state import sessions as S
from ..varlink.wire import Channel


class Refused(Exception):
    """A call the holder refuses: ``args`` = (error name, its one-line why).
    Declared here, which every holder imports once: the holder itself may be
    ``python -m``'s ``__main__`` (a holder unit), another copy of its own module."""


class Spawner:
    def __init__(self, directory: str, session_id: str, systemd: bool = False):
        from ..kernel.prctl import set_child_subreaper

        set_child_subreaper()
        self.directory, self.session_id = directory, session_id
        #: The background runs' corrals this holder started (and compiled clients' fronts, which
        #: fork their runs' corrals), and the callers waiting for their end.
        self.children: dict[int, Channel | None] = {}
        #: Those of them that are fronts (``Front``): a child of one is a background run's corral.
        self.fronts: set[int] = set()
        #: The session's runs are the manager's (``_warm`` loads the systemd engine too).
        self.systemd = systemd
        self._warmed = False

    def close(self) -> None:
        for channel in self.children.values():
            if channel is not None:
                channel.sock.close()
        self.children.clear()
        self.fronts.clear()

    # -- a front's call ---------------------------------------------------------------------
    def spawn(self, channel: Channel, params: dict, fds: list[int]) -> bool:
        """Start the run's corral (``Spawn``), answer with its pid, a pidfd and its
        gate, which the front releases (``continues``); True if ``channel`` is kept
        to tell the front its exit code."""
        return self._answer(channel, *self._spawn(params, fds), caller_releases=params.get("caller_releases") is True)

    def front(self, channel: Channel, caller: int, pinned: int, params: dict, fds: list[int]) -> bool:
        """A compiled client's ``--background`` command line in this session
        (``Front``): its front is forked here, as the run's corral is, made the
        client's process context (read from the kernel: ``ProcessContext.of_process``)
        with the client's stdin, stdout and stderr (``fds``), and runs the command
        line as corral would in the client's place (``cli.served_front``: the
        readiness wait, the start record, the messages, the exit code). Answered
        as ``spawn``: the front's pid, a pidfd (the client relays its stop
        signals through it) and its gate, which the client releases once it has
        read the answer; then its exit code. ``NotServed`` (the client's own
        corral runs it) for anything that would be another run here: not a
        background run of this session, a context the holder cannot give, a
        client of another version; ``UsageError`` for a command line corral refuses.
        ``pinned``: a pidfd of the client (``caller``), alive after the last read of it."""
        pid, pidfd, gate = self._front(channel, caller, pinned, params, fds)
        self.fronts.add(pid)
        return self._answer(channel, pid, pidfd, gate, caller_releases=True)  # a client of this version

    def _answer(self, channel: Channel, pid: int, pidfd: int, gate: int, *, caller_releases: bool) -> bool:
        """Tell the caller the child's pid, a pidfd of it and its gate
        (``_fork_answered``), which the caller releases once it has read the answer
        (``state.sessions.release``; the compiled client so too). A caller gone by
        then is not answered; one that gave up waiting as the answer landed (a
        Python front's timeout: it starts the run itself) never reads it, and the
        gate closes with its socket. Either way the child, never let go, exits
        without a run: reaped here. A caller that did not ask for the gate (a
        front of an earlier version) is not sent it: the child is let go here once
        the answer is sent."""
        answer: dict = {"pid": pid, "pidfd": 0, **({"gate": 1} if caller_releases else {})}
        try:
            channel.send({"parameters": answer, "continues": True}, [pidfd, gate] if caller_releases else [pidfd])
        except OSError:
            self.children[pid] = None
            os.close(gate)
            return False
        except BaseException:
            os.close(gate)
            raise
        finally:
            os.close(pidfd)
        if caller_releases:
            os.close(gate)  # the caller's copy is the only one now
        else:
            S.release(gate)
        self.children[pid] = channel
        return True

    def _spawn(self, params: dict, fds: list[int]) -> tuple[int, int, int]:
        """Fork the run's corral; (its pid, a pidfd of it, its gate: ``_fork_answered``)."""
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

            ctx.enter(cwd_fd)
            return detached_run(default_mode, run_id, started_fd, argv)

        return _fork_answered(log_fd, (cwd_fd, *([] if started_fd is None else [started_fd])), become)

    def _front(self, channel: Channel, caller: int, pinned: int, params: dict, fds: list[int]) -> tuple[int, int, int]:
        from ..common.errors import UsageError
        from ..common.programs import PROGRAMS
        from ..common.version import __version__
        from ..core.request import Printing, parse_command_line
        from ..kernel.context import cannot_carry, own_place

        def not_served(why: str) -> Exception:  # the client's own corral runs it
            return Refused("NotServed", why)

        if params.get("version") != __version__:
            raise not_served(f"the session's holder is corral {__version__}, the client {params.get('version')}")
        program, argv = params.get("program"), params.get("argv")
        if program not in PROGRAMS or not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ValueError("program or argv")
        if len(fds) != 3:
            raise ValueError("stdin, stdout, stderr")
        self._warm()
        cwd_fd = -1
        try:
            ctx = ProcessContext.of_process(caller)
            cwd_fd = os.open(f"/proc/{caller}/cwd", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            why = cannot_carry(os.getpid(), ctx, own_place(), caller=caller)
            if select.select([pinned], [], [], 0)[0]:  # what was read is of the process that connected
                raise not_served("the client ended")
        except BaseException:
            if cwd_fd >= 0:
                os.close(cwd_fd)
            raise
        try:
            if why is not None:
                raise not_served(f"the session's holder cannot be the client's front: {why}")
            if "CORRAL_RUN_ID" in ctx.env:
                raise not_served("a run inside a corral run: its front stays inside it")
            try:
                request = parse_command_line(argv, default_mode=PROGRAMS[program], environ=ctx.env, cwd=ctx.cwd)
            except Printing:
                raise not_served("help, version and completion are printed by corral itself") from None
            except UsageError as exc:
                raise Refused("UsageError", str(exc)) from None
            except Exception as exc:  # noqa: BLE001  (a line the parser chokes on: the client's corral says it)
                raise not_served(f"the command line could not be read here ({type(exc).__name__})") from None
            if request.background is None or request.yield_after is not None or request.json_fd is not None:
                raise not_served("not a --background command line (or one with --yield or --json-fd)")
            if request.spec.session != self.session_id:
                raise not_served(f"not a run of session {self.session_id}")
            connection = channel.sock.fileno()

            def become() -> int:  # in the child: the client's context and stdio, then corral in its place
                from ..cli import served_front

                ctx.enter(cwd_fd)
                os.dup2(fds[0], 0)
                os.close(fds[0])  # a number of its own: received here, never 0 (the holder's is /dev/null)
                request.below_holder = True  # the run's corral is forked by the front: no Spawn, no second reading
                request.spec.cwd = None  # the caller's directory is this one (its descriptor), not a path to it
                return served_front(request, program, connection)

            return _fork_answered(fds[1], (cwd_fd, fds[0], connection), become, stderr=fds[2])
        finally:
            os.close(cwd_fd)

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
    def keeps(self, pid: int) -> bool:
        """Is ``pid`` (a member's corral, alive) a background run's corral below this
        holder: its child, or the child of a front it forked? The kernel's word (its
        parent), never the caller's. One whose front died before its Join (come to the
        holder) is taken for a foreground run: it keeps the session open, never ends it early."""
        if pid in self.children:
            return True
        info = procfs.read_stat(pid)
        return info is not None and info.ppid in self.fronts

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
            self.fronts.discard(pid)
            if channel is not None:
                code = os.waitstatus_to_exitcode(status)
                try:
                    channel.send({"parameters": {"exit_code": code if code >= 0 else 128 - code}})
                except OSError:
                    pass
                channel.sock.close()

    def sweep(self, corrals: "list[int]", grace: float, bound: float = 10.0) -> list[int]:
        """At the session's end: give the runs' corrals (this holder's children, and
        ``corrals``: pidfds of the others) ``grace`` to finish (their runs are
        stopped: they write their records and exit), then SIGKILL every
        process below the holder (found through the kernel's children lists of
        its own tree, signalled through pidfds) until ``waitpid`` reports no
        child left. That is the proof: the holder is a child subreaper, so
        whatever lives below it is its child or a child's descendant -- however
        it forked, detached or cleared its environment. [] when proven; else
        (after ``bound`` seconds) the pids still below."""
        end = time.monotonic() + grace
        while (self.children or not all(map(exited, corrals))) and time.monotonic() < end:
            self.reap()
            time.sleep(min(0.25, max(0.0, end - time.monotonic())))  # a child's SIGCHLD does not cut it short
        end = time.monotonic() + bound
        while True:
            self.reap()  # every child that has ended, its caller told
            try:
                os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return []
            below = own_descendants()
            if time.monotonic() >= end:
                return below
            for pid in below:
                info = procfs.read_stat(pid)
                if info is not None:
                    signal_process(info, signal.SIGKILL, lambda _current: True)
            time.sleep(0.05)


def _fork_answered(log_fd: int, keep: "tuple[int, ...]", become, stderr: int | None = None) -> tuple[int, int, int]:
    """Fork a call's child (``core.background.fork_run_corral``), held until the call
    is answered: (its pid, a pidfd of it, the write end of its gate, which ``_answer``
    sends the caller to release once it has read the answer). A gate
    closed unreleased -- the holder died first (SIGKILL), or the caller was gone or
    had given up waiting -- makes the child exit at once without a run: a caller
    never answered starts the run another way (its own front), so no run is started twice."""
    from ..core.background import fork_run_corral
    from ..kernel.gate import EXIT_NOT_RELEASED

    gate_r, gate_w = os.pipe2(os.O_CLOEXEC)

    def answered_then_become() -> int:
        told = os.read(gate_r, 1)
        os.close(gate_r)
        if told != b"1":  # not let go: the run is its caller's to start (and say so), or nobody's
            os._exit(EXIT_NOT_RELEASED)
        return become()

    try:
        pid = fork_run_corral(log_fd, (*keep, gate_r), answered_then_become, stderr=stderr)
    except BaseException:
        os.close(gate_w)
        raise
    finally:
        os.close(gate_r)
    try:
        return pid, _pidfd_or_kill(pid), gate_w
    except BaseException:
        os.close(gate_w)
        raise


def _pidfd_or_kill(pid: int) -> int:
    """A pidfd of ``pid``, this holder's unreaped child just forked; if none can be had,
    the child is SIGKILLed and reaped (it has not been answered for: nobody would
    wait for it, and its caller runs it another way) and the OSError raised."""
    try:
        return os.pidfd_open(pid)
    except OSError:
        os.kill(pid, signal.SIGKILL)  # its number cannot have been reused: unreaped
        os.waitpid(pid, 0)
        raise


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
#: supervisor and the in-process engines with what the engine ladder reads
#: (the cgroup tiers' modules, even where it climbs past them); with a
#: manager, the systemd engine too. A module missing here is only imported
#: later, by the child itself (a few ms of the run's start).
WARM_MODULES = (
    "..cli",
    "..core.assemble",
    "..core.background",
    "..core.logkeeper",
    "..core.record_fd",
    "..core.signalwatch",
    "..core.supervisor",
    "..core.runguard",
    "..engines.cgroup_limits",
    "..engines.cgroupv2",
    "..engines.delegated",
    "..engines.unitcgroup",
    "..kernel.cgroupfs",
    "..core.output",
    "..state.journal",
    "threading",
    "..engines.fallback",
    "..engines.fallback_tether",
    "..engines.pidns",
    "..engines.pidns_init",
    "..engines.tether",
    "..kernel.inotify",
    "..kernel.spawn",
    "..kernel.startup",
)
WARM_SYSTEMD = ("..engines.systemd", "..engines.systemd.engine", "..dbus.connection", "..dbus.systemd1")
