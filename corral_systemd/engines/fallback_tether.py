"""The fallback's tether: when corral dies, its run is stopped all the same.

A systemd run dies with corral through its unit (``tether.py``: the manager
stops what is bound to it). A fallback run has no manager: corral is the
subreaper that finds the run's processes, and once it is SIGKILLed nothing
would stop them. So a fallback run gets a tether of its own: a child of
corral, forked before the command (so the engine counts it foreign), in a
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
"""

import os
import select
import signal
import time

_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP, signal.SIGPIPE)
_DONE = b"d"


class FallbackTether:
    """``target``: what the tether stops when corral dies, made in the tether
    (a ``common.stopping.StopTarget``; default: ``MarkedProcesses(run_id)``);
    the cgroup engine's is its run group (``cgroup_target.CgroupTarget``)."""

    def __init__(self, run_id: str, grace: float, verify_timeout: float, target=None, wall: float | None = None):
        parent = os.getpid()
        done_r, done_w = os.pipe2(os.O_CLOEXEC)
        # When corral is late: its deadline and grace passed, and a second more (a loaded machine).
        deadline = None if wall is None else wall + grace + 1.0
        pid = os.fork()
        if pid == 0:  # pragma: no cover  (the tether; tested by killing corral)
            try:
                target = target or (lambda: MarkedProcesses(run_id))
                _tether(parent, done_r, target, grace, verify_timeout, deadline)
            finally:
                os._exit(0)
        os.close(done_r)
        self.pid = pid
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


def _tether(parent, done_r, target, grace: float, verify_timeout: float, deadline) -> None:  # pragma: no cover
    corral = os.pidfd_open(parent)  # before anything else: its pid is corral's now
    signal.set_wakeup_fd(-1)
    os.setsid()
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.dup2(done_r, 3)
    os.dup2(corral, 4)
    os.closerange(5, 65536)
    corral = 4
    poller = select.poll()
    poller.register(3, select.POLLIN)
    from ..common.stopping import stop_and_verify

    if deadline is not None and not _said_within(poller, deadline):
        # corral is late: stopped by what it runs (a process of its uid), or hung.
        _continue(corral)
        if not _said_within(poller, grace + verify_timeout + 1.0):
            stop_and_verify(target(), grace=grace, verify_timeout=verify_timeout, wait=_sleep)
            _continue(corral)  # nothing of the run is left to stop it again
    while not poller.poll():
        pass
    try:
        said = os.read(3, 1)
    except OSError:
        said = b""
    if said == _DONE:
        return
    # End of file without "done": corral is gone (however it died).
    stop_and_verify(target(), grace=grace, verify_timeout=verify_timeout, wait=_sleep)


def _said_within(poller, seconds: float) -> bool:
    """Did corral write or close the pipe within ``seconds``?"""
    give_up = time.monotonic() + seconds
    while (left := give_up - time.monotonic()) > 0:
        if poller.poll(left * 1000 + 1):
            return True
    return False


def _continue(pidfd: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGCONT)
    except OSError:
        pass


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False


class MarkedProcesses:
    """Every live process carrying ``CORRAL_RUN_ID=<run id>`` in its
    environment (but this one), as a stop target (``common.stopping.StopTarget``)."""

    def __init__(self, run_id: str):
        from ..common.nesting import RUN_ENV

        self._mark = f"{RUN_ENV}={run_id}".encode()
        self._last: dict = {}
        self._signalled: set[int] = set()

    def _carries(self, pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                return self._mark in f.read().split(b"\0")
        except OSError:
            return False

    def remaining(self) -> list[int]:
        from ..kernel import procfs

        me = os.getpid()
        self._last = {p.pid: p for p in procfs.scan().values() if p.alive and p.pid != me and self._carries(p.pid)}
        return list(self._last)

    def _send(self, infos, sigs) -> int:
        from ..kernel.pidfd import signal_process

        sent = 0
        for info in infos:
            self._signalled.add(info.pid)
            for sig in sigs:
                try:
                    sent += signal_process(info, sig, lambda current: self._carries(current.pid))
                except PermissionError:
                    pass
        return sent

    def signal_all(self, *sigs: int) -> int:
        self.remaining()
        return self._send(list(self._last.values()), sigs)

    def signal_new(self, *sigs: int) -> int:
        return self._send([p for pid, p in self._last.items() if pid not in self._signalled], sigs)

    def kill_all(self) -> None:
        self.remaining()
        self._send(list(self._last.values()), (signal.SIGKILL,))

    def verify_empty(self) -> list[int]:
        return self.remaining()

    def unproven(self) -> str | None:
        return None
