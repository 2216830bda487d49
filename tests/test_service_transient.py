"""The corral service with no install step (``service/transient.py``).

``service_unit`` (run alone, in the harness: the transient pair listens at
the default socket path, which every corral of the user would then use):
nothing installed, the first run starts ``corral-transient.socket`` +
``.service`` and is served (the record's ``via``), a second reuses that
service, it exits when idle and its socket brings it back, clients at once
start one service, an installed service wins, ``CORRAL_SERVICE=0`` and
``=installed`` start nothing. Each test stops the pair it made.

Without a manager: a pair of that name that is not this corral's is not used.
"""

import json
import os
import socket
import subprocess
import sys

import pytest
from serving import compiled_client  # noqa: F401  (fixture)
from test_registry import wait_for

from conftest import CORRAL, TIME_SCALE
from corral_systemd.common.programs import manager_for, socket_paths
from corral_systemd.common.unit_names import TRANSIENT_SERVICE
from corral_systemd.service import transient
from corral_systemd.varlink.wire import Channel
from modes import MANAGER

SYSTEMCTL = ["systemctl", *(["--user"] if MANAGER == "user" else [])]
SOCKET_UNIT, SERVICE_UNIT = f"{TRANSIENT_SERVICE}.socket", f"{TRANSIENT_SERVICE}.service"


def _user_env(**extra) -> dict:
    """As a user has it: no test socket, the default registry (the service's), start allowed."""
    env = dict(os.environ, **extra)
    for name in ("CORRAL_SERVICE_SOCKET", "CORRAL_STATE_DIR"):
        env.pop(name, None)
    if "CORRAL_SERVICE" not in extra:
        env.pop("CORRAL_SERVICE", None)
    return env


def _socket_path(monkeypatch) -> str:
    """The manager's socket path the client would start the service at ("" if none here)."""
    for name in ("CORRAL_SERVICE_SOCKET", "CORRAL_SERVICE"):
        monkeypatch.delenv(name, raising=False)
    return next((p for p in socket_paths() if manager_for(p) == MANAGER), "")


def _unit(unit: str, prop: str) -> str:
    out = subprocess.run([*SYSTEMCTL, "show", f"--property={prop}", "--value", unit], capture_output=True, text=True)
    return out.stdout.strip()


def _loaded() -> bool:
    return any(_unit(u, "LoadState") == "loaded" for u in (SOCKET_UNIT, SERVICE_UNIT))


def _status(path: str) -> dict:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(60 * TIME_SCALE)
    sock.connect(path)
    try:
        return Channel(sock).call("io.corral.Run.Status", {})[0]
    finally:
        sock.close()


def _run(argv: list[str], env: dict, *command: str) -> dict:
    """One run's record (``--json -``), which must say it ran."""
    proc = subprocess.run(
        [*argv, "--json", "-", "--quiet", "--", *(command or ["true"])],
        env=env,
        capture_output=True,
        timeout=180 * TIME_SCALE,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def nothing_installed(monkeypatch):
    """No corral service at the manager's socket before; the transient pair stopped after."""
    with monkeypatch.context() as patched:
        path = _socket_path(patched)
    if not path:
        pytest.skip(f"no {MANAGER} manager's private socket for this uid")
    assert not os.path.exists(path) and not _loaded(), "a corral service is already there"
    yield path
    subprocess.run([*SYSTEMCTL, "stop", SOCKET_UNIT, SERVICE_UNIT], capture_output=True)
    subprocess.run([*SYSTEMCTL, "reset-failed", SOCKET_UNIT, SERVICE_UNIT], capture_output=True)
    wait_for(lambda: not _loaded(), timeout=60)


@pytest.fixture(params=["python", "compiled"])
def any_client(request) -> list[str]:
    if request.param == "python":
        return list(CORRAL)
    return request.getfixturevalue("compiled_client")


@pytest.mark.service_unit
def test_the_first_run_starts_the_service_and_the_next_reuses_it(nothing_installed, any_client):
    env = _user_env(CORRAL_SERVICE_DEBUG="1")
    assert _run(any_client, env)["via"] == "service"
    assert _unit(SOCKET_UNIT, "ActiveState") == "active" and _unit(SOCKET_UNIT, "Transient") == "yes"
    first = _status(nothing_installed)
    assert str(first["pid"]) == _unit(SERVICE_UNIT, "MainPID")
    assert _run(any_client, env)["via"] == "service"
    again = _status(nothing_installed)
    assert again["pid"] == first["pid"] and again["runs_served"] == first["runs_served"] + 1


@pytest.mark.service_unit
def test_it_exits_when_idle_and_its_socket_brings_it_back(nothing_installed):
    env = _user_env()
    assert _run(CORRAL, env)["via"] == "service"
    first = _status(nothing_installed)["pid"]
    # transient.IDLE_EXIT (60 s) with no connection: the service ends, its socket stays.
    wait_for(lambda: _unit(SERVICE_UNIT, "ActiveState") == "inactive", timeout=transient.IDLE_EXIT * 3)
    assert _unit(SOCKET_UNIT, "ActiveState") == "active"
    assert _run(CORRAL, env)["via"] == "service"
    assert _status(nothing_installed)["pid"] != first


@pytest.mark.service_unit
def test_clients_starting_it_at_once_end_with_one_service(nothing_installed):
    env = _user_env(CORRAL_SERVICE_DEBUG="1")
    procs = [
        subprocess.Popen(
            [*CORRAL, "--json", "-", "--quiet", "--", "true"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=180 * TIME_SCALE) for p in procs]
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0 and json.loads(out)["via"] == "service", err
    status = _status(nothing_installed)
    assert status["runs_served"] == 4 and str(status["pid"]) == _unit(SERVICE_UNIT, "MainPID")


@pytest.mark.service_unit
def test_an_installed_service_wins(nothing_installed, tmp_path):
    ctl = [sys.executable, "-m", "corral_systemd.ctl", "service"]
    flag = "--system" if MANAGER == "system" else "--user"
    env = _user_env()
    install = subprocess.run([*ctl, "install", flag, "--runtime"], env=env, capture_output=True, text=True, timeout=120)
    assert install.returncode == 0, install.stderr
    try:
        assert _run(CORRAL, env)["via"] == "service"
        assert str(_status(nothing_installed)["pid"]) == _unit("corral.service", "MainPID")
        assert not _loaded()
    finally:
        uninstall = subprocess.run([*ctl, "uninstall", flag], env=env, capture_output=True, text=True, timeout=120)
        assert uninstall.returncode == 0, uninstall.stderr


@pytest.mark.service_unit
@pytest.mark.parametrize("knob", ["0", "installed"])
def test_corral_service_0_or_installed_starts_nothing(nothing_installed, any_client, knob):
    assert _run(any_client, _user_env(CORRAL_SERVICE=knob))["via"] == "cli"
    assert not _loaded() and not os.path.exists(nothing_installed)


def _shown(exec_argv: str, pythonpath: str, listen: str):
    def show(unit: str, props: list[str]) -> dict[str, str]:
        if unit.endswith(".socket"):
            return {"LoadState": "loaded", "Listen": f"{listen} (Stream)"}
        return {
            "LoadState": "loaded",
            "ExecStart": f"{{ path=x ; argv[]={exec_argv} ; ignore_errors=no ; pid=0 }}",
            "Environment": f"PYTHONPATH={pythonpath}",
        }

    return show


def test_a_pair_of_that_name_that_is_not_this_corrals_is_not_used():
    path = "/run/user/1000/io.corral.Run"
    ours = " ".join(transient.service_command("user"))
    root = transient.package_root()
    assert transient.not_ours("user", path, _shown(ours, root, path)) is None
    for shown in (
        _shown("/tmp/fake -m corral_systemd.service --manager user --idle-exit 60", root, path),
        _shown(ours, "/tmp/elsewhere", path),
        _shown(ours, root, "/tmp/io.corral.Run"),
    ):
        why = transient.not_ours("user", path, shown)
        assert why is not None and "not this corral's" in why
    assert "could not be made" in transient.not_ours("user", path, lambda unit, props: {})
