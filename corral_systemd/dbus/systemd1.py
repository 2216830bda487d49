"""The parts of org.freedesktop.systemd1 corral uses, as plain calls.

Names follow systemd's D-Bus API (see org.freedesktop.systemd1(5)).
"""

import re
from collections.abc import Sequence

from ..common.plainclass import plainclass
from ._dbus_fast import Variant
from .connection import BusError

DEST = "org.freedesktop.systemd1"
PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
UNIT = "org.freedesktop.systemd1.Unit"
PROPS = "org.freedesktop.DBus.Properties"
NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"


def unit_path(name: str) -> str:
    """systemd's bus label escaping: every byte not [A-Za-z0-9] becomes _xx."""
    out = []
    for byte in name.encode():
        ch = chr(byte)
        out.append(ch if ch.isascii() and ch.isalnum() else f"_{byte:02x}")
    return f"{PATH}/unit/{''.join(out)}"


def interface_for(unit_name: str) -> str:
    return (
        "org.freedesktop.systemd1."
        + {"scope": "Scope", "service": "Service", "slice": "Slice"}[unit_name.rsplit(".", 1)[1]]
    )


#: Errors after which the manager is taken to be gone for the rest of the run.
LOST_ERRORS = (
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    "org.freedesktop.DBus.Error.NoReply",
    "org.freedesktop.DBus.Error.Disconnected",
    None,
)
MANAGER_LOST = "corral.Error.ManagerLost"
#: What a manager that lacks a method or property answers (a call made anyway).
NOT_OFFERED = (
    "org.freedesktop.DBus.Error.UnknownMethod",
    "org.freedesktop.DBus.Error.InvalidArgs",
    "org.freedesktop.DBus.Error.PropertyReadOnly",
)


@plainclass(frozen=True)
class ManagerAPIs:
    """What this manager offers beyond systemd 252, from its own ``Version``
    property (read once per connection: ``Manager.apis``). ``version`` is
    None when it could not be read or parsed: then nothing newer is assumed
    and every call takes 252's path. The version each came in is systemd's
    (org.freedesktop.systemd1(5), NEWS):

    - ``scope_from_pidfds``: a scope's ``PIDFDs=`` (255): the manager takes
      the process by a descriptor, not by a number that may be reused;
    - ``unit_by_pidfd``: ``GetUnitByPIDFD`` (253): which unit holds a process,
      asked about the process itself (one call, the unit's name in its reply);
    - ``memory_peak``: a unit's ``MemoryPeak`` (255): the manager's own
      reading of the group's memory.peak, kept after the group is gone.
    """

    version: int | None

    def _since(self, version: int) -> bool:
        return self.version is not None and self.version >= version

    @property
    def scope_from_pidfds(self) -> bool:
        return self._since(255)

    @property
    def unit_by_pidfd(self) -> bool:
        return self._since(253)

    @property
    def memory_peak(self) -> bool:
        return self._since(255)


def parse_version(text) -> int | None:
    """systemd's major version from its ``Version`` ("252.39-1~deb12u1",
    "257.9-1~deb13u1", "v258-rc1"); None when there is none."""
    match = re.match(r"v?(\d+)", str(text or "").strip())
    return int(match.group(1)) if match else None


class Manager:
    """Calls on the manager. Once it stops answering, every later call fails
    at once with MANAGER_LOST instead of waiting out a timeout each time."""

    def __init__(self, conn, apis: "ManagerAPIs | None" = None):
        self.conn = conn
        self.lost: str | None = None  # why the manager is considered gone
        #: Given when another holder of the same connection already read them (a Runner's session).
        self._apis = apis

    @property
    def apis(self) -> ManagerAPIs:
        """What this manager offers beyond systemd 252 (``ManagerAPIs``): its
        ``Version`` read on first use, then kept for this connection (a
        reconnected run makes a new ``Manager``: a re-executed manager may be
        another version). Unreadable: ``ManagerAPIs(None)``, the old paths."""
        if self._apis is None:
            try:
                version = parse_version(self.manager_property("Version"))
            except BusError:
                version = None
            self._apis = ManagerAPIs(version)
        return self._apis

    def _call(self, *args, **kw):
        if self.lost is not None:
            raise BusError(f"manager lost: {self.lost}", MANAGER_LOST)
        try:
            return self.conn.call(*args, **kw)
        except BusError as exc:
            if exc.name in LOST_ERRORS:
                self.lost = str(exc)
            raise

    def add_match(self, rule: str) -> None:
        if self.conn.unique_name is not None:  # peer-to-peer connections need no matches
            self._call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "AddMatch", "s", [rule])

    def subscribe(self) -> None:
        self._call(DEST, PATH, MANAGER, "Subscribe")

    def start_transient_unit(self, name: str, properties: list, aux: Sequence = (), *, fds=()) -> str:
        reply = self._call(
            DEST,
            PATH,
            MANAGER,
            "StartTransientUnit",
            "ssa(sv)a(sa(sv))",
            [name, "fail", properties, list(aux)],
            fds=fds,
        )
        return reply.body[0]

    def kill_unit(self, name: str, whom: str, signo: int) -> None:
        self._call(DEST, PATH, MANAGER, "KillUnit", "ssi", [name, whom, signo])

    def stop_unit(self, name: str) -> str:
        return self._call(DEST, PATH, MANAGER, "StopUnit", "ss", [name, "replace"]).body[0]

    def reset_failed_unit(self, name: str) -> None:
        self._call(DEST, PATH, MANAGER, "ResetFailedUnit", "s", [name])

    def stop_unit_nowait(self, name: str) -> None:
        """StopUnit without waiting for the job: its effect comes as signals."""
        if self.lost is not None:
            raise BusError(f"manager lost: {self.lost}", MANAGER_LOST)
        self.conn.call_no_reply(DEST, PATH, MANAGER, "StopUnit", "ss", [name, "replace"])

    def unref_unit(self, name: str) -> None:
        self._call(DEST, PATH, MANAGER, "UnrefUnit", "s", [name])

    def unit_loaded(self, name: str) -> bool:
        """Whether the manager has the unit loaded (GetUnit; NoSuchUnit: no)."""
        try:
            self._call(DEST, PATH, MANAGER, "GetUnit", "s", [name])
        except BusError as exc:
            if exc.name == NO_SUCH_UNIT:
                return False
            raise
        return True

    def get_all(self, name: str, interface: str) -> dict:
        reply = self._call(DEST, unit_path(name), PROPS, "GetAll", "s", [interface])
        return {k: v.value for k, v in reply.body[0].items()}

    def get(self, name: str, interface: str, prop: str):
        return self._call(DEST, unit_path(name), PROPS, "Get", "ss", [interface, prop]).body[0].value

    def manager_property(self, prop: str):
        """A property of the manager itself (e.g. its ``Environment``)."""
        return self._call(DEST, PATH, PROPS, "Get", "ss", [MANAGER, prop]).body[0].value

    def unit_of_pid(self, pid: int) -> str:
        """The unit that holds ``pid``, in the manager's own word (GetUnitByPID:
        the unit whose cgroup the process is in, for this manager)."""
        path = self._call(DEST, PATH, MANAGER, "GetUnitByPID", "u", [pid]).body[0]
        return self._call(DEST, path, PROPS, "Get", "ss", [UNIT, "Id"]).body[0].value

    def unit_of_process(self, pid: int, pidfd: int | None) -> tuple[str, str]:
        """(the unit that holds the process, "pidfd" or "pid": how it was
        asked). By its pidfd (GetUnitByPIDFD, one call, no number that may
        have been reused) where the manager has it (``apis``) and a pidfd is
        given; else, or if the manager answers that it lacks the method, by
        number (``unit_of_pid``). BusError when no unit of this manager holds
        it (NoUnitForPID) or the manager cannot be asked."""
        if pidfd is not None and pidfd >= 0 and self.apis.unit_by_pidfd:
            try:
                return self._call(DEST, PATH, MANAGER, "GetUnitByPIDFD", "h", [0], fds=[pidfd]).body[1], "pidfd"
            except BusError as exc:
                if exc.name not in NOT_OFFERED:
                    raise
                self._apis = ManagerAPIs(None)  # its Version said otherwise: believe the answer
        return self.unit_of_pid(pid), "pid"

    def list_units(self, patterns: list[str]) -> list[tuple[str, str]]:
        """(name, active state) of every loaded unit matching one of ``patterns``."""
        reply = self._call(DEST, PATH, MANAGER, "ListUnitsByPatterns", "asas", [[], patterns])
        return [(unit[0], unit[3]) for unit in reply.body[0]]


def prop(name: str, signature: str, value) -> tuple:
    return (name, Variant(signature, value))
