"""procfs.subtree: a run's processes read from the kernel's children lists,
from the run's root down, never a scan of all of /proc (issue 38: a waiting
or ending run's cost grows with the run, not with the machine).

Processes are found by the test's marker in their environment (procscan),
never by name; every one started here is SIGKILLed by pid at the end.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from corral_systemd.kernel import procfs
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker


def _wait_for(marker: str, count: int) -> set[int]:
    """The pids carrying ``marker`` once there are ``count`` of them."""
    for _ in range(400):
        pids = set(marked_pids(marker))
        if len(pids) >= count:
            return pids
        time.sleep(0.025)
    raise AssertionError(f"{count} processes with the marker never appeared: {pids}")


@pytest.fixture
def marker():
    mark = new_marker()
    yield mark
    kill_marked(mark)


def test_subtree_is_the_tree_a_scan_finds(marker):
    # A tree three deep, one branch in a session of its own: all below the root.
    script = "sleep 60 & setsid sh -c 'sleep 60 & sleep 60' & sleep 60"
    root = subprocess.Popen(["sh", "-c", script], env={**os.environ, MARKER_ENV: marker})
    try:
        marked = _wait_for(marker, 6)  # sh, sleep, setsid's sh, its two sleeps, the last sleep
        walked = procfs.subtree(root.pid)
        assert walked is not None
        scanned = {p.pid for p in procfs.descendants(procfs.scan(), root.pid)}
        assert {p.pid for p in walked} == scanned == marked - {root.pid}
    finally:
        kill_marked(marker)
        root.wait()


THREADED = """
import subprocess, sys, threading, time
def start():
    child = subprocess.Popen(["sleep", "60"])
    print(child.pid, flush=True)
    time.sleep(60)  # a thread that exits hands its children to another thread
threading.Thread(target=start).start()
time.sleep(60)
"""


def test_a_child_forked_by_a_thread_is_in_the_subtree(marker):
    # The kernel lists a child under the thread that forked it
    # (/proc/PID/task/TID/children), not under the process's main thread.
    parent = subprocess.Popen(
        [sys.executable, "-c", THREADED], env={**os.environ, MARKER_ENV: marker}, stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(parent.stdout.readline())
        walked = procfs.subtree(parent.pid)
        assert walked is not None
        assert child in {p.pid for p in walked}
        assert all(p.ppid == parent.pid for p in walked)
    finally:
        kill_marked(marker)
        parent.wait()


def test_no_tree_to_read_is_none():
    # A pid that is no process: the caller falls back to a scan, never takes "no members".
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert procfs.subtree(dead.pid) is None


#: corral in-process with procfs.scan refused: the subreaper tier must find its run without it.
NO_SCAN = """
import sys
from corral_systemd.kernel import procfs


def scan():
    raise AssertionError("the subreaper tier scanned all of /proc")


procfs.scan = scan
from corral_systemd.client import main

print(main(sys.argv[1:]))
"""


def test_the_subreaper_tier_reads_its_tree_not_all_of_proc(marker, tmp_path):
    # Its daemons (a session of their own, a double fork) re-parent to corral, the
    # subreaper: found and stopped through the kernel's children lists, from corral down.
    if procfs.subtree(os.getpid()) is None:
        pytest.skip("no children lists on this kernel (CONFIG_PROC_CHILDREN): the tier scans")
    record = tmp_path / "r.json"
    daemons = "setsid sleep 60 & (sleep 60 &); echo started"
    argv = ["--guarantee", "subreaper", "--quiet", "--json", str(record), "--", "sh", "-c", daemons]
    env = {**os.environ, MARKER_ENV: marker, "CORRAL_SERVICE": "0"}
    out = subprocess.run([sys.executable, "-c", NO_SCAN, *argv], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout == "started\n0\n", out
    got = json.loads(record.read_text())
    assert got["verified"] is True and got["processes_stopped"] == 2, got
    assert marked_pids(marker) == []
