"""Fallback engine: no cgroup, corral as child subreaper.

Guarantees, given that corral runs one run per process (the CLI does):
- every process the command starts stays below corral in the process tree,
  because corral is a child subreaper: an orphan re-parents to corral, not
  to init, however it detaches (setsid, double fork, nohup);
- a process is signalled only through a pidfd opened and re-checked against
  the scan that found it (``kernel.pidfd``), so a recycled pid is never hit;
- corral's children that existed before the run (``foreign``) and their
  subtrees are never touched.
Limits: --mem is watched (sum of resident memory, polled), --pids is not
enforceable. A setuid process may refuse our signals: then the run cannot
be proven stopped (exit 120).

A process is alive while any of its threads is (``procfs.ProcInfo.alive``):
one whose main thread called ``pthread_exit()`` shows ``Z`` in
/proc/PID/stat but is a member to stop, and its memory is counted through
a live thread.
"""

import os
import signal
import time

from ..common.limits import CPU_TIME_INTERVAL, MEM
from ..kernel import procfs
from ..kernel.pidfd import signal_process
from ..kernel.prctl import set_child_subreaper
from .base import Engine, cpu_time_reached, fork_run_command, network_fact
from .fallback_tether import FallbackTether

MEMORY_WATCH_INTERVAL = 0.025


class FallbackEngine(Engine):
    mode = "fallback"
    guarantee = "subreaper"
    marks_processes = True

    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        self._self_pid = os.getpid()
        self._mem_limit = spec.mem
        if spec.mem is not None:
            self.limits_enforced["mem"] = "watch"
        if spec.pids is not None:
            self.limits_enforced["pids"] = "none"
            self.warnings.append("--pids is not enforced in fallback mode (no cgroup)")
        if spec.cpus is not None:
            self.limits_enforced["cpus"] = "none"
            self.warnings.append("--cpus is not enforced in fallback mode (no cgroup)")
        self._cpu_time_limit = spec.cpu_time
        if spec.cpu_time is not None:
            self.limits_enforced["cpu_time"] = "watch"
        self._next_cpu_check = 0.0
        self._cpu = (0, 0)  # (user, system) ns, as last read
        # What corral's reaped children used before the run: not the run's.
        self._reaped_before = _reaped_cpu_nsec()
        set_child_subreaper()
        # If corral dies, the tether stops the run (fallback_tether.py): forked
        # now, before the foreign children are listed, so it is one of them.
        self._tether = FallbackTether(spec.run_id, spec.grace, spec.verify_timeout)
        # Children corral already had are not the run's: never signal them.
        self._foreign = {p.pid for p in procfs.scan().values() if p.ppid == self._self_pid}
        self._signalled: set[tuple[int, int]] = set()
        self._peak_rss = 0
        self._last_infos: list[procfs.ProcInfo] = []
        #: cgroup v1 freezer groups thawed to stop the run (the record's ``thawed``).
        self._thawed: list[str] = []

    def ignore_child(self, pid):
        self._foreign.add(pid)

    def helper_pids(self) -> list[int]:
        return [self._tether.pid]

    # -- start ---------------------------------------------------------
    def start(self, argv, *, stdin, stdout, stderr, env, cwd, survey=None):
        child = fork_run_command(
            self.spec, argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd, gated=False, survey=survey
        )
        child.release()  # raises ExecError (after reaping) if exec failed
        self._child = child
        self.seen.add(child.pid)

    def poll_events(self):
        self._reap_main()

    def _reap_main(self):
        # Read the main process's status but leave it a zombie (WNOWAIT):
        # while it is unreaped its pid, and so its process group id, cannot
        # be reused, which makes signalling that group safe (see signal_all).
        if self._status is None and self._child is not None:
            self._status = self._child.exited(hold=True)

    def _release_main(self):
        """Reap the main process for good (only once the run is proven empty)."""
        if self._child is not None:
            self._child.reap(exited=self._status is not None)

    # -- membership ----------------------------------------------------
    def _members(self) -> list[procfs.ProcInfo]:
        table = procfs.scan()
        main = self.main_pid
        members = [
            p
            for p in procfs.descendants(table, self._self_pid)
            if not self._under_foreign(p, table) and not (p.pid == main and not p.alive)
        ]
        self.seen.update(p.pid for p in members)
        return members

    def _under_foreign(self, info, table) -> bool:
        # Walk up to corral; the process is foreign if the walk passes a
        # foreign child of corral. Bounded by the tree depth.
        while info.ppid != self._self_pid:
            info = table.get(info.ppid)
            if info is None:
                return False
        return info.pid in self._foreign

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
        """The run's CPU time: what corral has reaped of it (it is their
        subreaper: getrusage(RUSAGE_CHILDREN) since the run began), plus each
        process still in /proc, zombies included, with what it has reaped
        itself (utime+cutime, stime+cstime). The rusage is read first: a
        process reaped between the two reads is missed once, never counted
        twice, so a reading errs low."""
        (user_now, system_now), (user_before, system_before) = _reaped_cpu_nsec(), self._reaped_before
        reaped_user, reaped_system = user_now - user_before, system_now - system_before
        user = system = 0
        for info in self._members():
            ticks = procfs.cpu_ticks(info.pid)
            if ticks is not None:
                user, system = user + ticks[0], system + ticks[1]
        tick = 1_000_000_000 // procfs.CLOCK_TICKS
        self._cpu = max(self._cpu, (reaped_user + user * tick, reaped_system + system * tick), key=sum)
        return sum(self._cpu)

    # -- stopping ------------------------------------------------------
    def signal_all(self, *sigs):
        # First the command's process group, in one kill(): the kernel makes
        # a group signal atomic with fork, so a chain of processes that fork
        # and exit at once cannot outrun it. Safe by pid rules: the group id
        # is the main process's pid, which we keep unreaped, and only
        # processes of the command's own session can join that group.
        try:
            members = self._members()
        except OSError:
            # /proc cannot be read (the command took corral's descriptors:
            # prlimit --pid $PPID --nofile=4:4): the command's group at least,
            # which needs no descriptor; the proof will say what is left.
            if self._child is not None and not self._child.reaped:
                for sig in sigs:
                    try:
                        os.killpg(self._child.pid, sig)
                    except ProcessLookupError:
                        pass
            raise
        if os.geteuid() == 0 and members:
            # A process the command froze (cgroup v1 freezer) would act on no
            # signal until thawed: thaw its group, if it holds only the run's.
            from ..kernel.cgroupfs import thaw_v1_frozen

            for group_dir in thaw_v1_frozen([p.pid for p in members], {p.pid for p in members}):
                if group_dir not in self._thawed:
                    self._thawed.append(group_dir)
        group = None
        if self._child is not None and not self._child.reaped:
            try:
                for sig in sigs:
                    os.killpg(self._child.pid, sig)
                group = self._child.pid
            except ProcessLookupError:
                pass
        # Then everything else (other groups, other sessions), one by one;
        # members of the group just signalled are not signalled twice.
        in_group = [p for p in members if p.pgid == group and p.alive]
        self._signalled.update((p.pid, p.starttime) for p in in_group)
        others = [p for p in members if p.pgid != group]
        return len(in_group) + self._signal(others, sigs, {p.pid for p in members})

    def _signal(self, members, sigs, pids) -> int:
        def belongs(current):
            return (current.ppid == self._self_pid and current.pid not in self._foreign) or current.ppid in pids

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

    def kill_all(self):
        self.signal_all(signal.SIGKILL)

    def kill_without_descriptors(self) -> bool:
        # The command's process group: its leader is our unreaped child, so
        # the id is still the run's; kill() needs no descriptor.
        if self._child is None or self._child.reaped:
            return False
        try:
            os.killpg(self._child.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    def reap(self):
        self._reap_main()
        for info in self._members():
            if info.ppid == self._self_pid and not info.alive and info.pid != self.main_pid:
                try:
                    os.waitpid(info.pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def remaining(self):
        self.reap()
        self._last_infos = self._members()
        return [p.pid for p in self._last_infos]

    def signal_new(self, *sigs):
        fresh = [p for p in self._last_infos if (p.pid, p.starttime) not in self._signalled]
        return self._signal(fresh, sigs, {p.pid for p in self._last_infos}) if fresh else 0

    def verify_empty(self):
        left = self.remaining()
        if not left and self._status is not None:
            self._release_main()
        return left

    def close(self):
        self._tether.close()
        if self._child is not None and not self._child.reaped and self._status is not None:
            self._release_main()
        if self._child is not None and self._child.pidfd >= 0:
            os.close(self._child.pidfd)
            self._child.pidfd = -1

    def describe(self):
        info = {"processes_signalled": len(self._signalled), **network_fact(self.spec)}
        if self._thawed:
            info["thawed"] = list(self._thawed)
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
