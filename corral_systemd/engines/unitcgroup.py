"""A run's control group, as the kernel shows it: the engine's proof.

Shared by the systemd engine (the unit's cgroup) and the ``--cgroup-parent``
engine (the group corral made). The manager says what it did; the kernel
says what is there. Once the engine knows the group's path (``cgroup_of``
for a process in it, the manager's ControlGroup, or the directory corral
created), ``UnitCgroup`` answers from the cgroup files
of every hierarchy that has the group (cgroup v2; in the hybrid layout also
name=systemd and the v1 controllers):

- which processes are in it (``pids``), and whether it is empty
  (``remaining``), which is what verification rests on;
- whether the limits corral asked the manager for were set (``limits_set``);
- whether the kernel OOM-killed in it (``oom_counted``, and the v1 eventfd,
  ``oom_event``), read as it happens: the manager removes the group as soon
  as the unit ends;
- what it used (``sample``: ``cgroupfs.Usage`` keeps the largest readings);
- SIGKILL for all of it (``kill``): cgroup.kill, and a pidfd kill for what
  only name=systemd still lists.

Failure modes: a group that is gone reads as empty and adds no figures;
every file is optional (no controller, no such file: nothing is claimed).
"""

import _signal  # not signal: the same numbers without enum's start-up cost
import os
import time

from ..kernel import cgroupfs
from ..kernel.fsread import read_bytes
from ..kernel.pidfd import signal_cgroup_members
from .cgroup_limits import CgroupLimit, asked

#: How long after a v1 OOM signal, counting kills only, corral looks for the
#: kill in the group's count (``UnitCgroup.oom_notifies``): the kernel signals
#: before it picks and kills a victim, within milliseconds.
OOM_SETTLE = 1.0


def cgroup_of(pid: int, unit: str) -> str:
    """``pid``'s cgroup path as the kernel shows it, if it is ``unit``'s.

    Only a path that ends in the unit's own name is accepted: a stale or
    foreign path (e.g. a v1 hierarchy systemd does not manage, which reads
    "/") must never become the group corral kills.
    """
    try:
        lines = [line.split(":", 2) for line in read_bytes(f"/proc/{pid}/cgroup").decode().splitlines()]
    except OSError:
        return ""
    # The unified line first (the tree systemd tracks processes in), then name=systemd.
    for hierarchy, controllers, path in sorted(lines, key=lambda line: line[0] != "0"):
        if (hierarchy == "0" or "name=systemd" in controllers.split(",")) and path.endswith("/" + unit):
            return path
    return ""


class UnitCgroup:
    """The cgroup ``path`` (as /proc/PID/cgroup shows it) in every mounted hierarchy."""

    def __init__(self, path: str, mounts: cgroupfs.Mounts):
        self.path = path
        self.mounts = mounts
        #: The kernel's resource figures, largest readings kept.
        self.usage = cgroupfs.Usage()
        #: The figures were read after the group emptied: they are the run's
        #: totals, not the last sample before the group went (lower bounds).
        self.final = False
        #: cgroup v2 memory.events and cgroup.events, kept open (see ``arm``).
        self._watches: dict[str, cgroupfs.KeyedWatch] = {}
        self._oom_eventfd: int | None = None
        self._oom_seen = False
        #: An OOM was signalled while the group was there (its victim may be another group's).
        self._oom_signalled = False
        self._oom_signals_after_removal = 0
        self._oom_signalled_at = float("-inf")  # monotonic: the last v1 signal read while the group was there
        self._kills_counted_only = False

    @classmethod
    def v2_directory(cls, directory: str, mounts: cgroupfs.Mounts | None = None) -> "UnitCgroup":
        """The group at ``directory``, an absolute path in the unified
        hierarchy, and only there (a --cgroup-parent run's: no v1 directory is its)."""
        import copy

        mounts = mounts or cgroupfs.Mounts()
        if mounts.unified is None or not directory.startswith(mounts.unified.rstrip("/") + "/"):
            raise ValueError(f"{directory} is not in the unified cgroup hierarchy")
        only_v2 = copy.copy(mounts)
        only_v2.v1 = {}
        return cls(directory[len(mounts.unified.rstrip("/")) :], only_v2)

    def dir(self, hierarchy: str) -> str | None:
        """The group's directory in ``hierarchy`` ("unified", "name=systemd",
        "memory", "pids"...), or None where that hierarchy is not mounted."""
        if hierarchy == "unified":
            return cgroupfs.unified_dir(self.mounts, self.path)
        return cgroupfs.v1_dir(self.mounts, hierarchy, self.path)

    def exists(self) -> bool:
        return any(d is not None and os.path.isdir(d) for d in (self.dir("unified"), self.dir("name=systemd")))

    @property
    def tracker_hierarchy(self) -> str:
        """The /proc/PID/cgroup line that ``pids`` lists: "0" (v2) or "name=systemd"."""
        return "0" if self.mounts.unified is not None else "name=systemd"

    # -- what is in it -------------------------------------------------
    def pids(self) -> list[int]:
        """The processes in the group (and below), from the hierarchy systemd tracks them in."""
        for hierarchy in ("unified", "name=systemd"):
            d = self.dir(hierarchy)
            if d and os.path.isdir(d):
                return cgroupfs.procs_below(d)
        return []

    def remaining(self) -> tuple[list[int], list[int]]:
        """(what the kernel still lists, of those: the pids listed in
        name=systemd only). A populated v2 group whose listing raced empty
        is ``[-1]``: not empty, no pid to name. ``([], [])``: empty."""
        left: list[int] = []
        unified = self.dir("unified")
        if unified and cgroupfs.populated(unified):
            left = cgroupfs.procs_below(unified) or [-1]
        v1_only: list[int] = []
        systemd_v1 = self.dir("name=systemd")
        if systemd_v1 and os.path.isdir(systemd_v1):
            v1 = cgroupfs.procs_below(systemd_v1)
            if v1 and unified and not left:
                v1_only = v1  # out of the unit in the unified hierarchy, still in it in name=systemd
            left = sorted(set(left) | set(v1))
        return left, v1_only

    # -- the limits ----------------------------------------------------
    def limits_set(self, spec) -> tuple[dict[str, str], list[str]]:
        """How each cgroup limit is enforced (``cgroup_limits.py``: "kernel"
        when it reads back as set, in cgroup v2 or v1; else its ``otherwise``)
        and the warnings that go with it."""
        enforced, warnings = {}, []
        for limit, value in asked(spec):
            held = self.holds(limit, value)
            enforced[limit.field] = "kernel" if held else limit.otherwise
            if not held:
                why = f"no {limit.controller} controller for the unit; {limit.otherwise_words}"
                warnings.append(f"{limit.option}: {why}")
        return enforced, warnings

    def holds(self, limit: CgroupLimit, value) -> bool:
        """The kernel holds ``limit`` at ``value`` in this group: in the
        unified hierarchy where the controller is there, else in its v1 one."""
        unified, v1 = self.dir("unified"), self.dir(limit.controller)
        in_v2 = unified is not None and limit.controller in cgroupfs.controllers(unified)
        if limit.read_back == "exact":
            want = limit.expected(value)
            return (in_v2 and cgroupfs.read_int(os.path.join(unified or "", limit.v2_file)) == want) or (
                v1 is not None and cgroupfs.read_int(os.path.join(v1, limit.v1_file)) == want
            )
        try:  # "set": any limit in force ("max" in v2, -1 in v1: none)
            if in_v2:
                with open(os.path.join(unified or "", limit.v2_file)) as f:
                    return f.read().split()[0] != "max"
            if v1 is not None:
                return cgroupfs.read_int(os.path.join(v1, limit.v1_file)) not in (None, -1)
        except (OSError, IndexError):
            pass
        return False

    # -- watching: OOM and the figures ---------------------------------
    def arm(self, *, oom_eventfd: bool, kills_counted_only: bool = False) -> None:
        """Keep the group's cgroup v2 ``memory.events`` and ``cgroup.events``
        open and watched (``cgroupfs.KeyedWatch``, polled for POLLPRI through
        ``priority_fds``), and with ``oom_eventfd`` register a cgroup v1 OOM
        eventfd (``oom_fds``).

        ``kills_counted_only``: the limit that may be crossed is an ancestor's
        (a session's slice), whose OOM fires the eventfd of every group below
        it; an OOM is then this group's only where the kernel counts a kill
        in it (v1 ``oom_control``'s ``oom_kill`` is the group's own), or, once
        the group is gone, where its main process died of a SIGKILL no one sent.

        The manager removes the group as soon as the unit ends, often before
        corral learns that the main process exited (a service's end comes
        from the manager, after its clean-up; systemd 252 gives a scope no
        ``oom-kill`` result): what is not read by then is lost. So the OOM
        counters are re-read on every change of memory.events (the usage
        too, on an OOM event), and the usage is sampled when the group
        empties (cgroup.events); the engine samples it too, at each step
        of the stop and now and then while the run lives (``base.CgroupLimits``).
        """
        self._kills_counted_only = kills_counted_only
        if oom_eventfd:
            self._arm_oom_eventfd()
        unified = self.dir("unified")
        if unified is None:
            return
        for name in ("memory.events", "cgroup.events"):
            try:
                self._watches[name] = cgroupfs.KeyedWatch(os.path.join(unified, name))
            except OSError:
                pass  # no memory controller for the unit, or the group is already gone

    def _arm_oom_eventfd(self) -> None:
        # cgroup v1: an eventfd registered on memory.oom_control fires on OOM
        # even if the cgroup is removed right after, so a fast collection
        # cannot hide an OOM kill from us (see oom_event for its removal signal).
        mem_v1 = self.dir("memory")
        if mem_v1 is None or not os.path.isdir(mem_v1):
            return
        try:
            efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            ofd = os.open(os.path.join(mem_v1, "memory.oom_control"), os.O_RDONLY | os.O_CLOEXEC)
            try:
                with open(os.path.join(mem_v1, "cgroup.event_control"), "w") as f:
                    f.write(f"{efd} {ofd}")
            finally:
                os.close(ofd)
            self._oom_eventfd = efd
        except OSError:
            pass

    def priority_fds(self) -> list[int]:
        return [w.fileno() for w in self._watches.values() if w.alive]

    def oom_notifies(self) -> bool:
        """An OOM kill of the group's processes marks a descriptor of
        ``priority_fds`` or ``oom_fds``: cgroup v2 memory.events (its
        ``oom_kill``), or the v1 eventfd; except, counting kills only, just
        after a v1 signal (``OOM_SETTLE``): it came before the kill, whose
        count no event tells (``oom_event``)."""
        memory = self._watches.get("memory.events")
        if memory is not None and memory.alive:
            return True
        if self._oom_eventfd is None:
            return False
        return not (
            self._kills_counted_only and not self._oom_seen and time.monotonic() - self._oom_signalled_at < OOM_SETTLE
        )

    def oom_fds(self) -> list[int]:
        return [self._oom_eventfd] if self._oom_eventfd is not None else []

    def read_watches(self) -> None:
        """Re-read the watched files (re-arming them); sample the usage on an
        OOM event or when the group has emptied."""
        memory = self._watches.get("memory.events")
        if memory is not None and memory.alive:
            before = (memory.values.get("oom", 0), memory.values.get("oom_kill", 0))
            if memory.read() and (memory.values.get("oom", 0), memory.values.get("oom_kill", 0)) != before:
                self.sample()
        events = self._watches.get("cgroup.events")
        if events is not None and events.alive:
            was = events.values.get("populated")
            if events.read() and events.values.get("populated") == 0 and was != 0:
                self.sample_final()

    def sample(self) -> bool:
        """Read the kernel's resource figures while the group exists (True if it did)."""
        return self.usage.sample(self.dir("unified"), self.dir("memory"), self.dir("pids"))

    def sample_final(self) -> None:
        """Read the figures of a group known to be empty: if it is still
        there to read, they are the totals (``final``)."""
        if self.sample():
            self.final = True

    def oom_event(self, main_sigkilled_unprompted: bool) -> bool:
        """cgroup v1: has the OOM eventfd fired for an OOM?

        The kernel also signals it once when the group is removed (to tell
        listeners the registration is gone; from a work item, so possibly
        later). A signal read while the group is still there is an OOM.
        Once the group is gone: a second signal means one of them was an
        OOM; a single one is an OOM only if the main process was SIGKILLed
        by no one else (the OOM killer's signal: ``main_sigkilled_unprompted``),
        not a removal after a normal end.

        ``kills_counted_only`` (see ``arm``): a signal says only that an OOM
        began at or above the group, before its victim is killed; the group's
        own kill count says whether the victim was its, read at every call
        while the group is there; once it is gone, an OOM signalled and the
        main process SIGKILLed by no one else."""
        there = False
        if self._oom_eventfd is not None:
            try:
                count = os.eventfd_read(self._oom_eventfd)
            except BlockingIOError:
                count = 0
            mem_v1 = self.dir("memory")
            there = mem_v1 is not None and os.path.isdir(mem_v1)
            if count and there:
                self._oom_signalled = True
                self._oom_signalled_at = time.monotonic()
                self._oom_seen = self._oom_seen or not self._kills_counted_only
                self.sample()  # while the group is still there
            elif count:
                self._oom_signals_after_removal += count
            if self._kills_counted_only and there and not self._oom_seen and self._oom_signalled:
                self._oom_seen = self._v1_kills(mem_v1 or "") > 0
        if not self._oom_seen and self._oom_signals_after_removal:
            # Counting kills only, a second signal is no proof (a sibling's OOM signals too).
            several = self._oom_signals_after_removal > 1 and not self._kills_counted_only
            self._oom_seen = several or main_sigkilled_unprompted
        elif not self._oom_seen and self._oom_signalled and self._kills_counted_only and not there:
            self._oom_seen = main_sigkilled_unprompted
        return self._oom_seen

    def oom_counted(self, main_sigkilled_unprompted: bool) -> bool:
        """The kernel's OOM counters say it killed in the group: cgroup v2
        ``oom_kill`` (as last read, read again while the group is there), or
        the group at its limit while the main process died of a SIGKILL no
        one else sent (the kernel's kill, whose count was not read before
        the manager removed the group: the VM lane, under emulation, read
        {max: 1, oom: 0, oom_kill: 0} last); cgroup v1 ``oom_kill``, read
        where no OOM eventfd is armed, or once it fired, or the main process
        died of a SIGKILL no one sent: an armed eventfd that never fired
        says no OOM of the group's memory (its limit or an ancestor's) began,
        and it is asked after every event of the run's (``base.CgroupLimits``)."""
        self.read_watches()
        memory = self._watches.get("memory.events")
        if memory is not None:
            values = memory.values
            if values.get("oom_kill", 0) > 0:
                return True
            if (values.get("oom", 0) > 0 or values.get("max", 0) > 0) and main_sigkilled_unprompted:
                return True
        mem_v1 = self.dir("memory")
        if mem_v1 is None:
            return False
        signalled = self._oom_signalled or self._oom_signals_after_removal > 0 or main_sigkilled_unprompted
        return (self._oom_eventfd is None or signalled) and self._v1_kills(mem_v1) > 0

    @staticmethod
    def _v1_kills(mem_v1: str) -> int:
        """cgroup v1: the kernel's count of OOM kills of this group's own processes."""
        try:
            return cgroupfs.read_keyed(os.path.join(mem_v1, "memory.oom_control")).get("oom_kill", 0)
        except OSError:
            return 0

    def memory_events(self) -> dict | None:
        """memory.events' counters as last read (None where it was never open)."""
        memory = self._watches.get("memory.events")
        if memory is None:
            return None
        return {key: memory.values.get(key, 0) for key in ("max", "oom", "oom_kill")}

    # -- stopping ------------------------------------------------------
    def kill(self, *, use_cgroup_kill: bool) -> bool:
        """SIGKILL what only name=systemd still lists (hybrid layout: a process
        that left the unit's v2 group; cgroup.kill does not reach it), then
        the whole group through cgroup.kill where allowed. True when nothing
        is left for the manager's KillUnit to do (done, or the group is gone)."""
        systemd_v1 = self.dir("name=systemd")
        unified = self.dir("unified")
        if unified is not None and systemd_v1 and os.path.isdir(systemd_v1):
            if pids := cgroupfs.procs_below(systemd_v1):
                signal_cgroup_members(pids, (_signal.SIGKILL,), systemd_v1)
        if unified and not os.path.isdir(unified):
            return True  # the group is gone: nothing left to kill
        self.sample()
        return bool(use_cgroup_kill and unified and cgroupfs.kill(unified))

    def signal(self, pids, sigs) -> list[int]:
        """Signal those of ``pids`` still in the group (pidfd, checked against its listing)."""
        directory = self.dir("unified") or self.dir("name=systemd")
        return signal_cgroup_members(pids, sigs, directory) if directory is not None else []

    def close(self) -> None:
        if self._oom_eventfd is not None:
            os.close(self._oom_eventfd)
            self._oom_eventfd = None
        for watch in self._watches.values():
            watch.close()
