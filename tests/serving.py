"""The corral service and both corral clients, as the tests start them.

``Service`` is ``python -m corral_systemd.service --socket PATH`` as a
child of the test; ``client`` (a fixture) the argv of each client: the
Python one (pip installs without a compiler) and the compiled one (the
.deb; packaging/client/corral.c built as the .deb builds it).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_registry import wait_for

from conftest import CORRAL, TIME_SCALE
from corral_systemd.varlink.wire import Channel
from modes import MANAGER
from procscan import MARKER_ENV


class Service:
    """``python -m corral_systemd.service --socket PATH`` as a child of the test."""

    def __init__(self, directory: Path, *extra: str, env=None):
        self.path = str(directory / "io.corral.Run")
        self.log = directory / "service.log"
        # A test's service lives as long as its fixture: the default idle exit
        # (60 s) ended a module's service between two of its tests on a slow
        # guest, and its clients then ran the command themselves.
        idle = [] if "--idle-exit" in extra else ["--idle-exit", "86400"]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "corral_systemd.service",
                "--socket",
                self.path,
                "--manager",
                MANAGER,
                *idle,
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "wb"),
            env=env,
        )
        # Listening, not only bound: the socket file exists a moment before listen().
        wait_for(lambda: self._answers() or self.proc.poll() is not None, timeout=60)
        assert self.proc.poll() is None, self.log.read_text()

    def _answers(self) -> bool:
        try:
            self.channel().sock.close()
            return True
        except OSError:
            return False

    def channel(self) -> Channel:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(30 * TIME_SCALE)
        sock.connect(self.path)
        return Channel(sock)

    def status(self) -> dict:
        return self.channel().call("io.corral.Run.Status", {})[0]

    def alive(self) -> bool:
        """The process runs and answers a call."""
        return self.proc.poll() is None and self.status()["pid"] == self.proc.pid

    def env(self, **extra) -> dict:
        return dict(os.environ, CORRAL_SERVICE_SOCKET=self.path, **extra)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=120)


@pytest.fixture
def service(tmp_path):
    svc = Service(tmp_path)
    yield svc
    svc.stop()


REPO = Path(__file__).resolve().parent.parent
CLIENT_BUILD = REPO / "packaging" / "client" / "build"


@pytest.fixture(scope="session")
def compiled_client(tmp_path_factory) -> list[str]:
    """packaging/client/corral.c built as the .deb builds it, its way back
    in-process being this interpreter's ``client.entry_in_process``. Without
    a compiler (the VM lane's guest): the one this interpreter's install
    built (setup.py; the lane's wheel is built on the host)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        installed = Path(sys.executable).parent / "corral"
        if installed.exists() and installed.read_bytes()[:4] == b"\x7fELF":
            return [str(installed)]
        pytest.skip("no C compiler (tests/run installs gcc) and no compiled corral installed")
    work = tmp_path_factory.mktemp("client")
    in_process = work / "corral-inprocess"
    in_process.write_text(
        f"#!{sys.executable} -I\nfrom corral_systemd.client import entry_in_process\n\nentry_in_process()\n"
    )
    in_process.chmod(0o755)
    binary = work / "corral"
    subprocess.run(
        ["sh", CLIENT_BUILD, binary, in_process],
        env=dict(os.environ, CC=cc, CFLAGS="-O2 -Werror"),
        check=True,
        timeout=120,
    )
    return [str(binary)]


@pytest.fixture(params=["python", "compiled"])
def client(request) -> list[str]:
    """The argv of each corral client: the Python one (pip installs) and the compiled one (the .deb)."""
    if request.param == "python":
        return list(CORRAL)
    return request.getfixturevalue("compiled_client")


def run_corral(svc, args, *, marker=None, cwd=None, env=None, timeout=120, client=CORRAL, **kw):
    """``client`` with ``args``, its environment pointing at ``svc``."""
    full = svc.env() if env is None else env
    if marker:
        full[MARKER_ENV] = marker
    return subprocess.run([*client, *args], env=full, cwd=cwd, capture_output=True, timeout=timeout, **kw)
