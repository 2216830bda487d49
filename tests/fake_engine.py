"""A scripted engine for the supervisor's own tests: no processes, no kernel.

It implements the engine contract (``corral_systemd.engines.base.Engine``)
over a table of pretend processes, each with how it answers signals, so the
supervisor's deadline, stop sequence, verification and exit-code mapping
can be driven in milliseconds, and every signal it sent is on record.
"""

import os
import signal
import threading
import time

from corral_systemd.engines.base import Engine

#: How a pretend process answers SIGTERM.
DIES_ON_TERM = "dies on TERM"
IGNORES_TERM = "ignores TERM"
#: Never dies, not even of SIGKILL (what a process in D state looks like to the stop).
UNKILLABLE = "unkillable"


class FakeEngine(Engine):
    mode = "fake"

    def __init__(self, *, main_exits_after=None, main_status=0, others=None, over_limit_after=None, unproven=None):
        """``main_exits_after``: seconds after start when the main process
        exits with ``main_status`` (None: it runs until signalled, and dies
        on TERM); ``others``: {pid: behaviour} of the run's other processes;
        ``over_limit_after``: seconds after start when check_limits says "mem";
        ``unproven``: what unproven() says once the run is empty."""
        super().__init__()
        self.main_exits_after = main_exits_after
        self.exit_status = main_status << 8
        self.procs = {1000: DIES_ON_TERM, **(others or {})}
        self.over_limit_after = over_limit_after
        self._unproven = unproven
        self.started_at = None
        #: (seconds since start, signal, pids it reached) for every signal sent.
        self.sent: list[tuple[float, int, list[int]]] = []
        self.closed = False
        #: Readable once the main process "exits" on its own (a pidfd's part).
        self._exit_r, self._exit_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._timer = None

    # -- the contract ----------------------------------------------------
    def start(self, argv, **kwargs):
        self.started_at = time.monotonic()
        self.seen.update(self.procs)
        if self.main_exits_after is not None:
            self._timer = threading.Timer(self.main_exits_after, os.write, (self._exit_w, b"x"))
            self._timer.start()

    def wait_fds(self):
        return [self._exit_r] if self._status is None else []

    def _since(self) -> float:
        return time.monotonic() - self.started_at

    def poll_events(self):
        try:
            os.read(self._exit_r, 64)
        except BlockingIOError:
            pass
        self.reap()

    def reap(self):
        if self._status is None and 1000 not in self.procs:
            self._status = self.exit_status
        if self._status is None and self.main_exits_after is not None and self._since() >= self.main_exits_after:
            self.procs.pop(1000, None)
            self._status = self.exit_status

    def watch_interval(self):
        return 0.01 if self.over_limit_after is not None else None

    def check_limits(self):
        if self.over_limit_after is not None and self._since() >= self.over_limit_after:
            return "mem"
        return None

    def live_pids(self):
        return sorted(self.procs)

    def _deliver(self, sig, pids):
        self.sent.append((round(self._since(), 3), sig, sorted(pids)))
        for pid in pids:
            behaviour = self.procs.get(pid)
            if behaviour == UNKILLABLE:
                continue
            if sig == signal.SIGKILL or (sig == signal.SIGTERM and behaviour == DIES_ON_TERM):
                self.procs.pop(pid, None)
                if pid == 1000 and self._status is None:
                    self._status = sig  # killed by the signal
        return len(pids)

    def signal_all(self, *sigs):
        pids = list(self.procs)
        for sig in sigs:
            self._deliver(sig, pids)
        return len(pids)

    def kill_all(self):
        self._deliver(signal.SIGKILL, list(self.procs))

    def verify_empty(self):
        self.reap()
        return sorted(self.procs)

    def unproven(self):
        return self._unproven if not self.procs else None

    def close(self):
        if self._timer is not None:
            self._timer.cancel()
        if not self.closed:
            os.close(self._exit_r)
            os.close(self._exit_w)
        self.closed = True

    # -- for the tests ---------------------------------------------------
    def signals(self) -> list[int]:
        return [sig for _, sig, _ in self.sent]
