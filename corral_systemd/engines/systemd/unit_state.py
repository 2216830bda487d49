"""What the manager has said about a run's unit: its state, its end, its figures.

The common path costs no round trips: the unit's PropertiesChanged signals
(ActiveState, Result, InvocationID, and a service's ExecMain*, handed to the
strategy) and UnitRemoved are taken as they arrive (``handle``). The manager
is asked only where a signal may be late or was missed (``inactive``), and
read in full when its figures are wanted (``sample``).

After a start whose reply was lost (link.py), the manager's word is all
there is about how a service was started: ``adopt`` records whether it can
be watched, and ``lost_track`` says when it cannot be known.

Nothing here believes the command: every value comes from the manager over
the run's own connection (``ManagerLink``), the one source the command cannot
write to. A lost manager is not an inactive unit by itself; ``inactive`` says
so only when the kernel's word on the cgroup is to decide (and warns).
"""

from collections.abc import Callable

from ...dbus.connection import BusError
from ...dbus.discovery import describe_error as _why
from ...dbus.systemd1 import NO_SUCH_UNIT, UNIT, interface_for
from .link import ManagerLink

#: How often ``inactive`` waits for PropertiesChanged before asking.
SIGNAL_CHECKS = 4
#: Systemd 252 reports an unset figure as 2**64-1.
UNSET = 2**63

#: The manager's figures kept (its property, the record's name).
MANAGER_FIGURES = (
    ("CPUUsageNSec", "cpu_usage_nsec"),
    ("TasksCurrent", "tasks_peak"),
    ("IOReadBytes", "io_read_bytes"),
    ("IOWriteBytes", "io_write_bytes"),
)
#: Where the manager has it (``ManagerAPIs.memory_peak``, systemd 255+): its memory.peak reading.
MEMORY_PEAK = ("MemoryPeak", "memory_peak")


class UnitState:
    """The unit's state per its manager. ``active``: its ActiveState;
    ``gone``: collected (UnitRemoved, or no such unit); ``figures``: the
    largest of each figure the manager reported (see ``usage_facts``)."""

    def __init__(self, link: ManagerLink, unit_path: str, facts: dict, warnings: list[str]):
        self.link = link
        self.unit = link.unit
        self._unit_path = unit_path
        self._facts = facts
        self._warnings = warnings
        self.active: str | None = None
        self.gone = False
        self.figures: dict[str, int] = {}
        #: The manager's figures were read once the unit was over.
        self.final_sampled = False
        self._checks = 0
        #: After a lost start reply: why the service was adopted, and why
        #: how it ran cannot be known (then the run is unproven).
        self.adopted: str | None = None
        self.reply_lost: str | None = None

    def ended(self) -> bool:
        """The manager has said the unit is over (or collected it)."""
        return self.gone or self.active in ("inactive", "failed")

    def handle(self, msg) -> dict | None:
        """One signal from the manager. The changes to the unit type's own
        interface (Service or Scope) are returned, for the strategy."""
        if msg.member == "UnitRemoved" and msg.body[0] == self.unit:
            self.gone = True  # collected: over, and no more calls about it
            return None
        if msg.member != "PropertiesChanged" or msg.path != self._unit_path:
            return None
        interface, changed = msg.body[0], {k: v.value for k, v in msg.body[1].items()}
        if interface == UNIT:
            if "ActiveState" in changed:
                self.active = changed["ActiveState"]
            if changed.get("InvocationID") and "invocation_id" not in self._facts:
                self._facts["invocation_id"] = bytes(changed["InvocationID"]).hex()
            return None
        if "Result" in changed:
            self._facts["unit_result"] = changed["Result"]
        return changed

    def keep_figures(self, props: dict) -> None:
        """Keep the larger of each reading; the manager's MemoryPeak where it
        has one (255+; 252's has none: the peak is then the cgroup's alone).
        ``manager_apis.memory_peak`` in the record: the manager's last reading."""
        figures: tuple[tuple[str, str], ...] = MANAGER_FIGURES
        if self.link.manager.apis.memory_peak:
            figures += (MEMORY_PEAK,)
            peak = props.get(MEMORY_PEAK[0])
            if peak is not None and peak < UNSET:
                self.note_api("memory_peak", peak)
        for prop_name, name in figures:
            value = props.get(prop_name)
            if value is not None and value < UNSET:
                self.figures[name] = max(self.figures.get(name, 0), value)

    def note_api(self, what: str, value) -> None:
        """The record's ``manager_apis``: the manager's version and which of
        its newer calls this run took (``scope_from``, ``unit_lookup``:
        "pidfd" or "pid"; ``memory_peak``: its last MemoryPeak reading)."""
        apis = self._facts.setdefault("manager_apis", {})
        apis.setdefault("version", self.link.manager.apis.version)
        apis[what] = value

    def read_back(self, loaded: bool, state: str | None) -> None:
        """A new connection's word on the unit (``ManagerLink.reconnect``).
        It wins: a manager going down for daemon-reexec frees its units and
        says UnitRemoved for each, this one too (VM lane)."""
        self.gone = not loaded  # it ended and was collected while we were away
        if loaded:
            self.active = state

    def sample(self) -> None:
        """The unit's figures and Result, asked for; nothing if it cannot be asked."""
        try:
            props = self.link.manager.get_all(self.unit, interface_for(self.unit))
        except BusError:
            return
        self.keep_figures(props)
        if props.get("Result"):
            self._facts["unit_result"] = props["Result"]

    def sample_final(self) -> None:
        """Once the kernel said the group is empty and the unit is over: the
        manager's figures are final too, its CPU total included where the
        group went between samples. Only while the unit is still referenced."""
        if not self.final_sampled and not self.gone and self.link.manager.lost is None:
            self.final_sampled = True
            self.sample()

    def inactive(self, nudge: Callable[[], bool]) -> bool:
        """The unit is inactive, failed or gone (a vanished manager has no
        units). Called once per verification round: PropertiesChanged is
        waited for SIGNAL_CHECKS rounds, then the manager is asked. On the
        second round ``nudge()`` may say to stop the unit (an empty scope
        is stopped only once the manager notices its empty cgroup)."""
        if self.ended():
            return True
        manager = self.link.manager
        self._checks += 1
        if self._checks == 2 and manager.lost is None and nudge():
            # The reply does not matter (PropertiesChanged tells): none awaited.
            try:
                manager.stop_unit_nowait(self.unit)
            except BusError:
                pass
        if self._checks <= SIGNAL_CHECKS:
            return False
        try:
            state = manager.get(self.unit, UNIT, "ActiveState")
        except BusError as exc:
            if exc.name in (NO_SUCH_UNIT, "org.freedesktop.DBus.Error.UnknownObject"):
                self.gone = True
                return True
            if manager.lost is not None:
                # No manager, no unit: the kernel's word on the cgroup decides.
                self.gone = True
                self._warnings.append(
                    f"systemd manager lost during the run ({manager.lost}); emptiness proven from the cgroup alone"
                )
                return True
            return False
        self.active = state
        return state in ("inactive", "failed")

    # -- after a lost start reply ----------------------------------------
    def adopt(self, why: str) -> None:
        """The manager took our StartTransientUnit, its reply was lost: the
        service was started by that request. Watch it as any run: its end
        arrives on the new connection (subscribed before we looked), its
        status read as usual if it has already ended but is still loaded.
        If it was collected, or cannot be asked about, how it ended cannot
        be known: ``lost_track`` says so, and the run is stopped and proven
        empty from its cgroup (exit 120)."""
        why = f"{why}, after the manager had started it"
        self.adopted = why
        try:
            loaded, state = self.link.unit_state()
        except BusError as exc:
            self.reply_lost = (
                f"{why}; the manager could not be asked about it ({_why(exc)}), so how it ran cannot be known"
            )
            return
        if not loaded:
            self.gone = True
            self.reply_lost = f"{why}; it ended unseen and was collected, so its exit status cannot be known"
        else:
            self.active = state
            self._warnings.append(f"{why}; watching that start")

    def unknowable(self, why: str) -> None:
        """Whether the manager had taken the request cannot be known."""
        self.adopted = self.reply_lost = f"{why}: how the service ran cannot be known"

    def lost_track(self) -> str | None:
        """Why the main process's end cannot be known after a lost start
        reply (asked only while its exit status is missing)."""
        if self.reply_lost is not None:
            return self.reply_lost
        if self.adopted and self.ended():
            # Its start job may have failed before the command ran (we never saw the job).
            return f"{self.adopted}; it ended without an exit status of its command"
        return None

    # -- the end -----------------------------------------------------------
    def release(self, *, started: bool, keep_failed: bool) -> None:
        """The unit's Result if no signal told it, then UnrefUnit (on a bus)
        and ResetFailedUnit (a unit kept when failed): the manager may
        collect it. Nothing is asked of a lost manager or a collected unit."""
        manager = self.link.manager
        if self.gone or manager.lost is not None:
            return
        if started:
            if self._facts.get("unit_result") is None:
                try:
                    self._facts["unit_result"] = manager.get(self.unit, interface_for(self.unit), "Result")
                except BusError:
                    pass
            if not self.link.direct:
                try:
                    manager.unref_unit(self.unit)
                except BusError:
                    pass
        if keep_failed:
            try:
                manager.reset_failed_unit(self.unit)
            except BusError:
                pass  # not failed (already collected) or gone
