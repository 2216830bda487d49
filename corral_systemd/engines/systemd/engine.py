"""The systemd engine: a run is a transient unit, stopped and proven empty.

The flow, as in systemd-run (run.c), each step a method below:

1. connect to the manager (``dbus.discovery``: its private socket where we
   may, as systemctl does, else its bus); on a bus, AddMatch + Subscribe,
   so no JobRemoved / PropertiesChanged is missed;
2. fork the *tether* (a tiny child of corral that dies with corral) and let
   the strategy (``strategy.py``: scope or service, chosen once) prepare
   the command: a scope's is forked and held at a gate;
3. StartTransientUnit: the run unit (``properties.py``: limits, BindsTo+After
   the tether's scope) plus the tether scope as an auxiliary unit, in one call;
4. wait for the start job's JobRemoved (``dbus.jobs``); only then open the
   gate, so nothing the command runs can start outside the unit;
5. watch: the main process (scope: our child, via pidfd; service:
   PropertiesChanged on the unit), the unit's cgroup (``unitcgroup.py``: OOM
   counters, figures);
6. stop: KillUnit(all, SIGTERM+SIGCONT), SIGKILL after grace through
   cgroup.kill where the unified hierarchy offers it, else KillUnit;
7. verify: the kernel reports the unit's cgroup empty and the unit is
   inactive or gone; read results; UnrefUnit; end the tether.

If corral is SIGKILLed, the tether exits (``tether.py``), its scope
empties and stops, and BindsTo= makes the manager stop the run within
TimeoutStopSec (= grace). RuntimeMaxSec is a further backstop.

A library ``Runner`` passes a ``SystemdSession`` (``session.py``): one
manager connection (multiplexed between its concurrent runs) and one
tether, so a run costs one StartTransientUnit and no extra process. The
CLI makes both per run (the tether scope then rides in the same
StartTransientUnit call as an auxiliary unit), and reconnects if its
connection ends mid-run (a manager's daemon-reexec).

This is the one place the manager's word and the kernel's meet; the rest
lives beside it: the connection and its loss (``link.py``), what the manager
said about the unit (``unit_state.py``), its properties, its cgroup
(``unitcgroup.py``), scope vs service, the environment file, the session.
"""

import os
import signal

from ...common.errors import SetupError
from ...common.unit_names import tether_unit, unit_name
from ...dbus.connection import BusError
from ...dbus.discovery import describe_error as _why
from ...dbus.systemd1 import NO_SUCH_UNIT, interface_for, unit_path
from ...kernel import cgroupfs
from ...kernel.pidfd import RunTracker
from ..base import CgroupLimits, Engine, main_rusage, usage_facts
from ..tether import Tether, tether_facts
from ..unitcgroup import UnitCgroup, cgroup_of
from . import properties as P
from .link import RUNTIME_CALL_TIMEOUT, ManagerLink
from .strategy import strategy_for
from .unit_state import UnitState


class SystemdEngine(CgroupLimits, Engine):
    mode = "systemd"
    guarantee = "unit"

    @property
    def kill_method(self) -> str:
        """How SIGKILL is delivered: "cgroup.kill" where writable, else "KillUnit"
        (``CORRAL_KILL_METHOD``, read when used: a session's holder loads this
        module before the run's corral has its caller's environment)."""
        return os.environ.get("CORRAL_KILL_METHOD", "cgroup.kill")

    def __init__(self, spec, session=None, held=None):
        super().__init__()
        self.spec = spec
        #: The command's process when the caller forked it (``kernel.held.HeldProcess``:
        #: the corral service's scopes); the strategy takes it at launch.
        self.held = held
        #: A child subreaper above the command, whose children the run's
        #: orphans become (``RunTracker.sweep``): corral itself for a run of
        #: its own (the CLI), the caller for a held process (the clients set
        #: it); None for a library Runner (its host's children are its own).
        self._subreaper: int | None = None
        #: Its children that are not the run's: the tether, corral's helpers, the main process.
        self._not_orphans: set[int] = set()
        if held is not None:
            self._subreaper = held.parent
        elif session is None:
            from ...kernel.prctl import set_child_subreaper

            set_child_subreaper()
            self._subreaper = os.getpid()
        #: A Runner's SystemdSession, or None for a run of its own (the CLI).
        self.session = session
        self.unit = unit_name(spec.run_id, spec.unit_type)
        self._unit_path = unit_path(self.unit)
        #: The connection to the manager, and its loss and recovery (link.py).
        self.link = ManagerLink(spec, self.unit, self._unit_path, session)
        self.tether_unit = tether_unit(spec.run_id) if session is None else session.tether_unit
        #: Scope or service, decided here once (see strategy.py).
        self.strategy = strategy_for(self)
        self._tether: Tether | None = None  # our own tether (no session)
        #: The tether's slice: the run's own, unless it joins a session's (``join_slice``).
        self._tether_slice = spec.slice
        #: The unit's cgroup, once located (see _locate_cgroup).
        self.cgroup: UnitCgroup | None = None
        self._stopping = False  # corral has signalled the run
        self._exit_sampled = False
        self._started = False
        self._stopped_count = 0
        self._signalled: set[int] = set()
        self._last: list[int] = []
        #: Processes that leave the unit's cgroup (see RunTracker); a scope's
        #: main process is held unreaped until close(), so its session id stays the run's.
        self.tracker = RunTracker()
        #: Escaped pids asked about, and the units the manager said hold them
        #: (not this run's: a hand-off, ``handed_off``).
        self._asked: set[int] = set()
        self._moved_into: dict[int, str] = {}
        self._hold_main = True
        if spec.cpu_time is not None:
            self.limits_enforced["cpu_time"] = "watch"
        self.facts: dict = {
            "manager": self.manager_kind,
            "unit": self.unit,
            "unit_type": spec.unit_type,
            "transport": "private" if self.direct else "bus",
        }
        if spec.properties:
            self.facts["properties"] = list(spec.properties)
        #: The manager's word on the unit: its state, end and figures (the kernel's are the cgroup's).
        self.unit_state = UnitState(self.link, self._unit_path, self.facts, self.warnings)

    # -- 1. connect (link.py) ------------------------------------------
    @property
    def conn(self):
        return self.link.conn

    @property
    def manager(self):
        return self.link.manager

    @property
    def manager_kind(self) -> str:
        return self.link.manager_kind

    @property
    def direct(self) -> bool:
        return self.link.direct

    @property
    def slice_manager(self) -> str:
        return self.manager_kind

    def join_slice(self, name: str, limits: dict) -> None:
        """The session's slice exists (``session start`` made it): the run's unit
        goes there; its tether stays in corral.slice (corral's, not the run's)."""
        self.spec.slice = name
        self._slice_limits = dict(limits)

    #: The limits of the slice the run joined (a session's), held over all its units.
    _slice_limits: dict = {}

    # -- 2-4. start ----------------------------------------------------
    def start(self, argv, *, stdin, stdout, stderr, env, cwd, survey=None):
        spec, strategy = self.spec, self.strategy
        strategy.prepare(argv, env, cwd)  # a service: ExecError (127/126) before anything starts
        aux = []
        if self.session is None:
            self._tether = Tether()
            self.facts.update(tether_facts(self._tether))
            aux = [(self.tether_unit, P.tether_properties(self._tether.pid, self._tether_slice, self.unit))]
        props = P.unit_properties(
            spec,
            argv,
            tether_unit=self.tether_unit,
            add_ref=not self.direct,
            keep_failed=strategy.keep_failed,
        )
        try:
            command_props, fds = strategy.launch(
                argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd, survey=survey
            )
            # None from either: the connection ended and the strategy took over (a service adopted)
            job = self.link.start_unit(props + command_props, aux, fds, self.tether_unit, strategy, self.warnings)
            result = None
            if job is not None:
                result = self.link.wait_started(job, self._handle_signal, strategy, self._count_reconnect)
            if result is not None:
                # The start job is over: the manager has exec'd the command
                # (or given up), and read the environment file for good.
                self.strategy.remove_env_file()
                if result != "done":
                    strategy.start_failed(result)  # SetupError or ExecError, unless the command did run
        except BusError as exc:
            self._abandon()
            raise SetupError(f"StartTransientUnit failed: {_why(exc)}") from None
        except BaseException:
            self._abandon()
            raise
        finally:
            if not self.unit_state.adopted:  # else the manager may not have read it yet: close() removes it
                self.strategy.remove_env_file()
        # From here on the unit exists and (for a service) the command runs:
        # no failure may be reported as "not started" (125) any more.
        self._started = True
        self.conn.timeout = RUNTIME_CALL_TIMEOUT
        self._locate_cgroup()
        strategy.started()  # a scope's gate opens: ExecError propagates, the scope empties and stops
        # Signals that arrived while we waited for replies are queued, and the
        # socket will not poll readable for them: handle them now (a fast
        # service's exit status may be among them).
        self.poll_events()

    def _abandon(self):
        """Undo a start that failed after StartTransientUnit may have been accepted."""
        self.strategy.abandon()
        self._end_tether()

    # -- 5. the unit's cgroup ------------------------------------------
    def _locate_cgroup(self):
        """Find the unit's cgroup, then check limits and arm the OOM watch.

        Without a round trip where the kernel can tell: a scope's is its
        held main process's; a service's is its slice's (known from the
        tether's scope in the same slice) plus its name, which is how
        systemd names it. Else the manager's ControlGroup property.
        """
        mounts = cgroupfs.Mounts() if self.session is None else cgroupfs.Mounts.current()
        cg = self.strategy.cgroup_hint()
        derived = "" if cg else self._cgroup_beside_tether()
        if derived and (UnitCgroup(derived, mounts).exists() or self._ended_per_signals()):
            cg = derived
        elif not cg:
            # A derived path must be seen to exist while the unit runs, or a
            # wrong guess would read as an empty group: ask the manager.
            try:
                cg = self.manager.get(self.unit, interface_for(self.unit), "ControlGroup")
                # "" (or, below, no such unit): the unit has no cgroup any more,
                # it ran and ended, so the derived path's absence is the truth.
                cg = cg or derived
            except BusError as exc:
                if exc.name == NO_SUCH_UNIT:
                    cg = derived  # already ran and was collected (a service exiting at once)
                else:
                    self.warnings.append(f"could not read the unit's cgroup from the manager ({_why(exc)})")
                    cg = ""
        if cg and not cg.endswith("/" + self.unit):
            self.warnings.append(f"ignoring control group {cg!r}: not the unit's")
            cg = ""
        if not cg:
            return
        self.cgroup = group = UnitCgroup(cg, mounts)
        self.facts["control_group"] = cg
        if self.tracker is not None:
            self.tracker.hierarchy = group.tracker_hierarchy
            self.tracker.cgroup = cg
            self._track(group.pids())
        enforced, warnings = group.limits_set(self.spec)
        self.limits_enforced.update(enforced)
        self.warnings += warnings
        # In a session's slice with a memory limit, the kernel's OOM killer may
        # pick this run's processes when the session crosses it: watched too,
        # but an OOM is this run's only where the kernel counts a kill in its group.
        group.arm(oom_eventfd=self._memory_limited, kills_counted_only="mem" in self._slice_limits)

    def _ended_per_signals(self) -> bool:
        """The manager has told us the unit ended (a service that exited at once)."""
        self.poll_events()
        return self.unit_state.ended()

    def _cgroup_beside_tether(self) -> str:
        """The service's cgroup, from the tether scope's when both share a slice."""
        slice_cgroup = None
        if self.session is not None:
            slice_cgroup = self.session.slice_cgroup if self.session.slice == self.spec.slice else None
        elif self._tether_slice == self.spec.slice:
            tether = self._tether
            path = tether and cgroup_of(tether.pid, self.tether_unit)
            slice_cgroup = path.rsplit("/", 1)[0] if path else None
        return f"{slice_cgroup}/{self.unit}" if slice_cgroup else ""

    def _sample_cgroup(self) -> None:
        """Read the kernel's resource figures from the unit's cgroup while it exists."""
        if self.cgroup is not None:
            self.cgroup.sample()

    def _has_group(self) -> bool:
        return self.cgroup is not None

    def _sample_group(self) -> dict:
        self._sample_cgroup()
        return self.cgroup.usage.figures if self.cgroup is not None else {}

    def _oom_notified(self) -> bool:
        return self.cgroup is not None and self.cgroup.oom_notifies()

    # -- 5. watching ---------------------------------------------------
    def priority_fds(self):
        return self.cgroup.priority_fds() if self.cgroup is not None else []

    def wait_fds(self):
        # A dead connection polls readable (EOF) forever: stop watching it.
        fds = [*([] if self.link.dead else [self.conn.fileno()]), *super().wait_fds()]
        if self.cgroup is not None:
            fds += self.cgroup.oom_fds()
        return fds

    def poll_events(self):
        if self.cgroup is not None:
            self.cgroup.read_watches()  # first: the OOM counters before the exit that may follow from them
        # Manager gone (or re-executing): the link is marked dead, _reconnect
        # tries again; if it never comes back, verification tells what we can prove.
        self.link.read_pending()
        while self.conn.signals:
            self._handle_signal(self.conn.signals.popleft())
        if self._status is None and self.unit_state.active in ("inactive", "failed", "deactivating"):
            self.strategy.refresh_status()  # it ended, yet no ExecMain* change reached us: ask
        self._reap_child()
        self._oom_event()
        if self._status is not None and not self._exit_sampled:
            # The main process exited: read what its cgroup says now,
            # before anything is stopped and before the manager removes it.
            self._exit_sampled = True
            if self.cgroup is not None:
                self.cgroup.read_watches()
                self.cgroup.sample()

    def _reconnect(self) -> bool:
        """The CLI's own connection ended while the run lives: connect again
        (``ManagerLink.reconnect``) and read the unit's state back. True once
        connected. A Runner's shared connection is the session's to restore."""
        if not self.link.dead:
            return True
        got = self.link.reconnect(self._pids)
        if got is None:
            return False
        self._count_reconnect()
        self.unit_state.read_back(*got)
        if not self.unit_state.gone:
            self.strategy.refresh_status()
        return True

    def _count_reconnect(self) -> None:
        self.facts["reconnected"] = self.facts.get("reconnected", 0) + 1

    def lost_track(self):
        from_manager = self.strategy.status_from_manager
        if self._child is not None and self._status is None and (why := self._child.lost()) is not None:
            return why  # a caller's held process whose end cannot be known
        if self._status is None and (why := self.unit_state.lost_track()) is not None:
            return why
        # A service's end and exit status come only from the manager: with
        # the connection gone, watching on would wait forever.
        if self.link.dead and self._started and self._status is None and not self._reconnect():
            # (a unit gone is no reason to stop waiting: see UnitState.read_back)
            if self.link.within_window():
                return None  # a re-executing manager comes back: keep watching (the deadline still holds)
        if self.facts.get("reconnected") and self.unit_state.gone and from_manager and self._status is None:
            return (
                f"the systemd manager connection was lost and {self.unit} was collected "
                "before corral reconnected: the service's exit status cannot be known"
            )
        if self.link.dead and self._started and from_manager and self._status is None:
            return f"systemd manager lost ({self.manager.lost}): the service's exit status cannot be known; stopped it"
        return None

    def _handle_signal(self, msg):
        changed = self.unit_state.handle(msg)
        if changed is not None:
            self.strategy.unit_changed(changed)

    def _sigkilled_unprompted(self) -> bool:
        """The main process died of a SIGKILL corral did not send (the OOM killer's signal)."""
        status = self._status
        return (
            status is not None
            and not self._stopping
            and os.WIFSIGNALED(status)
            and os.WTERMSIG(status) == signal.SIGKILL
        )

    def _oom_event(self) -> bool:
        return self.cgroup is not None and self.cgroup.oom_event(self._sigkilled_unprompted())

    @property
    def _memory_limited(self) -> bool:
        return self.spec.mem is not None or "mem" in self._slice_limits

    def oom_killed(self):
        if not self._memory_limited:
            return False
        if self.cgroup is not None and (
            self.cgroup.oom_event(self._sigkilled_unprompted()) or self.cgroup.oom_counted(self._sigkilled_unprompted())
        ):
            return True
        return self.facts.get("unit_result") == "oom-kill"

    def cpu_time_nsec(self):
        """The unit's CPU time: its cgroup's cpu.stat (sampled: CgroupLimits), the manager's figure,
        or the main process's own once it has exited (the larger)."""
        figures = self.cgroup.usage.figures if self.cgroup is not None else {}
        readings = [
            v
            for v in (
                figures.get("cpu_usage_nsec"),
                self.unit_state.figures.get("cpu_usage_nsec"),
                main_rusage(self._child).get("cpu_usage_nsec"),
            )
            if v
        ]
        return max(readings) if readings else None

    # -- 6. stop -------------------------------------------------------
    def _pids(self) -> list[int]:
        return self.cgroup.pids() if self.cgroup is not None else []

    def live_pids(self):
        return self._pids()

    def signal_all(self, *sigs):
        self._stopping = True
        self._sample_cgroup()
        self.unit_state.sample()
        pids = self._pids()
        self.seen.update(pids)
        self._track(pids)
        self._signalled.update(pids)
        self._stopped_count = max(self._stopped_count, len(pids))
        for sig in sigs:
            self._kill_unit(sig)
        return len(pids)

    def _kill_unit(self, sig):
        try:
            self.manager.kill_unit(self.unit, "all", sig)
        except BusError:
            pass  # unit or manager gone: verification decides whether it mattered

    def kill_all(self):
        self._stopping = True
        pids = self._pids()
        self.seen.update(pids)
        self._track(pids)
        if self.tracker is not None:
            self.tracker.kill_escaped()
        self._stopped_count = max(self._stopped_count, len(pids))
        if self.cgroup is None or not self.cgroup.kill(use_cgroup_kill=self.kill_method == "cgroup.kill"):
            self._kill_unit(signal.SIGKILL)

    def signal_new(self, *sigs):
        fresh = [pid for pid in self._last if pid not in self._signalled]
        if not fresh or self.cgroup is None:
            return 0
        done = self.cgroup.signal(fresh, sigs)
        self._signalled.update(fresh)
        return len(done)

    # -- 7. verify -----------------------------------------------------
    def verify_empty(self):
        self.reap()
        if self.cgroup is not None:
            left, v1_only = self.cgroup.remaining()
        elif self._started:
            # No cgroup to ask the kernel about: only a live manager's word
            # that the unit is gone will do.
            if not self._unit_inactive() or self.manager.lost is not None:
                return [-1]
            return []
        else:
            left, v1_only = [], []
        if v1_only and self.tracker is not None and self.tracker.cgroup is not None:
            # Out of the unit in the unified hierarchy, still in it in name=systemd: left it.
            for pid in v1_only:
                if self.tracker.in_group(pid) is False:
                    self.tracker.mark_escaped(pid)
            self._attribute_escapes()
        if left:
            return [p for p in left if p != -1] or left
        # The kernel says empty: the figures are final, and the manager may
        # remove the group any moment now. The unit must also be inactive or gone.
        if self.cgroup is not None:
            self.cgroup.sample_final()
        if not self._unit_inactive():
            self.poll_events()
            if not self._unit_inactive():
                return [-1]
        self.unit_state.sample_final()
        # Whatever of the run still lives is outside the group: find and kill it.
        if self.tracker is not None and (escaped := self._sweep()):
            self._stopped_count = max(self._stopped_count, len(self.tracker.escaped))
            return escaped
        return []

    def _sweep(self) -> list[int]:
        """The tracker's sweep: its sessions are the main process's, pinned
        while it is held unreaped, else known by the run's mark (a service's,
        which the manager reaps; ``ExecMainPID`` is its session id, as the
        manager starts each service in a session of its own); and the
        subreaper's children, the run's orphans."""
        assert self.tracker is not None
        pinned = self._pinned_sessions()
        marked = set(self.strategy.main_sessions()) - set(pinned)
        if self._child is not None and not pinned:
            marked.add(self._child.pid)
        not_orphans = {*self._not_orphans, *([self._child.pid] if self._child is not None else [])}
        if self._tether is not None:
            not_orphans.add(self._tether.pid)
        return self.tracker.sweep(
            pinned,
            still_pinned=self._child.session_pinned if self._child is not None else (lambda: True),
            marked=tuple(marked),
            run_id=self.spec.run_id,
            orphans_of=self._subreaper,
            not_orphans=frozenset(not_orphans),
            # corral's own children are its helpers or the run's; a caller's may be anything of its own
            orphans_marked=self._subreaper != os.getpid(),
            before_kill=self._attribute_escapes,
        )

    def _track(self, pids) -> None:
        super()._track(pids)
        self._attribute_escapes()

    def _attribute_escapes(self) -> None:
        """For each process that left the unit's cgroup alive (the tracker's
        escapers), ask the manager, while it lives, which unit holds it now
        (GetUnitByPID): another unit of the same manager is a hand-off
        (``systemd-run --scope`` inside the run moves itself into a scope of
        its own). systemd 252 records no requester of a unit (a job's
        requester only while the job runs, by bus name): this, the process
        corral had tracked as the run's, is the evidence there is. Asked by
        the process's pidfd where the manager takes one (GetUnitByPIDFD, 253+)."""
        if self.tracker is None or self.manager.lost is not None:
            return
        for pid in self.tracker.new_escapers(self._asked):
            self._asked.add(pid)
            try:
                unit, asked_by = self.manager.unit_of_process(pid, self.tracker.pidfd_of(pid))
            except BusError:
                continue  # not in a unit of this manager (or gone): an escape, not a hand-off to it
            self.unit_state.note_api("unit_lookup", asked_by)
            if unit != self.unit:
                self._moved_into[pid] = unit

    def handed_off(self) -> list[str]:
        return sorted(set(self._moved_into.values()))

    def unproven(self) -> str | None:
        why = super().unproven()
        if why is not None and self._moved_into:
            units = ", ".join(self.handed_off())
            why += (
                f"; the {self.manager_kind} manager holds them in {units} (a hand-off: what it runs is not the run's)"
            )
        return why

    def ignore_child(self, pid: int) -> None:
        self._not_orphans.add(pid)

    def _unit_inactive(self) -> bool:
        return self.unit_state.inactive(
            nudge=lambda: self.strategy.nudge_when_empty and self.cgroup is not None and self._started
        )

    # -- cleanup -------------------------------------------------------
    def _end_tether(self):
        if self._tether is not None:
            self._tether.close()
            self._tether = None

    def close(self):
        if self.held is not None:  # never launched (setup failed first)
            self.held.abandon()
            self.held = None
        if self.link.closed:
            return
        self.unit_state.release(started=self._started, keep_failed=self.strategy.keep_failed)
        self._end_tether()
        if self.tracker is not None:
            self.tracker.close()
        self._release_main()
        self.strategy.close()  # after the held main process is reaped through its pidfd
        if self.cgroup is not None:
            self.cgroup.close()
        self.link.close()

    def delivers_credentials(self) -> bool:
        return self.spec.unit_type == "service"  # LoadCredential=; a scope's command is corral's child

    def registry_facts(self):
        return {"unit": self.unit}

    def describe(self):
        info = dict(self.facts)
        figures = self.cgroup.usage.figures if self.cgroup is not None else {}
        info.update(usage_facts(figures, self.unit_state.figures, main_rusage(self._child)))
        info["accounting_final"] = self.cgroup.final if self.cgroup is not None else None
        info.update(self.strategy.network_fact())
        if self.tracker is not None:
            info.update(self.tracker.facts())
        events = self.cgroup.memory_events() if self.cgroup is not None else None
        if events is not None:
            info["memory_events"] = events
        return info

    @property
    def processes_stopped(self) -> int:
        return self._stopped_count
