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
forks from worker threads). It is in a session of its own, ignores
terminal signals and holds no descriptor of corral's but its own pidfd.

It is the compiled ``corral-tether`` (``TETHER_PROGRAM``, packaging/tether:
about 1 MiB resident, most of it libc's shared pages, where a fork of corral
is a copy of its interpreter) where the package was built with a C
compiler, spawned (posix_spawn: no fork of a threaded library host); else a
fork of corral (``tether_program``: ``CORRAL_TETHER=python|c``). The
fallback's tether is the same program (``fallback_tether``). ``program``
says which (the record's ``engine.tether_program``: ``tether_facts``).
Either way ``pid`` is corral's child, which the engine moves into the
tether scope; SetupError where ``CORRAL_TETHER`` asks for what cannot be.
"""

import os
import select

from ..kernel.pidfd import kill_and_reap
from .libexec import compiled_helper, libexec_path

#: Where the compiled tether sits (``libexec``): built from packaging/tether/tether.c.
TETHER_PROGRAM = libexec_path("corral-tether")

#: The record's ``engine.tether_program`` for a tether that is a fork of corral.
PYTHON = "python"


def tether_program() -> str | None:
    """The compiled tether's path, or None for the Python one: where it was
    not built (no C compiler), or with ``CORRAL_TETHER=python`` (the tests
    run both; ``=c`` insists on the compiled one: SetupError where it is not)."""
    return compiled_helper(TETHER_PROGRAM, "CORRAL_TETHER", "compiled tether")


def spawn_tether(program: str, args: list[str], done_r: int | None = None) -> int:
    """``program`` (the compiled tether) spawned as corral's child in a session
    of its own with ``args`` after corral's pid, ``done_r`` as its fd 3; its pid.
    The program closes every other descriptor and ignores the terminal signals
    (``kernel.detach.TERMINAL_SIGNALS``) itself."""
    actions = [] if done_r is None else [(os.POSIX_SPAWN_DUP2, done_r, 3)]
    return os.posix_spawn(program, [program, str(os.getpid()), *args], os.environ, file_actions=actions, setsid=True)


def tether_facts(tether) -> dict:
    """The record's word on which tether served (``engine.tether_program``)."""
    return {"tether_program": tether.program}


class Tether:
    def __init__(self):
        program = tether_program()
        self.program = program or PYTHON
        if program is not None:
            self.pid = spawn_tether(program, [])
        else:
            self.pid = _fork_tether()
        self.pidfd = os.pidfd_open(self.pid)

    def close(self) -> None:
        """End the tether (its scope then stops; bound units are already gone)."""
        if self.pidfd is None:
            return
        kill_and_reap(self.pid, self.pidfd)
        self.pidfd = None


def _fork_tether() -> int:
    """The Python tether: a fork of corral (no compiled one), detached
    (``kernel.detach``: its session, terminal signals ignored, no descriptor)."""
    from ..kernel.detach import fork_detached

    parent = os.getpid()
    pid = fork_detached(ignore_terminal_signals=True)
    if pid == 0:  # pragma: no cover  (the tether; tested by killing corral)
        try:
            watch = os.pidfd_open(parent)
            if os.getppid() == parent:  # else the parent died before we watched it
                poller = select.poll()
                poller.register(watch, select.POLLIN)
                while not poller.poll():
                    pass
        finally:
            os._exit(0)
    return pid
