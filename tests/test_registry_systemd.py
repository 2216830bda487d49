"""Issue 5 against a real manager: credentials, environment, ps/stop/gc for units
(run under tests/harness/with-user-manager; see tests/run)."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CORRAL
from modes import mode_flags
from procscan import marked_pids
from test_registry import (CRED_PROBE, SECRET, _assert_secret_nowhere, _secret_file, ctl, env_for, events, markers,  # noqa: F401
                           run_ids, state, wait_for)

pytestmark = pytest.mark.systemd
UNIT_TYPES = ["scope", "service"]


def _unit_state(unit: str) -> str:
    r = subprocess.run(["systemctl", "--user", "show", "-P", "ActiveState", unit], capture_output=True, text=True)
    return r.stdout.strip() or "gone"


@pytest.mark.parametrize("unit_type", UNIT_TYPES)
def test_credential_readable_then_gone(state, tmp_path, unit_type):
    src, where, rec = _secret_file(tmp_path), tmp_path / "where", tmp_path / "r.json"
    proc = subprocess.run([*CORRAL, *mode_flags(unit_type), "--json", str(rec), "--credential", f"api={src}", "--",
                           "sh", "-c", CRED_PROBE.format("exit 0"), "probe", str(src), str(where)],
                          env=env_for(state), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "match", proc.stderr
    assert not Path(where.read_text().strip()).exists()
    assert json.loads(rec.read_text())["credentials"] == ["api"]
    _assert_secret_nowhere(state, rec.read_text(), proc.stdout, proc.stderr)


@pytest.mark.parametrize("unit_type", UNIT_TYPES)
def test_credential_gone_and_unit_stopped_when_corral_is_sigkilled(state, tmp_path, markers, unit_type):
    src, where, marker = _secret_file(tmp_path), tmp_path / "where", markers()
    proc = subprocess.Popen([*CORRAL, *mode_flags(unit_type), "--grace", "500ms", "--credential", f"api={src}", "--",
                             "sh", "-c", 'echo "$CREDENTIALS_DIRECTORY" > "$0"; setsid sleep 60 & sleep 60', str(where)],
                            env=env_for(state, marker), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: where.exists() and where.read_text().strip(), timeout=20)
    cred_dir = Path(where.read_text().strip())
    assert (cred_dir / "api").read_text() == SECRET
    [run_id] = run_ids(state)
    unit = f"corral-{run_id}.{unit_type}"
    rows = json.loads(ctl(state, "ps", "--json").stdout)
    assert rows[0]["unit"] == unit and rows[0]["processes"] == 3, rows
    proc.kill()
    proc.wait()
    wait_for(lambda: not cred_dir.exists(), timeout=2)
    wait_for(lambda: _unit_state(unit) in ("inactive", "failed", "gone") and not marked_pids(marker), timeout=10)
    r = ctl(state, "gc")
    assert r.returncode == 0 and run_id in r.stdout, r.stdout + r.stderr
    entry = json.loads((state / f"{run_id}.json").read_text())
    assert entry["state"] == "finished" and entry["outcome"] == "reclaimed" and entry["verified"] is True
    assert ctl(state, "audit", "verify", run_id).returncode == 0
    _assert_secret_nowhere(state)


@pytest.mark.parametrize("unit_type", UNIT_TYPES)
def test_env_clear_keep_path(state, unit_type):
    env = env_for(state, SOME_TOKEN=SECRET)
    proc = subprocess.run([*CORRAL, *mode_flags(unit_type), "--env-clear", "--env-keep", "PATH", "--", "env"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    names = sorted(line.split("=", 1)[0] for line in proc.stdout.splitlines())
    # services: systemd sets MANAGERPID and SYSTEMD_EXEC_PID for every service (documented)
    expected = ["PATH"] if unit_type == "scope" else ["MANAGERPID", "PATH", "SYSTEMD_EXEC_PID"]
    assert names == expected


def test_stop_through_owner_and_gc_of_ownerless_unit(state, markers):
    """stop: corral's own verified stop. gc: a unit whose corral is gone (the tether is
    the proof) is stopped; a unit whose corral lives is left alone."""
    procs = [subprocess.Popen([*CORRAL, *mode_flags("scope"), "--", "sh", "-c", "sleep 60 & sleep 60"],
                              env=env_for(state, markers()), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(2)]
    try:
        ids = wait_for(lambda: (lambda i: i if len(i) == 2 else None)(run_ids(state)), timeout=20)
        wait_for(lambda: all(r["processes"] == 3 for r in json.loads(ctl(state, "ps", "--json").stdout)), timeout=20)
        r = ctl(state, "stop", ids[0])
        assert r.returncode == 0 and "verified" in r.stdout, r.stdout + r.stderr
        assert _unit_state(f"corral-{ids[0]}.scope") in ("inactive", "failed", "gone")
        r = ctl(state, "gc", "--json")
        assert json.loads(r.stdout)["reclaimed"] == []  # the live one is not touched
        assert _unit_state(f"corral-{ids[1]}.scope") == "active"
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)
