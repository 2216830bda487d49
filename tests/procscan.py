"""Finding a run's processes the way the kernel shows them.

Every test run puts a unique marker in the command's environment; every
process the command starts inherits it. A process is a survivor when its
environment still carries the marker and any of its threads is alive.
Names are never matched.

A process whose main thread has exited (``pthread_exit()``) while other
threads run shows ``Z`` in /proc/PID/stat and its /proc/PID/environ fails
(ESRCH): it is alive all the same. Its liveness is read from
/proc/PID/task/*/stat and its environment from a live thread's
/proc/PID/task/TID/environ.
"""

import os
import signal
import uuid

MARKER_ENV = "CORRAL_TEST_MARKER"
_DEAD = (b"Z", b"X")


def new_marker() -> str:
    return uuid.uuid4().hex


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _state(stat: bytes | None) -> bytes | None:
    if not stat:
        return None
    return stat.rsplit(b")", 1)[1].split()[0]


def live_tasks(pid: int) -> list[int]:
    """Tids of ``pid``'s thread group that have not exited ([] if it is dead or gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return [int(t) for t in tids if _state(_read(f"/proc/{pid}/task/{t}/stat")) not in (None, *_DEAD)]


def process_environ(pid: int) -> bytes | None:
    """The process's environment; through a live thread if its leader has exited."""
    env = _read(f"/proc/{pid}/environ")
    if env:
        return env
    for tid in live_tasks(pid):
        env = _read(f"/proc/{pid}/task/{tid}/environ")
        if env:
            return env
    return env


def marked_pids(marker: str) -> list[int]:
    """Live processes (any thread not Z/X) whose environment carries ``marker``."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        state = _state(_read(f"/proc/{pid}/stat"))
        if state is None:
            continue
        if state in _DEAD and not live_tasks(pid):
            continue
        env = process_environ(pid)
        if env is not None and needle in env.split(b"\0"):
            found.append(pid)
    return found


def kill_marked(marker: str, rounds: int = 20) -> list[int]:
    """Test cleanup: SIGKILL every process carrying the marker, by pid."""
    killed = []
    for _ in range(rounds):
        pids = marked_pids(marker)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    return killed


def voluntary_wakeups(pid: int) -> int:
    """The times ``pid``'s threads gave up the CPU of their own accord (each a
    wake-up after a wait): what a tick adds to, whatever the machine's load."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            total += next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches:"))
    return total
