"""Snags a new user hit first (issue 40), corralctl's part:

- ``corralctl ps`` counts a pidns run's processes and their memory: the
  namespace's processes (the command's tree below the namespace's init),
  never corral's own (corral, the init: the entry's ``helper_pids``);
- ``corralctl status`` takes a run's ``--name`` as logs, wait and stop do
  (one resolver: ``ctl.logs.find_run``).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import CORRAL, TIME_SCALE
from modes import PIDNS_FLAGS, pidns_unavailable
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

CTL = [sys.executable, "-m", "corral_systemd.ctl"]
FB = ["--cgroup-mode", "fallback"]


@pytest.fixture
def state():
    path = Path(tempfile.mkdtemp(prefix="corral-test-state-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def marker():
    m = new_marker()
    yield m
    kill_marked(m)


def _env(state, marker=None) -> dict:
    env = {**os.environ, "CORRAL_STATE_DIR": str(state), "CORRAL_SERVICE": "0"}
    if marker:
        env[MARKER_ENV] = marker
    return env


def ctl(state, *args):
    return subprocess.run([*CTL, *args], env=_env(state), capture_output=True, text=True, timeout=30)


def start(state, marker, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [*CORRAL, *args], env=_env(state, marker), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30 * TIME_SCALE)


def wait_for(predicate, timeout=15.0, every=0.05):
    end = time.monotonic() + timeout * TIME_SCALE
    while time.monotonic() < end:
        if value := predicate():
            return value
        time.sleep(every)
    raise AssertionError("condition not met in time")


# -- ps: a pidns run's processes ----------------------------------------------------------------
@pytest.mark.pidns
def test_ps_counts_a_pidns_runs_processes_and_their_memory(state, marker):
    if (why := pidns_unavailable()) is not None:
        pytest.skip(f"no pid namespace here: {why}")
    proc = start(state, marker, *PIDNS_FLAGS, "--wall", "60s", "--", "sh", "-c", "sleep 60 & sleep 60")
    try:
        # corral, the namespace's init (a clone of corral), sh and its two sleeps carry the marker
        wait_for(lambda: len(marked_pids(marker)) >= 5)
        (entry_path,) = state.glob("*.json")
        entry = json.loads(entry_path.read_text())
        assert entry["mode"] == "pidns" and entry["owner"]["pid"] == proc.pid
        run = set(marked_pids(marker)) - {proc.pid} - set(entry["helper_pids"])  # sh, sleep, sleep
        assert len(run) == 3, (marked_pids(marker), entry["helper_pids"])

        (row,) = json.loads(ctl(state, "ps", "--json").stdout)
        assert row["processes"] == 3 and set(row["pids"]) == run, (row, run)
        assert row["memory"] > 0
        table = ctl(state, "ps").stdout.splitlines()
        header = table[0].split()
        assert table[1].split()[header.index("PROCS")] == "3"
    finally:
        stop(proc)
    assert ctl(state, "ps", "--json").stdout.strip() == "[]"


# -- status NAME ---------------------------------------------------------------------------------
def test_status_takes_a_runs_name_as_logs_wait_and_stop_do(state, marker):
    done = subprocess.run(
        [*CORRAL, *FB, "--name", "built", "--", "true"], env=_env(state, marker), capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    r = ctl(state, "status", "built")
    assert r.returncode == 11 and r.stdout.startswith("finished (exit 0"), r.stdout + r.stderr

    live = start(state, marker, *FB, "--name", "web", "--wall", "60s", "--", "sleep", "60")
    twins = []
    try:
        wait_for(lambda: ctl(state, "status", "web").returncode == 0)
        r = ctl(state, "status", "web")
        assert r.stdout.startswith("active ("), r.stdout
        entries = [json.loads(path.read_text()) for path in state.glob("*.json")]
        (run_id,) = [e["run_id"] for e in entries if e.get("name") == "web"]
        assert ctl(state, "status", run_id).stdout == r.stdout  # the name and the id: the same run

        # Two runs still going under one name (foreground runs may share one): status names neither.
        twins = [start(state, marker, *FB, "--name", "twin", "--wall", "60s", "--", "sleep", "60") for _ in range(2)]
        wait_for(lambda: "names 2 runs still going" in ctl(state, "status", "twin").stdout)
        r = ctl(state, "status", "twin")
        assert r.returncode == 12 and r.stdout.startswith("unknown ("), r.stdout
    finally:
        for p in [live, *twins]:
            stop(p)
    r = ctl(state, "status", "web")
    assert r.returncode == 11 and r.stdout.startswith("finished ("), r.stdout

    r = ctl(state, "status", "nosuch")
    assert r.returncode == 12 and r.stdout.strip() == f"unknown ('nosuch': no such run in {state})", r.stdout


def test_service_uninstall_finds_a_user_install_as_root(tmp_path):
    """As root, ``service uninstall`` with no --user/--system after an install for the
    user manager removes that one (it used to say "nothing to remove" and leave it)."""
    from corral_systemd.ctl import service_units as units

    if os.geteuid() != 0:
        pytest.skip("root's default is the system manager")
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_RUNTIME_DIR=str(tmp_path / "run"))
    directory = tmp_path / "config" / "systemd" / "user"
    directory.mkdir(parents=True)
    for name, text in units.unit_texts("user").items():  # as install --user writes them
        (directory / name).write_text(text)
    if units.installed("system"):
        pytest.skip("corral's units are installed for this machine's system manager")
    r = subprocess.run([*CTL, "service", "uninstall"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "(user manager)" in r.stdout and not list(directory.iterdir()), r.stdout


@pytest.mark.parametrize(
    "line, out",
    [
        (["--wall", "5s", "echo", "hi", "-n"], "hi -n\n"),  # the command's own options are its own
        (["--wall", "5s", "--", "echo", "--wall"], "--wall\n"),
        (["--", "--version"], None),  # after --, a word starting with - is the command (not found: 127)
    ],
)
def test_the_command_starts_at_dash_dash_or_its_first_word_as_readme_says(line, out):
    """README's Usage: the command starts after --, or at the first word that is not an
    option, as timeout and systemd-run take it."""
    r = subprocess.run([*CORRAL, "--quiet", *line], capture_output=True, text=True, timeout=60 * TIME_SCALE)
    if out is None:
        assert r.returncode == 127, r.stderr
    else:
        assert (r.returncode, r.stdout) == (0, out), r.stderr
