"""Issue 14: no secret in a unit's properties.

A unit's properties are visible to everyone who may ask its manager
(``systemctl show``; for the system manager any local user), and a
transient unit's file too. So Description= carries the argv redacted as the
registry redacts it, and a service's environment goes to a private file the
unit only names (EnvironmentFiles=), removed once the start job is done:
no value of any variable, and no secret-looking argument's value, is in any
property. What stays visible: a service's ExecStart= (its argv verbatim; see
README, Security). Run under tests/harness/with-user-manager.
"""

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from modes import manager_runtime_dir, mode_flags, systemctl

pytestmark = pytest.mark.systemd

TRICKY = {
    "CORRAL_T_QUOTES": "a'b\"c",
    "CORRAL_T_BACKSLASH": "back\\slash\\\\ and \\n not a newline",
    "CORRAL_T_DOLLAR": "$HOME ${HOME} $$ `id` $(id)",
    "CORRAL_T_NEWLINE": "line1\nline2\n",
    "CORRAL_T_SPACES": "  lead and trail  \t",
    "CORRAL_T_HASH": "# not a comment; ; x=y",
    "CORRAL_T_EMPTY": "",
    "CORRAL_T_UNICODE": "żółw ✓",
}


def _unit_for(tag: str, timeout: float = 15) -> str:
    """The corral unit whose Description carries ``tag`` (an argument of its command)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        out = systemctl("list-units", "--all", "--no-legend", "--plain", "corral-*").stdout
        for line in out.splitlines():
            if tag in line:
                return line.split()[0]
        time.sleep(0.05)
    raise AssertionError(f"no unit for {tag}")


def _everything_about(unit: str) -> str:
    """Every property of the unit, and its transient unit file."""
    text = systemctl("show", "--all", unit).stdout
    transient = os.path.join(manager_runtime_dir(), "systemd", "transient", unit)
    try:
        with open(transient) as f:
            text += f.read()
    except FileNotFoundError:
        pass
    return text


def _start(args, env, tmp_path):
    record = tmp_path / "record.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral_systemd", "--json", str(record), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return proc, record


@pytest.mark.parametrize("mode", ["service", "scope"])
def test_no_secret_value_in_any_unit_property(tmp_path, marker, mode):
    tag = "tag-" + uuid.uuid4().hex
    secrets = {
        "API_TOKEN": "tokval-" + uuid.uuid4().hex,
        "DB_PASSWORD": "pwval-" + uuid.uuid4().hex,
        "PLAIN": "plainval-" + uuid.uuid4().hex,
    }
    arg_secrets = ["hunter-" + uuid.uuid4().hex, "bearer-" + uuid.uuid4().hex, "urlpw-" + uuid.uuid4().hex]
    dump = tmp_path / "env.json"
    script = tmp_path / "d.py"
    script.write_text(
        "import json, os, sys, time\n"
        f"json.dump({{'env': dict(os.environ), 'argv': sys.argv}}, open({str(dump)!r}, 'w'))\n"
        "time.sleep(1.5)\n"
    )
    argv = [
        sys.executable,
        str(script),
        tag,
        f"--password={arg_secrets[0]}",
        f"Authorization: Bearer {arg_secrets[1]}",
        f"https://user:{arg_secrets[2]}@example.invalid/",
    ]
    env = dict(os.environ, CORRAL_TEST_MARKER=marker, **secrets, **TRICKY)
    proc, record = _start([*mode_flags(mode), "--", *argv], env, tmp_path)
    try:
        unit = _unit_for(tag)
        end = time.monotonic() + 10
        while not dump.exists() and time.monotonic() < end:
            time.sleep(0.05)
        seen = _everything_about(unit)
    finally:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    # Environment values: in no property, for no variable (not only secret-looking ones).
    for name, value in {**secrets, **TRICKY}.items():
        if len(value.strip()) >= 6:
            assert value not in seen, f"value of {name} visible in {unit}'s properties"
    assert "Environment=API_TOKEN" not in seen and "tokval-" not in seen
    # Secret-looking arguments: not in the Description.
    description = [line for line in seen.splitlines() if line.startswith("Description=")]
    assert description and tag in description[0] and "[redacted]" in description[0], description
    for value in arg_secrets:
        assert value not in description[0]
    if mode == "scope":
        for value in arg_secrets:
            assert value not in seen
    # The command got its environment and argv exactly.
    got = json.loads(dump.read_text())
    for name, value in {**secrets, **TRICKY}.items():
        assert got["env"].get(name) == value, name
    assert got["argv"][1:] == argv[2:]


def test_service_environment_file_is_gone_once_the_command_runs(tmp_path, marker):
    tag = "tag-" + uuid.uuid4().hex
    flag = tmp_path / "running"
    argv = [sys.executable, "-c", f"{tag!r}; import time; open({str(flag)!r}, 'w').close(); time.sleep(1)", tag]
    env = dict(os.environ, CORRAL_TEST_MARKER=marker, API_TOKEN="x" * 20)
    proc, record = _start([*mode_flags("service"), "--", *argv], env, tmp_path)
    try:
        unit = _unit_for(tag)
        end = time.monotonic() + 10
        while not flag.exists() and time.monotonic() < end:
            time.sleep(0.02)
        files = systemctl("show", "-p", "EnvironmentFiles", "--value", unit).stdout.split()
        time.sleep(0.2)  # corral removes it when it reads the start job's end
        paths = [f for f in files if f.startswith("/")]
        assert paths, files
        for path in paths:
            assert not os.path.exists(path), f"{path} still there while the command runs"
            directory = os.path.dirname(path)
            assert os.stat(directory).st_mode & 0o777 == 0o700
            assert all(not n.startswith(unit[len("corral-") : -len(".service")]) for n in os.listdir(directory))
    finally:
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert json.loads(record.read_text())["verified"] is True


def test_service_that_cannot_start_leaves_no_environment_file(tmp_path, marker):
    """The manager refuses the unit (an invalid slice name): 125, and the
    environment file written for it is removed all the same."""
    env = dict(os.environ, CORRAL_TEST_MARKER=marker, API_TOKEN="y" * 20)
    proc, record = _start([*mode_flags("service"), "--slice", "bad name.slice", "--", "true"], env, tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 125, err.decode()
    run_id = json.loads(record.read_text())["run_id"]
    for directory in (
        os.path.join(os.environ.get("XDG_RUNTIME_DIR", "/nonexistent"), "corral-env"),
        "/run/corral-env",
        f"/dev/shm/corral-env-{os.geteuid()}",
    ):
        if os.path.isdir(directory):
            assert [n for n in os.listdir(directory) if n.startswith(run_id)] == []
