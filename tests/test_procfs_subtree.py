"""procfs.subtree: a run's processes read from the kernel's children lists,
from the run's root down, never a scan of all of /proc (issue 38: a waiting
or ending run's cost grows with the run, not with the machine).

Processes are found by the test's marker in their environment (procscan),
never by name; every one started here is SIGKILLed by pid at the end.
"""

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
