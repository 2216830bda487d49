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
"""

import os
import signal

from ..kernel import procfs
from ..kernel.pidfd import signal_process
from ..kernel.prctl import set_child_subreaper
from ..kernel.spawn import fork_command
from .base import Engine

MEMORY_WATCH_INTERVAL = 0.025


class FallbackEngine(Engine):
    mode = "fallback"
    #: Set by ``open_engine`` when auto mode chose this engine: why not systemd.
    auto_fallback_reason: str | None = None

    def __init__(self, spec):
        super().__init__()
        self._self_pid = os.getpid()
        self._mem_limit = spec.mem
        if spec.mem is not None:
            self.limits_enforced["mem"] = "watch"
        if spec.pids is not None:
            self.limits_enforced["pids"] = "none"
            self.warnings.append("--pids is not enforced in fallback mode (no cgroup)")
        set_child_subreaper()
        # Children corral already had are not the run's: never signal them.
        self._foreign = {p.pid for p in procfs.scan().values() if p.ppid == self._self_pid}
        self._child = None
        self._status: int | None = None
        self._signalled: set[tuple[int, int]] = set()
        self._peak_rss = 0

    # -- start ---------------------------------------------------------
    def start(self, argv, *, stdin, stdout, stderr, env, cwd):
        child = fork_command(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd, gated=False)
        child.release()  # raises ExecError (after reaping) if exec failed
        self._child = child
        self.seen.add(child.pid)

    @property
    def main_pid(self):
        return self._child.pid if self._child else None

    def wait_fds(self):
        return [self._child.pidfd] if self._child and self._status is None else []

    def poll_events(self):
        self._reap_main()

    def main_status(self):
        return self._status

    def _reap_main(self):
        if self._status is None and self._child is not None:
            pid, status = os.waitpid(self._child.pid, os.WNOHANG)
            if pid:
                self._status = status

    # -- membership ----------------------------------------------------
    def _members(self) -> list[procfs.ProcInfo]:
        table = procfs.scan()
        members = [
            p for p in procfs.descendants(table, self._self_pid)
            if not self._under_foreign(p, table)
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
        return MEMORY_WATCH_INTERVAL if self._mem_limit is not None else None

    def check_limits(self):
        if self._mem_limit is None:
            return None
        total = sum(procfs.resident_bytes(p.pid) for p in self._members() if p.state != "Z")
        self._peak_rss = max(self._peak_rss, total)
        return "memory" if total > self._mem_limit else None

    # -- stopping ------------------------------------------------------
    def signal_all(self, *sigs):
        members = self._members()
        pids = {p.pid for p in members}

        def belongs(current):
            return (current.ppid == self._self_pid and current.pid not in self._foreign) or current.ppid in pids

        count = 0
        for info in members:
            if info.state == "Z":
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

    def reap(self):
        self._reap_main()
        for info in self._members():
            if info.ppid == self._self_pid and info.state == "Z" and info.pid != self.main_pid:
                try:
                    os.waitpid(info.pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def remaining(self):
        self.reap()
        return [p.pid for p in self._members()]

    def verify_empty(self):
        return self.remaining()

    def close(self):
        if self._child is not None and self._child.pidfd >= 0:
            os.close(self._child.pidfd)
            self._child.pidfd = -1

    def describe(self):
        info = {"processes_signalled": len(self._signalled)}
        if self.auto_fallback_reason:
            info["auto_fallback_reason"] = self.auto_fallback_reason
        if self._mem_limit is not None:
            info["memory_peak_rss"] = self._peak_rss
        return info

    @property
    def processes_stopped(self) -> int:
        return len(self._signalled)
