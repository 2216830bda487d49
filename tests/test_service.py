"""Issue 16: the corral service (io.corral.Run over Varlink) and the CLI's client side.

Host tests (no manager needed): the wire protocol under malformed and
hostile input (the service stays up and answers), a second user refused,
the client's choices (no service, CORRAL_SERVICE=0, a service that dies
before or after it took the run), idle exit.

Systemd tests (beside a manager; ``systemd`` marker): runs handed to a real
service on a private socket keep every guarantee of the in-process CLI:
exit codes, output on the client's own descriptors, --json written by the
client, environment, cwd, umask, credentials, the registry; the client
SIGKILLed or signalled; the service killed or stopped mid-run.

``service_unit`` (run alone: it installs corral.socket at the default path,
which every corral of the user would then use): socket activation through
``corralctl service install --runtime``, idle exit and re-activation.
"""

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving import REPO, Service, client, compiled_client, run_corral, service  # noqa: F401  (fixtures)
from test_registry import wait_for

from conftest import CORRAL, TIME_SCALE, scale_walls
from corral_systemd.varlink.wire import MAX_FDS, MAX_MESSAGE, Channel, VarlinkError
from modes import MANAGER
from procscan import MARKER_ENV, kill_marked, marked_pids

RUN = "io.corral.Run.Run"


def _run_params(**overrides) -> dict:
    params = {
        "program": "corral",
        "argv": ["--", "true"],
        "environment": [f"{k}={v}" for k, v in os.environ.items()],
        "cwd": os.getcwd(),
        "umask": 0o22,
        "stdin": 0,
        "stdout": 1,
        "stderr": 2,
        "control": 3,
    }
    params.update(overrides)
    return params


# -- the wire, hostile peers ---------------------------------------------------


def _raw(svc: Service, data: bytes, fds=()) -> bytes:
    """Send raw bytes; what the service answers before it closes (or 2 s pass)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2 * TIME_SCALE)
    sock.connect(svc.path)
    try:
        if fds:
            sock.sendmsg(
                [data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds))]
            )
        else:
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out
    except (TimeoutError, ConnectionResetError, BrokenPipeError):
        return b""
    finally:
        sock.close()


def test_malformed_messages_get_a_varlink_error_and_the_service_stays_up(service):
    for data, expected in [
        (b"not json\0", b"org.varlink.service.InvalidParameter"),
        (b"[1,2,3]\0", b"org.varlink.service.InvalidParameter"),
        (b'{"method": 42}\0', b"org.varlink.service.InvalidParameter"),
        (b'{"method": "io.corral.Run.Nope"}\0', b"org.varlink.service.MethodNotFound"),
        (b'{"method": "io.corral.Run.Run", "parameters": {}}\0', b'"parameter":"program"'),
        (b'{"method": "io.corral.Run.Run", "parameters": 7}\0', b'"parameter":"parameters"'),
        (json.dumps({"method": RUN, "parameters": _run_params()}).encode() + b"\0", b'"parameter":"stdin"'),  # no fds
        (json.dumps({"method": RUN, "oneway": True, "parameters": _run_params()}).encode() + b"\0", b""),  # no reply
        (b"\xff\xfe\0", b"org.varlink.service.InvalidParameter"),
        (b'{"method": "io.corral.Run.Run"', b""),  # EOF inside a message: closed
    ]:
        answer = _raw(service, data)
        assert expected in answer, (data, answer)
        assert service.alive(), data
    # A message past the bound, without its NUL: refused, not buffered forever.
    answer = _raw(service, b'{"method": "' + b"x" * (MAX_MESSAGE + 10))
    assert b"longer than" in answer or answer == b""
    # More descriptors than a call may carry, in one piece or over two: refused, each closed.
    r, w = os.pipe()
    try:
        answer = _raw(service, b'{"method": "org.varlink.service.GetInfo"}\0', fds=[r] * (MAX_FDS + 1))
        assert b"file descriptors" in answer or answer == b"", answer
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5 * TIME_SCALE)
        sock.connect(service.path)
        half = MAX_FDS // 2 + 1
        for part in (b'{"method": "org.varlink.', b'service.GetInfo"}\0'):
            sock.sendmsg(
                [part],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, b"".join(r.to_bytes(4, sys.byteorder) for _ in range(half)))],
            )
            time.sleep(0.2)  # the service reads each part on its own
        answer = sock.recv(65536)
        sock.close()
        assert b"file descriptors" in answer and b"interfaces" not in answer, answer
    finally:
        os.close(r)
        os.close(w)
    assert service.alive()
    fds = os.listdir(f"/proc/{service.proc.pid}/fd")
    assert len(fds) < 30, fds  # nothing received was kept


def test_run_parameters_are_checked_one_by_one(service):
    r, w = os.pipe()
    try:
        fds = [os.open(os.devnull, os.O_RDONLY), 1, 2, r]
        for name, bad in [
            ("program", "rm"),
            ("program", ["corral"]),  # unhashable: found by the fuzz test below once
            ("argv", ["a", 1]),
            ("argv", ["a\0b"]),
            ("environment", ["=x"]),
            ("environment", ["NOEQUALS"]),
            ("cwd", "relative"),
            ("umask", 0o1000),
            ("umask", "022"),
            ("stdout", 9),
            ("control", -1),
        ]:
            with pytest.raises(VarlinkError) as err:
                service.channel().call(RUN, _run_params(**{name: bad}), fds)
            assert err.value.name == "org.varlink.service.InvalidParameter"
            assert err.value.parameters == {"parameter": name}
        os.close(fds[0])
    finally:
        os.close(r)
        os.close(w)
    assert service.alive()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300))
def test_fuzzed_bytes_never_take_the_service_down(service, data):
    _raw(service, data + b"\0")
    assert service.alive()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    params=st.dictionaries(
        st.sampled_from(list(_run_params()) + ["x"]),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-5, 2**40),
            st.text(max_size=20),
            st.lists(st.text(max_size=10), max_size=4),
        ),
    ),
    method=st.sampled_from([RUN, "io.corral.Run.Status", "org.varlink.service.GetInterfaceDescription", "x.y.Z"]),
)
def test_fuzzed_calls_get_an_answer_and_the_service_stays_up(service, params, method):
    r, w = os.pipe()
    try:
        try:
            service.channel().call(method, params, [r])
        except VarlinkError:
            pass  # an error reply is an answer
    finally:
        os.close(r)
        os.close(w)
    assert service.alive()


def test_the_interface_is_described(service):
    channel = service.channel()
    info, _ = channel.call("org.varlink.service.GetInfo", {})
    assert "io.corral.Run" in info["interfaces"]
    description, _ = channel.call("org.varlink.service.GetInterfaceDescription", {"interface": "io.corral.Run"})
    text = description["description"]
    assert "interface io.corral.Run" in text.splitlines()
    for name in ("method Run(", "method Status(", "error UsageError", "error NotServed", "error PermissionDenied"):
        assert name in text
    with pytest.raises(VarlinkError) as err:
        channel.call("org.varlink.service.GetInterfaceDescription", {"interface": "no.such"})
    assert err.value.name == "org.varlink.service.InterfaceNotFound"


def test_a_refusal_sent_before_the_call_is_the_answer_not_a_broken_pipe():
    """The service refuses a peer (PermissionDenied, Busy) at once and closes,
    before the peer's call arrives: the call's send then fails with EPIPE, and
    the refusal waiting unread is what the caller gets (seen in CI: a
    BrokenPipeError traceback instead of PermissionDenied)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours:
        Channel(theirs).send({"error": "io.corral.Run.PermissionDenied", "parameters": {"uid": 65534}})
        theirs.close()
        with pytest.raises(VarlinkError) as refused:
            Channel(ours).call("io.corral.Run.Status", {})
    assert refused.value.name == "io.corral.Run.PermissionDenied"
    # No refusal waiting: the broken pipe is the answer.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.close()
    with ours, pytest.raises(BrokenPipeError):
        Channel(ours).call("io.corral.Run.Status", {})


def test_a_second_user_is_refused():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another user")
    import tempfile

    # Let the other user reach the socket at all (as a group-writable /run would):
    # then only the service's own check (SO_PEERCRED) stands in the way.
    directory = Path(tempfile.mkdtemp(prefix="corral-test-service-", dir="/tmp"))
    directory.chmod(0o755)
    service = Service(directory)
    os.chmod(service.path, 0o666)
    probe = (
        "import socket,sys; sys.path.insert(0, sys.argv[2]);"
        "from corral_systemd.varlink.wire import Channel, VarlinkError;"
        "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]);"
        'exec(\'try:\\n Channel(s).call("io.corral.Run.Status", {})\\n print("ANSWERED")\\n'
        "except VarlinkError as e:\\n print(e.name)')"
    )
    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            sys.executable,
            "-c",
            probe,
            service.path,
            root,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    try:
        assert proc.stdout.strip() == "io.corral.Run.PermissionDenied", (proc.stdout, proc.stderr)
        assert service.alive()
    finally:
        service.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_idle_exit(tmp_path):
    svc = Service(tmp_path, "--idle-exit", "0.5")
    assert svc.proc.wait(timeout=60 * TIME_SCALE) == 0
    assert not os.path.exists(svc.path)  # a --socket it bound itself is removed


# -- the client's choices (host: fake services) -----------------------------------


class FakeService:
    """A socket the test serves by hand: ``behaviour(conn)`` runs for each connection."""

    def __init__(self, directory: Path, behaviour):
        import threading

        self.path = str(directory / "fake.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(8)
        self.connections = 0
        self._behaviour = behaviour
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            try:
                self._behaviour(conn)
            finally:
                conn.close()

    def close(self):
        self.listener.close()


def hello(conn, version: str | None = None) -> Channel:
    """Answer the client's hello (GetInfo: the service's version, this package's by
    default) as the corral service does; the channel, for what comes next."""
    from corral_systemd.common.version import __version__

    channel = Channel(conn)
    message, fds = channel.receive()
    for fd in fds:
        os.close(fd)
    assert message == {"method": "org.varlink.service.GetInfo"}, message
    channel.send({"parameters": {"vendor": "corral-systemd", "product": "corral", "version": version or __version__}})
    return channel


@pytest.mark.parametrize("version", ["0.0.1", "not a version"])
def test_a_service_of_another_version_never_runs_the_line(tmp_path, corral, client, version):
    """The hello, as chg's: a service of another version (one left running from
    before an upgrade) is asked nothing more; the run goes on in-process, said."""
    calls = []

    def other_version(conn):
        channel = hello(conn, version)
        calls.append(channel.receive())

    fake = FakeService(tmp_path, other_version)
    try:
        run = corral(
            ["--cgroup-mode", "fallback", "--", "sh", "-c", "echo ran; exit 6"],
            env=dict(os.environ, CORRAL_SERVICE_SOCKET=fake.path),
            program=client,
        )
        assert run.returncode == 6 and run.stdout == b"ran\n" and fake.connections == 1
        assert calls == [None], calls  # after the hello, nothing: the connection closed
        assert f"is version {version}, this corral".encode() in run.stderr, run.stderr
        assert run.record["via"] == "cli"
    finally:
        fake.close()


def test_corral_service_0_makes_no_connection(tmp_path, corral, client):
    fake = FakeService(tmp_path, lambda conn: None)
    try:
        run = corral(
            ["--cgroup-mode", "fallback", "--", "sh", "-c", "exit 3"],
            env=dict(os.environ, CORRAL_SERVICE_SOCKET=fake.path, CORRAL_SERVICE="0"),
            program=client,
        )
        assert run.returncode == 3 and fake.connections == 0
        assert run.record["via"] == "cli"
    finally:
        fake.close()


def test_no_service_listening_runs_in_process(tmp_path, corral, client):
    run = corral(
        ["--cgroup-mode", "fallback", "--", "sh", "-c", "exit 4"],
        env=dict(os.environ, CORRAL_SERVICE_SOCKET=str(tmp_path / "nothing-here")),
        program=client,
    )
    assert run.returncode == 4 and run.record["via"] == "cli" and b"warning" not in run.stderr


def test_a_service_dying_before_it_took_the_run_leaves_it_to_the_client(tmp_path, corral, client):
    """Nothing had run, so running it here is safe: once, with a warning."""

    calls = []

    def die_at_once(conn):
        message, fds = hello(conn).receive()  # the call, then gone without a word
        calls.append((message, len(fds)))
        for fd in fds:
            os.close(fd)

    fake = FakeService(tmp_path, die_at_once)
    try:
        run = corral(
            ["--cgroup-mode", "fallback", "--", "sh", "-c", "echo ran; exit 5"],
            env=dict(os.environ, CORRAL_SERVICE_SOCKET=fake.path),
            program=client,
        )
        assert run.returncode == 5 and run.stdout == b"ran\n" and fake.connections == 1
        # It had asked properly: a Run call with the argv as typed and its seven descriptors
        # (stdio, control, and its held child's pidfd, gate and exit pipe).
        (message, nfds), *_ = calls
        assert message["method"] == RUN and message["more"] is True and nfds == 7
        assert [message["parameters"][name] for name in ("control", "process", "gate", "exit")] == [3, 4, 5, 6]
        assert message["parameters"]["argv"][-4:] == ["--", "sh", "-c", "echo ran; exit 5"]
        assert message["parameters"]["cwd"] == os.getcwd() and message["parameters"]["program"] == "corral"
        assert b"ended before it took the run" in run.stderr and run.record["via"] == "cli"
    finally:
        fake.close()


def test_a_service_dying_after_it_took_the_run_is_120(tmp_path, corral, client):
    """The command may have run: the client cannot verify, so it says so (120) and does not run it again."""

    def accept_then_die(conn):
        channel = hello(conn)
        got = channel.receive()
        for fd in got[1]:
            os.close(fd)
        channel.send({"parameters": {"accepted": True}, "continues": True})

    fake = FakeService(tmp_path, accept_then_die)
    try:
        run = corral(
            ["--cgroup-mode", "fallback", "--", "sh", "-c", "echo ran"],
            env=dict(os.environ, CORRAL_SERVICE_SOCKET=fake.path),
            record=False,
            program=client,
        )
        assert run.returncode == 120 and run.stdout == b"" and b"ended during the run" in run.stderr
    finally:
        fake.close()


def test_an_installs_corral_is_the_compiled_client_when_a_compiler_was_there(tmp_path):
    """setup.py builds corral and corral-enforced from packaging/client/corral.c
    (this venv was installed with tests/run's gcc there); the binary finds
    corral-inprocess beside its own real path, also when run through a symlink."""
    bindir = Path(sys.executable).parent
    if not (shutil.which("cc") or shutil.which("gcc")) or not (bindir / "corral-inprocess").exists():
        pytest.skip("installed without a C compiler, or not by pip")
    for prog in ("corral", "corral-enforced"):
        assert (bindir / prog).read_bytes()[:4] == b"\x7fELF", prog
    link = tmp_path / "corral"
    link.symlink_to(bindir / "corral")
    proc = subprocess.run(
        [str(link), "--json", "-", "--quiet", "--cgroup-mode", "fallback", "--", "sh", "-c", "exit 4"],
        env=dict(os.environ, CORRAL_SERVICE="0"),
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 4 and json.loads(proc.stdout)["via"] == "cli", proc.stderr


def test_service_status_says_which_client_corral_is(tmp_path, compiled_client):
    """``corralctl service status``: whether the corral on PATH is the compiled client or the Python one."""
    for kind, source in (("compiled", Path(compiled_client[0])), ("python", REPO / "bin" / "corral")):
        bindir = tmp_path / kind
        bindir.mkdir()
        shutil.copy(source, bindir / "corral")
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", CORRAL_SERVICE_SOCKET=str(tmp_path / "none"))
        ctl = [sys.executable, "-m", "corral_systemd.ctl", "service", "status"]
        report = subprocess.run([*ctl, "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert report.returncode == 3 and json.loads(report.stdout)["client"] == {
            "path": str(bindir / "corral"),
            "kind": kind,
        }, report.stdout + report.stderr
        text = subprocess.run(ctl, env=env, capture_output=True, text=True, timeout=60).stdout
        assert (
            f"corral client: {bindir / 'corral'}: " + ("compiled" if kind == "compiled" else "the Python one") in text
        )


def test_corral_inprocess_refuses_another_program_name():
    """corral-inprocess PROG ARGS: PROG picks the default mode; anything else is 125, in one line."""
    code = "from corral_systemd.client import entry_in_process; entry_in_process()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "corralx", "--", "true"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 125 and proc.stderr.count("\n") == 1 and "corralx" in proc.stderr, proc.stderr


def test_the_client_imports_nothing_heavy():
    """The hot path: no typer, click, dbus-fast, asyncio or pydantic (nor json's re)."""
    code = (
        "import sys; from corral_systemd import client; from corral_systemd.varlink import wire;"
        "from corral_systemd.kernel import signals;"
        "heavy = [m for m in ('typer', 'click', 'dbus_fast', 'asyncio', 'pydantic', 'json', 'corral_systemd.cli')"
        " if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(Path(__file__).resolve().parent.parent),
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# -- runs through a real service (beside a manager) ---------------------------------

systemd = pytest.mark.systemd


_corral = run_corral


@systemd
@pytest.mark.parametrize("unit_type", ["scope", "service"])
def test_runs_through_the_service_keep_the_clis_results(service, tmp_path, marker, unit_type, client):
    ut = ["--unit-type", unit_type]
    # exit status, output on the client's own stdout and stderr, the record written by the client
    proc = _corral(
        service,
        client=client,
        args=[*ut, "--json", "r.json", "--", "sh", "-c", "echo out; echo err >&2; exit 3"],
        marker=marker,
        cwd=tmp_path,
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == b"out\n" and proc.stderr.startswith(b"err\n"), proc.stderr
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["via"] == "service" and record["mode"] == "systemd" and record["exit_code"] == 3
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o600
    assert b"corral: systemd corral-" in proc.stderr.splitlines()[-1]  # the summary line, last
    # the wall limit, and nothing left
    proc = _corral(
        service, client=client, args=[*ut, *scale_walls(["--wall", "1s"]), "--", "sleep", "60"], marker=marker
    )
    assert proc.returncode == 124 and not marked_pids(marker), proc.stderr
    # 127, 125: as in-process
    assert _corral(service, client=client, args=[*ut, "--", "/no/such/command"]).returncode == 127
    proc = _corral(service, client=client, args=[*ut, "--mem", "bogus", "--", "true"])
    assert proc.returncode == 125 and proc.stderr.count(b"\n") == 1, proc.stderr
    # --max-output: 122
    proc = _corral(
        service, client=client, args=[*ut, "--max-output", "1K", "--", "sh", "-c", "head -c 100000 /dev/zero; sleep 30"]
    )
    assert proc.returncode == 122, proc.stderr
    # --json -: the record after the command's output on stdout
    proc = _corral(service, client=client, args=[*ut, "--quiet", "--json", "-", "--", "echo", "first"])
    assert proc.stdout.startswith(b"first\n") and json.loads(proc.stdout[len(b"first\n") :])["via"] == "service"
    assert service.status()["runs_served"] >= 5


@systemd
def test_the_commands_environment_cwd_and_umask_are_the_clients(service, tmp_path, client):
    (tmp_path / "sub").mkdir()
    env = service.env(CORRAL_TEST_CLIENT_VAR="from-the-client", SECRET_TOKEN="s3")
    # Bytes that are not UTF-8 (and some that are) reach the command as they are.
    env["CORRAL_TEST_BYTES"] = b'\xff\xfe caf\xc3\xa9 \xed\xa0\x80 \\ " \x01'
    script = (
        'echo "$CORRAL_TEST_CLIENT_VAR ${SECRET_TOKEN:-dropped} $(pwd) $(umask)"; printf %s "$CORRAL_TEST_BYTES|$1"'
    )
    proc = _corral(
        service,
        ["--env-drop", "SECRET_*", "--", "sh", "-c", script, "sh", b"arg \x80\xc3\xa9\t\n"],
        env=env,
        cwd=tmp_path / "sub",
        preexec_fn=lambda: os.umask(0o027),
        client=client,
    )
    assert proc.returncode == 0, proc.stderr
    first, rest = proc.stdout.split(b"\n", 1)
    assert first.decode().split() == ["from-the-client", "dropped", str(tmp_path / "sub"), "0027"]
    assert rest == env["CORRAL_TEST_BYTES"] + b"|arg \x80\xc3\xa9\t\n"
    assert service.status()["runs_served"] == 1
    # A service's command line goes over D-Bus (UTF-8 only): refused in one line, here and in-process.
    for where in ({}, {"CORRAL_SERVICE": "0"}):
        proc = _corral(
            service, ["--unit-type", "service", "--", "printf", b"\xff"], env=service.env(**where), client=client
        )
        assert proc.returncode == 125 and proc.stderr.count(b"\n") == 1 and b"UTF-8" in proc.stderr, proc.stderr


@systemd
def test_credentials_through_the_service(service, tmp_path):
    (tmp_path / "token").write_text("tok-123")
    proc = _corral(
        service,
        [
            "--json",
            "r.json",
            "--credential",
            "api=token",
            "--",
            "sh",
            "-c",
            'cat "$CREDENTIALS_DIRECTORY/api"; echo "$CREDENTIALS_DIRECTORY" > where',
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and proc.stdout == b"tok-123", proc.stderr
    assert not Path((tmp_path / "where").read_text().strip()).exists()  # gone with the run
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["credentials"] == ["api"] and b"tok-123" not in (tmp_path / "r.json").read_bytes()


@systemd
def test_a_served_run_is_in_the_registry_while_it_runs(tmp_path, marker, corral):
    state = tmp_path / "state"
    (tmp_path / "svc").mkdir()
    svc = Service(tmp_path / "svc", env=dict(os.environ, CORRAL_STATE_DIR=str(state)))
    env = svc.env(CORRAL_STATE_DIR=str(state))
    client = subprocess.Popen(
        [*CORRAL, "--", "sleep", "60"],
        env={**env, MARKER_ENV: marker},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: marked_pids(marker) and any(state.glob("*.json")), timeout=30)
        ps = subprocess.run(
            [sys.executable, "-m", "corral_systemd.ctl", "ps", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        runs = json.loads(ps.stdout)
        assert len(runs) == 1 and runs[0]["command"] == ["sleep", "60"], ps.stdout
        client.send_signal(signal.SIGTERM)
        assert client.wait(timeout=60) == 143
        assert not marked_pids(marker)
        # A client with another registry is not served: its runs must be where it looks for them.
        run = corral(["--", "true"], env=svc.env(CORRAL_STATE_DIR=str(tmp_path / "other")))
        assert run.returncode == 0 and run.record["via"] == "cli"
    finally:
        client.kill()
        svc.stop()


def _start_client(svc, marker, *args, program=CORRAL):
    client = subprocess.Popen(
        [*program, *args, "--", "sh", "-c", "trap '' TERM; echo started; exec sleep 60"],
        env={**svc.env(), MARKER_ENV: marker},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert client.stdout.readline() == b"started\n"
    return client


@systemd
@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_to_the_client_stops_the_run_as_corral_would(service, marker, signum, code, client):
    client = _start_client(service, marker, "--grace", "300ms", program=client)
    client.send_signal(signum)
    assert client.wait(timeout=60) == code, client.stderr.read()
    assert not marked_pids(marker)


@systemd
def test_the_client_sigkilled_stops_the_run(service, marker, client):
    """The service holds the client's pidfd (and its control pipe ends):
    the run is stopped within its grace period, verified."""
    client = _start_client(service, marker, "--grace", "500ms", program=client)
    # Looked for until seen: /proc/PID/environ cannot be read while the shell execs sleep.
    assert wait_for(lambda: [p for p in marked_pids(marker) if p != client.pid])
    client.kill()
    client.wait(timeout=60)
    wait_for(lambda: not marked_pids(marker), timeout=30)
    assert wait_for(lambda: service.status()["runs_in_flight"] == 0, timeout=30)


@systemd
def test_the_service_killed_mid_run_gives_120_and_the_tether_stops_the_run(tmp_path, marker, client):
    svc = Service(tmp_path)
    try:
        client = _start_client(svc, marker, program=client)
        svc.proc.kill()
        svc.proc.wait(timeout=60)
        assert client.wait(timeout=60) == 120
        assert b"ended during the run" in client.stderr.read()
        wait_for(lambda: not marked_pids(marker), timeout=60)  # the manager stopped the unit (tether)
    finally:
        svc.stop()
        kill_marked(marker)


@systemd
def test_the_service_stopped_mid_run_stops_the_run_and_answers(tmp_path, marker):
    svc = Service(tmp_path)
    client = _start_client(svc, marker, "--grace", "300ms")
    assert svc.stop() == 0
    assert client.wait(timeout=60) == 143  # as corral stops for SIGTERM
    assert not marked_pids(marker)


@systemd
def test_what_the_service_does_not_take_runs_in_the_client(service, tmp_path, corral, client):
    env = service.env()
    # --pty: the client's terminal stays the client's
    run = corral(["--pty", "--", "true"], env=env, program=client)
    assert run.returncode == 0 and run.record["via"] == "cli"
    # a run inside a run: it stays inside (auto: a tier below the unit, nested_in)
    outer = corral(
        ["--json", str(tmp_path / "inner.json"), "--", *client, "--json", str(tmp_path / "i.json"), "--", "true"],
        env=env,
        record=False,
        program=client,
    )
    assert outer.returncode == 0, outer.stderr
    inner = json.loads((tmp_path / "i.json").read_text())
    # below the unit: a pid namespace where one can be had, else the subreaper
    assert inner["via"] == "cli" and inner["nested_in"] is not None and inner["guarantee"] in ("pidns", "subreaper")
    assert service.status()["runs_served"] == 1  # the outer run only


@systemd
@pytest.mark.parametrize("tier", ["pidns", "subreaper"])
def test_a_tier_below_the_unit_through_the_service_is_the_in_process_run(service, corral, client, tier):
    """--guarantee TIER is no unit: the service declines it and the client runs it
    itself, so the record (tier, exit code, nothing left) is the in-process CLI's."""
    from modes import pidns_unavailable

    if tier == "pidns" and (why := pidns_unavailable()) is not None:
        pytest.skip(f"no pid namespace here: {why}")
    argv = ["--guarantee", tier, "--", "sh", "-c", "setsid sleep 300 & exit 3"]
    here = corral(argv)
    served = corral(argv, env=service.env(), program=client)
    for run in (here, served):
        assert run.returncode == 3, run.stderr
        assert run.record["guarantee"] == tier and run.record["verified"], run.record
        assert run.survivors == []
    assert served.record["via"] == "cli" and service.status()["runs_served"] == 0


@systemd
def test_a_busy_service_sends_runs_back(tmp_path, corral, client):
    svc = Service(tmp_path, "--max-runs", "0")
    try:
        run = corral(["--", "sh", "-c", "exit 7"], env=svc.env(), program=client)
        assert run.returncode == 7 and run.record["via"] == "cli", run.stderr
    finally:
        svc.stop()


# -- socket activation (alone: the default socket path) -------------------------------


@pytest.mark.service_unit
def test_socket_activation_idle_exit_and_reactivation(tmp_path):
    ctl = [sys.executable, "-m", "corral_systemd.ctl", "service"]
    flag = "--system" if MANAGER == "system" else "--user"
    env = dict(os.environ)
    # As a user has it: the service's registry is the default one (the suite's own state dir is not).
    for name in ("CORRAL_SERVICE_SOCKET", "CORRAL_STATE_DIR"):
        env.pop(name, None)
    env["CORRAL_SERVICE"] = "installed"  # the installed units' test: no transient one (test_service_transient.py)
    systemctl = ["systemctl", *(["--user"] if MANAGER == "user" else [])]
    install = subprocess.run(
        [*ctl, "install", flag, "--runtime", "--idle-exit", "1"], env=env, capture_output=True, text=True, timeout=120
    )
    assert install.returncode == 0, install.stderr
    try:
        status = subprocess.run([*ctl, "status", "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0 and json.loads(status.stdout)["in_use"], status.stdout + status.stderr
        first = json.loads(status.stdout)["service"]["pid"]
        proc = subprocess.run(
            [*CORRAL, "--json", "-", "--quiet", "--", "true"], env=env, capture_output=True, timeout=120
        )
        assert proc.returncode == 0 and json.loads(proc.stdout)["via"] == "service", proc.stderr
        # idle: the service exits; the socket stays and brings it back
        wait_for(
            lambda: (
                subprocess.run(
                    [*systemctl, "is-active", "corral.service"], capture_output=True, text=True
                ).stdout.strip()
                == "inactive"
            ),
            timeout=60,
        )
        proc = subprocess.run(
            [*CORRAL, "--json", "-", "--quiet", "--", "true"], env=env, capture_output=True, timeout=120
        )
        assert proc.returncode == 0 and json.loads(proc.stdout)["via"] == "service", proc.stderr
        status = subprocess.run([*ctl, "status", "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert json.loads(status.stdout)["service"]["pid"] != first
    finally:
        uninstall = subprocess.run([*ctl, "uninstall", flag], env=env, capture_output=True, text=True, timeout=120)
        assert uninstall.returncode == 0, uninstall.stderr
    status = subprocess.run([*ctl, "status"], env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 3 and "not in use" in status.stdout
    proc = subprocess.run(
        [*CORRAL, "--json", "-", "--quiet", "--cgroup-mode", "fallback", "--", "true"],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert json.loads(proc.stdout)["via"] == "cli"


@pytest.mark.service_unit
def test_the_packaged_units(tmp_path):
    """The .deb's corral.socket, enabled for this manager, takes /usr/bin/corral's runs."""
    unit = f"/usr/lib/systemd/{MANAGER}/corral.socket"
    if not (os.path.exists(unit) and os.path.exists("/usr/bin/corral")):
        pytest.skip("the .deb is not installed here")
    systemctl = ["systemctl", *(["--user"] if MANAGER == "user" else [])]
    env = dict(os.environ)
    for name in ("CORRAL_SERVICE_SOCKET", "CORRAL_STATE_DIR"):
        env.pop(name, None)
    env["CORRAL_SERVICE"] = "installed"  # the installed units' test: no transient one (test_service_transient.py)
    subprocess.run([*systemctl, "daemon-reload"], check=True, timeout=120)
    subprocess.run([*systemctl, "enable", "--runtime", "--now", "corral.socket"], check=True, timeout=120)
    try:
        proc = subprocess.run(
            ["/usr/bin/corral", "--json", "-", "--quiet", "--", "true"], env=env, capture_output=True, timeout=120
        )
        assert proc.returncode == 0 and json.loads(proc.stdout)["via"] == "service", proc.stderr
        proc = subprocess.run(
            ["/usr/bin/corral-enforced", "--json", "r.json", "--", "sh", "-c", "exit 3"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            timeout=120,
        )
        record = json.loads((tmp_path / "r.json").read_text())
        assert proc.returncode == 3 and record["via"] == "service" and record["mode"] == "systemd", proc.stderr
        assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o600
    finally:
        subprocess.run([*systemctl, "disable", "--runtime", "--now", "corral.socket", "corral.service"], timeout=120)
    # No service: the compiled client runs it in-process (corral-inprocess).
    proc = subprocess.run(
        ["/usr/bin/corral", "--json", "-", "--quiet", "--", "true"], env=env, capture_output=True, timeout=120
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["via"] == "cli", proc.stderr


@systemd
def test_a_caller_without_descriptors_gets_the_output_back_and_hanging_up_stops_the_run(service, marker):
    """What a Node or Rust agent does: a plain socket, no SCM_RIGHTS."""
    import base64

    env = [f"{k}={v}" for k, v in {**os.environ, MARKER_ENV: marker}.items()]
    params = {
        "program": "corral-enforced",
        "argv": ["--", "sh", "-c", "echo out; echo err >&2; exit 4"],
        "environment": env,
        "cwd": os.getcwd(),
        "umask": 0o22,
    }
    reply, _ = service.channel().call(RUN, params)
    assert reply["exit_code"] == 4 and base64.b64decode(reply["stdout"]) == b"out\n"
    assert base64.b64decode(reply["stderr"]) == b"err\n" and reply["summary"].startswith("corral: systemd")
    # The caller hangs up mid-run: the run is stopped, verified, nothing left.
    channel = service.channel()
    channel.send(
        {
            "method": RUN,
            "more": True,
            "parameters": {**params, "argv": ["--grace", "300ms", "--", "sh", "-c", "trap '' TERM; sleep 60"]},
        }
    )
    assert channel.receive()[0]["parameters"]["accepted"]
    wait_for(lambda: marked_pids(marker), timeout=30)
    channel.sock.close()
    wait_for(lambda: not marked_pids(marker), timeout=30)
    assert wait_for(lambda: service.status()["runs_in_flight"] == 0, timeout=30)


@systemd
def test_the_node_example(service, tmp_path):
    if shutil.which("node") is None:
        pytest.skip("no node here")
    readme = (Path(__file__).resolve().parent.parent / "docs" / "service.md").read_text()
    script = readme.split("```js\n", 1)[1].split("```", 1)[0]
    (tmp_path / "corral-run.js").write_text(script)
    proc = subprocess.run(
        ["node", str(tmp_path / "corral-run.js"), "--", "sh", "-c", "echo from-node; exit 6"],
        env=service.env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 6 and proc.stdout == "from-node\n", proc.stderr
    assert "corral: systemd corral-" in proc.stderr


@systemd
def test_a_client_that_dies_while_its_control_pipe_lives_on_elsewhere_still_stops_its_run(service, marker):
    """The service watches the client's pidfd, not only its control pipe: a
    client that handed the pipe's write end to another process (the pipe
    then never reaches end of file) and dies still ends its run."""
    client_code = (
        "import os, socket, subprocess, sys, time\n"
        "from corral_systemd.varlink.wire import Channel\n"
        "r, w = os.pipe()\n"
        "holder = subprocess.Popen(['sleep', '120'], pass_fds=(w,), env={})\n"
        "print(holder.pid, flush=True)\n"
        "os.close(w)\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); c = Channel(s)\n"
        "env = [k + '=' + v for k, v in os.environ.items()]\n"
        "params = {'program': 'corral', 'argv': ['--grace', '300ms', '--', 'sleep', '60'], 'environment': env,\n"
        "          'cwd': '/', 'umask': 18, 'stdin': 0, 'stdout': 1, 'stderr': 2, 'control': 3}\n"
        "c.send({'method': 'io.corral.Run.Run', 'parameters': params, 'more': True}, [0, 1, 2, r])\n"
        "print(c.receive()[0], flush=True)\n"
        "time.sleep(120)\n"
    )
    client = subprocess.Popen(
        [sys.executable, "-c", client_code, service.path],
        env={**os.environ, MARKER_ENV: marker},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    holder = int(client.stdout.readline())
    try:
        assert b"accepted" in client.stdout.readline()
        wait_for(lambda: [p for p in marked_pids(marker) if p != client.pid], timeout=30)
        client.kill()
        client.wait(timeout=60)
        wait_for(lambda: not marked_pids(marker), timeout=30)
    finally:
        os.kill(holder, signal.SIGKILL)


# -- issue 27: sessions and background runs through the service -----------------------------
def _ctl(service, *argv: str, env: dict) -> tuple[int, str, str]:
    import base64

    reply, _ = service.channel().call(
        "io.corral.Session.Ctl", {"argv": list(argv), "environment": [f"{k}={v}" for k, v in env.items()], "cwd": "/"}
    )
    return reply["exit_code"], base64.b64decode(reply["stdout"]).decode(), base64.b64decode(reply["stderr"]).decode()


@systemd
def test_the_readme_node_session_example(service, tmp_path, marker):
    """An agent in Node.js, no Python of its own: its session (owned by it), a dev server
    started in the background through the service, a page fetched from it, its log, a
    job waited for, the session ended: every process proven gone, the port free."""
    from test_background import free_port, port_accepts

    if shutil.which("node") is None:
        pytest.skip("no node here")
    readme = (Path(__file__).resolve().parent.parent / "docs" / "service.md").read_text()
    script = "// corral-session.js" + readme.split("// corral-session.js", 1)[1].split("```", 1)[0]
    port = free_port()
    (tmp_path / "corral-session.js").write_text(script.replace("8000", str(port)))
    proc = subprocess.run(
        ["node", str(tmp_path / "corral-session.js")],
        env=service.env(**{MARKER_ENV: marker}),
        capture_output=True,
        text=True,
        timeout=180 * TIME_SCALE,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "fetched: 200" in lines and "job exit: 3" in lines, proc.stdout
    assert any(line.startswith("its log:") and '"GET / HTTP/1.1" 200' in line for line in lines), proc.stdout
    assert lines[-1].startswith("session ") and lines[-1].endswith("every process proven gone"), proc.stdout
    assert marked_pids(marker) == [] and not port_accepts(port)


@systemd
def test_session_runs_are_served_and_join_the_session(service, client, tmp_path, marker):
    """A foreground run with --session is served (the caller's own process in a unit
    of the session's slice); a background one from a client with descriptors is not
    the service's (NotServed): the Python client's own corral is its front, the
    compiled client's front the session's holder's fork; either way the holder
    starts the run's corral."""
    env = service.env(**{MARKER_ENV: marker})
    code, sid, err = _ctl(service, "session", "start", env=env)
    assert code == 0, err
    sid = sid.strip()
    fg = subprocess.run(
        [*client, "--session", sid, "--json", "-", "--", "cat", "/proc/self/cgroup"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fg.returncode == 0, fg.stderr
    assert f"/corral-session_{sid}.slice/" in fg.stdout and '"via": "service"' in fg.stdout, fg.stdout
    bg = subprocess.run(
        [*client, "--session", sid, "--background", "--json", "-", "--", "sleep", "1000"],
        env=dict(env, CORRAL_SERVICE_DEBUG="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bg.returncode == 0, bg.stderr
    assert json.loads(bg.stdout)["started_by"] == "holder", bg.stdout
    if client == list(CORRAL):
        assert "client's corral starts it" in bg.stderr, bg.stderr
    else:  # the holder was its front: the service was never asked
        assert "not this run's front" not in bg.stderr and "corral service" not in bg.stderr, bg.stderr
    assert _ctl(service, "session", "end", sid, env=env)[0] == 0
    assert marked_pids(marker) == []


@systemd
def test_session_ctl_refuses_what_it_does_not_run(service):
    env = dict(os.environ)
    for argv in (["gc"], ["service", "uninstall"], ["session", "start", "--cgroup-mode", "fallback"]):
        with pytest.raises(VarlinkError) as refused:
            _ctl(service, *argv, env=env)
        assert refused.value.name == "io.corral.Session.NotServed", argv
    with pytest.raises(VarlinkError) as bad:
        service.channel().call("io.corral.Session.Ctl", {"argv": "session ls", "environment": [], "cwd": "/"})
    assert bad.value.name == "org.varlink.service.InvalidParameter"
    assert service.alive()


@systemd
def test_logs_follow_streams_through_the_service(service, tmp_path, marker):
    """io.corral.Session.Ctl with "more": `logs -f` sent as it is written, ended with the run."""
    import base64

    env = service.env(**{MARKER_ENV: marker})
    sid = _ctl(service, "session", "start", env=env)[1].strip()
    reply, _ = service.channel().call(
        "io.corral.Run.Run",
        {
            "program": "corral",
            "argv": [
                "--session",
                sid,
                "--background",
                "--",
                "sh",
                "-c",
                "for i in 1 2 3; do echo line-$i; sleep 0.5; done",
            ],
            "environment": [f"{k}={v}" for k, v in env.items()],
            "cwd": "/",
            "umask": 0o22,
        },
    )
    assert reply["exit_code"] == 0, reply
    run_id = base64.b64decode(reply["stdout"]).decode().strip()
    channel = service.channel()
    channel.send(
        {
            "method": "io.corral.Session.Ctl",
            "more": True,
            "parameters": {
                "argv": ["logs", "-f", run_id],
                "environment": [f"{k}={v}" for k, v in env.items()],
                "cwd": "/",
            },
        }
    )
    streamed, last = b"", None
    while last is None:
        message, _ = channel.receive()
        params = message["parameters"]
        streamed += base64.b64decode(params.get("stdout") or "")
        if not message.get("continues"):
            last = params
    assert last["exit_code"] == 0 and streamed.splitlines()[:3] == [b"line-1", b"line-2", b"line-3"], streamed
    assert _ctl(service, "session", "end", sid, env=env)[0] == 0
    assert marked_pids(marker) == []


@systemd
def test_a_sessions_background_run_outlives_the_services_restart(tmp_path, marker):
    """Runs started through the service for a session are its holder's, not the
    service's: stopping the service (and starting it again) leaves them running,
    and the session's end through the new one still proves everything gone."""
    import base64

    first = Service(_dir(tmp_path / "first"))
    env = first.env(**{MARKER_ENV: marker})
    sid = _ctl(first, "session", "start", env=env)[1].strip()
    reply, _ = first.channel().call(
        "io.corral.Run.Run",
        {
            "program": "corral",
            "argv": ["--session", sid, "--background", "--", "sh", "-c", "trap '' TERM; sleep 1000"],
            "environment": [f"{k}={v}" for k, v in env.items()],
            "cwd": "/",
            "umask": 0o22,
        },
    )
    assert reply["exit_code"] == 0, base64.b64decode(reply["stderr"])
    assert first.stop() == 0
    assert marked_pids(marker), "the session's run ended with the service"
    second = Service(_dir(tmp_path / "second"))
    try:
        code, out, err = _ctl(second, "session", "end", sid, env=env)
        assert code == 0 and "every process proven gone" in out, err
        assert marked_pids(marker) == []
    finally:
        second.stop()


@systemd
def test_a_served_background_run_whose_caller_hangs_up_before_it_is_ready_is_stopped(service, tmp_path, marker):
    """The served front waits in poll on the ready pipe, the run's corral and the caller's
    connection (POLLRDHUP): the caller hanging up while the run waits for its ready file
    stops the run at once (not at its --ready-timeout), nothing of it left."""
    plain = service.env()
    sid = _ctl(service, "session", "start", env=plain)[1].strip()
    env = service.env(**{MARKER_ENV: marker})
    argv = ["--session", sid, "--background", "--ready-timeout", "300s", "--ready-file", str(tmp_path / "never")]
    channel = service.channel()
    channel.send(
        {
            "method": RUN,
            "more": True,
            "parameters": {
                "program": "corral",
                "argv": [*argv, "--", "sleep", "1000"],
                "environment": [f"{k}={v}" for k, v in env.items()],
                "cwd": "/",
                "umask": 0o22,
            },
        }
    )
    try:
        assert channel.receive()[0]["parameters"]["accepted"]
        assert wait_for(lambda: len(marked_pids(marker)) >= 2, timeout=30), "the run never started"
        channel.sock.close()
        assert wait_for(lambda: not marked_pids(marker), timeout=20), "the run outlived its caller's hang-up"
    finally:
        kill_marked(marker)
        _ctl(service, "session", "end", sid, env=plain)


def _dir(path: Path) -> Path:
    path.mkdir()
    return path
