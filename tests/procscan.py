"""Finding a run's processes the way the kernel shows them.

Every test run puts a unique marker in the command's environment; every
process the command starts inherits it. A process is a survivor when its
/proc/PID/environ still carries the marker. Names are never matched.
"""

import os
import signal
import uuid

MARKER_ENV = "CORRAL_TEST_MARKER"


def new_marker() -> str:
    return uuid.uuid4().hex


def marked_pids(marker: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries ``marker``."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and needle in env.split(b"\0"):
            found.append(int(name))
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
