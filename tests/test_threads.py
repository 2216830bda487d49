"""Thread groups whose main thread has exited (issue 13, item 1).

A process that calls ``pthread_exit()`` in its main thread while other
threads run shows ``Z`` in /proc/PID/stat, and its /proc/PID/environ and
statm read as a dead process's: it is alive all the same. corral must stop
it (and count its memory); the tests' survivor scan must see it.
"""

import os
import subprocess
import sys
import time

import pytest

from corral_systemd.kernel import procfs
from modes import all_modes, mode_flags
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

#: Threads that sleep, then the main thread exits: a live process whose leader is a zombie.
LEADER_EXITS = (
    "import ctypes, threading, time\n"
    "[threading.Thread(target=time.sleep, args=(1000,)).start() for _ in range(3)]\n"
    "ctypes.CDLL(None).pthread_exit(None)\n"
)

#: The same, detached in its own session by a child; the main process exits 0 at once.
DETACHED = (
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n" + "".join("    " + line + "\n" for line in LEADER_EXITS.splitlines()) + "time.sleep(0.3)\n"
)

#: A thread allocates ~200 MiB once the main thread has exited (its stat shows Z).
HOG = (
    "import ctypes, os, threading, time\n"
    "def hog():\n"
    "    while open(f'/proc/{os.getpid()}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z':\n"
    "        time.sleep(0.01)\n"
    "    data = bytearray(200 * 1024 * 1024)\n"
    "    for i in range(0, len(data), 4096): data[i] = 1\n"
    "    time.sleep(1000)\n"
    "threading.Thread(target=hog).start()\n"
    "ctypes.CDLL(None).pthread_exit(None)\n"
)


def _wait_leader_exited(pid: int, timeout: float = 10.0) -> procfs.ProcInfo:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        info = procfs.read_stat(pid)
        if info is not None and info.leader_exited:
            return info
        time.sleep(0.01)
    raise AssertionError(f"process {pid}: the main thread did not exit")


@pytest.fixture
def zombie_leader():
    """A live process (three threads) whose main thread has exited, carrying a marker."""
    marker = new_marker()
    proc = subprocess.Popen([sys.executable, "-c", LEADER_EXITS], env=dict(os.environ, **{MARKER_ENV: marker}))
    try:
        yield proc, marker, _wait_leader_exited(proc.pid)
    finally:
        kill_marked(marker)
        proc.kill()
        proc.wait()


def test_procfs_sees_a_zombie_leader_with_live_threads_as_alive(zombie_leader):
    proc, _marker, info = zombie_leader
    raw_state = open(f"/proc/{proc.pid}/stat", "rb").read().rsplit(b")", 1)[1].split()[0]
    assert raw_state == b"Z", "test setup: the leader should show as a zombie"
    assert info.alive and info.state not in ("Z", "X")
    assert procfs.live_task(proc.pid) is not None
    assert procfs.resident_bytes(proc.pid) > 0  # the leader's own statm reads 0


def test_survivor_scan_sees_a_zombie_leader_with_live_threads(zombie_leader):
    proc, marker, _info = zombie_leader
    assert proc.pid in marked_pids(marker)
    kill_marked(marker)
    proc.wait(timeout=10)
    assert marked_pids(marker) == []


@pytest.mark.parametrize("mode", all_modes())
def test_detached_thread_group_with_exited_leader_is_stopped(corral, mode):
    run = corral(mode_flags(mode) + ["--wall", "5s", "--", sys.executable, "-c", DETACHED])
    detail = run.stderr.decode(errors="replace")
    assert run.survivors == [], detail
    assert run.returncode == 0, detail
    assert run.record["verified"] is True
    if mode == "fallback":
        assert run.record["processes_stopped"] >= 1, detail


@pytest.mark.parametrize("mode", all_modes())
def test_main_process_with_exited_leader_runs_until_the_wall(corral, mode):
    run = corral(mode_flags(mode) + ["--wall", "1s", "--", sys.executable, "-c", LEADER_EXITS])
    detail = run.stderr.decode(errors="replace")
    assert run.survivors == [], detail
    assert run.returncode == 124, detail
    assert run.record["verified"] is True
    assert run.record["processes_stopped"] >= 1, detail


def test_memory_of_threads_under_an_exited_leader_is_counted(corral):
    run = corral(["--cgroup-mode", "fallback", "--mem", "64M", "--wall", "20s", "--", sys.executable, "-c", HOG])
    detail = run.stderr.decode(errors="replace")
    assert run.survivors == [], detail
    assert run.returncode == 121, detail
    assert run.record["outcome"] == "memory"
