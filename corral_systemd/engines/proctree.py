"""A run held as a process tree, without a cgroup: what the subreaper tier
(``fallback.py``) and the PID namespace tier (``pidns.py``) share.

The run's members are the live descendants of one process that reaps
every orphan among them (corral as child subreaper; the namespace's init,
its pid 1), read from /proc (``_members``, the engine's). On that:

- ``--mem`` is watched: the sum of the members' resident memory, every
  ``MEMORY_WATCH_INTERVAL``; its largest sample is the record's ``memory_peak``;
- ``--cpu-time`` is watched: what the reaper has reaped of the run plus each
  member's own figures (``cpu_time_nsec``), every ``CPU_TIME_INTERVAL``;
- ``--pids`` and ``--cpus`` are not enforced (no cgroup), said in the
  warnings and ``limits_enforced``;
- a member is signalled only through a pidfd re-checked against the scan
  that found it (``kernel.pidfd.signal_process``): its start time, and its
  parent still the reaper or a member, so a recycled pid is never hit.
"""

import time

from ..common.limits import CPU_TIME_INTERVAL, MEM
from ..kernel import procfs
from ..kernel.pidfd import signal_process
from .base import Engine, cpu_time_reached

MEMORY_WATCH_INTERVAL = 0.025


class ProcessTreeEngine(Engine):
    #: How the warnings name the tier ("fallback mode", "the pid namespace tier").
    _tier_words = "?"

    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        self._mem_limit = spec.mem
        if spec.mem is not None:
            self.limits_enforced["mem"] = "watch"
        if spec.pids is not None:
            self.limits_enforced["pids"] = "none"
            self.warnings.append(f"--pids is not enforced in {self._tier_words} (no cgroup)")
        if spec.cpus is not None:
            self.limits_enforced["cpus"] = "none"
            self.warnings.append(f"--cpus is not enforced in {self._tier_words} (no cgroup)")
        self._cpu_time_limit = spec.cpu_time
        if spec.cpu_time is not None:
            self.limits_enforced["cpu_time"] = "watch"
        self._next_cpu_check = 0.0
        self._cpu = (0, 0)  # (user, system) ns, as last read
        # What corral's reaped children used before the run: not the run's.
        self._reaped_before = _reaped_cpu_nsec()
        self._signalled: set[tuple[int, int]] = set()
        self._peak_rss = 0
        self._last_infos: list[procfs.ProcInfo] = []

    # -- what the engine says -------------------------------------------
    def _members(self) -> list[procfs.ProcInfo]:
        """The run's processes now (one reading of /proc: the tree, or a scan), added to ``seen``."""
        raise NotImplementedError

    def _reaper_child(self, current: procfs.ProcInfo) -> bool:
        """Is ``current`` (just re-read) a child of the run's reaper that belongs to the run?"""
        raise NotImplementedError

    def _reaper_cpu_ticks(self) -> tuple[int, int]:
        """(user, system) clock ticks of what the run's reaper reaped, when it is
        not corral (whose reaped children ``getrusage`` counts); else (0, 0)."""
        return (0, 0)

    # -- limits --------------------------------------------------------
    def watch_interval(self):
        intervals = [MEMORY_WATCH_INTERVAL] if self._mem_limit is not None else []
        if self._cpu_time_limit is not None:
            intervals.append(CPU_TIME_INTERVAL)
        return min(intervals) if intervals else None

    def check_limits(self):
        if self._mem_limit is not None:
            total = sum(procfs.resident_bytes(p.pid) for p in self._members() if p.alive)
            self._peak_rss = max(self._peak_rss, total)
            if total > self._mem_limit:
                return MEM.field
        if self._cpu_time_limit is not None and time.monotonic() >= self._next_cpu_check:
            self._next_cpu_check = time.monotonic() + CPU_TIME_INTERVAL
            return cpu_time_reached(self._cpu_time_limit, self.cpu_time_nsec())
        return None

    def cpu_time_nsec(self) -> int:
        """The run's CPU time: what corral has reaped of it (getrusage(RUSAGE_CHILDREN)
        since the run began), what the run's own reaper reaped (``_reaper_cpu_ticks``),
        plus each process still in /proc, zombies included, with what it has reaped
        itself (utime+cutime, stime+cstime). The rusage is read first: a
        process reaped between the two reads is missed once, never counted
        twice, so a reading errs low."""
        (user_now, system_now), (user_before, system_before) = _reaped_cpu_nsec(), self._reaped_before
        reaped_user, reaped_system = user_now - user_before, system_now - system_before
        user, system = self._reaper_cpu_ticks()
        for info in self._members():
            ticks = procfs.cpu_ticks(info.pid)
            if ticks is not None:
                user, system = user + ticks[0], system + ticks[1]
        tick = 1_000_000_000 // procfs.CLOCK_TICKS
        self._cpu = max(self._cpu, (reaped_user + user * tick, reaped_system + system * tick), key=sum)
        return sum(self._cpu)

    # -- stopping ------------------------------------------------------
    def _signal(self, members, sigs, pids) -> int:
        """Signal each live member through a pidfd re-checked against the scan (``pids``: its members)."""

        def belongs(current):
            return self._reaper_child(current) or current.ppid in pids

        count = 0
        for info in members:
            if not info.alive:
                continue
            delivered = False
            for sig in sigs:
                delivered = signal_process(info, sig, belongs) or delivered
            if delivered:
                count += 1
                self._signalled.add((info.pid, info.starttime))
        return count

    def remaining(self):
        self.reap()
        self._last_infos = self._members()
        return [p.pid for p in self._last_infos]

    def signal_new(self, *sigs):
        fresh = [p for p in self._last_infos if (p.pid, p.starttime) not in self._signalled]
        return self._signal(fresh, sigs, {p.pid for p in self._last_infos}) if fresh else 0

    def tree_facts(self) -> dict:
        """The record's figures of a process-tree run (``describe``)."""
        info: dict = {"processes_signalled": len(self._signalled)}
        self.cpu_time_nsec()
        info["cpu_usage_nsec"] = sum(self._cpu)
        info["cpu_user_nsec"], info["cpu_system_nsec"] = self._cpu
        info["accounting_source"] = "procfs"
        if self._mem_limit is not None:
            # No cgroup: the largest sum of the run's resident set sizes that
            # the --mem watch sampled (a lower bound of memory.peak's figure).
            info["memory_peak"] = self._peak_rss
        return info

    @property
    def processes_stopped(self) -> int:
        return len(self._signalled)


def _reaped_cpu_nsec() -> tuple[int, int]:
    """(user, system) CPU time of this process's reaped children, in ns."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(usage.ru_utime * 1e9), round(usage.ru_stime * 1e9)
