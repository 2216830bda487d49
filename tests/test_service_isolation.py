"""Issue 24: runs handed to the corral service are isolated from each other
and from the service, and nothing a command can write steers it.

- what a command does to its ``$PPID`` (signal it, stop it, lower its
  rlimits) reaches its own run only: a concurrent run ends as it would
  alone, and the service stays up (no command has the service as its parent);
- hijacks: a client started with stdout closed does not hand the command its
  socket to the service; a second Run call written onto a client's
  connection is never run (one run per connection); in-process, a closed
  stdin does not become corral's signal pipe;
- the protocol with every kind of descriptor in every slot: an error, or a
  run, never a dead or weakened service, never a changed flag on a file the
  caller shares;
- a thread of the service that dies stops the service loudly;
- service-type runs: a process that leaves the unit through the manager is
  found and the run says 120; what the stop found is counted; SIGPIPE is at
  its default.
"""

import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from serving import Service, client, compiled_client, run_corral, service  # noqa: F401  (fixtures)
from test_registry import wait_for

from conftest import CORRAL, TIME_SCALE
from corral_systemd.varlink.wire import Channel
from modes import MANAGER, scope_flag
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

RUN = "io.corral.Run.Run"
systemd = pytest.mark.systemd


def _call_params(argv: list[str], **descriptors) -> dict:
    """A Run call's parameters for ``argv`` (this process's environment, cwd /);
    ``descriptors``: the indexes of the ones it passes (none: captured output)."""
    return {
        "program": "corral",
        "argv": argv,
        "environment": [f"{k}={v}" for k, v in os.environ.items()],
        "cwd": "/",
        "umask": 0o22,
        **descriptors,
    }


def _start(svc, client_argv, marker, *args, stdout=subprocess.PIPE, **kw):
    return subprocess.Popen(
        [*client_argv, *args],
        env={**svc.env(), MARKER_ENV: marker},
        stdout=stdout,
        stderr=subprocess.PIPE,
        **kw,
    )


# -- $PPID: each run's own ---------------------------------------------------------------


@systemd
@pytest.mark.parametrize(
    "attack,own_code",
    [
        ("kill -TERM $PPID; sleep 5", 143),
        ("kill -QUIT $PPID; sleep 5", 131),
        ("prlimit --pid $PPID --nofile=4: && exit 0", 0),
    ],
    ids=["kill-TERM", "kill-QUIT", "prlimit-nofile"],
)
def test_what_a_command_does_to_its_ppid_reaches_its_own_run_only(service, client, attack, own_code):
    """A concurrent clean run ends as it would alone (0, verified), the service answers afterwards."""
    calm, rough = new_marker(), new_marker()
    try:
        other = _start(service, client, calm, "--json", "-", "--quiet", "--", "sh", "-c", "sleep 2; echo done")
        wait_for(lambda: marked_pids(calm), timeout=30)
        mine = _start(service, client, rough, "--", "sh", "-c", attack)
        assert mine.wait(timeout=60) == own_code, mine.stderr.read()
        out, err = other.communicate(timeout=60)
        assert other.returncode == 0, err
        record = json.loads(out.split(b"\n", 1)[1])
        assert record["via"] == "service" and record["verified"] is True
        assert service.alive()
        assert not marked_pids(rough) and not marked_pids(calm)
    finally:
        kill_marked(calm)
        kill_marked(rough)


@systemd
def test_a_command_that_stops_its_ppid_is_still_stopped_at_its_deadline(service, client):
    """``kill -STOP $PPID`` freezes this run's client only: its command is
    stopped at its wall all the same (the service keeps the deadline), a
    concurrent run ends at once, and once the client is continued it says 124."""
    rough, calm = new_marker(), new_marker()
    wall = 3 * TIME_SCALE
    try:
        mine = _start(
            service, client, rough, "--wall", f"{wall}s", "--", "sh", "-c", "kill -STOP $PPID; exec sleep 600"
        )
        wait_for(lambda: _state(mine.pid) == "T", timeout=30)
        other = run_corral(service, ["--", "true"], marker=calm, client=client, timeout=60)
        assert other.returncode == 0, other.stderr
        commands = lambda: [p for p in marked_pids(rough) if p != mine.pid]  # noqa: E731  (the client has the mark too)
        assert wait_for(lambda: not commands(), timeout=wall + 30), "the command outlived its wall"
        os.kill(mine.pid, signal.SIGCONT)
        assert mine.wait(timeout=60) == 124, mine.stderr.read()
    finally:
        kill_marked(rough)
        kill_marked(calm)


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


# -- hijacks -----------------------------------------------------------------------------

_FORGE = r"""
import ctypes, json, os, signal, socket, sys
# Find the client (this command's parent) and its connection to the service.
client = os.getppid()
libc = ctypes.CDLL(None, use_errno=True)
pidfd = os.pidfd_open(client)
forged = {"method": "io.corral.Run.Run", "more": True, "parameters": {
    "program": "corral", "argv": ["--grace", "100h", "--", "sh", "-c", "trap '' TERM; exec sleep 600"],
    "environment": [k + "=" + v for k, v in os.environ.items() if k != "CORRAL_TEST_MARKER"]
                   + ["CORRAL_TEST_MARKER=" + sys.argv[1]],
    "cwd": "/", "umask": 18}}
data = json.dumps(forged).encode() + b"\0"
written = []
# 1. onto this command's own stdout (the client's socket, if it had taken fd 1)
try:
    written.append(("stdout", os.write(1, data)))
except OSError as exc:
    written.append(("stdout", str(exc)))
# 2. onto the client's sockets themselves, taken with pidfd_getfd (root may)
for name in os.listdir(f"/proc/{client}/fd"):
    try:
        if not os.readlink(f"/proc/{client}/fd/{name}").startswith("socket:"):
            continue
    except OSError:
        continue
    fd = libc.syscall(438, pidfd, int(name), 0)  # pidfd_getfd
    if fd >= 0:
        try:
            written.append((name, os.write(fd, data)))
        except OSError as exc:
            written.append((name, str(exc)))
print(json.dumps(written), file=sys.stderr, flush=True)
os.kill(client, signal.SIGSTOP)
"""


@systemd
@pytest.mark.parametrize("closed", [">&-", ""])
def test_a_run_written_onto_the_clients_connection_never_runs(service, client, tmp_path, closed):
    """The command writes a second Run call (a TERM-ignoring sleep with a
    100 h grace) onto the client's stdout -- its connection to the service,
    had a closed fd 1 let the socket take that number -- and onto every
    socket of the client (pidfd_getfd), then SIGSTOPs the client. The
    forged run never runs: the client opens /dev/null on a closed 1, and
    the service takes one Run per connection."""
    if os.geteuid() != 0:
        pytest.skip("pidfd_getfd of the client needs root here")
    forge = tmp_path / "forge.py"
    forge.write_text(_FORGE)
    mine, forged = new_marker(), new_marker()
    try:
        proc = subprocess.Popen(
            ["sh", "-c", f'exec "$@" {closed}', "sh", *client, "--quiet", "--", sys.executable, str(forge), forged],
            env={**service.env(), MARKER_ENV: mine},
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL if not closed else None,
        )
        wait_for(lambda: _state(proc.pid) == "T" or proc.poll() is not None, timeout=60)
        time.sleep(2 * TIME_SCALE)  # a forged run would be running by now
        assert not marked_pids(forged), "the forged call ran"
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        time.sleep(1 * TIME_SCALE)
        assert not marked_pids(forged), "the forged call ran once its client went on"
        assert service.alive()
    finally:
        kill_marked(forged)
        kill_marked(mine)


def test_a_closed_stdin_is_not_corrals_signal_pipe_in_process(tmp_path):
    """In-process, corral's first pipe would take a closed fd 0: the command
    (``--stdin inherit``) would read corral's signal bytes. With /dev/null
    there (the command's stdin is /dev/null), SIGTERM stops the run at once
    (143), not at the wall (124)."""
    witness = tmp_path / "stdin"
    marker = new_marker()
    env = {**os.environ, MARKER_ENV: marker, "CORRAL_SERVICE": "0"}
    try:
        proc = subprocess.Popen(
            [
                "sh",
                "-c",
                'exec "$@" <&-',
                "sh",
                *CORRAL,
                "--cgroup-mode",
                "fallback",
                "--stdin",
                "inherit",
                "--wall",
                f"{20 * TIME_SCALE}s",
                "--grace",
                "200ms",
                "--",
                "sh",
                "-c",
                f"readlink /proc/$$/fd/0 > {witness}; cat >/dev/null; exec sleep 60",
            ],
            env=env,
            stderr=subprocess.PIPE,
        )
        wait_for(lambda: len(marked_pids(marker)) >= 2, timeout=60)
        time.sleep(0.5 * TIME_SCALE)
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        assert proc.wait(timeout=60) == 143, proc.stderr.read()
        assert time.monotonic() - start < 10 * TIME_SCALE
        assert witness.read_text().strip() == "/dev/null"
    finally:
        kill_marked(marker)


# -- the protocol, with every kind of descriptor ----------------------------------------


def _fd_kinds(tmp_path):
    """One descriptor of each kind, and a closer for them all."""
    made = {}
    made["directory"] = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    a, b = socket.socketpair()
    made["socket"], made["socket-peer"] = a.detach(), b.detach()
    epoll = select.epoll()
    made["epoll"] = os.dup(epoll.fileno())
    epoll.close()
    made["eventfd"] = os.eventfd(0)
    made["pidfd"] = os.pidfd_open(os.getpid())
    made["memfd"] = os.memfd_create("corral-fuzz")
    master, slave = os.openpty()
    made["tty"], made["tty-master"] = slave, master
    r, w = os.pipe()
    made["pipe-write-end"], made["pipe-read-end"] = w, r
    made["regular file"] = os.open(str(tmp_path / "file"), os.O_RDWR | os.O_CREAT)
    return made


@systemd
def test_every_kind_of_descriptor_in_every_slot_leaves_the_service_whole(service, tmp_path):
    """Each kind of descriptor as control, process, gate and exit: the call
    gets an error reply or runs (a kind a slot may take), the service stays
    up, never sets a flag on the caller's open file, and afterwards a run's
    signal still reaches it (its watcher is alive)."""
    made = _fd_kinds(tmp_path)
    base = _call_params(["--quiet", "--", "true"], stdin=0, stdout=1, stderr=2)
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        flags_before = {name: fcntl.fcntl(fd, fcntl.F_GETFL) for name, fd in made.items()}
        for slot in ("control", "process", "gate", "exit"):
            for kind, fd in made.items():
                params = dict(base)
                fds = [devnull, devnull, devnull, fd]
                if slot == "control":
                    params["control"] = 3
                else:  # the three held-process slots: this kind in one, real-looking ones in the others
                    params.update(process=3, gate=3, exit=3)
                    params[slot] = 3
                channel = service.channel()
                channel.send({"method": RUN, "parameters": params, "more": True}, fds)
                while (got := channel.receive()) is not None:
                    reply, reply_fds = got
                    for extra in reply_fds:
                        os.close(extra)
                    if not reply.get("continues"):
                        break
                assert got is not None, (slot, kind)
                assert "error" in reply or reply["parameters"]["exit_code"] == 0, (slot, kind, reply)
                assert service.alive(), (slot, kind)
        # The caller's own stdin as the control pipe: read through the service's own open file.
        r, w = os.pipe()
        params = dict(base, argv=["--quiet", "--", "sleep", "0.2"], control=0, stdin=0)
        service.channel().call(RUN, params, [r, devnull, devnull])
        assert not fcntl.fcntl(r, fcntl.F_GETFL) & os.O_NONBLOCK
        os.close(r)
        os.close(w)
        assert {name: fcntl.fcntl(fd, fcntl.F_GETFL) for name, fd in made.items()} == flags_before
        for method, params in (
            ("org.varlink.service.GetInterfaceDescription", ["io.corral.Run"]),
            ("org.varlink.service.GetInterfaceDescription", {"interface": ["x"]}),
            ("org.varlink.service.GetInterfaceDescription", {"interface": 7}),
            ("io.corral.Run.Status", [1, 2]),
        ):
            channel = service.channel()
            channel.send({"method": method, "parameters": params})
            reply, _ = channel.receive()
            assert reply.get("error") != "io.corral.Run.InternalError", (method, params, reply)
            assert service.alive()
    finally:
        for fd in (*made.values(), devnull):
            os.close(fd)
    # The watcher still watches: a signal to a later client stops its run (143).
    marker = new_marker()
    try:
        later = _start(service, CORRAL, marker, "--grace", "300ms", "--", "sh", "-c", "echo started; exec sleep 60")
        assert later.stdout.readline() == b"started\n"
        later.send_signal(signal.SIGTERM)
        assert later.wait(timeout=60) == 143
    finally:
        kill_marked(marker)


def test_a_dead_watcher_stops_the_service(tmp_path, capfd):
    """The thread that turns clients' signals and deaths into stops dies (a
    bug): the service says so on stderr, stops the runs in flight (as for
    SIGTERM), takes no more runs, exits 1."""
    from corral_systemd.service import server

    listener = server.bind(str(tmp_path / "sock"))
    listener.setblocking(False)
    svc = server.Service(listener, manager_kind=MANAGER, idle_exit=600)
    run = _FakeExecution()

    def bug(fd):
        raise RuntimeError("a bug in the watcher")

    def break_it():
        time.sleep(0.2)
        svc.watcher._event = bug
        fd = os.eventfd(1)  # readable at once: the loop calls _event
        svc.watcher.watch(run, fd, os.pidfd_open(os.getpid()))

    threading.Thread(target=break_it, daemon=True).start()
    # Should the service not stop by itself, SIGTERM stops it (exit 0: this test fails, not hangs).
    watchdog = threading.Timer(30 * TIME_SCALE, lambda: os.kill(os.getpid(), signal.SIGTERM))
    watchdog.start()
    try:
        code = svc.serve()  # the main thread's: it sets signal handlers
    finally:
        watchdog.cancel()
    listener.close()
    assert code == 1
    assert svc.watcher.failed and "a bug in the watcher" in svc.watcher.failed
    assert run.cancelled == [signal.SIGTERM]
    assert "a part of it failed" in capfd.readouterr().err


class _FakeExecution:
    def __init__(self):
        self.cancelled = []

    def cancel(self, signum):
        self.cancelled.append(signum)


# -- service-type runs ---------------------------------------------------------------------


@systemd
@pytest.mark.parametrize("unit_type", ["service", "scope"])
@pytest.mark.parametrize("served", [True, False])
def test_a_process_that_leaves_the_unit_through_the_manager_is_found(corral, service, unit_type, served):
    """``systemd-run --scope`` moves a process of the run into a unit of its
    own: it is found (it keeps the run's session and mark), killed, and the
    run says 120 -- for a service as for a scope (before: a service said 0,
    verified, 9 times in 10, and the process lived on)."""
    env = service.env() if served else {**os.environ, "CORRAL_SERVICE": "0"}
    escape = f"systemd-run {' '.join(scope_flag())} --scope -q sleep 600 & sleep 1"
    for _ in range(3):
        run = corral(["--unit-type", unit_type, "--", "sh", "-c", escape], env=env)
        assert run.returncode == 120, run.stderr
        assert run.record["via"] == ("service" if served else "cli")
        assert run.record["engine"].get("escape_tracking", {}).get("escaped_pids"), run.record["engine"]
        assert not run.survivors, run.survivors


@systemd
def test_what_a_services_stop_found_is_counted_and_sigpipe_is_default(corral):
    run = corral(["--unit-type", "service", "--", "sh", "-c", "setsid sleep 100 & sleep 100 & exit 0"])
    assert run.returncode == 0 and run.record["processes_stopped"] >= 2, run.record
    assert not run.survivors
    run = corral(["--unit-type", "service", "--", "sh", "-c", "yes | head -1"])
    assert run.returncode == 0 and run.stdout == b"y\n" and b"Broken pipe" not in run.stderr, run.stderr


@systemd
def test_a_callers_other_children_are_not_taken_for_the_runs_orphans(service, tmp_path):
    """The subreaper above a served command is its caller; a caller may have
    children of its own (an agent's runtime, this soak-like script). Only
    orphans carrying the run's mark are the run's: the caller's bystander
    child lives on, and so does the caller's own child the corral service
    runs as (before the mark was required: the soak's service was
    SIGKILLed as an "orphan" of its own client)."""
    script = tmp_path / "caller.py"
    script.write_text(
        "import os, subprocess, sys\n"
        "from corral_systemd.client import run_via_service\n"
        "bystander = subprocess.Popen(['sleep', '60'], env={'PATH': os.environ['PATH']})\n"
        "argv = ['--quiet', '--', 'sh', '-c', 'setsid sleep 1 & exit 0']\n"
        "code = run_via_service(argv, 'corral-enforced', sys.argv[1])\n"
        "alive = bystander.poll() is None\n"
        "bystander.kill(); bystander.wait()\n"
        "print(code, alive)\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script), service.path], env=service.env(), capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.split() == ["0", "True"], proc.stdout + proc.stderr
    assert service.alive()


@systemd
def test_a_second_run_on_one_connection_is_never_run(service, tmp_path):
    """One Run per connection: a second call written after the first (by a
    command that got hold of the socket, say) is never read, let alone run;
    the service closes the connection after the first reply."""
    witness = tmp_path / "second-ran"
    params = _call_params(["--quiet", "--", "true"])
    second = _call_params(["--quiet", "--", "touch", str(witness)])
    channel = service.channel()
    channel.send({"method": RUN, "parameters": params})
    channel.send({"method": RUN, "parameters": second})
    reply, _ = channel.receive()
    assert reply["parameters"]["exit_code"] == 0
    try:
        assert channel.receive() is None  # closed, no second reply
    except ConnectionResetError:
        # Closed too: the second call was still unread on the service's side
        # (it came after the service read the first), and a unix socket closed
        # with bytes unread is a reset for its peer, not an end of file.
        pass
    time.sleep(1 * TIME_SCALE)
    assert not witness.exists()


@systemd
def test_a_caller_without_descriptors_gets_a_parent_of_its_runs_own(service):
    """A caller that passes no process (the Node example): the command's
    parent is a holder of the run's own, never the service; what the
    command does to its $PPID ends its own run only."""
    import base64

    params = _call_params(["--quiet", "--", "sh", "-c", "echo $PPID; kill -TERM $PPID; sleep 5"])
    reply, _ = service.channel().call(RUN, params)
    parent = int(base64.b64decode(reply["stdout"]))
    assert parent != service.proc.pid
    assert service.alive()
