"""Reclaiming what a dead corral left: its unit, its cgroup, its marked processes, each
cross-checked against the manager or the kernel before anything is signalled or removed.

About 450 lines, kept together: what proves a unit, a cgroup or a process the run's
(``_Bus.not_corrals``, ``_not_corrals_cgroup``, the run mark) sits beside the stop
targets that act on that proof, so no action can be reached without it (the cgroup's,
``engines.cgroup_target``, is the cgroup engine's tether's too). The stop sequence itself
is shared with the supervisor (``common.stopping``)."""

import os
import signal
import time

from ..common.unit_names import group_name, is_tether, run_of_unit, run_units
from ..engines.cgroup_target import CgroupTarget as _CgroupTarget
from ..engines.kinds import kind_of, leftovers_of
from ..state import registry as REG
from .processes import marked_members
from .ps import cell


# -- reclaiming what a dead corral left -------------------------------------------------
class _Bus:
    """The systemd manager, when one is reachable (for units)."""

    def __init__(self):
        self.manager = None
        self.why = None
        try:
            from .. import dbus
            from ..common.errors import SetupError
            from ..dbus.discovery import connect_manager
            from ..dbus.systemd1 import Manager

            dbus.light_import = True
            try:
                _kind, conn = connect_manager("auto", timeout=5.0)
                self.manager = Manager(conn)
            except SetupError as exc:
                self.why = str(exc)
        except Exception as exc:  # no bus: units are not checked, and we say so
            self.why = f"systemd manager unreachable: {exc}"

    def list_units(self) -> list[tuple[str, str]]:
        return self.manager.list_units(["corral-*"])

    def active_state(self, unit: str) -> str:
        from ..dbus.connection import BusError
        from ..dbus.systemd1 import UNIT

        try:
            return self.manager.get(unit, UNIT, "ActiveState")
        except BusError as exc:
            if exc.name in ("org.freedesktop.systemd1.NoSuchUnit", "org.freedesktop.DBus.Error.UnknownObject"):
                return "gone"
            raise

    def not_corrals(self, unit: str, run_id: str | None = None) -> str | None:
        """Why ``unit`` is not a run unit corral started (for ``run_id``, if given), or None.

        By corral's own marks, never by name alone: named ``corral-<id>.scope``
        or ``.service`` (a run id: hex), bound (BindsTo=) to that run's tether
        scope ``corral-<id>-tether.scope`` or to a library Runner's
        ``corral-runner-<pid>-<hex>-tether.scope``, and described ``corral: ...``.
        A unit that is gone is not corral's to stop either.
        """

        from ..dbus.connection import BusError
        from ..dbus.systemd1 import UNIT

        named = run_of_unit(unit)
        if named is None:
            return "not named like a corral run unit (corral-<run id>.scope/.service)"
        if run_id is not None and named != run_id:
            return f"not this run's unit (corral-{run_id}.*)"
        try:
            bound = list(self.manager.get(unit, UNIT, "BindsTo"))
            description = self.manager.get(unit, UNIT, "Description")
        except BusError as exc:
            return f"cannot read its properties ({exc.name})"
        tethers = [b for b in bound if is_tether(b, named)]
        if not tethers:
            return "not bound to a corral tether (BindsTo=)"
        if not str(description).startswith("corral: "):
            return "its description is not corral's"
        return None

    def tether_alive(self, unit: str) -> bool:
        """Does a live corral own ``unit``? Its tether (the unit it BindsTo=) lives exactly as long as corral."""
        from ..dbus.connection import BusError
        from ..dbus.systemd1 import UNIT

        try:
            bound = self.manager.get(unit, UNIT, "BindsTo")
        except BusError:
            return False
        return any(self.active_state(b) in ("active", "activating", "reloading") for b in bound)


# -- what a dead corral left, as targets of the shared stop sequence ----------------------
class _UnitTarget:
    """A run's unit, signalled through its manager (KillUnit, as the
    supervisor does) and proven stopped by it (inactive, failed or gone):
    a unit's processes are its manager's to list."""

    def __init__(self, bus: _Bus, unit: str):
        self.bus, self.unit = bus, unit
        self._nudged = False

    def _active(self) -> bool:
        return self.bus.active_state(self.unit) not in ("inactive", "failed", "gone")

    def remaining(self) -> list[int]:
        return [-1] if self._active() else []  # not empty, no pid to name

    def _kill(self, sig: int) -> None:
        from ..dbus.connection import BusError

        try:
            self.bus.manager.kill_unit(self.unit, "all", sig)
        except BusError:
            pass  # gone meanwhile: verification says

    def signal_all(self, *sigs: int) -> int:
        for sig in sigs:
            self._kill(sig)
        return 1

    def signal_new(self, *sigs: int) -> int:
        return 0  # KillUnit reached the whole unit

    def kill_all(self) -> None:
        self._kill(signal.SIGKILL)

    def verify_empty(self) -> list[int]:
        if not self._active():
            return []
        if not self._nudged:
            # An emptied scope is stopped once its manager notices; ask now.
            from ..dbus.connection import BusError

            self._nudged = True
            try:
                self.bus.manager.stop_unit_nowait(self.unit)
            except BusError:
                pass
        return [-1]

    def unproven(self) -> str | None:
        return None


def _marked_target(entry: dict):
    """A fallback run's processes once its corral is gone: those that carry
    its mark (``marked_members``), each signalled through a pidfd re-checked
    against that mark and the session it was found in."""
    from ..kernel import procfs
    from ..kernel.pidfd import FoundProcesses

    return FoundProcesses(
        lambda: {p.pid: p for p in marked_members(entry, procfs.scan())},
        lambda found, current: current.sid == found.sid and REG.carries_mark(found.pid, entry),
    )


def _not_corrals_cgroup(cg, run_id: str) -> str | None:
    """Why ``cg`` is not the cgroup corral made for this run (``--cgroup-parent``), or None."""
    from ..kernel import cgroupfs

    if not isinstance(cg, str) or not os.path.isabs(cg) or os.path.normpath(cg) != cg:
        return "not a normalised absolute path"
    if os.path.basename(cg) != group_name(run_id):
        return f"not named corral-{run_id}"
    unified = cgroupfs.Mounts().unified
    if unified is None or not cg.startswith(unified.rstrip("/") + "/"):
        return "not inside the cgroup v2 hierarchy"
    if os.path.realpath(cg) != cg:
        return "reached through a symlink"
    if not os.path.isfile(os.path.join(cg, "cgroup.procs")):
        return "not a control group"
    return None


def stop_target(target, *, grace: float, verify: float, label: str | None, actions: list[str]):
    """Stop ``target`` with the supervisor's own sequence (``stopping``:
    TERM and CONT, the grace period, KILL, verification), listing what was
    sent in ``actions`` ("SIGTERM <label or pids>", "SIGKILL ...")."""
    from ..common.stopping import stop_and_verify

    def step(name: str, pids=(), **_):
        if name in ("term_sent", "kill_sent"):
            sig = "SIGTERM" if name == "term_sent" else "SIGKILL"
            actions.append(f"{sig} {label or ' '.join(str(p) for p in pids)}")

    def wait(seconds: float) -> bool:
        time.sleep(seconds)
        return False

    return stop_and_verify(target, grace=grace, verify_timeout=verify, wait=wait, step=step)


def stop_unit(bus: _Bus, unit: str, *, grace: float = 2.0, verify: float = 3.0, actions: list[str] | None = None):
    """Stop a unit proven corral's (``_Bus.not_corrals``) as ``reclaim`` does."""
    return stop_target(
        _UnitTarget(bus, unit), grace=grace, verify=verify, label=unit, actions=[] if actions is None else actions
    )


def reclaim(directory: str, entry: dict, *, bus: "_Bus | None", dry_run: bool, by: str) -> dict:
    """Stop what a run whose corral is gone left behind, then remove its
    credentials directory.

    The run's unit, its ``--cgroup-parent`` cgroup, or (fallback) the marked
    processes of the sessions its log names: each first proven the run's
    against the manager or the kernel (the entry is a file the run's uid can
    write), then stopped and verified by the supervisor's own sequence
    (``stop_target``). ``dry_run`` lists what would be done, and does none of it.
    """
    events = REG.read_events(directory, entry["run_id"])
    grace = _seconds(entry.get("grace"), 2.0)
    verify = _seconds(entry.get("verify_timeout"), 2.0) + 1.0
    report = {
        "run_id": entry["run_id"],
        "mode": entry.get("mode"),
        "unit": entry.get("unit"),
        "actions": [],
        "verified": True,
        "remaining": [],
        "notes": [],
    }
    target, label = _target(entry, events, bus, report)
    if target is not None:
        if dry_run:
            if left := target.remaining():
                report["actions"].append(f"SIGTERM {label or ' '.join(str(p) for p in left)}")
        else:
            outcome = stop_target(target, grace=grace, verify=verify, label=label, actions=report["actions"])
            report["verified"] = outcome.verified
            report["remaining"] = outcome.remaining
            if outcome.unproven:
                report["notes"].append(outcome.unproven)
    if (kind := kind_of(entry)) is not None and kind.reclaim_note:
        report["notes"].append(kind.reclaim_note)
    creds = entry.get("credentials_directory")
    if creds and isinstance(creds, str) and os.path.lexists(creds):
        from ..state.credentials import removable, remove_tree

        why = removable(creds, entry["run_id"], directory)
        if why is not None:
            report["notes"].append(f"{cell(creds)} left alone: {why}")
        else:
            report["actions"].append(f"remove {creds}")
            if not dry_run:
                remove_tree(creds)
    if not dry_run:
        _record_reclaim(directory, entry, report, by)
    return report


def _target(entry: dict, events: list, bus: "_Bus | None", report: dict):
    """(what to stop, how to name it in actions) for a run's leftovers, or
    (None, None) when there is nothing to stop or it is not proven the
    run's (then the report says why, and is unverified)."""
    unit, leftovers = entry.get("unit"), leftovers_of(entry)
    if unit:
        if bus is None or bus.manager is None:
            report["verified"] = False
            report["notes"].append(bus.why if bus else "no systemd manager")
        elif bus.active_state(unit) in ("inactive", "failed", "gone"):
            pass  # nothing left to stop (asking is harmless, whatever unit the entry names)
        elif (why := bus.not_corrals(unit, entry["run_id"])) is not None:
            report["verified"] = False
            report["notes"].append(f"{cell(unit)} left alone: {why}")
        else:
            return _UnitTarget(bus, unit), unit
    elif leftovers == "cgroup" and entry.get("control_group"):
        cg = entry["control_group"]
        why = _not_corrals_cgroup(cg, entry["run_id"])
        if why is not None:
            report["verified"] = False
            report["notes"].append(f"control group {cell(cg)} left alone: {why}")
        elif os.path.isdir(cg):
            return _CgroupTarget(cg), cg
    elif leftovers == "sessions":
        return _marked_target(entry), None
    return None, None


def _record_reclaim(directory: str, entry: dict, report: dict, by: str) -> None:
    import fcntl

    path = REG.log_path(directory, entry["run_id"])
    log = REG.EventLog(path, entry["run_id"], create=False)
    try:
        fcntl.flock(log.fd, fcntl.LOCK_EX)
        log.seq, log.head = REG.log_tail(path)
        reg = REG.Registration(directory, dict(entry), log)
        reg.event(
            "reclaimed",
            {"by": by, "actions": report["actions"], "verified": report["verified"], "remaining": report["remaining"]},
        )
        reg.save(
            state="finished",
            outcome="reclaimed",
            verified=report["verified"],
            remaining_pids=report["remaining"],
            finished_at=time.time(),
            finished_monotonic=time.monotonic(),
        )
    finally:
        log.close()


def _seconds(value, default: float, cap: float = 600.0) -> float:
    """A duration read from an entry (a file the run's uid can write): a number in [0, cap], else ``default``."""
    return min(float(value), cap) if isinstance(value, (int, float)) and value >= 0 else default


def _leftovers(directory: str, entry: dict, bus: "_Bus | None") -> tuple[str | None, str | None]:
    """(what is still running, the unit it is in) for a run whose entry claims it finished.

    Asked of the kernel and the manager, not the entry: a unit of corral's
    for this run id still active, a corral cgroup still populated, or a
    process carrying the run's mark in a session its log names.
    """
    from ..kernel import cgroupfs, procfs

    run_id = entry["run_id"]
    if bus is not None and bus.manager is not None:
        for unit in run_units(run_id):
            state = bus.active_state(unit)
            if state not in ("inactive", "failed", "gone") and bus.not_corrals(unit, run_id) is None:
                return f"its unit {unit} is {state}", unit
    cg = entry.get("control_group")
    if (
        leftovers_of(entry) == "cgroup"
        and isinstance(cg, str)
        and _not_corrals_cgroup(cg, run_id) is None
        and cgroupfs.populated(cg)
    ):
        return f"its control group {cg} still has processes", None
    members = marked_members(entry, procfs.scan())
    if members:
        return f"processes of the run are alive: {' '.join(str(p.pid) for p in members)}", None
    return None, None


def _signal_owner(entry: dict) -> bool:
    """SIGTERM the run's owner (a corral: it runs its verified stop), through a pidfd, re-verified after opening it."""
    pid = entry["owner"]["pid"]
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return False
    try:
        # The pidfd pins the process: if it is still the verified owner now, it is the one we signal.
        if not REG.owner_verified(entry)[0]:
            return False
        signal.pidfd_send_signal(fd, signal.SIGTERM)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)
