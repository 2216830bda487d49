"""The corral service with no install step: a transient socket and service of the manager.

When no corral service listens where the client looks (nothing installed, or
the .deb's units not enabled) and a manager runs for this user, the client
starts the service as that manager's transient pair, as ``systemd-run
--socket-property=`` makes one:

- ``corral-transient.socket`` listens where an installed ``corral.socket``
  would (``$XDG_RUNTIME_DIR/io.corral.Run``; ``/run/io.corral.Run`` for the
  system manager), mode 0600, removed when it stops;
- ``corral-transient.service``, which it activates: this interpreter running
  this ``corral_systemd`` (``PYTHONPATH`` is the client's package root), so
  the same code as the client's (the hello checks the version again); it
  exits after 60 s idle as the installed one does, and the socket brings it
  back. The socket stays until its manager ends (logout, reboot) or
  ``systemctl [--user] stop corral-transient.socket``.

Guarantees and failure modes:

- **One per manager**: the unit name is the lock. Of two clients starting it
  at once, one creates the pair; the other's StartTransientUnit fails (the
  name exists) and it starts that socket (``systemctl start``: it waits for
  the first one's start job), so both end with one service.
- **Not someone else's**: a pair of that name whose service runs another
  program, with another ``PYTHONPATH``, or whose socket listens elsewhere
  (made by something else of this uid) is never started or used: ``start``
  says why and the run goes on in-process. The socket itself is checked on
  every run as the installed one's is (its owner, then the hello).
- **Only where a manager runs**: its private socket
  (``$XDG_RUNTIME_DIR/systemd/private``, ``/run/systemd/private`` for root),
  owned by this uid. A session bus alone (dbus-launch in a container) is no
  sign of one: trying there would cost a failed systemd-run on every run.
- **Cost**: one ``systemd-run`` (and, for the second of two, one
  ``systemctl``) per manager's life, never on a run that found a service.
"""

import os
import sys

from ..common.unit_names import TRANSIENT_SERVICE

#: As the installed unit's default (``corralctl service install --idle-exit``).
IDLE_EXIT = 60.0
#: How long a systemd-run or systemctl call may take (a manager that hangs).
CALL_TIMEOUT = 30.0


def service_command(kind: str) -> list[str]:
    """The transient service's command line: this interpreter, this package."""
    return [sys.executable, "-m", "corral_systemd.service", "--manager", kind, "--idle-exit", f"{IDLE_EXIT:g}"]


def package_root() -> str:
    """The directory this ``corral_systemd`` is imported from (the service's ``PYTHONPATH``)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start(kind: str, path: str) -> str | None:
    """Start the transient pair in ``kind``'s manager, listening on ``path``,
    or find it started by another client; None once its socket listens, else
    why not (one line)."""
    import subprocess

    scope = ["--user"] if kind == "user" else []
    # systemd-run --user finds the manager by XDG_RUNTIME_DIR; under cron it may be unset (socket_paths' default).
    env = dict(os.environ, XDG_RUNTIME_DIR=os.path.dirname(path)) if kind == "user" else None
    argv = [
        "systemd-run",
        *scope,
        f"--unit={TRANSIENT_SERVICE}",
        "--quiet",
        "--description=corral run service (io.corral.Run, Varlink; started by corral, not installed)",
        f"--socket-property=ListenStream={path}",
        "--socket-property=SocketMode=0600",
        "--socket-property=RemoveOnStop=yes",
        # SIGTERM reaches the service alone: it stops its runs (verified) and answers their clients.
        "--property=KillMode=mixed",
        f"--setenv=PYTHONPATH={package_root()}",
        "--",
        *service_command(kind),
    ]

    def call(argv: list[str]) -> str | None:
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=CALL_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{argv[0]}: {exc}"
        if done.returncode == 0:
            return None
        return (done.stderr.strip().splitlines() or [f"{argv[0]} exit {done.returncode}"])[-1]

    if call(argv) is None:
        return None  # made here, and its socket listens (systemd-run waits for the start job)
    # The name exists (another client made it a moment ago, or it stopped or
    # failed since): start that socket, if it is this program's.
    if why := not_ours(kind, path, call_show=lambda unit, props: _show(scope, env, unit, props)):
        return why
    return call(["systemctl", *scope, "start", f"{TRANSIENT_SERVICE}.socket"])


def _show(scope: list[str], env, unit: str, props: list[str]) -> dict[str, str]:
    """``systemctl show``'s NAME=VALUE lines for ``unit`` ({} when it does not answer)."""
    import subprocess

    argv = ["systemctl", *scope, "show", *(f"--property={p}" for p in props), unit]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=CALL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def not_ours(kind: str, path: str, call_show) -> str | None:
    """Why the existing pair of that name is not this client's corral service
    (another program, package root or socket path), or None.
    ``call_show(unit, properties)``: the manager's word on them."""
    service = call_show(f"{TRANSIENT_SERVICE}.service", ["ExecStart", "Environment", "LoadState"])
    socket = call_show(f"{TRANSIENT_SERVICE}.socket", ["Listen", "LoadState"])
    if service.get("LoadState") != "loaded" or socket.get("LoadState") != "loaded":
        return f"{TRANSIENT_SERVICE}.socket could not be made, nor found ({kind} manager)"
    # ExecStart={ path=... ; argv[]=ARGV ; ignore_errors=no ; ... }
    exec_start = service.get("ExecStart", "")
    argv = exec_start.split("argv[]=", 1)[1].split(" ; ", 1)[0] if "argv[]=" in exec_start else ""
    wanted = [
        (argv == " ".join(service_command(kind)), f"runs {argv or 'nothing'!r}"),
        (f"PYTHONPATH={package_root()}" in service.get("Environment", "").split(), "has another PYTHONPATH"),
        (socket.get("Listen", "").split(" ", 1)[0] == path, f"listens on {socket.get('Listen')!r}"),
    ]
    for ok, why in wanted:
        if not ok:
            return f"{TRANSIENT_SERVICE}.service exists and is not this corral's ({why}): not used"
    return None
