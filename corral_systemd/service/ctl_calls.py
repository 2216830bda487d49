"""``io.corral.Session.Ctl``: a corralctl command line run for the caller.

The caller's corralctl, run as a child of the service with the caller's
environment and working directory (``python -P -m corral_systemd.ctl``: the
same code, so the same answers); nothing the service holds reaches it. Only
the commands agents need to manage sessions and background runs are taken
(``COMMANDS``); a session's holder is the manager's unit, never this
service's child (``--cgroup-mode fallback`` is refused).

Output: stdout and stderr, base64, up to ``CAPTURE_LIMIT`` each (as a Run
without descriptors); with ``more``, stdout is sent as it comes (``logs -f``).
The caller hanging up ends the command (SIGTERM; corralctl's own handling).
"""

import os
import select
import subprocess
import sys

from ..varlink.wire import VarlinkError
from .requests import Capture, check_parameters

#: The first words of a command line this method runs.
COMMANDS = (("session", "start"), ("session", "ls"), ("session", "end"), ("logs",), ("wait",), ("stop",), ("ps",))


def check(parameters) -> tuple[list[str], dict, str]:
    """(argv, environment, cwd) of a Ctl call; InvalidParameter or NotServed."""
    if not isinstance(parameters, dict):
        raise VarlinkError("org.varlink.service.InvalidParameter", {"parameter": "parameters"})
    checked = check_parameters(
        {"program": "corral", "umask": 0o22, **{k: parameters.get(k) for k in ("argv", "environment", "cwd")}}, []
    )
    argv = checked["argv"]
    if not any(tuple(argv[: len(words)]) == words for words in COMMANDS):
        said = ", ".join(" ".join(words) for words in COMMANDS)
        raise VarlinkError("io.corral.Session.NotServed", {"reason": f"runs only: {said}"})
    if argv[:2] == ["session", "start"] and _fallback_asked(argv):
        raise VarlinkError(
            "io.corral.Session.NotServed",
            {"reason": "--cgroup-mode fallback: its holder would be this service's child; run corralctl yourself"},
        )
    return argv, checked["environment"], checked["cwd"]


def _fallback_asked(argv: list[str]) -> bool:
    for i, arg in enumerate(argv):
        if arg == "--cgroup-mode=fallback" or (arg == "--cgroup-mode" and argv[i + 1 : i + 2] == ["fallback"]):
            return True
    return False


def run(argv: list[str], env: dict, cwd: str, connection_fd: int, send_more) -> dict:
    """Run corralctl; the last reply's parameters. ``send_more(parameters)``, if
    given, sends stdout as it comes (a reply with continues: true)."""
    out, err = Capture(), Capture()
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "corral_systemd.ctl", *argv],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}  # type: ignore[union-attr]
    poller = select.poll()
    for fd in streams:
        poller.register(fd, select.POLLIN)
    poller.register(connection_fd, select.POLLRDHUP)
    try:
        while streams:
            for fd, events in poller.poll():
                if fd == connection_fd:
                    if events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR):
                        proc.terminate()  # the caller is gone: its command ends
                        poller.unregister(connection_fd)
                    continue
                data = os.read(fd, 65536)
                if not data:
                    poller.unregister(fd)
                    del streams[fd]
                elif send_more is not None and streams[fd] is out:
                    import base64

                    send_more({"stdout": base64.b64encode(data).decode()})
                else:
                    streams[fd](data)
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return {"exit_code": code, "stdout": out.text(), "stderr": err.text()}
