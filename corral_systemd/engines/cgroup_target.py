"""A cgroup engine's run group as a stop target (``common.stopping.StopTarget``), and its removal."""

import _signal  # not signal: the same numbers without enum's start-up cost
import errno
import os


def remove_group(path: str) -> bool:
    """Remove the run group ``path``, and first the groups the command made in
    it (it may write its own group: an empty child left would keep the rmdir
    refused). For a group the kernel shows unpopulated; it refuses to remove
    one with a process in it (False: EBUSY). Gone already: True."""
    for below, dirs, _files in os.walk(path, topdown=False):
        for name in dirs:
            try:
                os.rmdir(os.path.join(below, name))
            except OSError:
                pass  # the rmdir of the group below says what is left
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return False
        raise
    return True


class CgroupTarget:
    """A cgroup engine's run group (``--cgroup-parent``, the cgroup tier), through
    its own reader (``UnitCgroup``): signalled member by member through pidfds
    checked against its listing, killed with cgroup.kill, proven empty by the
    kernel's listing and removed (``remove_group``). corralctl stops a dead
    corral's run with it, and the run's tether when its corral dies."""

    def __init__(self, path: str):
        from .unitcgroup import UnitCgroup

        self.path = path
        self.group = UnitCgroup.v2_directory(path)
        self._last: list[int] = []
        self._signalled: set[int] = set()

    def remaining(self) -> list[int]:
        self._last = self.group.pids()
        return self._last

    def _send(self, pids: list[int], sigs) -> int:
        self._signalled.update(pids)
        return len(self.group.signal(pids, sigs))

    def signal_all(self, *sigs: int) -> int:
        return self._send(self.remaining(), sigs)

    def signal_new(self, *sigs: int) -> int:
        return self._send([p for p in self._last if p not in self._signalled], sigs)

    def kill_all(self) -> None:
        if not self.group.kill(use_cgroup_kill=True):
            self._send(self.remaining(), (_signal.SIGKILL,))  # no cgroup.kill (Linux < 5.14)

    def verify_empty(self) -> list[int]:
        if not os.path.isdir(self.path):
            return []
        if left := self.group.remaining()[0]:
            return left
        return [] if remove_group(self.path) else (self.group.pids() or [-1])

    def unproven(self) -> str | None:
        return None
