"""RunTracker on its own: no cgroup, no engine. The tracker is told the run's
group is a path no process is in, so a process it has seen there and no
longer sees listed counts as escaped, as a process that moved itself out
of a unit's cgroup would."""

import os
import subprocess
import time

from conftest import marker_env
from corral_systemd.kernel.pidfd import RunTracker
from procscan import marked_pids

NOWHERE = "/corral-test-no-process-is-here"


def _escaper(marker):
    """A session leader that forks a child in its session and one in a
    session of its own, then says so."""
    script = "sleep 600 & setsid sleep 600 & echo forked; exec sleep 600"
    proc = subprocess.Popen(
        ["sh", "-c", script], env=marker_env(marker), stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout.readline() == b"forked\n"
    return proc


def _seen_then_escaped(pid):
    tracker = RunTracker("0")
    tracker.cgroup = NOWHERE
    tracker.observe([pid], lambda: [pid])  # listed in the group: tracked
    tracker.observe([], lambda: [])  # no longer listed, alive elsewhere
    assert tracker.escaped == {pid}
    return tracker


def _gone(marker, timeout=10.0):
    end = time.monotonic() + timeout
    while (left := marked_pids(marker)) and time.monotonic() < end:
        time.sleep(0.05)
    return left


def test_killing_an_escaper_first_finds_its_children(marker):
    """The stop sequence SIGKILLs escaped processes before verification
    sweeps for their members. The escaper's session and children must be
    found while it lives: once it is dead its children are reparented and
    its session id no longer proves anything, and both of its children
    outlived a CI run that way."""
    proc = _escaper(marker)
    tracker = _seen_then_escaped(proc.pid)
    try:
        tracker.kill_escaped()
        proc.wait(timeout=10)
        tracker.sweep()
        assert _gone(marker) == [], "a child of the killed escaper is still alive"
        assert len(tracker.escaped) == 3
        assert os.getpid() not in tracker.escaped
    finally:
        tracker.close()


def test_sweep_finds_a_live_escapers_children(marker):
    """Verification with the escaper still alive: its session and its
    children are found from one /proc scan and killed with it."""
    proc = _escaper(marker)
    tracker = _seen_then_escaped(proc.pid)
    try:
        tracker.sweep()
        proc.wait(timeout=10)
        assert _gone(marker) == []
        assert len(tracker.escaped) == 3
    finally:
        tracker.close()


def test_a_session_known_by_mark_only_is_swept_for_its_marked_members():
    """A service's session: its leader (the main process) reaped by the
    manager, so the session id may have been reused; the sweep takes only
    members that carry the run's mark (CORRAL_RUN_ID=<id>): a process of
    the run that left its group unseen is killed, a stranger in a session
    of that number never is."""
    import subprocess
    import time

    from corral_systemd.kernel.pidfd import RunTracker
    from corral_systemd.kernel.procfs import read_stat

    run_id = "0123456789ab"
    # A session whose leader exits at once, leaving a member: the run's (marked) and a stranger (unmarked).
    leader = subprocess.Popen(
        ["setsid", "sh", "-c", "CORRAL_RUN_ID=0123456789ab sleep 60 & env -u CORRAL_RUN_ID sleep 60 & exit 0"],
        env={k: v for k, v in os.environ.items() if k != "CORRAL_RUN_ID"},
    )
    leader.wait()
    time.sleep(0.2)
    sid = leader.pid
    members = [
        pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if (s := read_stat(pid)) and s.sid == sid
    ]
    try:
        marked = [p for p in members if b"CORRAL_RUN_ID=" + run_id.encode() in open(f"/proc/{p}/environ", "rb").read()]
        stranger = [p for p in members if p not in marked]
        assert len(marked) == 1 and len(stranger) == 1, members
        tracker = RunTracker()
        tracker.cgroup = "/nowhere"
        left = tracker.sweep(marked=(sid,), run_id=run_id)
        assert left == marked and tracker.escaped == set(marked)
        time.sleep(0.2)
        assert (read_stat(marked[0]) is None or not read_stat(marked[0]).alive) and read_stat(stranger[0]).alive
        tracker.close()
    finally:
        for pid in members:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
