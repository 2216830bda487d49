"""Issue 27 (part): ``corral --background`` with readiness, ``corralctl logs``/``wait``/``stop`` by id or name.

Every mode: the background run is a foreground run's supervisor detached from
the front, so what is proven here (nothing tagged left after a stop, the
exit code through ``wait``) is proven from /proc by the run marker.
"""

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
def bg(tmp_path):
    """Start background runs and corralctl against a private state directory; kill survivors after."""
    state = tmp_path / "state"
    markers = []

    class Bg:
        env = dict(os.environ, CORRAL_STATE_DIR=str(state))
        directory = state

        def start(self, args, *, timeout=60 * TIME_SCALE, marker=None):
            marker = marker or new_marker()
            markers.append(marker)
            proc = subprocess.run(
                [*CORRAL, *args],
                env=dict(self.env, **{MARKER_ENV: marker}),
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
            proc.marker = marker
            return proc

        def ctl(self, *args, timeout=60 * TIME_SCALE):
            return subprocess.run([*CTL, *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    yield Bg()
    for marker in markers:
        kill_marked(marker)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def gone(marker: str, within: float = 5.0) -> list[int]:
    end = time.monotonic() + within
    while (left := marked_pids(marker)) and time.monotonic() < end:
        time.sleep(0.05)
    return left


SERVER = [sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1"]
#: A server's --ready-timeout: the default 30 s, scaled for an emulated machine.
READY_TIMEOUT = ["--ready-timeout", f"{30 * TIME_SCALE:g}s"]


@pytest.mark.parametrize("mode", all_modes())
def test_a_dev_server_runs_in_the_background_until_stopped(bg, mode):
    port = free_port()
    r = bg.start(
        [*mode_flags(mode), "--background", "--name", "web", *READY_TIMEOUT, "--ready-port", str(port), "--", *SERVER]
        + [str(port)]
    )
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip()
    assert (bg.directory / f"{run_id}.json").exists()
    # The front has returned (its stdout pipe closed: capture_output did not wait
    # for the server), and the server is ready and serving.
    assert marked_pids(r.marker), "the background run died with its front"
    assert port_accepts(port)
    fetch = subprocess.run(
        [
            *CORRAL,
            "--",
            sys.executable,
            "-c",
            f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/').status)",
        ],
        env=bg.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert fetch.stdout.strip() == "200", fetch.stderr
    deadline = time.monotonic() + 10
    while '"GET / HTTP' not in (log := bg.ctl("logs", "web").stdout) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert '"GET / HTTP/1.1" 200' in log
    stop = bg.ctl("stop", "web")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert gone(r.marker) == []
    assert not port_accepts(port)
    # wait, after the end: the exit code corral gave (SIGTERM'd by the stop: 143)
    assert bg.ctl("wait", run_id).returncode == 143
    log = (bg.directory / f"{run_id}.out").stat()
    assert log.st_mode & 0o777 == 0o600


@pytest.mark.parametrize("mode", all_modes())
def test_wait_returns_the_exit_code_corral_would_have(bg, mode):
    go = bg.directory.parent / "go"
    r = bg.start(
        [
            *mode_flags(mode),
            "--background",
            "--",
            "sh",
            "-c",
            f"echo done; until [ -e {go} ]; do sleep 0.05; done; exit 3",
        ]
    )
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip()
    assert bg.ctl("wait", run_id, "--timeout", "0.05s").returncode == 124  # still going
    go.touch()
    w = bg.ctl("wait", run_id)
    assert w.returncode == 3, w.stderr
    assert bg.ctl("logs", run_id).stdout.startswith("done\n")
    assert gone(r.marker) == []


@pytest.mark.parametrize("mode", all_modes())
def test_a_leaked_daemon_is_stopped_with_its_background_run(bg, mode):
    ready = bg.directory.parent / "ready"
    r = bg.start(
        [
            *mode_flags(mode),
            "--background",
            "--ready-file",
            str(ready),
            "--",
            "sh",
            "-c",
            f"setsid sh -c 'trap \"\" TERM; while :; do sleep 1; done' & touch {ready}; sleep 1000",
        ]
    )
    assert r.returncode == 0, r.stderr
    assert len(marked_pids(r.marker)) >= 2
    stop = bg.ctl("stop", r.stdout.strip())
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert gone(r.marker) == []


@pytest.mark.parametrize("mode", all_modes())
def test_ready_by_a_line_of_its_output(bg, mode):
    r = bg.start(
        [
            *mode_flags(mode),
            "--background",
            "--ready-log",
            r"listening on \d+",
            "--json",
            "-",
            "--",
            "sh",
            "-c",
            "sleep 0.3; echo listening on 42; sleep 1000",
        ]
    )
    assert r.returncode == 0, r.stderr
    started = json.loads(r.stdout)
    assert set(started) >= {"run_id", "name", "log", "unit", "mode"}
    assert (bg.directory / f"{started['run_id']}.out").read_text().endswith("listening on 42\n")
    assert (started["unit"] is not None) == (mode in ("scope", "service"))
    assert bg.ctl("stop", started["run_id"]).returncode == 0
    assert gone(r.marker) == []


@pytest.mark.parametrize("mode", all_modes())
def test_a_run_that_exits_before_it_is_ready_gives_its_exit_code_and_the_log_tail(bg, mode):
    r = bg.start(
        [
            *mode_flags(mode),
            "--background",
            "--ready-port",
            str(free_port()),
            "--",
            "sh",
            "-c",
            "echo cannot bind >&2; exit 7",
        ]
    )
    assert r.returncode == 7
    assert "cannot bind" in r.stderr and "ended before it was ready (exit 7)" in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("mode", all_modes())
def test_not_ready_in_time_is_stopped_and_124(bg, mode):
    timeout = f"{TIME_SCALE:g}s"
    r = bg.start(
        [
            *mode_flags(mode),
            "--background",
            "--ready-port",
            str(free_port()),
            "--ready-timeout",
            timeout,
            "--grace",
            "0.5s",
            "--",
            "sh",
            "-c",
            "trap '' TERM; setsid sleep 1000 & sleep 1000",
        ]
    )
    assert r.returncode == 124, r.stderr
    # (under emulation the front may not yet have seen it start: "was not started")
    assert f"within {timeout}: stopped" in r.stderr and "was not " in r.stderr
    assert marked_pids(r.marker) == []  # stopped before the front returned


def test_the_log_keeps_head_and_tail_past_log_max(bg):
    r = bg.start(
        [
            "--background",
            "--log-max",
            "2K",
            "--",
            sys.executable,
            "-c",
            "import sys\nfor i in range(5000): print(f'line {i}')",
        ]
    )
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip()
    assert bg.ctl("wait", run_id).returncode == 0
    out = (bg.directory / f"{run_id}.out").read_bytes()
    body = out.split(b"\ncorral: ")[0]  # the run's own summary line follows the output
    assert body.startswith(b"line 0\n") and body.endswith(b"line 4999")
    assert b"bytes of output left out]" in body and len(body) < 2048 + 200
    assert bg.ctl("logs", run_id, "--tail", "1").stdout.startswith("corral: ")


def wait_started(directory, within: float = 20) -> None:
    """Until a run's command has started (its corral logs "started"), at most ``within`` s."""
    end = time.monotonic() + within
    while time.monotonic() < end and not any(
        '"event":"started"' in p.read_text() for p in directory.glob("*.log") if directory.exists()
    ):
        time.sleep(0.02)


def test_a_signal_to_the_waiting_front_stops_the_run(bg):
    marker = new_marker()
    front = subprocess.Popen(
        [*CORRAL, "--background", "--ready-port", str(free_port()), "--", "sleep", "1000"],
        env=dict(bg.env, **{MARKER_ENV: marker}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_started(bg.directory)
        front.send_signal(signal.SIGINT)
        out, err = front.communicate(timeout=30)
        assert front.returncode == 130, err
        assert "stopped before it was ready (SIGINT)" in err
        assert marked_pids(marker) == []
    finally:
        front.kill()
        kill_marked(marker)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--ready-port", "80", "--", "true"], "--ready-port is for --background runs"),
        (["--background", "--ready-port", "0", "--", "true"], "a TCP port, 1 to 65535"),
        (["--background", "--ready-port", "1", "--ready-file", "f", "--", "true"], "one readiness test at a time"),
        (["--background", "--ready-log", "(", "--", "true"], "invalid --ready-log"),
        (["--background", "--no-registry", "--", "true"], "--background needs the registry"),
        (["--background", "--stdin", "inherit", "--", "true"], "stdin is /dev/null"),
        (["--background", "--log-max", "0", "--", "true"], "invalid --log-max '0'"),
        (["--background", "--name", "-x", "--", "true"], "invalid --name"),
        (["--background", "--name", "0123456789ab", "--", "true"], "reads as a run id"),
    ],
)
def test_bad_background_input_is_one_line_and_125(bg, args, says):
    r = bg.start(args)
    assert r.returncode == 125
    assert r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    assert not bg.directory.exists() or not any(p.suffix == ".out" for p in bg.directory.iterdir())


def test_a_port_already_taken_or_a_file_already_there_is_refused(bg, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = bg.start(["--background", "--ready-port", str(taken.getsockname()[1]), "--", "sleep", "100"])
    assert r.returncode == 125 and "already accepts connections" in r.stderr
    there = tmp_path / "there"
    there.write_text("")
    r = bg.start(["--background", "--ready-file", str(there), "--", "sleep", "100"])
    assert r.returncode == 125 and "already exists" in r.stderr
    assert marked_pids(r.marker) == []


def test_a_name_is_one_live_run(bg):
    r = bg.start(["--background", "--name", "db", "--", "sleep", "100"])
    assert r.returncode == 0, r.stderr
    again = bg.start(["--background", "--name", "db", "--", "sleep", "100"])
    assert again.returncode == 125 and "still going" in again.stderr
    assert marked_pids(again.marker) == []
    assert bg.ctl("stop", "db").returncode == 0
    assert gone(r.marker) == []
    assert bg.ctl("logs", "nosuch").returncode == 125


def test_logs_reads_only_the_log_the_id_names(bg, tmp_path):
    """The entry is the run's to rewrite: a forged output_log, or a log replaced by a symlink, is not read."""
    r = bg.start(["--background", "--", "sh", "-c", "echo mine; sleep 100"])
    run_id = r.stdout.strip()
    secret = tmp_path / "secret"
    secret.write_text("not the run's\n")
    entry_path = bg.directory / f"{run_id}.json"
    entry = json.loads(entry_path.read_text())
    entry["output_log"] = str(secret)
    entry_path.write_text(json.dumps(entry))
    time.sleep(0.2)
    assert "not the run's" not in bg.ctl("logs", run_id).stdout
    log = bg.directory / f"{run_id}.out"
    log.unlink()
    log.symlink_to(secret)
    shown = bg.ctl("logs", run_id)
    assert shown.returncode == 125 and "not the run's" not in shown.stdout
    assert bg.ctl("stop", run_id).returncode == 0
    assert gone(r.marker) == []


def test_logs_follow_ends_with_the_run(bg):
    r = bg.start(["--background", "--", "sh", "-c", "for i in 1 2 3; do echo tick $i; sleep 0.2; done"])
    f = bg.ctl("logs", "-f", r.stdout.strip(), timeout=30)
    assert f.returncode == 0
    assert f.stdout.startswith("tick 1\ntick 2\ntick 3\n") and "exit 0" in f.stdout


def test_logs_since_a_cursor_gives_every_byte_once(bg):
    """``logs --since N``: the next cursor is N plus the bytes printed; read in
    steps as the run writes, the pieces are its whole output, once each."""
    r = bg.start(["--background", "--", "sh", "-c", "for i in $(seq 1 30); do echo line $i; sleep 0.02; done"])
    run_id, cursor, pieces = r.stdout.strip(), 0, []
    while True:
        done = bg.ctl("wait", run_id, "--timeout", "0.1s").returncode == 0
        got = bg.ctl("logs", run_id, "--since", str(cursor))
        assert got.returncode == 0, got.stderr
        pieces.append(got.stdout)
        cursor += len(got.stdout.encode())
        if done and not got.stdout:
            break
    text = "".join(pieces)
    assert text.startswith("".join(f"line {i}\n" for i in range(1, 31))), text


@pytest.mark.parametrize("how", ["wait", "logs-follow"])
def test_waiting_for_a_background_run_is_blocked_not_a_tick(bg, how):
    """``corralctl wait`` and ``logs -f`` on a run sleeping 3 s: woken by its corral's
    exit and its entry's writes (a pidfd, inotify), not by a timer -- a 50 ms tick
    would wake them some 60 times; a blocked wait, a handful."""
    r = bg.start(["--background", "--", "sleep", "3"])
    run_id = r.stdout.strip()
    argv = ["wait", run_id] if how == "wait" else ["logs", "-f", run_id]
    waiter = subprocess.Popen([*CTL, *argv], env=bg.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(0.8)  # its start-up (imports) behind it
        try:
            before = voluntary_wakeups(waiter.pid)
        except FileNotFoundError:
            pytest.fail(f"corralctl {how} ended before the run did: {waiter.communicate()}")
        time.sleep(1.5)
        woke = voluntary_wakeups(waiter.pid) - before
        assert waiter.wait(timeout=30 * TIME_SCALE) == 0, waiter.stderr.read()
        assert woke < 10, f"corralctl {how} woke {woke} times in 1.5 s of waiting"
    finally:
        waiter.kill()
        waiter.wait()


@pytest.mark.parametrize("mode", all_modes())
def test_the_run_outlives_its_fronts_process_group_and_holds_none_of_its_descriptors(bg, mode):
    """A runner that kills the tool call's process group, or reads a pipe it
    gave the call to its end, neither kills the background run nor waits for it."""
    import select

    marker = new_marker()
    r, w = os.pipe()
    front = subprocess.Popen(
        [*CORRAL, *mode_flags(mode), "--background", "--", "sleep", "1000"],
        env=dict(bg.env, **{MARKER_ENV: marker}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        pass_fds=(w,),
        start_new_session=True,
    )
    os.close(w)
    try:
        out, err = front.communicate(timeout=60)
        assert front.returncode == 0, err
        assert select.select([r], [], [], 5)[0] and os.read(r, 1) == b"", "the run holds the caller's pipe"
        with pytest.raises(ProcessLookupError):
            os.killpg(front.pid, signal.SIGKILL)  # the front's group: nothing of the run is in it
        time.sleep(0.2)
        assert marked_pids(marker), "the background run died with its front's process group"
        assert bg.ctl("stop", out.strip()).returncode == 0
        assert gone(marker) == []
    finally:
        os.close(r)
        kill_marked(marker)


def _exited(pid: int, within: float) -> bool:
    """Has ``pid`` (not this process's child) exited within ``within`` seconds?"""
    import select

    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([pidfd], [], [], within)[0])
    finally:
        os.close(pidfd)


#: Writes into its own run's log past corral: through corral's descriptor
#: (/proc/$PPID/fd/1: corral's, or the pid namespace init's, a clone of corral's;
#: only where that is the log) and by the log's path in the state directory.
FLOOD = (
    'log="$CORRAL_STATE_DIR/$CORRAL_RUN_ID.out"; echo first; '
    'until grep -q first "$log"; do sleep 0.01; done; until [ -e "$1" ]; do sleep 0.01; done; '
    'if [ /proc/$PPID/fd/1 -ef "$log" ]; then head -c 5000000 /dev/zero | tr "\\0" a >> /proc/$PPID/fd/1; fi; '
    'head -c 5000000 /dev/zero | tr "\\0" b >> "$log"; echo last'
)


@pytest.mark.parametrize("mode", all_modes())
def test_log_max_bounds_the_log_on_disk_whoever_writes_it(bg, mode):
    """--log-max bounds the file, not only what corral relays into it: 5 MB
    written through corral's own descriptor and 5 MB by the log's path are cut
    back (the keeper: core/logkeeper.py), and the log corral leaves is at most
    --log-max + ROOM, its head first and a note saying what was cut."""
    from corral_systemd.core.logkeeper import bound

    go = bg.directory.parent / "go"
    r = bg.start(
        [*mode_flags(mode), "--background", "--log-max", "4K", "--json", "-", "--", "sh", "-c", FLOOD, "sh", str(go)]
    )
    assert r.returncode == 0, r.stderr
    started = json.loads(r.stdout)
    log = bg.directory / f"{started['run_id']}.out"
    go.touch()
    assert bg.ctl("wait", started["run_id"]).returncode == 0
    assert _exited(started["corral_pid"], 60 * TIME_SCALE), "the run's corral did not exit"
    out = log.read_bytes()
    assert len(out) <= bound(4096), len(out)
    assert out.startswith(b"first\n"), out[:100]
    assert b"bytes cut in all]\n" in out, out[-400:]
    assert gone(r.marker) == []


#: Listens on 127.0.0.1:$1 (in its own network namespace, with --network none), then waits.
LISTEN = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(1000)"
)


@pytest.mark.parametrize("mode", all_modes())
def test_ready_port_of_a_network_none_run_is_looked_for_in_its_own_namespace(bg, mode):
    """--ready-port of a run with a network namespace of its own: a host process
    listening on the port neither refuses the run nor makes it ready (the port
    is looked for in the run's namespace, not connected to from the host's);
    the command listening on it there does."""
    from modes import MANAGER

    if mode == "service" and MANAGER == "user":
        pytest.skip("a user manager's service cannot have --network none (test_network.py)")
    with socket.socket() as host:
        host.bind(("127.0.0.1", 0))
        host.listen()
        port = str(host.getsockname()[1])
        timeout = f"{2 * TIME_SCALE:g}s"
        r = bg.start(
            [*mode_flags(mode), "--background", "--network", "none", "--ready-port", port]
            + ["--ready-timeout", timeout, "--", "sleep", "30"]
        )
        assert r.returncode == 124, r.stderr
        assert f"was not accepting connections on port {port} within {timeout}: stopped" in r.stderr, r.stderr
        assert r.stdout == "" and marked_pids(r.marker) == []
        r = bg.start(
            [*mode_flags(mode), "--background", "--network", "none", "--ready-port", port, *READY_TIMEOUT]
            + ["--", sys.executable, "-c", LISTEN, port]
        )
        assert r.returncode == 0, r.stderr
        run_id = r.stdout.strip()
        assert bg.ctl("stop", run_id).returncode == 0
        assert gone(r.marker) == []
