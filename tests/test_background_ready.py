"""Issue 38 (part): the ``--background`` front learns of the start through its ready pipe.

What the kernel shows: the front sleeps (no voluntary wake-up) until the
run's corral tells it the command has started, and a signal still wakes it;
no process of the run holds a descriptor of the front's pipes (the command
cannot write the front a start). What the front prints comes from the pipe,
not from the state directory the command can write. Once started, a line in
the run's log wakes the front (inotify), not only its timed looks.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import CORRAL, TIME_SCALE
from modes import all_modes, mode_flags
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker, voluntary_wakeups

CTL = [sys.executable, "-m", "corral_systemd.ctl"]


@pytest.fixture
def env(tmp_path):
    return dict(os.environ, CORRAL_STATE_DIR=str(tmp_path / "state"))


def _pipes(pid: int) -> set[str]:
    """The pipes ``pid`` holds a descriptor of (``pipe:[inode]``)."""
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if target.startswith("pipe:"):
            held.add(target)
    return held


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _pending(pid: int) -> int:
    """The signals pending for ``pid`` as a whole (/proc/PID/status ShdPnd)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1], 16) for line in f if line.startswith("ShdPnd:"))


def _started(directory) -> bool:
    return directory.exists() and any('"event":"started"' in p.read_text() for p in directory.glob("*.log"))


def _front(args, env, marker):
    return subprocess.Popen(
        [*CORRAL, *args],
        env=dict(env, **{MARKER_ENV: marker}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stopped_before_the_start(front, directory) -> int | None:
    """The run's corral (the front's child), stopped (SIGSTOP) before it started the
    command (its imports come first), or None where it was too quick for this process."""
    end = time.monotonic() + 10 * TIME_SCALE
    while not (children := _children(front.pid)) and time.monotonic() < end:
        time.sleep(0.0005)
    assert children, "the front forked no run corral"
    os.kill(children[0], signal.SIGSTOP)
    while _state(children[0]) != "T":
        time.sleep(0.001)
    if _started(directory):
        os.kill(children[0], signal.SIGCONT)
        return None
    return children[0]


def test_the_front_sleeps_until_the_start_and_a_signal_still_wakes_it(env, tmp_path):
    """Its corral held before the start: the front's poll has nothing to wake it in 1 s
    (registry polling every 5-20 ms woke it some 50 times); SIGTERM ends the wait at
    once (the wakeup pipe), the run stopped: 143."""
    directory = tmp_path / "state"
    for _ in range(5):  # the run's corral can start the command before this process stops it
        marker = new_marker()
        front = _front(
            ["--background", "--ready-timeout", "60s", "--ready-file", str(tmp_path / "never"), "--", "sleep", "1000"],
            env,
            marker,
        )
        corral = None
        try:
            corral = _stopped_before_the_start(front, directory)
            if corral is None:
                front.send_signal(signal.SIGTERM)
                front.communicate(timeout=60)
                continue
            time.sleep(0.3)  # the front's own last steps before its wait
            before = voluntary_wakeups(front.pid)
            time.sleep(1.0)
            woke = voluntary_wakeups(front.pid) - before
            assert woke <= 2, f"the front woke {woke} times in 1 s before the start"
            front.send_signal(signal.SIGTERM)
            end = time.monotonic() + 5 * TIME_SCALE
            while not (stopping := _pending(corral) & 1 << signal.SIGTERM - 1) and time.monotonic() < end:
                time.sleep(0.01)
            os.kill(corral, signal.SIGCONT)  # its pending SIGTERM (the front's stop) ends it now
            out, err = front.communicate(timeout=10 * TIME_SCALE)
            assert stopping, "the front did not act on its SIGTERM while the start was held back"
            assert front.returncode == 143, err
            assert "stopped before it was ready (SIGTERM)" in err
            end = time.monotonic() + 5
            while marked_pids(marker) and time.monotonic() < end:
                time.sleep(0.05)
            assert marked_pids(marker) == []
            return
        finally:
            if corral is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(corral, signal.SIGCONT)
            front.kill()
            front.wait()
            kill_marked(marker)
    pytest.fail("the run's corral started the command each time before it could be stopped")


@pytest.mark.parametrize("session", [False, True], ids=["forked", "in-a-session"])
@pytest.mark.parametrize("mode", all_modes())
def test_no_process_of_the_run_holds_the_fronts_pipes(env, tmp_path, mode, session):
    """While the front waits for readiness, every process of the run (its corral, the
    command, a child of the command) holds none of the front's pipes: the ready pipe
    is close-on-exec and the corral's own end is closed once it has told the start."""
    marker = new_marker()
    options = []
    if session:
        sid = subprocess.run([*CTL, "session", "start"], env=env, capture_output=True, text=True, check=True)
        options = ["--session", sid.stdout.strip()]
    ready = tmp_path / "ready"
    front = _front(
        [
            *mode_flags(mode),
            *options,
            "--background",
            "--ready-file",
            str(ready),
            "--",
            "sh",
            "-c",
            "sleep 1000 & sleep 1000",
        ],
        env,
        marker,
    )
    try:
        end = time.monotonic() + 30 * TIME_SCALE
        while not _started(tmp_path / "state") and time.monotonic() < end:
            time.sleep(0.02)
        time.sleep(0.3)  # the command's sh has forked its sleep
        assert front.poll() is None, front.communicate()
        fronts = _pipes(front.pid)
        run = [pid for pid in marked_pids(marker) if pid != front.pid]
        assert len(run) >= 3, run  # its corral, sh and the two sleeps
        held = {pid: _pipes(pid) & fronts for pid in run}
        assert not any(held.values()), f"processes of the run hold the front's pipes: {held}"
        ready.touch()
        out, err = front.communicate(timeout=30 * TIME_SCALE)
        assert front.returncode == 0, err
        assert subprocess.run([*CTL, "stop", out.strip()], env=env, capture_output=True).returncode == 0
    finally:
        front.kill()
        front.wait()
        if session:
            subprocess.run([*CTL, "session", "end", options[1]], env=env, capture_output=True)
        kill_marked(marker)


#: Rewrites its own registry entry (the state directory is its uid's) to name a
#: unit and a mode, then says it is ready.
FORGE = (
    "import json, os, sys; d = os.environ['CORRAL_STATE_DIR']; "
    "p = os.path.join(d, os.environ['CORRAL_RUN_ID'] + '.json'); e = json.load(open(p)); "
    "e.update(mode='systemd', unit='forged.service'); json.dump(e, open(p + '.f', 'w')); os.replace(p + '.f', p); "
    "open(sys.argv[1] + '.forged', 'w').close(); open(sys.argv[1], 'w').close(); import time; time.sleep(1000)"
)


@pytest.mark.parametrize("mode", all_modes())
def test_the_start_record_is_the_runs_corrals_word_not_the_registrys(env, tmp_path, mode):
    """``--json -``'s mode and unit are what the run's corral told the front, whatever
    the command wrote into the registry before it was ready."""
    marker = new_marker()
    ready = tmp_path / "ready"
    r = subprocess.run(
        [*CORRAL, *mode_flags(mode), "--background", "--json", "-", "--ready-file", str(ready), "--"]
        + [sys.executable, "-c", FORGE, str(ready)],
        env=dict(env, **{MARKER_ENV: marker}),
        capture_output=True,
        text=True,
        timeout=60 * TIME_SCALE,
    )
    try:
        assert r.returncode == 0, r.stderr
        record = json.loads(r.stdout)
        assert (tmp_path / "ready.forged").exists()  # the command rewrote its entry before it was ready
        assert record["unit"] != "forged.service", record
        if mode not in ("scope", "service"):
            assert record["mode"] != "systemd", record
        stop = subprocess.run([*CTL, "stop", record["run_id"]], env=env, capture_output=True, text=True)
        assert stop.returncode == 0, stop.stderr
    finally:
        kill_marked(marker)


#: Listens on the port after 2 s, writes the monotonic time, then says so on stdout.
ANNOUNCE = (
    "import socket, sys, time; time.sleep(2); s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); "
    "s.listen(); open(sys.argv[2], 'w').write(repr(time.monotonic())); print('listening', flush=True); "
    "time.sleep(1000)"
)


def test_a_server_saying_it_listens_is_seen_at_once(env, tmp_path):
    """2 s after the start the timed looks come 0.2 s apart; the server's line in the
    log wakes the front (inotify on the log), so the front is back within tens of ms
    of the line (the median of 5; looks alone: about 0.1 s)."""
    lags = []
    for i in range(5):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        said, marker = tmp_path / f"said{i}", new_marker()
        r = subprocess.run(
            [*CORRAL, "--background", "--ready-port", str(port), "--", sys.executable, "-c", ANNOUNCE, str(port)]
            + [str(said)],
            env=dict(env, **{MARKER_ENV: marker}),
            capture_output=True,
            text=True,
            timeout=60 * TIME_SCALE,
        )
        back = time.monotonic()
        try:
            assert r.returncode == 0, r.stderr
            lags.append(back - float(said.read_text()))
            assert subprocess.run([*CTL, "stop", r.stdout.strip()], env=env, capture_output=True).returncode == 0
        finally:
            kill_marked(marker)
    assert sorted(lags)[2] < 0.06 * TIME_SCALE, lags


def test_a_silent_target_is_looked_for_every_5_ms_at_first_and_rarely_later():
    """The timed looks (what finds a server whose output is buffered: nothing in its
    log says it listens): every 5 ms for the first 50 ms after the start, then 10 %
    of the time since it, at most every 0.25 s. bench/session_bench.py measures what
    that is worth (its silent server)."""
    from corral_systemd.core.background import look_wait

    assert [look_wait(t) for t in (0.0, 0.01, 0.049)] == [0.005, 0.005, 0.005]
    assert look_wait(0.2) == pytest.approx(0.02)
    assert look_wait(2.5) == look_wait(600) == 0.25
