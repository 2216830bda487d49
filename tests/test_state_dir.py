"""The command cannot crash corral through its state directory (issue 13, items 4 and 6).

A command that removes corral's state directory or fills its filesystem
makes registry writes fail after the start: corral reports it (one stderr
line, the record's warnings) and still stops the run and proves it empty.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import CORRAL
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

FB = ["--cgroup-mode", "fallback"]


def _state_env(state: str) -> dict:
    return dict(os.environ, CORRAL_STATE_DIR=state)


@pytest.mark.parametrize(
    "script,expected",
    [
        ('rm -rf "$CORRAL_STATE_DIR"; setsid sleep 600 & sleep 600', 124),  # fails at deadline_expired
        ('rm -rf "$CORRAL_STATE_DIR"; setsid sleep 600 & exit 3', 3),  # fails at command_exited/finished
    ],
)
def test_command_removing_the_state_directory(corral, tmp_path, script, expected):
    state = tmp_path / "state"
    run = corral(FB + ["--wall", "1s", "--", "sh", "-c", script], env=_state_env(str(state)))
    err = run.stderr.decode(errors="replace")
    assert "Traceback" not in err
    assert run.returncode == expected, err
    assert run.survivors == []
    assert run.record is not None and run.record["verified"] is True
    registry_lines = [line for line in err.splitlines() if "registry:" in line]
    assert len(registry_lines) == 1, err
    assert any(w.startswith("registry: could not record") for w in run.record["warnings"])
    assert err.splitlines()[-1].startswith("corral: fallback: ")  # the summary is there


def test_command_filling_the_state_filesystem(tmp_path):
    """ENOSPC on a small tmpfs (own mount namespace: needs root and unshare)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    marker = new_marker()
    record = tmp_path / "record.json"
    inner = f'mount -t tmpfs -o size=256k tmpfs {mnt} || exit 99; CORRAL_STATE_DIR={mnt}/state exec "$@"'
    argv = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        inner,
        "sh",
        *CORRAL,
        *FB,
        "--json",
        str(record),
        "--wall",
        "1s",
        "--",
        "sh",
        "-c",
        f"cat /dev/zero > {mnt}/fill 2>/dev/null; setsid sleep 600 & sleep 600",
    ]
    try:
        proc = subprocess.run(
            argv,
            env=dict(os.environ, **{MARKER_ENV: marker}),
            capture_output=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        survivors = marked_pids(marker)
    finally:
        kill_marked(marker)
    if proc.returncode == 99:
        pytest.skip("cannot mount a tmpfs here")
    err = proc.stderr.decode(errors="replace")
    assert "Traceback" not in err
    assert proc.returncode == 124, err
    assert survivors == []
    data = json.loads(record.read_text())
    assert data["verified"] is True
    assert any("No space left on device" in w for w in data["warnings"]), data["warnings"]


def test_state_dir_with_a_missing_parent_is_125_and_creates_nothing(tmp_path):
    state = tmp_path / "missing" / "state"
    witness = tmp_path / "ran"
    proc = subprocess.run(
        [*CORRAL, *FB, "--", "touch", str(witness)],
        env=_state_env(str(state)),
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 125, err
    assert len(err.splitlines()) == 1 and "does not exist" in err
    assert not (tmp_path / "missing").exists()
    assert not witness.exists()


def test_state_dir_last_component_is_created_private(tmp_path):
    state = tmp_path / "state"
    proc = subprocess.run(
        [*CORRAL, *FB, "--quiet", "--", "true"],
        env=_state_env(str(state)),
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert state.is_dir() and state.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("home", ["/", "/nonexistent"])
def test_a_user_without_a_private_state_location_runs_unregistered(home):
    """An arbitrary uid in a container (``docker run -u 1234``): no runtime
    directory, a HOME that is not its own. The run goes on, unregistered,
    with one warning, and its record says so; corralctl says it knows
    nothing (before: 125 "cannot register the run" for every run)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another user")
    marker = new_marker()
    uid = 51234
    env = {"PATH": os.environ["PATH"], "HOME": home, "CORRAL_SERVICE": "0", MARKER_ENV: marker}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    as_user = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    try:
        proc = subprocess.run(
            [*as_user, *CORRAL, *FB, "--json", "-", "--", "sh", "-c", "echo hi; setsid sleep 600 & exit 0"],
            env=env,
            capture_output=True,
            cwd="/",
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout.decode()
        assert out.startswith("hi\n")
        record = json.loads(out[3:])
        assert record["registry"] == "unavailable" and record["verified"] and not marked_pids(marker)
        warnings = [line for line in proc.stderr.decode().splitlines() if "warning" in line]
        assert len(warnings) == 1 and "not registered" in warnings[0], proc.stderr
        ctl = [sys.executable, "-m", "corral_systemd.ctl"]
        for args, code in ((["status", record["run_id"]], 12), (["ps"], 0)):
            said = subprocess.run([*as_user, *ctl, *args], env=env, capture_output=True, text=True, timeout=60)
            assert said.returncode == code and "no run registry" in said.stdout + said.stderr, said
        # Asked for by name: that directory, or nothing runs (125, one line).
        proc = subprocess.run(
            [*as_user, *CORRAL, *FB, "--", "true"],
            env={**env, "CORRAL_STATE_DIR": "/"},
            capture_output=True,
            cwd="/",
            timeout=120,
        )
        assert proc.returncode == 125 and b"cannot register" in proc.stderr, proc.stderr
    finally:
        kill_marked(marker)
