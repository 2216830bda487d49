"""The tether: a tiny process that lives exactly as long as corral's process.

Run units are started with ``BindsTo=`` + ``After=`` the tether's scope.
When corral's process dies — however, SIGKILL included — the tether exits,
its scope empties and stops, and the manager stops every unit bound to it
(SIGTERM, then SIGKILL after TimeoutStopSec = grace). systemd itself does
nothing when a D-Bus client disappears (AddRef does not stop a unit), and
RuntimeMaxSec cannot be changed on a running unit, so this is the
systemd-native way to make a run die with its supervisor.

The tether watches a pidfd of its parent *process* (not PR_SET_PDEATHSIG,
which fires when the forking *thread* exits: wrong for a library that
forks from worker threads). It ignores terminal signals and holds no
descriptor of corral's but its own pidfd.
"""

import os
import select
import signal

from ..kernel.pidfd import kill_and_reap

_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP, signal.SIGPIPE)


class Tether:
    def __init__(self):
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                signal.set_wakeup_fd(-1)
                os.setsid()  # terminal signals are for corral, not the tether
                for sig in _IGNORED:
                    signal.signal(sig, signal.SIG_IGN)
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.closerange(3, 65536)
                watch = os.pidfd_open(parent)
                if os.getppid() == parent:  # else the parent died before we watched it
                    poller = select.poll()
                    poller.register(watch, select.POLLIN)
                    while not poller.poll():
                        pass
            finally:
                os._exit(0)
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)

    def close(self) -> None:
        """End the tether (its scope then stops; bound units are already gone)."""
        if self.pidfd is None:
            return
        kill_and_reap(self.pid, self.pidfd)
        self.pidfd = None
