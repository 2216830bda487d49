"""A session in a systemd manager: its slice and its holder unit.

    corral.slice
    ├─ corral-session_<id>.slice      the session: its runs' units go here, under its
    │                                 aggregate limits (MemoryMax, TasksMax, CPUQuota)
    └─ corral-session_<id>.service    its holder (``ctl/session_holder.py``), run by the
                                      manager: no process of the caller's holds the session

``SessionSlice`` is the manager's side of a session for whoever needs it:
``corralctl session start`` makes both units (``create``), the holder stops
the slice when the session ends, and ``session end`` / ``gc`` do the same
when the holder is gone (``stop``). Stopping a slice stops every unit in it
(they require it); what proves the session's processes gone is the kernel:
the slice's cgroup, read in every hierarchy, lists no process (``remaining``).

Failure modes: ``SetupError`` with one line when the manager cannot be
reached or refuses a unit; a slice whose limits the kernel does not hold
(no controller: the unified harness layout) is made all the same and
``create`` says which limits are not enforced.
"""

import os
import time

from ...common.errors import SetupError
from ...common.unit_names import DEFAULT_SLICE, session_holder_unit, session_slice

#: How long ``stop`` waits for the manager to stop the slice's units.
STOP_TIMEOUT = 30.0


class SessionSlice:
    def __init__(self, session_id: str, manager: str = "auto"):
        from ... import dbus

        dbus.light_import = True  # corralctl's and the holder's own process: see dbus/_dbus_fast.py
        from ...dbus.discovery import connect_manager
        from ...dbus.systemd1 import Manager

        self.session_id = session_id
        self.slice = session_slice(session_id)
        self.holder_unit = session_holder_unit(session_id)
        #: "user" or "system": the manager that has the session's units.
        self.kind, self.conn = connect_manager(manager, timeout=5.0)
        self.manager = Manager(self.conn)

    def close(self) -> None:
        self.conn.close()

    # -- session start ----------------------------------------------------------------------
    def make_slice(self, limits: dict) -> tuple[dict, list[str]]:
        """Make the slice with ``limits`` (``common.limits`` fields). Returns how
        the kernel holds each ("kernel", or the limit's ``otherwise``) and the
        warnings that say which it does not."""
        from ...common.limits import BY_FIELD
        from ...dbus.systemd1 import prop as _prop
        from . import properties as P

        said = ", ".join(f"{BY_FIELD[k].option} {BY_FIELD[k].show(v)}" for k, v in limits.items()) or "no limits"
        self._start(
            self.slice,
            [
                _prop("Description", "s", f"corral session {self.session_id} ({said})"),
                _prop("MemoryAccounting", "b", True),
                _prop("TasksAccounting", "b", True),
                *P.slice_limit_properties(limits),
            ],
        )
        if not limits:
            return {}, []
        from ..cgroup_limits import CGROUP_LIMITS

        group = self.cgroup()
        enforced, warnings = {}, []
        for limit in CGROUP_LIMITS:
            if limit.field in limits:
                held = group is not None and group.holds(limit, limits[limit.field])
                # Nothing watches a session's total: where the kernel does not hold it, nothing does.
                enforced[limit.field] = "kernel" if held else "none"
                if not held:
                    why = f"no {limit.controller} controller for the session's slice; not enforced"
                    warnings.append(f"{limit.option}: {why}")
        return enforced, warnings

    def start_holder(self, argv: list[str], env: dict) -> None:
        """Start the holder unit, running ``argv`` with ``env`` and, where the
        manager can give them, the caller's rlimits, nice and OOM score
        (``caller_context``), so that giving them to the session's background
        runs (the holder's children, ``kernel.context``) needs no privilege. A
        manager that cannot (a user manager, below the caller's hard limits)
        starts it with its own instead: those runs are then started by their
        callers (``core/background.py`` says so)."""
        from ...dbus.systemd1 import prop as _prop

        props = [
            _prop("Description", "s", f"corral session {self.session_id}: its holder"),
            # Beside the session's slice, not in it: the holder's own memory and
            # tasks do not count against the session, and stopping the slice
            # does not stop the holder that is proving it empty.
            _prop("Slice", "s", DEFAULT_SLICE),
            _prop("ExecStart", "a(sasb)", [(argv[0], argv, False)]),
            _prop("Type", "s", "exec"),
            _prop("Environment", "as", [f"{k}={v}" for k, v in sorted(env.items())]),
            _prop("WorkingDirectory", "s", "/"),
            # Killed (SIGKILL included), the holder comes back and takes the
            # session up again; the processes it started (background runs'
            # corrals) stay where they are (KillMode=process).
            _prop("Restart", "s", "on-failure"),
            _prop("RestartUSec", "t", 200_000),
            # Stopped (SIGSTOP) by a run of its uid, it would end nothing (its owner's
            # exit, its idle timeout): the manager's watchdog kills it and starts it again.
            _prop("NotifyAccess", "s", "main"),
            _prop("WatchdogUSec", "t", round(holder_watchdog() * 1e6)),
            _prop("WatchdogSignal", "i", 9),  # SIGKILL: a stopped holder handles nothing
            _prop("KillMode", "s", "process"),
            _prop("CollectMode", "s", "inactive-or-failed"),
        ]
        try:
            self._start(self.holder_unit, props + caller_context(), keep_slice=True)
        except SetupError:
            self._start(self.holder_unit, props)

    def _start(self, unit: str, props: list, keep_slice: bool = False) -> None:
        """Start ``unit`` and wait for its start job (a service's: the holder exec'd);
        SetupError (both units stopped, or with ``keep_slice`` only ``unit``) if it fails."""
        from ...dbus.connection import BusError
        from ...dbus.discovery import describe_error
        from ...dbus.jobs import subscribe, wait_job

        try:
            subscribe(self.conn, self.manager)
            job = self.manager.start_transient_unit(unit, props)
            result = wait_job(self.conn, job, what=unit)
        except (BusError, SetupError) as exc:
            self.abandon(*([unit] if keep_slice else []))
            why = describe_error(exc) if isinstance(exc, BusError) else str(exc)
            raise SetupError(f"the {self.kind} manager refused {unit}: {why}") from None
        if result != "done":
            self.abandon(*([unit] if keep_slice else []))
            raise SetupError(f"the {self.kind} manager could not start {unit}: {result}")

    def abandon(self, *units: str) -> None:
        """Undo a start that went wrong: stop ``units`` (default: both; what is
        not there is not stopped), and forget a failed one (its name is free again)."""
        for unit in units or (self.holder_unit, self.slice):
            for call in (self.manager.stop_unit, self.manager.reset_failed_unit):
                try:
                    call(unit)
                except Exception:
                    pass

    # -- the slice's processes --------------------------------------------------------------
    def cgroup(self):
        """The slice's cgroup (``UnitCgroup``): where the manager says it is, or,
        once the slice is unloaded, where it would be (beside corral.slice's own
        children); None where neither can be known."""
        from ...dbus.connection import BusError
        from ...dbus.systemd1 import interface_for
        from ...kernel import cgroupfs
        from ..unitcgroup import UnitCgroup

        path = ""
        for unit in (self.slice, DEFAULT_SLICE):
            try:
                path = self.manager.get(unit, interface_for(unit), "ControlGroup")
            except BusError:
                continue
            if path and unit == DEFAULT_SLICE:
                path = f"{path}/{self.slice}"
            break
        if not path or not path.endswith("/" + self.slice):
            return None
        return UnitCgroup(path, cgroupfs.Mounts())

    def stop(self, timeout: float = STOP_TIMEOUT) -> list[int]:
        """Stop the slice (every unit in it) and wait until the kernel lists no
        process in its cgroup; the pids still listed at ``timeout`` ([] = proven empty)."""
        from ...dbus.connection import BusError

        group = self.cgroup()
        try:
            self.manager.stop_unit(self.slice)
        except BusError:
            pass  # not loaded: nothing of it is left to stop, and the cgroup says so
        if group is None:
            return []
        end = time.monotonic() + timeout
        while True:
            left, _ = group.remaining()
            if not left or time.monotonic() >= end:
                return left
            time.sleep(0.05)

    def holder_active(self) -> bool:
        from ...dbus.connection import BusError
        from ...dbus.systemd1 import UNIT

        try:
            return self.manager.get(self.holder_unit, UNIT, "ActiveState") in ("active", "activating", "reloading")
        except BusError:
            return False


#: The holder unit's watchdog (seconds): it pings twice as often (``ctl/session_holder.py``).
HOLDER_WATCHDOG = 30.0


def holder_watchdog() -> float:
    """``HOLDER_WATCHDOG``, or ``CORRAL_HOLDER_WATCHDOG_SEC`` (the tests' shorter one)."""
    try:
        value = float(os.environ.get("CORRAL_HOLDER_WATCHDOG_SEC", HOLDER_WATCHDOG))
    except ValueError:
        return HOLDER_WATCHDOG
    return value if 0.5 <= value <= 3600 else HOLDER_WATCHDOG


def caller_context() -> list:
    """This process's rlimits, nice value and OOM score as unit properties
    (``LimitNOFILE=``/``LimitNOFILESoft=``..., ``Nice=``, ``OOMScoreAdjust=``)."""
    import resource

    from ...dbus.systemd1 import prop
    from ...kernel.context import RLIMITS

    def value(limit: int) -> int:
        return 2**64 - 1 if limit == resource.RLIM_INFINITY else limit

    props = []
    for name, number in RLIMITS.items():
        soft, hard = resource.getrlimit(number)
        unit_name = "Limit" + name[len("RLIMIT_") :]
        props += [prop(unit_name, "t", value(hard)), prop(unit_name + "Soft", "t", value(soft))]
    props.append(prop("Nice", "i", os.getpriority(os.PRIO_PROCESS, 0)))
    try:
        with open("/proc/self/oom_score_adj") as f:
            props.append(prop("OOMScoreAdjust", "i", int(f.read())))
    except (OSError, ValueError):
        pass
    return props


def holder_environment(directory: str) -> dict:
    """What the holder unit needs of the caller's environment: the state
    directory it keeps, and how to reach the manager again (its end)."""
    env = {"CORRAL_STATE_DIR": directory}
    for name in ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS", "DBUS_SYSTEM_BUS_ADDRESS", "PYTHONPATH", "PATH"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env
