"""The contract between the supervisor and an engine.

An engine owns the run's processes: it starts the command, tells the
supervisor when the main process has exited, signals and kills every
process of the run, and proves (from what the kernel reports) that none is
left. It never prints and never decides exit codes; it raises
``SetupError`` when it cannot do its job at all (the supervisor maps that
to 125) and lets ``ExecError`` from spawning through (126/127).
"""

import os
import time

from ..common.errors import SetupError
from ..common.limits import CPU_TIME, CPU_TIME_INTERVAL, MEM

TYPE_CHECKING = False  # typing is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from typing import Any

    from ..kernel.pidfd import RunTracker


class Engine:
    """What callers ask an engine is this contract, never its ``mode``: an
    engine says what it can do through the capabilities below."""

    #: Its kind (``kinds.KINDS``: "fallback", "systemd", "cgroup", "pidns"), recorded
    #: as the run's mode. Nothing decides by the name: corralctl reads what a
    #: registered run leaves from its kind's declaration, the core this contract.
    mode = "?"
    #: The guarantee tier it gives (``kinds.GUARANTEES``: "unit", "cgroup",
    #: "pidns", "subreaper"), recorded as the run's ``guarantee``.
    guarantee = "?"
    #: The command shares corral's pid namespace, so it can signal corral's own
    #: processes of its uid (its corral, the tether, a session's holder); False
    #: where it runs in a pid namespace of its own (``pidns.PidNamespace``).
    command_reaches_corral = True
    #: Set by ``open_engine`` when auto's ladder took a weaker tier than the
    #: strongest: why each stronger one could not be had (the record's
    #: ``engine.auto_fallback_reason``, the summary line).
    auto_fallback_reason: str | None = None
    #: No cgroup holds the run: once corral is gone, only a mark in the
    #: command's environment (inherited by all it starts) proves a process
    #: the run's to corralctl (``registry.carries_mark``).
    marks_processes = False

    def __init__(self):
        #: Per limit: "kernel" (enforced by the kernel), "watch" (corral
        #: polls usage and stops the run), "none" (not enforced).
        self.limits_enforced: dict[str, str] = {}
        #: Every pid ever seen in the run, for the record.
        self.seen: set[int] = set()
        #: Warnings for the user (the CLI prints them; engines never print).
        self.warnings: list[str] = []

    #: The command's main process when it is our child (``kernel.spawn.Child``),
    #: and its wait status once it has exited.
    _child = None
    _status: int | None = None

    def start(self, argv, *, stdin: int, stdout: int, stderr: int, env, cwd, survey=None) -> None:
        """Start the command; return once it has exec'd. ``survey``: the
        hand-off channels it could reach (``kernel.handoff.Survey``), which a
        sealed run hides (``spec.sealed``; SetupError if that cannot be had)."""
        raise NotImplementedError

    @property
    def slice_manager(self) -> str | None:
        """The manager ("user" or "system") whose slices its runs' units can join
        (a session's: its limits held by the kernel over every run in it;
        ``join_slice``), or None: no unit, no slice."""
        return None

    def join_slice(self, name: str, limits: dict) -> None:
        """Before ``start``: put the run's unit in slice ``name`` of ``slice_manager``,
        whose ``limits`` (``common.limits`` fields) hold over it and its siblings."""
        raise NotImplementedError

    @property
    def main_pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def wait_fds(self) -> list[int]:
        """File descriptors whose readiness for input (POLLIN) means "call ``poll_events()``"."""
        fd = self._child.wait_fd() if self._child is not None and self._status is None else None
        return [] if fd is None else [fd]

    def priority_fds(self) -> list[int]:
        """File descriptors to poll for POLLPRI only (and POLLERR, which poll
        always reports), whose readiness also means "call ``poll_events()``":
        open cgroup notification files (``memory.events``, ``cgroup.events``),
        which the kernel marks POLLPRI|POLLERR on a change. Never poll them
        for input: a cgroup file always polls readable. ``poll_events()``
        re-reads them, which clears the mark, and drops one whose group is
        gone (it would poll ready forever). Asked again before every wait."""
        return []

    def poll_events(self) -> None:
        """Consume whatever made a ``wait_fds()`` or ``priority_fds()`` descriptor ready."""
        self.reap()

    def lost_track(self) -> str | None:
        """Why the engine can no longer tell how the run ends (then the
        supervisor stops it and proves it empty), else None."""
        return None

    def main_status(self) -> int | None:
        """The main process's wait status once it has exited, else None."""
        return self._status

    #: Keep the main process a zombie until ``close()`` (its status is read
    #: with WNOWAIT): while unreaped, its pid, and so the session id it gave
    #: the command, cannot be reused, so the tracker may look for that
    #: session's members at verification (see ``kernel.pidfd.RunTracker``).
    _hold_main = False
    #: The run's processes as pidfds (``kernel.pidfd.RunTracker``), where the engine tracks them.
    tracker: "RunTracker | None" = None

    def _reap_child(self) -> None:
        """The main process's status, once it has exited (``kernel.spawn.Child``
        or ``kernel.held.HeldProcess``: the same protocol)."""
        if self._child is not None and self._status is None:
            self._status = self._child.exited(hold=self._hold_main)

    def _reap_adopted(self, *own: int | None) -> None:
        """As a pid namespace's init (corral as a container's pid 1) corral is every
        orphan's parent there, the run's and a `podman exec`'s alike, and one nobody
        reaps stays a zombie: reap the exited children that are not the main process,
        corral's helpers or ``own`` (whose statuses their owners read)."""
        if os.getpid() != 1:
            return
        from ..kernel.wait import reap_adopted

        reap_adopted({pid for pid in (self.main_pid, *self.helper_pids(), *own) if pid})

    def _release_main(self) -> None:
        """Reap a held main process for good (once the run is over)."""
        if self._child is not None and self._hold_main:
            self._child.reap(exited=self._status is not None)

    def _pinned_sessions(self) -> tuple:
        """Session ids whose number cannot have been reused: the main
        process's (it called setsid), while it is held unreaped."""
        if self._child is not None and self._hold_main and self._child.session_pinned():
            return (self._child.pid,)
        return ()

    def _track(self, pids) -> None:
        """Show the tracker a listing of the run's cgroup just read."""
        if self.tracker is not None:
            self.tracker.observe(pids, self.live_pids)

    def unproven(self) -> str | None:
        """Why the run is not proven gone although its cgroup is empty
        (processes of it that left the group while alive), else None."""
        return self.tracker.unproven() if self.tracker is not None else None

    def handed_off(self) -> list[str]:
        """The units a manager moved processes of the run into (a hand-off
        corral saw happen: the run is then not verified, ``unproven``)."""
        return []

    def watch_interval(self) -> float | None:
        """How often the supervisor must call ``check_limits()`` (None: never)."""
        return None

    def check_limits(self) -> str | None:
        """The field of the limit the run is over (``limits.BY_FIELD``: "mem"), else None."""
        return None

    def oom_killed(self) -> bool:
        """True if the kernel OOM-killed something of the run (kernel limits)."""
        return False

    def cpu_time_nsec(self) -> int | None:
        """The run's CPU time so far (every process, reaped ones included), or None if unknown."""
        return None

    def signal_all(self, *sigs: int) -> int:
        """Send each of ``sigs`` to every live process of the run; return how many."""
        raise NotImplementedError

    def signal_new(self, *sigs: int) -> int:
        """Send ``sigs`` to processes seen by the last ``remaining()`` that
        have not been signalled yet (born during the grace period)."""
        return 0

    def kill_all(self) -> None:
        """SIGKILL every process of the run, by the fastest correct means."""
        raise NotImplementedError

    def reap(self) -> None:
        """Collect exited children so they stop counting as processes."""
        self._reap_child()

    def remaining(self) -> list[int]:
        """Pids of the run still present (cheap; for the stop loop)."""
        self.reap()
        self._last = self.live_pids()
        self.seen.update(self._last)
        self._track(self._last)
        return self._last

    def live_pids(self) -> list[int]:
        """The run's processes, read-only (safe from another thread)."""
        return []

    def processes(self) -> list:
        """The run's live processes as ``kernel.procfs.ProcInfo`` (for observers)."""
        from ..kernel.procfs import read_stat

        return [info for pid in self.remaining() if (info := read_stat(pid)) is not None]

    def verify_empty(self) -> list[int]:
        """Kernel proof that the run is gone: [] if proven, else what remains."""
        raise NotImplementedError

    def ignore_child(self, pid: int) -> None:
        """``pid``, a child of corral that is not part of the run (the
        credentials watcher, forked before or after the engine was opened):
        never signal it, never count it as the run's orphan."""

    def kill_without_descriptors(self) -> bool:
        """SIGKILL what of the run can be reached without opening a
        descriptor (the stop's last resort when the command keeps lowering
        corral's descriptor limit); True if a signal went out."""
        return False

    def helper_pids(self) -> list[int]:
        """corral's own processes beside the run, known before the command
        starts (the fallback's tether): never the run's, for corralctl too
        (the registry entry's ``helper_pids``)."""
        return []

    def delivers_credentials(self) -> bool:
        """The manager makes the run's ``$CREDENTIALS_DIRECTORY`` (a
        service's ``LoadCredential=``, given ``spec.credentials``); else
        corral makes a private one (``state.credentials``)."""
        return False

    def registry_facts(self) -> dict:
        """Where corralctl finds the run later, known before the command
        starts: ``unit`` (a manager's unit) and/or ``control_group``."""
        return {}

    @property
    def processes_stopped(self) -> int:
        """Processes the stop signalled (the record's ``processes_stopped``)."""
        return 0

    def close(self) -> None:
        """Release resources (cgroups, units, fds). Safe to call twice."""

    def describe(self) -> dict:
        """Engine-specific facts for the record (unit, cgroup, resources)."""
        return {}


class CgroupLimits:
    """The limits corral watches for engines with a cgroup (systemd, --cgroup-parent),
    and the group read while the run lives: each on the kernel's word where it
    gives one, on a timer only where it does not.

    Mixed in before ``Engine``; needs ``spec``, ``oom_killed()``,
    ``live_pids()``, ``cpu_time_nsec()`` and ``limits_enforced["mem"]``:

    - ``--mem``: the kernel's (an OOM kill: memory.events marked POLLPRI, or
      the cgroup v1 OOM eventfd: the engine's ``_oom_notified``, checked
      after each of its events), or, where the kernel cannot ("watch") or
      would not tell, corral looks every ``LIMIT_WATCH_INTERVAL``;
    - ``--cpu-time``: the group's ``cpu.stat`` usage, every process of the
      run, exited ones included, read when the limit could first be reached
      (``cpu_time_wait``): a run that sleeps is read rarely;
    - the group's figures and members (``_sample_group``, the tracker), read
      at every event that may be the last chance (the engine's) and, while
      the run lives, ``SAMPLE_FIRST`` after the start and again as long as the
      group is busy (its processes or figures changed, its CPU time grew by
      ``BUSY_CPU`` of a core or more), at waits doubling up to
      ``SAMPLE_LONGEST`` while it idles: a run that sleeps is read rarely. A
      group the manager removes before corral's final read keeps only what
      was read before (the record then says its figures are lower bounds:
      ``accounting_final`` false), and a process that leaves the group
      unseen is beyond the tracker.
    """

    spec: "Any"  # the run's RunSpec (core.spec), set by the engine
    limits_enforced: dict[str, str]  # the engine's (``Engine.__init__``)
    #: How often corral looks for an OOM kill or sums the memory where no kernel event tells.
    LIMIT_WATCH_INTERVAL = 0.025
    #: How soon a living group is read after the start, and after a reading that found it busy (seconds);
    SAMPLE_FIRST = 0.1
    #: the longest wait between two readings while it idles;
    SAMPLE_LONGEST = 5.0
    #: busy: its CPU time grew by this much a second (a share of one core), or anything else changed.
    BUSY_CPU = 0.01
    _next_sample: float | None = None  # monotonic; None: the watch has not begun
    _sample_gap = SAMPLE_FIRST
    _sampled: tuple = (frozenset(), {})  # the last reading: (the group's processes, its figures)
    _next_cpu_check = 0.0  # monotonic: at once, then when the limit could first be reached

    def _has_group(self) -> bool:
        """Is the run's cgroup known (and not yet removed)?"""
        raise NotImplementedError

    def _sample_group(self) -> dict:
        """Read the group's figures now; return them (``cgroupfs.Usage.figures``: the largest readings)."""
        raise NotImplementedError

    def _oom_notified(self) -> bool:
        """An OOM kill in the run's group wakes the supervisor (a kernel event
        among the engine's descriptors), so no timer looks for one."""
        return False

    @property
    def _memory_limited(self) -> bool:
        """A memory limit holds the run: its own --mem (or its session's, ``SystemdEngine``)."""
        return self.spec.mem is not None

    def _memory_polled(self) -> bool:
        """--mem needs a timer: corral sums the memory itself, or no kernel event tells of an OOM kill."""
        if not self._memory_limited:
            return False
        return (self.spec.mem is not None and self.limits_enforced.get("mem") == "watch") or not self._oom_notified()

    def watch_interval(self):
        now = time.monotonic()
        due = []
        if self._has_group():
            if self._next_sample is None:
                self._next_sample = now + self.SAMPLE_FIRST
            due.append(self._next_sample)
        if self._memory_polled():
            due.append(now + self.LIMIT_WATCH_INTERVAL)
        if self.spec.cpu_time is not None:
            due.append(self._next_cpu_check)
        return max(0.0, min(due) - now) if due else None

    def check_limits(self):
        now = time.monotonic()
        sampled = False
        if self._has_group() and self._next_sample is not None and now >= self._next_sample:
            figures = dict(self._sample_group())
            sampled = True
            pids = frozenset(self.live_pids())
            self._track(pids)
            busy = _busy(self._sampled, (pids, figures), self._sample_gap, self.BUSY_CPU)
            self._sampled = (pids, figures)
            self._sample_gap = self.SAMPLE_FIRST if busy else min(2 * self._sample_gap, self.SAMPLE_LONGEST)
            self._next_sample = now + self._sample_gap
        if self._memory_limited:
            if self.oom_killed():
                return MEM.field
            if self.spec.mem is not None and self.limits_enforced.get("mem") == "watch":
                from ..kernel.procfs import resident_bytes

                if sum(resident_bytes(pid) for pid in self.live_pids()) > self.spec.mem:
                    return MEM.field
        if self.spec.cpu_time is not None and now >= self._next_cpu_check:
            if not sampled and self._has_group():
                self._sample_group()
            used = self.cpu_time_nsec()
            if (reached := cpu_time_reached(self.spec.cpu_time, used)) is not None:
                return reached
            self._next_cpu_check = now + cpu_time_wait(self.spec.cpu_time, used)
        return None


def _busy(before: tuple, after: tuple, seconds: float, busy_cpu: float) -> bool:
    """Two readings of a group, ``seconds`` apart, each (its processes, its
    figures): did anything change but its CPU time, or did that grow by
    ``busy_cpu`` of a core or more?"""
    (pids_before, figures_before), (pids_after, figures_after) = before, after
    cpu = "cpu_usage_nsec"
    grew = figures_after.get(cpu, 0) - figures_before.get(cpu, 0)
    rest = {k: v for k, v in figures_after.items() if not k.startswith("cpu_")}
    rest_before = {k: v for k, v in figures_before.items() if not k.startswith("cpu_")}
    return pids_after != pids_before or rest != rest_before or grew >= busy_cpu * seconds * 1e9


def cpu_time_reached(limit: float, used_nsec: int | None) -> str | None:
    """``"cpu_time"`` once the run's CPU time (ns) has reached ``--cpu-time`` (seconds)."""
    return CPU_TIME.field if used_nsec is not None and used_nsec >= limit * 1e9 else None


def cpu_time_wait(limit: float, used_nsec: int | None) -> float:
    """Seconds the run's CPU time cannot reach ``limit`` (``--cpu-time``, s)
    from ``used_nsec`` (None: nothing read yet, taken as none used): it grows
    at most one second a second per CPU of the machine. Never less than
    ``CPU_TIME_INTERVAL``, so a limit is seen at most that late (times the
    CPUs the run keeps busy, in CPU time), as with a fixed tick of it."""
    left = limit - (used_nsec or 0) / 1e9
    return max(CPU_TIME_INTERVAL, left / (os.cpu_count() or 1))


def fork_run_command(spec, argv, *, stdin, stdout, stderr, env, cwd, gated: bool, survey=None):
    """``kernel.spawn.fork_command`` with what the spec asks of the child:
    a sealed run (``--network none``, ``--handoff deny``: ``seal_for``), a
    terminal (``--pty``)."""
    from ..kernel.spawn import fork_command

    return fork_command(
        argv,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        env=env,
        cwd=cwd,
        gated=gated,
        seal=seal_for(spec, survey),
        controlling_tty=spec.pty,
        umask=spec.umask,
    )


def seal_for(spec, survey):
    """The ``kernel.seal.Seal`` a forked child makes for a sealed run (None:
    not sealed), hiding what ``survey`` (``kernel.handoff.survey``) found.
    SetupError if no mount can hide a channel (a bus on an abstract socket
    or TCP) and the network is not cut."""
    if not spec.sealed:
        return None
    refuse_unmaskable(spec, survey)
    from ..kernel.seal import Seal

    return Seal(survey.masks if survey is not None else [], network=spec.network == "none")


def refuse_unmaskable(spec, survey) -> None:
    """SetupError for --handoff deny (without --network none) when a bus
    address names what only a network namespace of its own cuts."""
    if spec.network != "none" and survey is not None and survey.unmaskable:
        raise SetupError(
            f"--handoff deny: not in place ({', '.join(survey.unmaskable)} cannot be hidden by a mount; "
            "add --network none); the command never ran"
        )


def network_fact(spec) -> dict:
    """The record's ``network``: how ``--network none`` was put in place by
    a forked child (``kernel.seal``); nothing for the host's network."""
    if spec.network != "none":
        return {}
    from ..kernel.seal import HOW

    return {"network": HOW}


def usage_facts(cgroup: dict, manager: dict | None = None, rusage: dict | None = None) -> dict:
    """The record's resource figures (``cgroupfs.Usage`` names): read from
    the run's cgroup, reported by the manager (which reads the same kernel
    files, and keeps its last reading once the group is gone), or the main
    process's own CPU time as its waiter read it (``rusage``: the kernel's
    getrusage of the zombie, it and what it waited for, final to the
    microsecond: a floor when the group went before its last reading).
    Each figure only grows, so the larger reading wins (the cgroup's on a
    tie); ``accounting_source`` says whose readings were used: "cgroup",
    "manager", "rusage" joined by "+", or None when there are none."""
    facts = dict(cgroup)
    used = {"cgroup"} if cgroup else set()
    for source, figures in (("manager", manager), ("rusage", rusage)):
        for name, value in (figures or {}).items():
            if value > facts.get(name, -1):
                facts[name] = value
                used.add(source)
    if "cgroup" in used and not any(facts[name] == value for name, value in cgroup.items()):
        used.discard("cgroup")
    facts["accounting_source"] = "+".join(s for s in ("cgroup", "manager", "rusage") if s in used) or None
    return facts


def main_rusage(child) -> dict:
    """The main process's CPU figures as its waiter read them (``Child.usage``,
    ``HeldProcess.usage``), for ``usage_facts``; {} when unknown."""
    usage = getattr(child, "usage", None) if child is not None else None
    if not usage or usage[0] is None or usage[1] is None:
        return {}
    user, system = usage
    return {"cpu_usage_nsec": user + system, "cpu_user_nsec": user, "cpu_system_nsec": system}
