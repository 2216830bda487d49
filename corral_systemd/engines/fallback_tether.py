"""The fallback's tether: when corral dies, its run is stopped all the same.

A systemd run dies with corral through its unit (``tether.py``: the manager
stops what is bound to it). A fallback run has no manager: corral is the
subreaper that finds the run's processes, and once it is SIGKILLed nothing
would stop them. So a fallback run gets a tether of its own: a child of
corral, started before the command (so the engine counts it foreign), in a
session of its own (terminal signals are corral's), holding the read end of
a pipe only corral writes to. corral ends the run and writes ``d`` (done):
the tether exits. corral dies without it (SIGKILL, a crash): end of file,
and the tether stops the run itself with the stop sequence
(``common.stopping``: TERM and CONT, the grace period, KILL, verification)
on every process carrying the run's mark, ``CORRAL_RUN_ID=<run id>`` in its
environment (every process the command started inherits it), each
signalled through a pidfd re-checked against that mark: what ``corralctl
stop`` does for a dead corral's fallback run, at once and without a
registry. A process that cleared its environment is beyond its reach, as
it is beyond corralctl's (documented).

It is also the run's deadline's backstop. The command runs as corral's uid
and may SIGSTOP it (``kill -STOP $PPID``): a stopped corral keeps no
deadline and hangs its caller. A run with ``--wall`` tells the tether when
corral must have ended it (``deadline``: the wall, the grace, and a second
more); the tether's one timed wake then finds it late, continues it
(SIGCONT through a pidfd), and, if it has still not said "done" within the
grace, stops the run itself, so nothing of the run is left to stop corral
again, and continues it once more: corral ends the run as at its deadline,
and its record says it was stopped (``SIGCONT`` reaches its signal watch).
Waiting costs nothing: no tick, one timeout.

The waiting is the compiled ``corral-tether`` where it was built
(``tether.tether_program``, packaging/tether/tether.c: about 1 MiB resident
instead of a copy of corral's interpreter): it holds the pipe, corral's
pidfd and the timeout, and continues a late corral; to stop the run it
execs ``tether_stop`` (this module's ``stop_run`` or ``stop_late``, the
same code the Python tether runs), with the pipe at fd 3 and corral's
pidfd at fd 4. Where it was not built (or ``CORRAL_TETHER=python``, or
this process is not ``sys.executable``: an embedding host, no interpreter
to exec the stop with) the tether is a fork of corral that does it all in
Python. Its ``program`` says which (the record's ``engine.tether_program``).
"""

import _signal  # not signal: the same numbers without enum's start-up cost
import os
import select
import sys
import time

from .tether import PYTHON, spawn_tether, tether_program

_DONE = b"d"
#: The compiled tether's descriptors, kept across its exec of the stop: the done pipe, corral's pidfd.
DONE_FD, CORRAL_FD = 3, 4


class FallbackTether:
    """``cgroup``: the run group the tether stops when corral dies (the cgroup
    engine's: ``cgroup_target.CgroupTarget``); else every process carrying the
    run's mark (``MarkedProcesses(run_id)``). SetupError: ``CORRAL_TETHER``
    names no program, or insists on the compiled one where it was not built."""

    def __init__(
        self, run_id: str, grace: float, verify_timeout: float, cgroup: str | None = None, wall: float | None = None
    ):
        target = ("cgroup", cgroup) if cgroup is not None else ("marked", run_id)
        program = tether_program()
        if program is not None and not _is_this_interpreter(sys.executable):
            program = None  # an embedding host's: no interpreter to exec the stop with
        done_r, done_w = os.pipe2(os.O_CLOEXEC)
        # When corral is late: its deadline and grace passed, and a second more (a loaded machine).
        deadline = None if wall is None else wall + grace + 1.0
        resume = grace + verify_timeout + 1.0  # how long a continued corral has to say something
        try:
            if program is not None:
                late = "-" if deadline is None else str(round(deadline * 1000))
                stop = _stop_argv(target, grace, verify_timeout)
                self.pid = spawn_tether(program, [late, str(round(resume * 1000)), *stop], done_r)
            else:
                self.pid = _fork_tether(done_r, target, grace, verify_timeout, deadline, resume)
        except BaseException:
            os.close(done_w)
            raise
        finally:
            os.close(done_r)
        self.program = program or PYTHON
        self._done_w = done_w

    def close(self) -> None:
        """The run ended under corral's own supervision: the tether exits, reaped here."""
        if self._done_w < 0:
            return
        try:
            os.write(self._done_w, _DONE)
        except OSError:
            pass
        os.close(self._done_w)
        self._done_w = -1
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _stop_argv(target: tuple[str, str], grace: float, verify_timeout: float) -> list[str]:
    """How the compiled tether runs the stop (``tether_stop``; it adds the
    phase): this interpreter, isolated and without site (its start is part
    of the grace), with this package's directory on its path."""
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    boot = "import sys; sys.path.insert(0, sys.argv[1]); from corral_systemd.engines.tether_stop import main; main()"
    return [
        sys.executable,
        "-I",
        "-S",
        "-c",
        boot,
        package_parent,
        target[0],
        target[1],
        repr(grace),
        repr(verify_timeout),
    ]


def _is_this_interpreter(path: str) -> bool:
    """``path`` is the program this process runs (the kernel's /proc/self/exe)."""
    try:
        return bool(path) and os.path.samefile(path, "/proc/self/exe")
    except OSError:
        return False


def stop_target(kind: str, what: str):
    """What a tether stops (a ``common.stopping.StopTarget``), made in the tether:
    ``("marked", run id)`` or ``("cgroup", its run group's path)``."""
    if kind == "cgroup":
        from .cgroup_target import CgroupTarget

        return CgroupTarget(what)
    if kind == "marked":
        return MarkedProcesses(what)
    raise ValueError(f"no such tether target: {kind!r}")


def _fork_tether(done_r, target, grace, verify_timeout, deadline, resume) -> int:
    """The Python tether: a fork of corral that waits and stops (no compiled one),
    detached (``kernel.detach``) with the pipe and corral's pidfd, opened here
    (the pid is corral's: it is this process)."""
    from ..kernel.detach import fork_detached

    corral = os.pidfd_open(os.getpid())
    try:
        pid = fork_detached(keep=(done_r, corral), ignore_terminal_signals=True)
        if pid == 0:  # pragma: no cover  (the tether; tested by killing corral)
            try:
                if deadline is not None and not _said_within(done_r, deadline):
                    # corral is late: stopped by what it runs (a process of its uid), or hung.
                    _continue(corral)
                    if not _said_within(done_r, resume):
                        stop_late(target, grace, verify_timeout, done_r, corral)
                        return 0
                if not _done(done_r):
                    stop_run(target, grace, verify_timeout)
            finally:
                os._exit(0)
    finally:
        os.close(corral)
    return pid


def stop_run(target: tuple[str, str], grace: float, verify_timeout: float) -> None:
    """corral is gone (however it died): the stop sequence on what it ran."""
    from ..common.stopping import stop_and_verify

    stop_and_verify(stop_target(*target), grace=grace, verify_timeout=verify_timeout, wait=_sleep)


def stop_late(target: tuple[str, str], grace: float, verify_timeout: float, done: int, corral: int) -> None:
    """corral, continued, still said nothing within the grace: the run is
    stopped in its place, so nothing of it is left to stop corral again, and
    corral (its pidfd ``corral``) continued once more; then as ever: its
    "done" on the pipe ``done``, or the stop again at its end of file."""
    stop_run(target, grace, verify_timeout)
    _continue(corral)
    if not _done(done):
        stop_run(target, grace, verify_timeout)


def _done(done: int) -> bool:
    """Wait for corral's word on the pipe: True for "done", False at its end of file."""
    poller = select.poll()
    poller.register(done, select.POLLIN)
    while not poller.poll():
        pass
    try:
        return os.read(done, 1) == _DONE
    except OSError:
        return False


def _said_within(done: int, seconds: float) -> bool:
    """Did corral write or close the pipe within ``seconds``?"""
    poller = select.poll()
    poller.register(done, select.POLLIN)
    give_up = time.monotonic() + seconds
    while (left := give_up - time.monotonic()) > 0:
        if poller.poll(left * 1000 + 1):
            return True
    return False


def _continue(corral: int) -> None:
    try:
        _signal.pidfd_send_signal(corral, _signal.SIGCONT)
    except OSError:
        pass


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False


def MarkedProcesses(run_id: str):  # noqa: N802 - a stop target's constructor, as it was a class
    """Every live process carrying ``CORRAL_RUN_ID=<run id>`` in its
    environment (but this one), as a stop target (``kernel.pidfd.FoundProcesses``)."""
    from ..common.nesting import RUN_ENV
    from ..kernel import procfs
    from ..kernel.pidfd import FoundProcesses

    mark = f"{RUN_ENV}={run_id}".encode()
    me = os.getpid()

    def carries(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                return mark in f.read().split(b"\0")
        except OSError:
            return False

    return FoundProcesses(
        lambda: {p.pid: p for p in procfs.scan().values() if p.alive and p.pid != me and carries(p.pid)},
        lambda found, current: carries(current.pid),
    )
