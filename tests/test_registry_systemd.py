"""Issue 5 against a real manager: credentials, environment, ps/stop/gc for units
(run under tests/harness/with-user-manager; see tests/run).

Credentials: a scope gets corral's private directory, a service systemd's own
($XDG_RUNTIME_DIR/credentials/<unit>, LoadCredential=), checked inside the unit
before the command runs."""

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from test_registry import (
    CRED_PROBE,
    SECRET,
    _assert_secret_nowhere,
    _secret_file,
    ctl,
    env_for,
    events,
    markers,
    run_ids,
    state,
    wait_for,
)

from conftest import CORRAL, scale_walls
from modes import MANAGER, manager_runtime_dir, mode_flags, scope_flag, unit_property, without_pid_namespaces
from procscan import marked_pids

pytestmark = pytest.mark.systemd
UNIT_TYPES = ["scope", "service"]


def _unit_state(unit: str) -> str:
    return unit_property(unit, "ActiveState") or "gone"


def _systemd_credentials_dir(unit: str) -> Path:
    return Path(manager_runtime_dir()) / "credentials" / unit


DELIVERY = {"scope": "corral", "service": "systemd"}


@pytest.mark.parametrize("unit_type", UNIT_TYPES)
def test_credential_readable_then_gone(state, tmp_path, unit_type):
    src, where, rec = _secret_file(tmp_path), tmp_path / "where", tmp_path / "r.json"
    # an inherited $CREDENTIALS_DIRECTORY must not win over the run's own
    env = env_for(state, CREDENTIALS_DIRECTORY=str(tmp_path))
    proc = subprocess.run(
        [
            *CORRAL,
            *mode_flags(unit_type),
            "--json",
            str(rec),
            "--credential",
            f"api={src}",
            "--",
            "sh",
            "-c",
            CRED_PROBE.format("exit 0"),
            "probe",
            str(src),
            str(where),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "match", proc.stderr
    cred_dir = Path(where.read_text().strip())
    record = json.loads(rec.read_text())
    unit = record["engine"]["unit"]
    if unit_type == "service":
        assert cred_dir == _systemd_credentials_dir(unit)  # systemd's, not corral's
    else:
        assert cred_dir.is_relative_to(state)
    assert not cred_dir.exists()  # gone when corral returns
    assert record["credentials"] == ["api"] and record["credentials_delivery"] == DELIVERY[unit_type]
    entry = json.loads((state / f"{record['run_id']}.json").read_text())
    assert entry["credentials"] == ["api"] and entry["credentials_delivery"] == DELIVERY[unit_type]
    assert entry["credentials_directory"] == (None if unit_type == "service" else str(cred_dir))
    assert entry["helper_pids"] == [] if unit_type == "service" else len(entry["helper_pids"]) == 1
    _assert_secret_nowhere(state, rec.read_text(), proc.stdout, proc.stderr)


def test_service_credentials_are_systemds_and_gone_after_a_timeout(state, tmp_path):
    src, where, rec = _secret_file(tmp_path), tmp_path / "where", tmp_path / "r.json"
    (tmp_path / "second").write_text("two")
    proc = subprocess.run(
        [
            *CORRAL,
            *mode_flags("service"),
            # Long enough for the command to list its credentials first, even
            # under emulation (scaled): 500 ms was not, once, in the VM lane.
            *scale_walls(["--wall", "2s"]),
            "--grace",
            "300ms",
            "--json",
            str(rec),
            "--credential",
            f"api={src}",
            "--credential",
            f"second.key={tmp_path / 'second'}",
            "--",
            "sh",
            "-c",
            'echo "$CREDENTIALS_DIRECTORY" > "$0"; cat "$CREDENTIALS_DIRECTORY/second.key"; '
            'ls -ld "$CREDENTIALS_DIRECTORY" "$CREDENTIALS_DIRECTORY"/*; trap "" TERM; sleep 30',
            str(where),
        ],
        env=env_for(state),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 124, proc.stderr
    record = json.loads(rec.read_text())
    cred_dir = Path(where.read_text().strip())
    assert cred_dir == _systemd_credentials_dir(record["engine"]["unit"])
    assert proc.stdout.startswith("two") and "dr-x------" in proc.stdout and "-r--------" in proc.stdout
    assert record["steps"]["kill_sent"] is not None  # ignored SIGTERM: killed
    assert not cred_dir.exists()
    _assert_secret_nowhere(state, rec.read_text(), proc.stdout, proc.stderr)


@pytest.mark.skipif(MANAGER != "system", reason="a user manager's credentials are not hidden (README, Security)")
def test_a_service_cannot_read_another_runs_credentials(state, tmp_path):
    """Issue 14: run A holds a credential; run B, another service of the same
    uid, reads A's credential path and finds nothing there (PrivateMounts=:
    the manager hides /run/credentials but B's own). The path is real: this
    process, outside any unit, reads the secret from it meanwhile."""
    src, where = _secret_file(tmp_path), tmp_path / "where"
    holder = subprocess.Popen(
        [
            *CORRAL,
            *mode_flags("service"),
            *scale_walls(["--wall", "60s"]),
            "--credential",
            f"api={src}",
            "--",
            "sh",
            "-c",
            'echo "$CREDENTIALS_DIRECTORY" > "$0.tmp" && mv "$0.tmp" "$0"; exec sleep 60',
            str(where),
        ],
        env=env_for(state),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        cred = Path(wait_for(lambda: where.exists() and where.read_text().strip(), timeout=30)) / "api"
        assert cred.read_text() == SECRET  # there, to anyone outside a unit's namespace (root)
        reader = subprocess.run(
            [*CORRAL, *mode_flags("service"), "--", "sh", "-c", 'cat "$0" || ls -a "$(dirname "$0")"', str(cred)],
            env=env_for(state),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert SECRET not in reader.stdout and reader.returncode != 0, (reader.returncode, reader.stdout)
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=60)
    assert not cred.exists()


def test_service_credential_source_missing_is_125_nothing_runs(state, tmp_path, marker):
    witness, rec = tmp_path / "ran", tmp_path / "r.json"
    proc = subprocess.run(
        [
            *CORRAL,
            *mode_flags("service"),
            "--json",
            str(rec),
            "--credential",
            f"api={tmp_path}/missing",
            "--",
            "sh",
            "-c",
            'touch "$0"; sleep 30',
            str(witness),
        ],
        env=env_for(state, marker),
        capture_output=True,
        text=True,
        timeout=60,
    )
    left = marked_pids(marker)
    assert proc.returncode == 125, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "could not load the credentials" in lines[0] and "243" in lines[0], lines
    assert f"api: {tmp_path}/missing: No such file or directory" in lines[0]
    assert left == [] and not witness.exists()
    record = json.loads(rec.read_text())
    assert record["outcome"] == "setup_failed" and record["exit_code"] == 125
    assert record["command_exit_status"] is None and record["command_signal"] is None
    assert record["credentials_delivery"] == "systemd"
    unit = record["engine"]["unit"]
    assert _unit_state(unit) in ("inactive", "failed", "gone") and not _systemd_credentials_dir(unit).exists()


@pytest.mark.private_run
def test_service_credentials_not_delivered_is_125(state, tmp_path, marker):
    """systemd 252 with a private /run: the unit's directory stays empty, silently.
    corral's ExecStartPre= check must notice before the command runs (tests/run runs
    this alone, in a harness with CORRAL_HARNESS_RUN_PROPAGATION=private)."""
    if os.environ.get("CORRAL_HARNESS_RUN_PROPAGATION") != "private":
        pytest.skip("needs CORRAL_HARNESS_RUN_PROPAGATION=private (tests/run)")
    src, witness, rec = _secret_file(tmp_path), tmp_path / "ran", tmp_path / "r.json"
    proc = subprocess.run(
        [
            *CORRAL,
            *mode_flags("service"),
            "--json",
            str(rec),
            "--credential",
            f"api={src}",
            "--",
            "sh",
            "-c",
            'touch "$0"; sleep 30',
            str(witness),
        ],
        env=env_for(state, marker),
        capture_output=True,
        text=True,
        timeout=60,
    )
    left = marked_pids(marker)
    assert proc.returncode == 125, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "did not deliver the credentials" in lines[0], lines
    assert "use --unit-type scope" in lines[0]
    assert left == [] and not witness.exists()
    record = json.loads(rec.read_text())
    assert record["outcome"] == "setup_failed" and record["command_exit_status"] is None
    assert _unit_state(record["engine"]["unit"]) in ("inactive", "failed", "gone")
    _assert_secret_nowhere(state, rec.read_text(), proc.stdout, proc.stderr)
    # a scope does not depend on the manager's mounts: corral's directory works there
    proc = subprocess.run(
        [
            *CORRAL,
            *mode_flags("scope"),
            "--credential",
            f"api={src}",
            "--",
            "sh",
            "-c",
            CRED_PROBE.format("exit 0"),
            "probe",
            str(src),
            str(tmp_path / "where"),
        ],
        env=env_for(state),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "match", proc.stderr


@pytest.mark.parametrize("unit_type", UNIT_TYPES)
def test_credential_gone_and_unit_stopped_when_corral_is_sigkilled(state, tmp_path, markers, unit_type):
    src, where, marker = _secret_file(tmp_path), tmp_path / "where", markers()
    proc = subprocess.Popen(
        [
            *CORRAL,
            *mode_flags(unit_type),
            "--grace",
            "500ms",
            "--credential",
            f"api={src}",
            "--",
            "sh",
            "-c",
            'echo "$CREDENTIALS_DIRECTORY" > "$0"; setsid sleep 60 & sleep 60',
            str(where),
        ],
        env=env_for(state, marker),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: where.exists() and where.read_text().strip(), timeout=20)
    cred_dir = Path(where.read_text().strip())
    assert (cred_dir / "api").read_text() == SECRET
    [run_id] = run_ids(state)
    unit = f"corral-{run_id}.{unit_type}"
    rows = json.loads(ctl(state, "ps", "--json").stdout)
    assert rows[0]["unit"] == unit and rows[0]["processes"] == 3, rows
    if unit_type == "service":
        assert cred_dir == _systemd_credentials_dir(unit)
        # the manager knows the path, never the secret: properties, unit file, Description
        show = subprocess.run(
            ["systemctl", *scope_flag(), "show", "--all", unit], capture_output=True, text=True
        ).stdout
        load = subprocess.run(
            [
                "busctl",
                *scope_flag(),
                "get-property",
                "org.freedesktop.systemd1",
                f"/org/freedesktop/systemd1/unit/{unit.replace('-', '_2d').replace('.', '_2e')}",
                "org.freedesktop.systemd1.Service",
                "LoadCredential",
            ],
            capture_output=True,
            text=True,
        ).stdout
        assert load.strip() == f'a(ss) 1 "api" "{src}"', load
        transient = Path(manager_runtime_dir()) / "systemd" / "transient" / unit
        assert f"LoadCredential=api:{src}" in transient.read_text()
        _assert_secret_nowhere(state, show, transient.read_text())
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
    proc = subprocess.run(
        [*CORRAL, *mode_flags(unit_type), "--env-clear", "--env-keep", "PATH", "--", "env"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    names = sorted(line.split("=", 1)[0] for line in proc.stdout.splitlines())
    # services: systemd sets SYSTEMD_EXEC_PID, and a user manager MANAGERPID (documented);
    # corral sets CORRAL_RUN_ID (a corral inside knows it is nested: common/nesting.py)
    expected = (
        ["CORRAL_RUN_ID", "PATH"]
        if unit_type == "scope"
        else sorted(["CORRAL_RUN_ID", "PATH", "SYSTEMD_EXEC_PID"] + (["MANAGERPID"] if MANAGER == "user" else []))
    )
    assert names == expected


def test_stop_through_owner_and_gc_of_ownerless_unit(state, markers):
    """stop: corral's own verified stop. gc: a unit whose corral is gone (the tether is
    the proof) is stopped; a unit whose corral lives is left alone."""
    procs = [
        subprocess.Popen(
            [*CORRAL, *mode_flags("scope"), "--", "sh", "-c", "sleep 60 & sleep 60"],
            env=env_for(state, markers()),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    try:
        ids = wait_for(lambda: (lambda i: i if len(i) == 2 else None)(run_ids(state)), timeout=20)
        wait_for(lambda: all(r["processes"] == 3 for r in json.loads(ctl(state, "ps", "--json").stdout)), timeout=20)
        r = ctl(state, "stop", ids[0])
        assert r.returncode == 0 and "verified" in r.stdout, r.stdout + r.stderr
        # Verified means no process is left; the manager notices the empty
        # scope a moment later (it may still say "deactivating" here).
        wait_for(lambda: _unit_state(f"corral-{ids[0]}.scope") in ("inactive", "failed", "gone"), timeout=5)
        r = ctl(state, "gc", "--json")
        # The live one is not touched. (The stopped one's unit may still be
        # on its way out when gc looks: stopping it again is gc's job then.)
        assert ids[1] not in [item["run_id"] for item in json.loads(r.stdout)["reclaimed"]], r.stdout
        assert _unit_state(f"corral-{ids[1]}.scope") == "active"
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)


@pytest.mark.cgroupv2
def test_gc_stops_a_dead_corrals_cgroup_with_the_stop_sequence(state, tmp_path, markers):
    """--cgroup-parent, corral and its tether SIGKILLed: its cgroup keeps the command's
    processes, one of them ignoring SIGTERM. gc stops them as corral would
    have (TERM, the run's grace period, KILL, the kernel's word that the
    group is empty) and removes the group. Where no pid namespace can be had:
    with one, its init dies with corral, and the kernel ends the run first."""
    marker = markers()
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [
            *without_pid_namespaces(CORRAL),
            *mode_flags("cgroup-parent"),
            "--grace",
            "300ms",
            "--",
            "sh",
            "-c",
            f"sh -c 'trap \"\" TERM; touch {ready}; while :; do sleep 1; done' & sleep 300 & wait",
        ],
        env=env_for(state, marker),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    [run_id] = wait_for(lambda: run_ids(state))
    wait_for(ready.exists, timeout=20)
    entry = json.loads((state / f"{run_id}.json").read_text())
    # corral and its tether both gone (which stops the run when only corral dies: test_tiers).
    [tether] = entry["helper_pids"]
    os.kill(tether, signal.SIGKILL)
    proc.kill()
    proc.wait()
    group = entry["control_group"]
    assert os.path.isdir(group) and len(marked_pids(marker)) >= 3
    r = ctl(state, "gc", "--json")
    # Only ours: another test's dead corral may have left a unit for this gc too.
    [report] = [item for item in json.loads(r.stdout)["reclaimed"] if item["run_id"] == run_id]
    assert report["verified"] is True and report["remaining"] == [], report
    assert report["actions"][:2] == [f"SIGTERM {group}", f"SIGKILL {group}"], report
    assert marked_pids(marker) == [] and not os.path.exists(group)
    entry = json.loads((state / f"{run_id}.json").read_text())
    assert entry["state"] == "finished" and entry["outcome"] == "reclaimed" and entry["verified"] is True
