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
from modes import all_modes, mode_flags, scope_flag

#: Prints its network namespace, its interfaces, and whether lo carries a connection.
PROBE = (
    "import json, os, socket\n"
    "with open('/proc/self/net/dev') as f:\n"
    "    ifaces = [line.split(':')[0].strip() for line in f if ':' in line]\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "c = socket.create_connection(s.getsockname(), timeout=5)\n"
    "print(json.dumps([os.readlink('/proc/self/ns/net'), ifaces, os.getuid()]))\n"
)

HOW = {
    "fallback": ("netns", "userns+netns"),
    "scope": ("netns", "userns+netns"),
    "cgroup-parent": ("netns", "userns+netns"),
    "service": ("PrivateNetwork", "PrivateNetwork+PrivateUsers"),
}


@pytest.mark.parametrize("mode", all_modes())
def test_network_none_leaves_only_loopback(corral, mode):
    run = corral(mode_flags(mode) + ["--network", "none", "--", "python3", "-c", PROBE])
    assert run.returncode == 0, run.stderr
    netns, ifaces, uid = json.loads(run.stdout)
    assert netns != os.readlink("/proc/self/ns/net")
    assert ifaces == ["lo"] and uid == os.getuid()
    assert run.record["engine"]["network"] in HOW[mode], run.record["engine"]
    assert run.survivors == []


@pytest.mark.parametrize("mode", all_modes())
def test_without_network_none_the_command_shares_corrals_network(corral, mode):
    run = corral(mode_flags(mode) + ["--", "python3", "-c", PROBE])
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)[0] == os.readlink("/proc/self/ns/net")
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
