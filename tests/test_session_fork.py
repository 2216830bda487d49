"""Issue 38: a session's holder forks a background run's corral, and a compiled client's front.

The holder has loaded what a run's corral loads, so it forks it (no second
interpreter start); what a fork would carry that exec would not is put right
in the child. The compiled client asks the holder to be a ``--background``
command line's front (no interpreter starts at all for it): the holder reads
the line as corral does, forks the front made the client's context with its
stdio, and the client relays the stop signals and exits with the front's
code. Each test reads the kernel's view (/proc), never a name:

- the run's corral is the holder's child running the holder's program (a
  fork: its command line is the holder's, not a new interpreter's), yet it
  acts on its caller's environment: a knob only the caller set
  (``CORRAL_PIDNS_INIT=python``) decides the run's pid namespace init;
- the session's verdict secrets (``common.verdict``) are in the holder's
  memory and in no byte of the run's corral's (read through /proc/PID/mem:
  root only);
- the caches a fork would share (the journal's socket, the mount table's
  watch) are dropped in a forked child, their descriptors closed at once;
- the directory a holder's starter ran in is not on its module path;
- a compiled client whose own way to Python is gone still starts a background
  run of a session (its front is the holder's), says what corral says, and
  stops the run on a signal as corral's front does; a client of another
  version is declined (its own corral runs it).
"""

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from serving import CLIENT_BUILD, compiled_client  # noqa: F401  (fixture)
from test_background import READY_TIMEOUT, free_port, wait_started
from test_sessions import agent, start_session  # noqa: F401  (fixture)

from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

ROOT = os.geteuid() == 0
HERE = Path(__file__).resolve().parent


def _holder(agent, sid: str) -> int:
    return agent.session_entry(sid)["holder"]["pid"]


def _children(pid: int) -> list[int]:
    kids = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            kids += [int(k) for k in f.read().split()]
    return kids


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _run_corral(agent, sid: str, run_id: str) -> int:
    """The run's corral (its registry entry's owner), checked to be the holder's child."""
    pid = __import__("json").loads((agent.directory / f"{run_id}.json").read_text())["owner"]["pid"]
    assert pid in _children(_holder(agent, sid)), (pid, _children(_holder(agent, sid)))
    return pid


def _serves_on(agent, sid: str, holder: int) -> None:
    """The holder lives and its session is open: a run starts and ends in it, and the
    session ends, proven."""
    assert os.path.exists(f"/proc/{holder}") and agent.session_entry(sid)["state"] == "open"
    run_id = _start(agent, sid, "--", "true")
    assert agent.ctl("wait", run_id).returncode == 0
    end = agent.ctl("session", "end", sid)
    assert end.returncode == 0, end.stderr


def _start(agent, sid: str, *args, env=None) -> str:
    r = agent.corral(["--session", sid, "--background", "--json", "-", *args], env=env)
    assert r.returncode == 0, r.stderr
    started = __import__("json").loads(r.stdout)
    assert started["started_by"] == "holder", started
    return started["run_id"]


@pytest.mark.skipif(not os.path.exists("/proc/self/ns/pid"), reason="no pid namespaces")
def test_the_runs_corral_is_the_holders_fork_and_acts_on_its_callers_environment(agent):
    sid = start_session(agent, mode="pidns")
    holder = _holder(agent, sid)
    for knob, init_is_python in ((None, False), ("python", True)):
        env = {} if knob is None else {"CORRAL_PIDNS_INIT": knob}
        run_id = _start(agent, sid, "--guarantee", "pidns", "--", "sleep", "30", env=env)
        corral = _run_corral(agent, sid, run_id)
        # A fork: the holder's own program and arguments, no interpreter exec'd again.
        assert _cmdline(corral) == _cmdline(holder)
        entry = __import__("json").loads((agent.directory / f"{run_id}.json").read_text())
        init = entry["helper_pids"][0]
        exe = os.path.basename(os.readlink(f"/proc/{init}/exe"))
        assert exe.startswith("python") == init_is_python, (knob, exe)
        stop = agent.ctl("stop", run_id)
        assert stop.returncode == 0, stop.stderr
    end = agent.ctl("session", "end", sid)
    assert end.returncode == 0, end.stderr


def _readable_memory(pid: int) -> bytes:
    """Every readable private mapping of ``pid`` (its heap, its anonymous memory, its data)."""
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if not fields[1].startswith("r") or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
                continue
            try:
                mem.seek(start)
                chunks.append(mem.read(end - start))
            except OSError:
                pass
    return b"".join(chunks)


@pytest.mark.skipif(not ROOT, reason="reading another process's memory (not dumpable) needs CAP_SYS_PTRACE")
def test_the_sessions_secrets_are_in_no_background_runs_corral(agent):
    """The run's corral's memory, read while it waits, holds no byte string of the
    secret its holder reveals at the session's end (proven); the holder's memory,
    read the same way at the same moment, does (so the probe finds it where it is)."""
    sid = start_session(agent, mode="fallback")
    holder = _holder(agent, sid)
    run_id = _start(agent, sid, "--", "sleep", "30")
    corral = _run_corral(agent, sid, run_id)
    time.sleep(0.2)  # waiting, its supervisor started
    seen_in_corral = _readable_memory(corral)
    seen_in_holder = _readable_memory(holder)
    assert len(seen_in_corral) > 1 << 20  # its heap and its interpreter's memory were read
    end = agent.ctl("session", "end", sid)
    assert end.returncode == 0, end.stderr
    secret = bytes.fromhex(agent.session_entry(sid)["verdict"]["secret"])
    assert len(secret) == 32
    in_holder, in_corral = secret in seen_in_holder, secret in seen_in_corral
    assert in_holder, "the probe does not find the secret in the holder's memory"
    assert not in_corral, "the session's secret is in its background run's corral's memory"


_FORK_CACHES = """
import os, socket, sys
from corral_systemd.kernel.cgroupfs import Mounts
from corral_systemd.state import journal

server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
server.bind(sys.argv[1])
journal.SOCKET = sys.argv[1]
sender = journal.sender()
Mounts.current()
held = [sender.sock.fileno(), Mounts._watch_file.fileno()]
pid = os.fork()
if pid == 0:
    closed = []
    for fd in held:
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
    fresh = journal.sender()
    ok = closed == held and fresh is not sender and Mounts._watch_file is None and Mounts.current() is not None
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_drops_the_cached_sockets_and_files(tmp_path):
    r = subprocess.run([sys.executable, "-c", _FORK_CACHES, str(tmp_path / "journal")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


_PATH_PROBE = """
import sys
from corral_systemd.ctl.session_holder import _off_the_callers_directory
first = sys.path[0]
_off_the_callers_directory()
print(repr(first), sys.path[0] != first)
"""


def test_the_directory_a_holders_starter_ran_in_is_off_its_module_path(tmp_path):
    """As ``python -P``: a ``-c`` or ``-m`` start puts its directory first on the path;
    the holder takes it off, so its forks never import a caller's file of a module's name."""
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    r = subprocess.run([sys.executable, "-c", _PATH_PROBE], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["''", "True"], r.stdout
    r = subprocess.run([sys.executable, "-P", "-c", _PATH_PROBE], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.stdout.split()[1] == "False", r.stdout  # -P: nothing of the caller's there to take off


def _client(tmp_path, in_process: str, version: str | None = None) -> list[str]:
    """The compiled client, its way to Python ``in_process``; ``version``: another than the package's."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    binary = tmp_path / "corral"
    if version is None:
        subprocess.run(["sh", CLIENT_BUILD, binary, in_process], env=dict(os.environ, CC=cc), check=True, timeout=120)
    else:
        source = CLIENT_BUILD.parent / "corral.c"
        defines = [f'-DCORRAL_INPROCESS="{in_process}"', f'-DCORRAL_VERSION="{version}"']
        subprocess.run([cc, "-O2", *defines, "-o", binary, source], check=True, timeout=120)
    return [str(binary)]


def test_a_compiled_clients_background_front_is_the_holders(agent, tmp_path):
    """No way to Python left to the client: the run starts all the same (its front is
    the holder's fork), the start record on the client's stdout; the same command
    line outside the session needs the client's own corral, and fails for want of it."""
    client = _client(tmp_path, "/nonexistent/corral-inprocess")
    sid = start_session(agent, mode="fallback")
    marker = new_marker()
    env = dict(agent.env, CORRAL_SERVICE_DEBUG="1", **{MARKER_ENV: marker})
    try:
        r = subprocess.run(
            [*client, "--session", sid, "--background", "--json", "-", "--", "sleep", "30"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        started = __import__("json").loads(r.stdout)
        assert started["started_by"] == "holder" and started["warnings"] == [], started
        assert "not this run's front" not in r.stderr, r.stderr
        assert marked_pids(marker), "the run's command is not running"
        alone = subprocess.run([*client, "--background", "--", "true"], env=env, capture_output=True, text=True)
        assert alone.returncode == 125 and "cannot run the in-process corral" in alone.stderr, alone.stderr
    finally:
        agent.ctl("session", "end", sid)
        kill_marked(marker)


def test_the_holders_front_says_what_corral_says(agent, compiled_client):  # noqa: F811
    sid = start_session(agent, mode="fallback")
    args = ["--session", sid, "--background", "--ready-port", "0", "--", "true"]
    # CORRAL_SERVICE_DEBUG: a client whose holder declined says so (and the two would differ)
    served = subprocess.run(
        [*compiled_client, *args], env=dict(agent.env, CORRAL_SERVICE_DEBUG="1"), capture_output=True, text=True
    )
    own = subprocess.run(
        [*compiled_client, *args], env=dict(agent.env, CORRAL_SERVICE="0"), capture_output=True, text=True
    )
    assert served.returncode == own.returncode == 125
    assert served.stderr == own.stderr and "a TCP port, 1 to 65535" in served.stderr, (served.stderr, own.stderr)
    agent.ctl("session", "end", sid)


def test_a_signal_to_the_client_stops_the_run_as_corrals_front_does(agent, compiled_client):  # noqa: F811
    sid = start_session(agent, mode="fallback")
    marker = new_marker()
    front = subprocess.Popen(
        [*compiled_client, "--session", sid, "--background", "--ready-port", str(free_port()), "--", "sleep", "1000"],
        env=dict(agent.env, CORRAL_SERVICE_DEBUG="1", **{MARKER_ENV: marker}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_started(agent.directory)
        front.send_signal(__import__("signal").SIGINT)
        out, err = front.communicate(timeout=30)
        assert front.returncode == 130, err
        assert "stopped before it was ready (SIGINT)" in err and "not this run's front" not in err, err
        assert marked_pids(marker) == []
    finally:
        front.kill()
        agent.ctl("session", "end", sid)
        kill_marked(marker)


def _in_session(agent, client: list[str], sid: str, *args: str) -> subprocess.CompletedProcess:
    """``client --session SID --background ARGS``; CORRAL_SERVICE_DEBUG: a declined front says why."""
    return subprocess.run(
        [*client, "--session", sid, "--background", *args],
        env=dict(agent.env, CORRAL_SERVICE_DEBUG="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_client_of_another_version_is_declined_by_the_holder(agent, tmp_path):
    in_process = tmp_path / "corral-inprocess"
    in_process.write_text(
        f"#!{sys.executable} -I\nfrom corral_systemd.client import entry_in_process\n\nentry_in_process()\n"
    )
    in_process.chmod(0o755)
    client = _client(tmp_path, str(in_process), version="0.0.0-another")
    sid = start_session(agent, mode="fallback")
    r = _in_session(agent, client, sid, "--json", "-", "--", "true")
    agent.ctl("session", "end", sid)
    assert r.returncode == 0, r.stderr
    assert "the session's holder is not this run's front" in r.stderr and "0.0.0-another" in r.stderr, r.stderr


_WIPED = """
import os, sys
from corral_systemd.common.verdict import Verdicts

verdicts = Verdicts()
before = verdicts.session_id
child = os.fork()
if child == 0:  # a fork before the holder says so: the secrets are there (the holder is one)
    os._exit(0 if verdicts.session_id == before else 1)
assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0, "a fork before keep_from_forks lost them"
verdicts.keep_from_forks()
child = os.fork()
if child == 0:
    os._exit(0 if bytes(verdicts._proven) == bytes(32) and bytes(verdicts._unproven) == bytes(32) else 1)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
"""


def test_a_fork_of_the_holder_sees_the_secrets_wiped():
    """Any uid: once the holder has said so, its forks read zeros where the secrets are."""
    r = subprocess.run([sys.executable, "-c", _WIPED], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_what_the_holder_cannot_read_never_ends_the_session(agent, compiled_client):  # noqa: F811
    """A Front call whose parameters are not an object, and a command line whose
    --ready-log the regex engine refuses (OverflowError): each is answered, the
    second by the client's own corral; the holder serves on and a run still joins."""
    from corral_systemd.state import sessions as S
    from corral_systemd.varlink.wire import Channel, VarlinkError

    sid = start_session(agent, mode="fallback")
    holder = _holder(agent, sid)
    sock, _pid = S.connect_holder(sid)
    with pytest.raises(VarlinkError) as refused:
        Channel(sock).call(S.FRONT_METHOD, [1])
    sock.close()
    assert refused.value.name.endswith(".InvalidParameter"), refused.value.name
    r = _in_session(agent, compiled_client, sid, "--ready-log", "a{4294967296}", "--", "true")
    assert "the session's holder is not this run's front" in r.stderr, r.stderr
    _serves_on(agent, sid, holder)


def test_a_client_gone_before_the_run_is_ready_stops_it_and_frees_its_pipes(agent, compiled_client):  # noqa: F811
    """As a served caller's lost connection: the front sees the client's connection
    hang up, stops the run, and no longer holds the caller's stdout."""
    sid = start_session(agent, mode="fallback")
    marker = new_marker()
    front = subprocess.Popen(
        [*compiled_client, "--session", sid, "--background", "--ready-timeout", "120s"]
        + ["--ready-port", str(free_port()), "--", "sleep", "1000"],
        env=dict(agent.env, **{MARKER_ENV: marker}),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_started(agent.directory)
        assert marked_pids(marker), "the run's command did not start"
        front.kill()
        front.wait()
        # End of file well before the readiness timeout: nothing holds the pipe's write end.
        assert select.select([front.stdout], [], [], 20)[0], "the caller's stdout is still held"
        assert front.stdout.read() == b""
        end = time.monotonic() + 20
        while marked_pids(marker) and time.monotonic() < end:
            time.sleep(0.05)
        assert marked_pids(marker) == []
    finally:
        front.kill()
        agent.ctl("session", "end", sid)
        kill_marked(marker)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_signal_before_the_holders_answer_goes_to_the_front(agent, compiled_client):  # noqa: F811
    """SIGINT while the holder has not answered yet (held back: the holder is
    stopped) is not the client's death (which would leave the front to start the
    run unwatched): relayed once the front exists, it ends the front, 130 as
    corral's front says it, and no run is left: the front was stopped before it
    started one, or stopped it. A fallback holder continues itself every 2 s
    (``CONTINUE_EVERY``): an attempt in which it was not stopped still when the
    signal went is made again, with a new session."""
    import signal

    for _attempt in range(5):
        sid = start_session(agent, mode="fallback")
        holder = _holder(agent, sid)
        marker = new_marker()
        front = None
        os.kill(holder, signal.SIGSTOP)
        try:
            front = subprocess.Popen(
                [*compiled_client, "--session", sid, "--background"]
                + ["--ready-port", str(free_port()), "--", "sleep", "1000"],
                env=dict(agent.env, CORRAL_SERVICE_DEBUG="1", **{MARKER_ENV: marker}),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(0.3)  # its call sent, its answer not come
            if _state(holder) != "T":
                continue  # continued by its own timer meanwhile: perhaps answered already
            front.send_signal(signal.SIGINT)
            time.sleep(0.1)
            if _state(holder) != "T":
                continue
            os.kill(holder, signal.SIGCONT)
            out, err = front.communicate(timeout=60)
            assert front.returncode == 130, (front.returncode, err)  # not -2: the client did not die of it
            assert "not this run's front" not in err, err
            time.sleep(0.5)  # a run the front had started is stopped before it exits: none is left to appear
            assert marked_pids(marker) == []
            return
        finally:
            os.kill(holder, signal.SIGCONT)
            if front is not None:
                front.kill()
                front.wait()
            agent.ctl("session", "end", sid)
            kill_marked(marker)
    pytest.fail("the holder was continued by its own timer in every attempt")


def test_a_front_that_cannot_be_made_on_the_clients_stdio_ends_alone(agent, compiled_client):  # noqa: F811
    """A client whose stderr is a directory: no stream can be made on it in the
    front (as no interpreter could start on it), so the front ends, 125, and never
    returns into the holder's code it was forked from: the holder serves on."""
    sid = start_session(agent, mode="fallback")
    holder = _holder(agent, sid)
    directory = os.open(agent.directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        r = subprocess.run(
            [*compiled_client, "--session", sid, "--background", "--", "true"],
            env=agent.env,
            stdout=subprocess.PIPE,
            stderr=directory,
            timeout=60,
        )
    finally:
        os.close(directory)
    assert r.returncode == 125, r.returncode
    _serves_on(agent, sid, holder)


def test_a_run_its_holders_front_forked_is_kept_below_the_holder(agent, compiled_client):  # noqa: F811
    """The holder's front forks the run's corral itself, with the request it read (no
    ``Spawn``): while the front waits, the run's corral is the front's child (not the
    holder's, as a Spawned one is); once the front has exited, it is the holder's child
    (its subreaper), a background run's, so it keeps no session open past its idle
    timeout (the kernel's word: its parent was the holder's front); and the session's end
    stops and proves it, its record written."""
    import json

    from conftest import TIME_SCALE

    idle = 3 * TIME_SCALE
    sid = start_session(agent, "--idle-timeout", f"{idle:g}s", mode="fallback")
    holder = _holder(agent, sid)
    marker = new_marker()
    ready = agent.directory.parent / "ready"
    try:
        client = subprocess.Popen(
            [*compiled_client, "--session", sid, "--background", "--json", "-", "--ready-file", str(ready)]
            + [*READY_TIMEOUT, "--", "sleep", "1000"],
            env=dict(agent.env, CORRAL_SERVICE_DEBUG="1", **{MARKER_ENV: marker}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_started(agent.directory, within=20 * TIME_SCALE)
        (entry,) = agent.directory.glob("*.json")
        corral = json.loads(entry.read_text())["owner"]["pid"]
        front = _ppid(corral)  # while the front waits: the run's corral is its child, and it the holder's
        assert front != holder and _ppid(front) == holder, (corral, front, holder)
        ready.touch()
        out, err = client.communicate(timeout=60 * TIME_SCALE)
        assert client.returncode == 0, err
        r = subprocess.CompletedProcess(client.args, 0, out, err)
        started = json.loads(r.stdout)
        assert started["started_by"] == "holder" and "not this run's front" not in r.stderr, (started, r.stderr)
        _run_corral(agent, sid, started["run_id"])  # the holder's child: its front has exited
        ended = agent.wait_ended(sid, within=30 * TIME_SCALE)
        assert ended["why"] == f"idle for {idle:g}s" and ended["not_proven"] == [], ended
        assert marked_pids(marker) == []
        record = json.loads((agent.directory / f"{started['run_id']}.json").read_text())
        assert record["state"] == "finished" and record["verified"] is True, record
    finally:
        agent.ctl("session", "end", sid)
        kill_marked(marker)


_GATE = """
import json, os, sys
from corral_systemd.ctl import session_spawner

r, w = os.pipe()

def become():
    os.write(w, b"ran")
    return 0

import socket

from corral_systemd.state import sessions
from corral_systemd.varlink.wire import Channel

pid, pidfd, gate = session_spawner._fork_answered(os.open(os.devnull, os.O_WRONLY), (w,), become)
holder = session_spawner.Spawner("/nonexistent", "x")
mine, theirs = socket.socketpair()
how = sys.argv[1]
if how == "died":
    os.close(gate)  # as the kernel closes a SIGKILLed holder's descriptors, unanswered
elif how == "unasked":  # a front of an earlier version asks for no gate: let go once the answer is sent
    assert holder._answer(Channel(mine), pid, pidfd, gate, caller_releases=False) is True
    reply, fds = Channel(theirs).receive()
    assert "gate" not in reply["parameters"] and len(fds) == 1, reply
elif how == "caller-gone":  # before its answer: the answer cannot be sent
    theirs.close()
    assert holder._answer(Channel(mine), pid, pidfd, gate, caller_releases=True) is False
else:  # the gate goes with the answer: its caller lets the child go
    assert holder._answer(Channel(mine), pid, pidfd, gate, caller_releases=True) is True
    if how == "answered":  # as a Python front and the compiled client do once they have read it
        reply, fds = Channel(theirs).receive()
        assert reply["parameters"]["gate"] == 1 and len(fds) == 2, reply
        sessions.release(fds[reply["parameters"]["gate"]])
    else:  # "given-up": the caller's timeout came as the answer landed: never read
        theirs.close()
os.close(w)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps({"code": code, "ran": os.read(r, 16).decode()}))
"""


@pytest.mark.parametrize("holder", ["answered", "unasked", "died", "caller-gone", "given-up"])
def test_a_calls_child_runs_only_once_its_caller_was_answered(holder):
    """Spawn's run corral and Front's front are held at a gate whose other end goes to
    the caller with the answer: the caller lets the child go once it has read it. A
    holder killed before answering, a caller gone, or one that gave up waiting as the
    answer landed (a Python front's timeout: it then starts the run itself) leaves a
    child that exits without a run, so no run is started twice. A caller of an earlier
    version, which asks for no gate, has its child let go once the answer is sent."""
    r = subprocess.run([sys.executable, "-c", _GATE, holder], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    told = __import__("json").loads(r.stdout)
    ran = holder in ("answered", "unasked")
    assert told == ({"code": 0, "ran": "ran"} if ran else {"code": 125, "ran": ""}), told


def test_a_call_given_up_midway_closes_the_gate_half_an_answer_brought():
    """A Python front's Spawn call that times out with half the holder's answer read
    (its descriptors come with the first bytes) closes them with the connection: the
    gate among them, unreleased, ends the holder's child instead of leaving it blocked."""
    import socket

    from corral_systemd.kernel.fdpass import rights
    from corral_systemd.varlink.wire import Channel

    r, w = os.pipe()
    mine, theirs = socket.socketpair()
    theirs.sendmsg([b'{"parameters": {"pid": 1, "pidfd": 0, '], rights([w]))
    os.close(w)
    mine.settimeout(0.1)
    channel = Channel(mine)
    with pytest.raises(TimeoutError):
        channel.receive()
    channel.close()
    try:
        assert select.select([r], [], [], 5)[0] and os.read(r, 1) == b"", "a write end of the gate is still open"
    finally:
        os.close(r)
        theirs.close()


def test_a_foreground_run_inside_a_background_run_keeps_its_session_busy(agent):
    """A run's corral whose parent is a background run's own corral (a subreaper run's
    command) is a foreground member, as one started anywhere else: only a child of a
    front the holder forked is taken for a background run's corral."""
    from conftest import TIME_SCALE

    idle = 3 * TIME_SCALE
    sid = start_session(agent, "--idle-timeout", f"{idle:g}s", mode="fallback")
    nested = [sys.executable, "-m", "corral_systemd", "--guarantee", "subreaper", "--session", sid]
    r = agent.corral(
        ["--guarantee", "subreaper", "--session", sid, "--background", "--", *nested, "--", "sleep", f"{3 * idle:g}"]
    )
    try:
        assert r.returncode == 0, r.stderr
        time.sleep(2 * idle)
        assert agent.session_entry(sid)["state"] == "open"  # idle for its timeout, but the nested run goes on
        assert agent.wait_ended(sid, within=30 * TIME_SCALE)["why"] == f"idle for {idle:g}s"
    finally:
        agent.ctl("session", "end", sid)
