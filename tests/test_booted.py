"""corral on a machine booted with systemd: PID 1 is the system manager,
cgroups are pure v2, a user's user@UID.service has its controllers delegated.

These run in the VM lane (tests/vm/run-lane), once as root against the
system manager and once as the unprivileged user `tester` against its
user@1000.service (CORRAL_TEST_MANAGER says which). They need what only a
booted machine has: a unit stopped or killed from outside by systemctl,
daemon-reexec of a real manager, a login session made by pam_systemd, the
installed .deb.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CORRAL, FAULTS, scale_walls
from modes import MANAGER, mode_flags, scope_flag, systemctl, unit_property
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

pytestmark = [pytest.mark.systemd, pytest.mark.booted]
UNIT_TYPES = ["scope", "service"]
INSTALLED = "/usr/bin/corral"


@pytest.fixture(autouse=True)
def _booted(request):
    if request.node.get_closest_marker("manager_kill") and os.environ.get("CORRAL_HARNESS_MANAGER_PID"):
        return  # a manager re-executed: tests/harness/with-user-manager's does as well
    if os.environ.get("CORRAL_TEST_BOOTED") != "1":
        if os.environ.get("CORRAL_REQUIRE_BOOTED") == "1":
            pytest.fail("required: a machine booted with systemd (CORRAL_TEST_BOOTED=1)")
        pytest.skip("needs a machine booted with systemd (the VM lane: tests/vm/run-lane)")


RUN_UNIT = re.compile(r"^corral-[0-9a-f]+\.(scope|service)$")


def _run_unit(pids: list[int]) -> str:
    """The run's unit, from the kernel's view of its processes' cgroups.
    (corral itself and its tether carry the marker too: they are elsewhere.)"""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                path = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0::"))
        except (OSError, StopIteration):
            continue
        for part in path.split("/"):
            if RUN_UNIT.match(part):
                return part
    raise AssertionError(f"no process of {pids} is in a run unit")


def _start(unit_type, tmp_path, *extra):
    """corral running a shell and a setsid daemon; returns (proc, marker, unit, stderr path)."""
    marker = new_marker()
    ready = tmp_path / f"ready-{marker}"
    errpath = tmp_path / f"stderr-{marker}"
    record = tmp_path / f"record-{marker}.json"
    env = dict(os.environ, **{MARKER_ENV: marker})
    with open(errpath, "wb") as err:  # a file: a survivor holding a pipe could not hang the test
        proc = subprocess.Popen(
            [
                *CORRAL,
                *mode_flags(unit_type),
                "--json",
                str(record),
                *scale_walls(extra),
                "--",
                "sh",
                "-c",
                f"setsid sleep 3600 & touch {ready}; sleep 3600",
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.exists(), "run never started"
    pids = marked_pids(marker)
    assert len(pids) >= 2, pids
    return proc, marker, _run_unit(pids), errpath, record


def _finish(proc, marker, errpath, record, timeout=60):
    try:
        code = proc.wait(timeout=timeout)
    finally:
        proc.kill()
    left = marked_pids(marker)
    kill_marked(marker)
    rec = json.loads(record.read_text()) if record.exists() else None
    return code, left, errpath.read_text(), rec


@pytest.mark.parametrize("unit_type", UNIT_TYPES)
@pytest.mark.parametrize("how,signo", [("stop", signal.SIGTERM), ("kill", signal.SIGKILL)])
def test_unit_stopped_or_killed_from_outside_is_an_honest_exit(unit_type, how, signo, tmp_path):
    """`systemctl stop|kill corral-…`: the command died of that signal, and
    corral says so (128+N) with the run proven empty, not a hang or a 0."""
    proc, marker, unit, errpath, record = _start(unit_type, tmp_path, "--wall", "60s")
    args = ["stop", unit] if how == "stop" else ["kill", "--signal", str(int(signo)), unit]
    out = systemctl(*args, timeout=60)
    assert out.returncode == 0, out.stderr
    code, left, err, rec = _finish(proc, marker, errpath, record)
    assert left == [], f"survivors {left}; {err}"
    assert code == 128 + signo, err
    assert rec is not None and rec["verified"] is True and rec["remaining_pids"] == [], rec
    assert unit_property(unit, "LoadState") in ("not-found", ""), "the unit is still loaded"


@pytest.mark.manager_kill  # disturbs every run on the manager: a step of its own
@pytest.mark.parametrize("unit_type", UNIT_TYPES)
def test_cli_run_across_daemon_reexec(unit_type, tmp_path):
    """daemon-reexec (what a systemd upgrade runs) mid-run closes corral's
    private connection: corral connects again, and the run still ends at its
    deadline with nothing left (a service's end is known only through the
    manager: without the reconnect, 120 "manager lost")."""
    proc, marker, unit, errpath, record = _start(unit_type, tmp_path, "--wall", "4s", "--grace", "1s")
    systemctl("daemon-reexec", timeout=120)
    code, left, err, rec = _finish(proc, marker, errpath, record)
    assert left == [], f"survivors {left}; {err}"
    assert code == 124, err
    assert rec is not None and rec["verified"] is True, rec
    engine = rec["engine"]
    assert (engine.get("reconnected") or 0) >= 1 or engine["transport"] == "bus", engine


def test_tasks_max_caps_a_fork_storm_at_the_limit(corral):
    run = corral(mode_flags("service") + ["--wall", "3s", "--pids", "16", "--", str(FAULTS / "F07-fork200")])
    assert run.returncode == 124 and run.survivors == [], run.stderr
    assert run.record["limits_enforced"]["pids"] == "kernel"
    forked = int(run.stdout.decode().split("forked ")[1].split()[0])
    assert forked + 1 <= 16, run.stdout  # the parent is one of the 16 tasks
    peak = run.record["engine"].get("tasks_peak")
    if peak is not None:
        assert peak <= 16, run.record["engine"]


def test_a_run_from_a_login_session_lands_in_the_users_manager(tmp_path):
    """`su -l tester` makes a logind session (pam_systemd) with the user's
    XDG_RUNTIME_DIR and bus: auto mode must find the user's manager and put
    the run under user@UID.service, as it would on a desktop."""
    if MANAGER != "system" or os.geteuid() != 0:
        pytest.skip("root opens the login session (system lane)")
    marker = new_marker()
    record = Path("/tmp") / f"corral-login-{marker}.json"
    # CORRAL_SERVICE=installed: a login shell does not have the suite's (tests/conftest.py), and
    # the first corral in it would leave a transient corral service in the user's manager.
    script = (
        f"env CORRAL_SERVICE=installed {MARKER_ENV}={marker} "
        f"{INSTALLED} --json {record} {' '.join(scale_walls(['--wall', '2s']))} -- "
        "sh -c 'setsid sleep 300 & echo session=$XDG_SESSION_ID; cat /proc/self/cgroup; sleep 300'"
    )
    try:
        out = subprocess.run(["su", "-l", "tester", "-c", script], capture_output=True, text=True, timeout=120)
        left = marked_pids(marker)
        assert out.returncode == 124, out.stdout + out.stderr
        assert left == [], left
        rec = json.loads(record.read_text())
        assert rec["mode"] == "systemd" and rec["engine"]["manager"] == "user", rec["engine"]
        assert "/user@1000.service/" in rec["engine"]["control_group"], rec["engine"]
        assert "session=" in out.stdout and "session=\n" not in out.stdout, out.stdout
    finally:
        kill_marked(marker)
        record.unlink(missing_ok=True)


def test_installed_package_on_this_manager(tmp_path):
    """The .deb on a real systemd: the commands, corral.slice known to this
    manager (and used), man pages, completions."""
    if not os.path.exists(INSTALLED):
        pytest.fail(f"{INSTALLED} missing: the lane installs the .deb first")
    frag = "/usr/lib/systemd/system/corral.slice" if MANAGER == "system" else "/usr/lib/systemd/user/corral.slice"
    # /lib is /usr/lib on Debian 12: the manager may name either.
    assert os.path.realpath(unit_property("corral.slice", "FragmentPath")) == os.path.realpath(frag)
    marker = new_marker()
    rec = tmp_path / "r.json"
    out = subprocess.run(
        [
            INSTALLED,
            "--json",
            str(rec),
            *scale_walls(["--wall", "2s"]),
            "--",
            "sh",
            "-c",
            "setsid sleep 300 & nohup sleep 300 >/dev/null 2>&1 & sleep 300",
        ],
        env=dict(os.environ, **{MARKER_ENV: marker}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    try:
        assert out.returncode == 124, out.stderr
        assert marked_pids(marker) == []
        record = json.loads(rec.read_text())
        assert record["mode"] == "systemd" and "/corral.slice/" in record["engine"]["control_group"], record["engine"]
    finally:
        kill_marked(marker)
    for page in ("corral", "corral-enforced", "corralctl"):
        where = subprocess.run(["man", "-w", page], capture_output=True, text=True)
        assert where.returncode == 0 and where.stdout.startswith("/usr/share/man/man1/"), where
    if shutil.which("bash") and os.path.exists("/usr/share/bash-completion/bash_completion"):
        comp = subprocess.run(
            [
                "bash",
                "-c",
                ". /usr/share/bash-completion/bash_completion; "
                ". /usr/share/bash-completion/completions/corral; complete -p corral",
            ],
            capture_output=True,
            text=True,
        )
        assert comp.returncode == 0 and "corral" in comp.stdout, comp
    ctl = subprocess.run(["/usr/bin/corralctl", "ps"], capture_output=True, text=True)
    assert ctl.returncode == 0, ctl.stderr


def test_the_manager_under_test_is_pid1s_or_a_users(tmp_path):
    """The lane is what it says: PID 1 is systemd, cgroups are pure v2 and the
    manager under test has the memory and pids controllers."""
    # /proc/1/exe is root's to read; the manager's own word is anyone's.
    assert Path("/run/systemd/system").is_dir()
    assert systemctl("show", "-p", "Version", "--value", check=True).stdout.strip()
    assert Path("/proc/1/comm").read_text().strip() == "systemd"
    assert Path("/sys/fs/cgroup/cgroup.controllers").exists()
    if MANAGER == "user":
        cg = f"/sys/fs/cgroup/user.slice/user-{os.getuid()}.slice/user@{os.getuid()}.service"
        controllers = Path(cg, "cgroup.controllers").read_text().split()
    else:
        controllers = Path("/sys/fs/cgroup/cgroup.subtree_control").read_text().split()
    assert {"memory", "pids"} <= set(controllers), controllers
    assert subprocess.run(["systemctl", *scope_flag(), "is-system-running"], capture_output=True).returncode in (0, 1)
