"""--network none: the command's network namespace is not corral's and
holds only lo (up: a server on 127.0.0.1 answers), in every engine; where
it cannot be had, the command never runs (125, one line)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import CORRAL
from modes import MANAGER, all_modes, mode_flags, scope_flag

#: Prints its network namespace, its interfaces and uid (after a connection
#: over its own lo), and, given a port, what connecting to 127.0.0.1:PORT did.
PROBE = (
    "import json, os, socket, sys\n"
    "with open('/proc/self/net/dev') as f:\n"
    "    ifaces = [line.split(':')[0].strip() for line in f if ':' in line]\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "c = socket.create_connection(s.getsockname(), timeout=5)\n"
    "out = [os.readlink('/proc/self/ns/net'), ifaces, os.getuid()]\n"
    "if len(sys.argv) > 1:\n"
    "    try:\n"
    "        socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5).close(); out.append('connected')\n"
    "    except OSError as e:\n"
    "        out.append(type(e).__name__)\n"
    "print(json.dumps(out))\n"
)

HOW = {
    "fallback": ("netns", "userns+netns"),
    "pidns": ("userns+netns",),
    "scope": ("netns", "userns+netns"),
    "cgroup-parent": ("netns", "userns+netns"),
    "service": ("PrivateNetwork",),
}


@pytest.fixture
def host_server():
    """A server on the host's 127.0.0.1 (the test's network namespace): its port."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("mode", all_modes())
def test_network_none_leaves_only_loopback(corral, host_server, mode, tmp_path):
    """Its own lo works; the host's 127.0.0.1 server is out of reach (refused).
    A user manager's service cannot have it (systemd 252 would run the command
    on the host's network): 125, one line, the command never runs."""
    if mode == "service" and MANAGER == "user":
        witness = tmp_path / "ran"
        run = corral(mode_flags(mode) + ["--network", "none", "--", "touch", str(witness)])
        assert run.returncode == 125, run.stderr
        lines = run.stderr.decode().strip().splitlines()
        assert len(lines) == 1 and "user manager's service" in lines[0], lines
        assert not witness.exists()
        return
    run = corral(mode_flags(mode) + ["--network", "none", "--", "python3", "-c", PROBE, str(host_server)])
    assert run.returncode == 0, run.stderr
    netns, ifaces, uid, outside = json.loads(run.stdout)
    assert netns != os.readlink("/proc/self/ns/net")
    assert ifaces == ["lo"] and uid == os.getuid()
    assert outside == "ConnectionRefusedError"
    assert run.record["engine"]["network"] in HOW[mode], run.record["engine"]
    assert run.survivors == []


@pytest.mark.parametrize("mode", all_modes())
def test_without_network_none_the_command_shares_corrals_network(corral, host_server, mode):
    run = corral(mode_flags(mode) + ["--", "python3", "-c", PROBE, str(host_server)])
    assert run.returncode == 0, run.stderr
    netns, _, _, outside = json.loads(run.stdout)
    assert netns == os.readlink("/proc/self/ns/net") and outside == "connected"
    assert run.record["engine"]["network"] is None


@pytest.mark.systemd
@pytest.mark.parametrize("mode", ["fallback", "scope"])
def test_network_none_that_cannot_be_had_never_runs_the_command(tmp_path, mode):
    """corral inside a unit whose namespaces are restricted (RestrictNamespaces=,
    a seccomp filter): its child cannot leave the network namespace, and the
    command never runs -- 125, one line, not a run on the host's network."""
    if shutil.which("systemd-run") is None:
        pytest.skip("systemd-run")
    witness = tmp_path / "ran"
    argv = [*CORRAL, "--no-registry", *mode_flags(mode), "--network", "none", "--", "touch", str(witness)]
    proc = subprocess.run(
        [
            "systemd-run",
            *scope_flag(),
            "--quiet",
            "--wait",
            "--pipe",
            "--collect",
            "-p",
            "RestrictNamespaces=yes",
            "-p",
            f"WorkingDirectory={os.getcwd()}",
            "--setenv",
            f"PYTHONPATH={os.pathsep.join(sys.path)}",
            "--setenv",
            f"PATH={os.environ['PATH']}",
            # the unit has the manager's environment, not the suite's: no transient service (tests/conftest.py)
            "--setenv",
            "CORRAL_SERVICE=installed",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 125, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--network none: not in place" in lines[0], lines
    assert not witness.exists()


@pytest.mark.systemd
def test_a_runner_scope_refuses_network_none_and_runs_nothing(tmp_path):
    """A library Runner's scopes are spawned without forking the host, so
    the command could not leave the network namespace: SetupError, never a
    run on the host's network."""
    witness = tmp_path / "ran"
    code = (
        "import corral_systemd as corral, sys\n"
        "try:\n"
        f"    corral.run(['touch', {str(witness)!r}], mode='enforced', unit_type='scope', network='none')\n"
        "except corral.SetupError as e:\n"
        "    print('SetupError', e)\n"
        "except corral.CorralError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("SetupError") and "--network none" in out.stdout, out.stdout
    assert not witness.exists()


def test_a_user_who_is_not_root_gets_a_user_namespace_first(tmp_path):
    """Not root: the child makes a user namespace (its own uid and gid mapped
    to themselves) to own the new network namespace; the command is still
    that user, and has only lo."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another user")
    import tempfile

    uid = 55000 + os.getpid() % 1000
    top = tempfile.mkdtemp(prefix="corral-test-home-", dir="/tmp")  # pytest's tmp_path is root's, 0700
    os.chmod(top, 0o755)
    home = os.path.join(top, "home")
    os.mkdir(home, 0o700)
    os.chown(home, uid, uid)
    record = os.path.join(home, "r.json")
    try:
        _run_as(uid, home, record)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _run_as(uid: int, home: str, record: str) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": home}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    proc = subprocess.run(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            *CORRAL,
            "--no-registry",
            "--cgroup-mode",
            "fallback",
            "--network",
            "none",
            "--json",
            str(record),
            "--",
            "python3",
            "-c",
            PROBE,
        ],
        env=env,
        cwd=str(home),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    netns, ifaces, seen_uid = json.loads(proc.stdout)
    assert netns != os.readlink("/proc/self/ns/net") and ifaces == ["lo"] and seen_uid == uid
    with open(record) as f:
        assert json.load(f)["engine"]["network"] == "userns+netns"
