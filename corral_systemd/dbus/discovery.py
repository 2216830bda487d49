"""Finding the systemd manager to talk to, and connecting to it.

As systemctl does: the manager's private socket where we may use it
(peer-to-peer, no bus daemon in between), else its bus — the session bus
for the user manager, the system bus for the system manager. SetupError
names what is missing. Cheap to import: the connection (and dbus-fast) is
loaded only when one is made.
"""

import os

from ..common.errors import SetupError

TYPE_CHECKING = False  # typing is not imported at run time: start-up is product speed

if TYPE_CHECKING:
    from .connection import BusError, Connection


def session_bus_candidates(env=os.environ) -> str | None:
    """The user manager's bus address, as clients find it, or None.

    dbus-fast does not look at $XDG_RUNTIME_DIR/bus itself; we do, because
    that is where a systemd user session puts the bus.
    """
    address = env.get("DBUS_SESSION_BUS_ADDRESS")
    if address:
        return address
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.exists(os.path.join(runtime, "bus")):
        return f"unix:path={runtime}/bus"
    return None


def private_socket(kind: str, env=os.environ) -> str | None:
    """The manager's own socket (peer-to-peer, no bus daemon in between), as
    systemctl uses it: $XDG_RUNTIME_DIR/systemd/private for the user
    manager, /run/systemd/private (root only) for the system manager."""
    if env.get("CORRAL_SYSTEMD_TRANSPORT") == "bus":
        return None
    if kind == "user":
        runtime = env.get("XDG_RUNTIME_DIR")
        path = os.path.join(runtime, "systemd", "private") if runtime else None
    else:
        path = "/run/systemd/private" if os.geteuid() == 0 else None
    try:
        # Ours only: root with an inherited XDG_RUNTIME_DIR (su, sudo -E) must
        # not land in another user's manager, whose private socket root may use.
        return path if path and os.stat(path).st_uid == os.geteuid() else None
    except OSError:
        return None


def user_manager_reachable(env=os.environ) -> bool:
    """Auto mode picks the user manager: a user bus, or its private socket (``env``: whose environment)."""
    return session_bus_candidates(env) is not None or private_socket("user", env) is not None


def bus_address(manager: str) -> tuple[str, str | None]:
    """(manager kind, bus address or None if only the private socket is
    there) or SetupError saying what is missing."""
    if manager in ("auto", "user"):
        if user_manager_reachable():
            return "user", session_bus_candidates()
        if manager == "user":
            raise SetupError(
                "no user manager bus: DBUS_SESSION_BUS_ADDRESS is unset and $XDG_RUNTIME_DIR/bus does not exist"
            )
    if os.geteuid() != 0 and manager == "auto":
        raise SetupError("no user manager bus (DBUS_SESSION_BUS_ADDRESS unset, no $XDG_RUNTIME_DIR/bus)")
    if not os.path.isdir("/run/systemd/system"):
        raise SetupError("no system manager: this machine was not booted with systemd (/run/systemd/system missing)")
    return "system", os.environ.get("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/run/dbus/system_bus_socket")


def connect_manager(manager: str, timeout: float = 10.0) -> "tuple[str, Connection]":
    """(manager kind, connection): the manager's private socket where we
    may use it, else its bus. SetupError if neither answers.

    The private socket saves the bus daemon's hop on every message and the
    Hello/AddMatch/Subscribe calls (the manager sends every signal to every
    private connection); the price is that AddRef/UnrefUnit need a bus name
    and are not available there (see ``SystemdEngine.direct``).
    """
    from .connection import BusError, Connection

    kind, address = bus_address(manager)
    private = private_socket(kind)
    if private is not None:
        try:
            return kind, _in_our_pid_namespace(kind, Connection(f"unix:path={private}", timeout=timeout, bus=False))
        except BusError:
            pass  # not ours to use (e.g. another user's): try the bus
    if address is None:
        raise SetupError(f"{kind} manager unreachable: its private socket did not answer and there is no bus")
    try:
        return kind, _in_our_pid_namespace(kind, Connection(address, timeout=timeout))
    except BusError as exc:
        raise SetupError(f"{kind} manager unreachable: {exc}") from None


def _in_our_pid_namespace(kind: str, conn: "Connection") -> "Connection":
    """``conn``, if its peer (the manager, or the bus daemon beside it) is in
    this process's pid namespace; else SetupError. A peer outside it has no
    number here (SO_PEERCRED says pid 0), and the numbers corral would name
    to it (a scope's ``PIDs=``, as systemd-run --scope) would be other
    processes' in its namespace: systemd 252 takes nothing else."""
    import socket
    import struct

    pid = struct.unpack("3i", conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    if pid == 0:
        conn.close()
        raise SetupError(
            f"the {kind} manager is outside this process's pid namespace (the process numbers corral would "
            "name to it are not its own); run through the corral service, or use --cgroup-mode fallback"
        )
    return conn


def describe_error(exc: "BusError") -> str:
    """A bus error as a user reads it (the common ones named, else as the bus gave it)."""
    names = {
        "org.freedesktop.DBus.Error.ServiceUnknown": "manager not running on this bus",
        "org.freedesktop.DBus.Error.NameHasNoOwner": "manager not running on this bus",
        "org.freedesktop.DBus.Error.AccessDenied": "permission denied",
        "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired": "permission denied (needs authorization)",
    }
    return names.get(exc.name or "", str(exc))
