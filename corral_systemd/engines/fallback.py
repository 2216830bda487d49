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

import _signal  # not signal: the same numbers without enum's start-up cost
import os

from ..kernel import procfs
from ..kernel.prctl import set_child_subreaper
from .base import fork_run_command, network_fact
from .fallback_tether import FallbackTether
from .proctree import ProcessTreeEngine
from .tether import tether_facts


class FallbackEngine(ProcessTreeEngine):
    mode = "fallback"
    guarantee = "subreaper"
    _tier_words = "fallback mode"
    marks_processes = True

    def __init__(self, spec):
        super().__init__(spec)
        self._self_pid = os.getpid()
        set_child_subreaper()
        # If corral dies, the tether stops the run (fallback_tether.py): forked
        # now, before the foreign children are listed, so it is one of them.
        self._tether = FallbackTether(spec.run_id, spec.grace, spec.verify_timeout, wall=spec.wall)
        # Children corral already had are not the run's: never signal them.
        self._foreign = {p.pid for p in self._tree() if p.ppid == self._self_pid}
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
        self._reap_adopted(*self._foreign)  # a SIGCHLD woke the loop: as pid 1, an orphan's end

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
    def _tree(self) -> list[procfs.ProcInfo]:
        """Every process below corral: its subtree as the kernel links it
        (``procfs.subtree``: what corral's tree holds, never all of /proc, so
        its cost grows with the run, not with the machine); a scan of /proc
        where the kernel lists no children. Either is one snapshot: every
        orphan of the run re-parents to corral, so the run is in it."""
        tree = procfs.subtree(self._self_pid)
        return procfs.descendants(procfs.scan(), self._self_pid) if tree is None else tree

    def _members(self) -> list[procfs.ProcInfo]:
        tree = self._tree()
        table = {p.pid: p for p in tree}
        main = self.main_pid
        members = [p for p in tree if not self._under_foreign(p, table) and not (p.pid == main and not p.alive)]
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

    def _reaper_child(self, current) -> bool:
        return current.ppid == self._self_pid and current.pid not in self._foreign

    def kill_all(self):
        self.signal_all(_signal.SIGKILL)

    def kill_without_descriptors(self) -> bool:
        # The command's process group: its leader is our unreaped child, so
        # the id is still the run's; kill() needs no descriptor.
        if self._child is None or self._child.reaped:
            return False
        try:
            os.killpg(self._child.pid, _signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    def reap(self):
        self._reap_main()
        self._reap_adopted(*self._foreign)
        for info in self._members():
            if info.ppid == self._self_pid and not info.alive and info.pid != self.main_pid:
                try:
                    os.waitpid(info.pid, os.WNOHANG)
                except ChildProcessError:
                    pass

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
        info = {**self.tree_facts(), **network_fact(self.spec), **tether_facts(self._tether)}
        if self._thawed:
            info["thawed"] = list(self._thawed)
        return info
