"""The corral service's units, for ``corralctl service install|status|uninstall``.

``corral.socket`` listens on ``%t/io.corral.Run`` (``/run`` for the system
manager, ``$XDG_RUNTIME_DIR`` for a user's) and starts ``corral.service``
on the first connection; the service exits when idle and the socket brings
it back. The .deb ships both (disabled); pip and pipx installations get them
from ``install``, which writes them for this installation's interpreter.

Where they go: a user manager's ``$XDG_CONFIG_HOME/systemd/user`` (default
``~/.config/systemd/user``), the system manager's ``/etc/systemd/system``;
with ``runtime``, the manager's runtime unit directory
(``$XDG_RUNTIME_DIR/systemd/user``, ``/run/systemd/system``), gone at
reboot. Files are written only where no unit of that name exists that
``install`` did not write itself, and ``uninstall`` removes only those.
"""

import json
import os
import subprocess
import sys

MARK = "# Written by corralctl service install (corral-systemd)."
UNITS = ("corral.socket", "corral.service")

SOCKET_UNIT = """{mark}
[Unit]
Description=corral run service socket (io.corral.Run, Varlink)
Documentation=man:corralctl(1)

[Socket]
ListenStream=%t/io.corral.Run
SocketMode=0600
RemoveOnStop=yes

[Install]
WantedBy=sockets.target
"""

SERVICE_UNIT = """{mark}
[Unit]
Description=corral run service (io.corral.Run, Varlink)
Documentation=man:corralctl(1)
Requires=corral.socket
After=corral.socket

[Service]
ExecStart={python} -m corral_systemd.service --manager {manager} --idle-exit {idle_exit:g}
# SIGTERM reaches the service alone: it stops its runs (verified) and answers
# their clients before it exits; what is left after that is killed.
KillMode=mixed
"""


class ServiceUnitError(Exception):
    """An install, status or uninstall step failed (one line: why)."""


def unit_dir(manager: str, runtime: bool, env=os.environ) -> str:
    if manager == "system":
        return "/run/systemd/system" if runtime else "/etc/systemd/system"
    if runtime:
        base = env.get("XDG_RUNTIME_DIR")
        if not base:
            raise ServiceUnitError("--runtime needs $XDG_RUNTIME_DIR (the user manager's runtime directory)")
        return os.path.join(base, "systemd", "user")
    config = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(config, "systemd", "user")


def unit_texts(manager: str, python: str = sys.executable, idle_exit: float = 60.0, mark: str = MARK) -> dict[str, str]:
    """The two units' text; the .deb's come from here too (packaging/stage), with their own ``mark``."""
    return {
        "corral.socket": SOCKET_UNIT.format(mark=mark),
        "corral.service": SERVICE_UNIT.format(mark=mark, python=python, manager=manager, idle_exit=idle_exit),
    }


def _systemctl(manager: str, *args: str) -> None:
    argv = ["systemctl", *(["--user"] if manager == "user" else []), *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServiceUnitError(f"{' '.join(argv)}: {exc}") from None
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise ServiceUnitError(f"{' '.join(argv)}: {why}")


def _ours(path: str) -> bool:
    try:
        with open(path) as f:
            return f.readline().rstrip("\n") == MARK
    except FileNotFoundError:
        return False


def install(manager: str, runtime: bool = False, idle_exit: float = 60.0) -> list[str]:
    """Write the units, reload the manager, enable and start the socket. Returns the files written.

    Nothing is written unless the manager answers first; if it fails after
    the files are written, they are removed again (ServiceUnitError says so)."""
    if manager == "system" and os.geteuid() != 0:
        raise ServiceUnitError("the system manager's service is root's: run as root, or use --user")
    try:
        _systemctl(manager, "show", "--property=Version")
    except ServiceUnitError as exc:
        raise ServiceUnitError(f"the {manager} manager does not answer, so nothing was written ({exc})") from None
    directory = unit_dir(manager, runtime)
    texts = unit_texts(manager, idle_exit=idle_exit)
    for name in texts:
        path = os.path.join(directory, name)
        if os.path.lexists(path) and not _ours(path):
            raise ServiceUnitError(f"{path} exists and was not written by corralctl: not replacing it")
    written = []
    try:
        for name, text in texts.items():
            path = os.path.join(directory, name)
            os.makedirs(directory, exist_ok=True)
            tmp = f"{path}.corralctl-tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)
            written.append(path)
        _systemctl(manager, "daemon-reload")
        # The service restarts on its next connection with the new unit.
        _systemctl(manager, *(["--runtime"] if runtime else []), "enable", "--now", "corral.socket")
    except (ServiceUnitError, OSError) as exc:
        for path in written:
            os.unlink(path)
        raise ServiceUnitError(f"{exc}; removed again: {', '.join(written) or 'nothing was written'}") from None
    return written


def installed(manager: str) -> list[str]:
    """The unit files ``install`` wrote for ``manager``, wherever they are."""
    found = []
    for runtime in (False, True):
        try:
            directory = unit_dir(manager, runtime)
        except ServiceUnitError:
            continue
        found += [path for name in UNITS if _ours(path := os.path.join(directory, name))]
    return found


def uninstall(manager: str) -> tuple[list[str], list[str], str | None]:
    """Stop and disable the units, remove the files ``install`` wrote.

    Returns (the files removed, the directories looked in, a warning or
    None): a manager that does not answer cannot be told (it reads its unit
    directories again when it starts), which is a warning, not a failure."""
    for args in (("--runtime", "disable", "--now", *UNITS), ("disable", "--now", *UNITS)):
        try:
            _systemctl(manager, *args)
        except ServiceUnitError:
            pass  # not enabled that way, not loaded, or no manager
    removed, looked = [], []
    for runtime in (False, True):
        try:
            directory = unit_dir(manager, runtime)
        except ServiceUnitError:
            continue
        looked.append(directory)
        for name in UNITS:
            path = os.path.join(directory, name)
            if _ours(path):
                os.unlink(path)
                removed.append(path)
    warning = None
    try:
        _systemctl(manager, "daemon-reload")
    except ServiceUnitError as exc:
        warning = f"the {manager} manager was not told ({exc})"
    return removed, looked, warning


def client_on_path() -> dict:
    """The ``corral`` a shell here runs (PATH), and which client it is:
    ``compiled`` (packaging/client/corral.c: no interpreter per run) or
    ``python`` (client.py: an interpreter's start-up on every run)."""
    import shutil

    path = shutil.which("corral")
    kind = None
    if path is not None:
        try:
            with open(path, "rb") as f:
                kind = "compiled" if f.read(4) == b"\x7fELF" else "python"
        except OSError:
            pass
    return {"path": path, "kind": kind}


def status(socket_path: str | None, why_not: str | None) -> dict:
    """Whether a corral started now (this environment) hands its run to a
    service, and why not; the service's own figures when one answers."""
    report: dict = {
        "socket": socket_path,
        "in_use": False,
        "reason": why_not,
        "service": None,
        "absent": False,
        "client": client_on_path(),
    }
    if socket_path is None:
        return report
    import socket

    from ..varlink.wire import Channel, VarlinkError, peer_credentials

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(30)
    try:
        sock.connect(socket_path)
        uid = peer_credentials(sock)[1]
        if uid not in (0, os.getuid()):
            report["reason"] = f"the socket is served by uid {uid}, not this user or root"
            return report
        report["service"], _ = Channel(sock).call("io.corral.Run.Status", {})
        report["in_use"], report["reason"] = True, None
    except FileNotFoundError:
        manager = "system" if os.path.dirname(socket_path) == "/run" else "user"
        report["reason"] = (
            f"no socket there (install the service: corralctl service install --{manager})"
            if _manager_here(manager, socket_path)
            else f"no socket there, and no {manager} manager to install the service in"
        )
        report["absent"] = True
    except ConnectionRefusedError:
        report["reason"] = "nothing listens on the socket (corral.socket stopped?)"
        report["absent"] = True
    except (OSError, VarlinkError, ValueError) as exc:
        report["reason"] = f"the service did not answer: {exc}"
    finally:
        sock.close()
    return report


def _manager_here(manager: str, socket_path: str) -> bool:
    """Is there a manager of that kind to install the service in (its private socket)?"""
    if manager == "system":
        return os.path.exists("/run/systemd/private")
    return os.path.exists(os.path.join(os.path.dirname(socket_path), "systemd", "private"))


def status_text(report: dict) -> str:
    client = report["client"]
    if client["kind"] == "compiled":
        said = f"\ncorral client: {client['path']}: compiled (no interpreter started per run)"
    elif client["kind"] == "python":
        said = (
            f"\ncorral client: {client['path']}: the Python one (an interpreter starts on every run; "
            "installed with a C compiler there, corral is the compiled client)"
        )
    else:
        said = "\ncorral client: no corral on PATH"
    if report["in_use"]:
        svc = report["service"]
        return (
            f"corral service: in use: {report['socket']} (pid {svc['pid']}, {svc['manager']} manager, "
            f"{svc['runs_in_flight']} runs in flight, {svc['runs_served']} served, up {svc['uptime_seconds']:.0f} s, "
            f"exits after {svc['idle_exit_seconds']:g} s idle)" + said
        )
    tried = report.get("tried") or []
    if len(tried) > 1:
        where = "; ".join(f"{t['socket']}: {t['reason']}" for t in tried)
        return f"corral service: not in use: {where}; corral runs the command in its own process" + said
    where = f" ({report['socket']})" if report["socket"] else ""
    return f"corral service: not in use{where}: {report['reason']}; corral runs the command in its own process" + said


def status_json(report: dict) -> str:
    return json.dumps(report, indent=2)
