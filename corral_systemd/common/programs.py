"""corral's program names and where their service listens: what the
clients, the corral service and corralctl all read (no other import: the
client's hot path loads this)."""

import os
import stat

SOCKET_NAME = "io.corral.Run"
#: Each program name and its default --cgroup-mode.
PROGRAMS = {"corral": "auto", "corral-enforced": "enforced"}
#: The manager's runtime directory (%t in corral.socket): /run for the system
#: manager, $XDG_RUNTIME_DIR (/run/user/UID) for a user's.
SYSTEM_SOCKET = "/run/" + SOCKET_NAME
#: A corral session holder's abstract socket: this, then "<uid>/<session id>" (``state.sessions``).
SESSION_ADDRESS_PREFIX = "corral-session/"


def may_start_service() -> bool:
    """May a client start the corral service as a transient unit of its
    manager when none listens (``service/transient.py``)? Yes by default;
    ``CORRAL_SERVICE=installed`` uses only one that is already there
    (installed, or started before), ``CORRAL_SERVICE=0`` none at all; nor
    with ``CORRAL_SERVICE_SOCKET`` (that socket is someone's own)."""
    if os.environ.get("CORRAL_SERVICE_SOCKET") or os.environ.get("CORRAL_SERVICE", "1").lower() == "installed":
        return False
    return bool(socket_paths())


def socket_paths() -> list[str]:
    """Where a corral service may listen for this user, in the order corral
    tries them; empty for "do not use one".

    ``CORRAL_SERVICE=0`` turns the service off (``installed``: on, but never
    started by the client: ``may_start_service``); ``CORRAL_SERVICE_SOCKET``
    names the one socket to use. Else the user manager's
    (``$XDG_RUNTIME_DIR/io.corral.Run``; without that variable, as under
    cron, ``/run/user/UID``'s), and for root then the system manager's
    (``/run/io.corral.Run``): the order in which auto mode picks a manager
    (``dbus.discovery.bus_address``). The service declines a run that asks
    for the other manager, and corral runs it itself."""
    if os.environ.get("CORRAL_SERVICE", "1").lower() in ("0", "no", "off", "false"):
        return []
    if path := os.environ.get("CORRAL_SERVICE_SOCKET"):
        return [path]
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    paths = [f"{runtime}/{SOCKET_NAME}"]
    if os.geteuid() == 0:
        paths.append(SYSTEM_SOCKET)
    return paths


def manager_for(path: str) -> str | None:
    """The manager ("user" or "system") whose transient corral service would
    listen on ``path`` (one of ``socket_paths``), or None: not a
    manager's socket path, or no such manager running for this uid."""
    if path == SYSTEM_SOCKET:
        kind, private = "system", "/run/systemd/private"
        if os.geteuid() != 0:
            return None
    elif os.path.basename(path) == SOCKET_NAME:
        kind, private = "user", os.path.join(os.path.dirname(path), "systemd", "private")
    else:
        return None
    try:
        st = os.stat(private)
    except OSError:
        return None
    # Ours only: root with another user's XDG_RUNTIME_DIR (su, sudo -E) must not start units in that user's manager.
    return kind if stat.S_ISSOCK(st.st_mode) and st.st_uid == os.geteuid() else None
