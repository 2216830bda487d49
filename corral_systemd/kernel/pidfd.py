"""Signalling processes that are not our children, without pid-reuse races.

A pid from a /proc scan may be recycled by the time we signal it. We open a
pidfd first (which pins that exact process), then re-read its stat: if the
start time still matches the scan and the caller's membership test still
holds, the pidfd is known to name the process we meant, and only then is
the signal sent through it.
"""

import os
import signal
from typing import Callable

from .procfs import ProcInfo, read_stat


def signal_process(info: ProcInfo, sig: int, belongs: Callable[[ProcInfo], bool]) -> bool:
    """Send ``sig`` to the process ``info`` describes, if it is still that process.

    Returns True when the signal was delivered, False when the process is
    gone or no longer belongs. PermissionError propagates: a process we may
    not signal is one we cannot prove stopped.
    """
    try:
        fd = os.pidfd_open(info.pid)
    except ProcessLookupError:
        return False
    try:
        current = read_stat(info.pid)
        if current is None or current.starttime != info.starttime or not belongs(current):
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


def kill_and_reap(pid: int, pidfd: int) -> None:
    """SIGKILL our child ``pid`` through its pidfd, reap it, close the pidfd."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
    os.close(pidfd)


def signal_cgroup_members(pids, sigs, directory: str) -> list[int]:
    """Signal each pid that is (still) in the cgroup at ``directory``.

    The pidfd is opened first; if the pid is then listed in the group's
    cgroup.procs, the pidfd names a process of the group, not a recycled
    pid. Returns the pids signalled.
    """
    from .cgroupfs import procs_below

    done = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            if pid not in procs_below(directory):
                continue
            for sig in sigs:
                signal.pidfd_send_signal(fd, sig)
            done.append(pid)
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)
    return done
