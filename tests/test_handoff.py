"""Issue 29: work handed to other services.

A sealed run (--handoff deny; --network none too) reaches no hand-off
channel outside it (the managers' and buses' sockets, the runtime
directory's listening sockets, a tmux server's), cannot undo its seal nor
join corral's network namespace, and where the seal cannot be had the
command never runs (125). An unsealed run's record lists what the command
could reach (``handoff``) and the summary says "tree-only". A process the
manager moves out of the run into a unit of its own (``systemd-run
--scope``) is a hand-off corral sees: 120, the unit named (``handed_off``).

Each channel is tried by connecting to its socket from inside the run: the
kernel's answer, not a name. On the host the channels are sockets this test
listens on (a runtime directory of its own); under the harness and in the
VM lane they are the real managers' and buses'.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid

import pytest
from serving import client, compiled_client, run_corral, service  # noqa: F401  (fixtures)

from conftest import CORRAL, TIME_SCALE
from modes import MANAGER, all_modes, mode_flags, scope_flag

#: Connects to each path given (a unix socket) and prints what happened, then
#: whether corral's /proc/$PPID/root and /proc/$PPID/ns/net could be opened,
#: and which of the channel variables the command has.
PROBE = (
    "import json, os, socket, sys\n"
    "out = {}\n"
    "for path in sys.argv[1:]:\n"
    "    s = socket.socket(socket.AF_UNIX)\n"
    "    try:\n"
    "        s.connect(path); out[path] = 'connected'\n"
    "    except OSError as e:\n"
    "        out[path] = type(e).__name__\n"
    "    s.close()\n"
    "ppid = os.getppid()\n"
    "def opens(p):\n"
    "    try:\n"
    "        os.close(os.open(p, os.O_RDONLY)); return True\n"
    "    except OSError:\n"
    "        return False\n"
    "print(json.dumps({'sockets': out, 'ppid_root': opens(f'/proc/{ppid}/root/'), "
    "'ppid_netns': opens(f'/proc/{ppid}/ns/net'), "
    "'vars': sorted(k for k in os.environ if k.startswith(('DBUS_', 'TMUX')))}))\n"
)

#: What connecting to a hidden channel gets: /dev/null over a socket refuses; a
#: socket in a masked directory is not there.
HIDDEN = {"ConnectionRefusedError", "FileNotFoundError"}

#: umount2(argv[1], MNT_DETACH) as the kernel takes it (umount(8) refuses a user itself).
UMOUNT = "import ctypes, sys; ctypes.CDLL(None).umount2(sys.argv[1].encode(), 2)"

HOST_MODES = ["fallback", pytest.param("cgroup-parent", marks=pytest.mark.cgroupv2)]
#: The manager's tests: fallback and the two unit types. Not the pid namespace tier: a
#: client inside it that names its own pid to the manager (`systemd-run --scope` sends
#: getpid()) names a number of the namespace's, another process's in the manager's view.
MANAGER_MODES = [m for m in all_modes() if getattr(m, "values", [m])[0] in ("fallback", "scope", "service")]


def _listen(path: str) -> socket.socket:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(8)
    return s


@pytest.fixture
def fake_session(tmp_path):
    """A runtime directory of this test's own with a user manager's socket, a
    session bus, a socket-activated agent's socket, a second bus that only
    $DBUS_SESSION_BUS_ADDRESS names and a corral service's socket elsewhere:
    each listening (the kernel lists them in /proc/net/unix). Returns
    (environment, {channel: socket path})."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    paths = {
        "user-manager": str(runtime / "systemd" / "private"),
        "session-bus": str(runtime / "bus"),
        "user-sockets": str(runtime / "gnupg" / "S.gpg-agent"),
        "named-bus": str(tmp_path / "elsewhere" / "bus"),
        "corral-service": str(tmp_path / "service" / "io.corral.Run"),
    }
    sockets = [_listen(p) for p in paths.values()]
    env = dict(
        os.environ,
        XDG_RUNTIME_DIR=str(runtime),
        DBUS_SESSION_BUS_ADDRESS=f"unix:path={paths['named-bus']}",
        # corral does not ask it (CORRAL_SERVICE=0); the command could
        CORRAL_SERVICE_SOCKET=paths["corral-service"],
        CORRAL_SERVICE="0",
    )
    yield env, paths
    for s in sockets:
        s.close()


def _probe(run) -> dict:
    assert run.returncode == 0, (run.stdout, run.stderr)
    return json.loads(run.stdout)


@pytest.mark.parametrize("mode", HOST_MODES)
def test_unsealed_the_command_reaches_every_channel_and_the_record_lists_them(corral, fake_session, mode):
    env, paths = fake_session
    run = corral(mode_flags(mode) + ["--", "python3", "-c", PROBE, *paths.values()], env=env)
    seen = _probe(run)
    assert set(seen["sockets"].values()) == {"connected"}, seen
    assert seen["vars"] == ["DBUS_SESSION_BUS_ADDRESS"]
    listed = ("user-manager", "session-bus", "user-sockets", "corral-service")
    assert list(listed) == [c for c in run.record["handoff"] if c in listed], run.record["handoff"]
    assert run.record["handed_off"] == []
    assert run.stderr.decode().rstrip().endswith(f"; tree-only; guarantee {run.record['guarantee']}"), run.stderr


@pytest.mark.parametrize("network", ["host", "none"])
@pytest.mark.parametrize("mode", HOST_MODES)
def test_sealed_no_channel_answers(corral, fake_session, mode, network):
    """--handoff deny (and --network none, which seals too): every channel's
    socket refuses, the variables are gone, corral's /proc/$PPID/root and its
    network namespace cannot be opened; the record says "denied"."""
    env, paths = fake_session
    seal = ["--handoff", "deny"] if network == "host" else ["--network", "none"]
    run = corral(mode_flags(mode) + seal + ["--", "python3", "-c", PROBE, *paths.values()], env=env)
    seen = _probe(run)
    assert set(seen["sockets"].values()) <= HIDDEN, seen
    assert seen["vars"] == [] and not seen["ppid_root"] and not seen["ppid_netns"], seen
    assert run.record["handoff"] == "denied"
    assert "tree-only" not in run.stderr.decode()
    assert run.survivors == []


def test_the_library_seals_as_the_cli_does(fake_session):
    """The library's keyword, declared once with the option: a fallback run
    (its own supervising process) sealed, the record's "denied"; unsealed, the
    channels listed."""
    import corral_systemd

    env, paths = fake_session
    sealed = corral_systemd.run(
        ["python3", "-c", PROBE, *paths.values()], mode="fallback", handoff="deny", env=env, stdin=b""
    )
    seen = json.loads(sealed.stdout)
    assert set(seen["sockets"].values()) <= HIDDEN and seen["vars"] == [], seen
    assert sealed.handoff == "denied" and sealed.exit_code == 0
    unsealed = corral_systemd.run(["python3", "-c", PROBE, *paths.values()], mode="fallback", env=env, stdin=b"")
    assert set(json.loads(unsealed.stdout)["sockets"].values()) == {"connected"}
    assert {"user-manager", "session-bus", "user-sockets"} <= set(unsealed.handoff or []), unsealed.handoff


def test_as_root_nsenter_into_corrals_network_namespace_is_refused(corral):
    """The issue's bypass: root joining corral's own network namespace."""
    if os.geteuid() != 0 or shutil.which("nsenter") is None:
        pytest.skip("needs root and nsenter")
    script = "nsenter --net=/proc/$PPID/ns/net cat /proc/self/net/dev >/dev/null 2>&1; echo nsenter=$?"
    run = corral(["--cgroup-mode", "fallback", "--network", "none", "--", "sh", "-c", script])
    assert run.returncode == 0 and run.stdout.strip() == b"nsenter=1", (run.stdout, run.stderr)
    unsealed = corral(["--cgroup-mode", "fallback", "--", "sh", "-c", script])
    assert unsealed.stdout.strip() == b"nsenter=0", (unsealed.stdout, unsealed.stderr)  # the probe can tell


@pytest.mark.parametrize("how", ["umount", "unshare"])
def test_the_command_cannot_undo_its_seal(corral, fake_session, how):
    """What hides a channel cannot be unmounted: not in the command's mount
    namespace (it belongs to the user namespace above the command's), nor in
    one the command makes (its mounts come locked)."""
    if shutil.which("umount") is None or shutil.which("unshare") is None:
        pytest.skip("needs umount and unshare")
    env, paths = fake_session
    target = paths["session-bus"]
    script = f"umount -l {target} 2>/dev/null; echo undo=$?; [ -S {target} ] && echo socket || echo hidden"
    if how == "unshare":
        script = f"unshare -m --propagation private sh -c '{script}'"
    run = corral(["--cgroup-mode", "fallback", "--handoff", "deny", "--", "sh", "-c", script], env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() != [b"undo=0", b"socket"], run.stdout
    assert run.stdout.split()[-1] == b"hidden", run.stdout


def test_a_multiplexer_server_outside_is_out_of_reach_one_the_command_starts_works(corral, tmp_path):
    """A tmux server that already runs outside the run: reachable unsealed (the
    record lists "tmux"), not sealed; a server the command starts itself in a
    sealed run works there and is stopped with the run."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux")
    env = dict(os.environ, TMUX_TMPDIR=str(tmp_path))
    env.pop("TMUX", None)
    name = f"corral-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["tmux", "-L", name, "new", "-d", "sleep 1009"], env=env, check=True, timeout=30)
    try:
        ask = ["tmux", "-L", name, "has-session"]
        unsealed = corral(["--cgroup-mode", "fallback", "--", *ask], env=env)
        assert unsealed.returncode == 0 and "tmux" in unsealed.record["handoff"], unsealed.stderr
        sealed = corral(["--cgroup-mode", "fallback", "--handoff", "deny", "--", *ask], env=env)
        assert sealed.returncode == 1 and sealed.record["handoff"] == "denied", sealed.stderr
        inner = f"tmux -L {name} new -d 'sleep 1010' && tmux -L {name} has-session && echo inner-server"
        own = corral(["--cgroup-mode", "fallback", "--handoff", "deny", "--", "sh", "-c", inner], env=env)
        assert own.returncode == 0 and own.stdout.strip() == b"inner-server", (own.stdout, own.stderr)
        assert own.record["verified"] and own.survivors == []
        # the outside server has one session still, its own
        outside = subprocess.run(["tmux", "-L", name, "list-sessions"], env=env, capture_output=True, timeout=30)
        assert len(outside.stdout.splitlines()) == 1, outside.stdout
    finally:
        subprocess.run(["tmux", "-L", name, "kill-server"], env=env, capture_output=True, timeout=30)


def test_a_bus_no_mount_can_hide_is_refused_unless_the_network_is_cut(corral, tmp_path):
    """An abstract socket is not a file: --handoff deny cannot hide it (125,
    one line, nothing ran); --network none cuts it."""
    witness = tmp_path / "ran"
    env = dict(os.environ, DBUS_SESSION_BUS_ADDRESS="unix:abstract=/tmp/dbus-corral-test")
    run = corral(["--cgroup-mode", "fallback", "--handoff", "deny", "--", "touch", str(witness)], env=env)
    assert run.returncode == 125, run.stderr
    lines = run.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "--handoff deny: not in place" in lines[0] and "abstract" in lines[0], lines
    assert not witness.exists()
    cut = corral(["--cgroup-mode", "fallback", "--network", "none", "--", "touch", str(witness)], env=env)
    assert cut.returncode == 0 and witness.exists(), cut.stderr


def test_a_spool_is_read_only_and_empty_and_a_private_directory_is_the_commands(tmp_path):
    """The seal's two directory masks, made in a child as corral's makes them
    (atd's and cron's spools cannot be faked on this machine): a spool shows
    nothing and takes nothing; a multiplexer's directory is empty and writable."""
    from corral_systemd.kernel.handoff import Mask
    from corral_systemd.kernel.seal import Seal

    spool, private = tmp_path / "spool", tmp_path / "private"
    for d in (spool, private):
        d.mkdir()
        (d / "job").write_text("queued outside")
    seal = Seal([Mask(str(spool), "spool"), Mask(str(private), "private")], network=False)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: seal, then report
        os.close(r)
        try:
            seal.apply()
            out = {"spool": os.listdir(spool), "private": os.listdir(private)}
            for key, d in (("spool_write", spool), ("private_write", private)):
                try:
                    (d / "new").write_text("x")
                    out[key] = "written"
                except OSError as exc:
                    out[key] = exc.errno
        except BaseException as exc:
            out = {"error": repr(exc)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        got = json.loads(f.read())
    os.waitpid(pid, 0)
    import errno

    assert got == {"spool": [], "private": [], "spool_write": errno.EROFS, "private_write": "written"}, got
    assert sorted(os.listdir(spool)) == ["job"] and sorted(os.listdir(private)) == ["job"]  # nothing leaked out


#: corral in this process after it made itself not dumpable, as the Python client
#: does before it asks the service (and stays, when the service declines).
NOT_DUMPABLE = (
    "import ctypes, sys; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); "
    "from corral_systemd.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize("parent", ["dumpable", "not-dumpable"])
@pytest.mark.parametrize("what", ["--handoff", "--network"])
def test_a_user_who_is_not_root_is_sealed_too(tmp_path, what, parent):
    """Not root: the masks are made in a user namespace of the child's own, the
    command runs in another below it: its own session bus is hidden and stays
    hidden (umount2 refused: it holds no capability over that mount
    namespace), corral's /proc/$PPID/root refused."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another user")
    import tempfile

    uid = 56000 + os.getpid() % 1000
    top = tempfile.mkdtemp(prefix="corral-test-home-", dir="/tmp")
    try:
        os.chmod(top, 0o755)
        home = os.path.join(top, "home")
        os.mkdir(home, 0o700)
        os.chown(home, uid, uid)
        runtime = os.path.join(home, "runtime")
        bus = os.path.join(runtime, "bus")
        os.mkdir(runtime, 0o700)
        os.chown(runtime, uid, uid)
        listener = _listen(bus)
        os.chown(bus, uid, uid)
        env = {"PATH": os.environ["PATH"], "HOME": home, "XDG_RUNTIME_DIR": runtime, "CORRAL_SERVICE": "0"}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        corral = CORRAL if parent == "dumpable" else [sys.executable, "-c", NOT_DUMPABLE]
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *corral, "--no-registry"]
        argv += ["--cgroup-mode", "fallback", what, "deny" if what == "--handoff" else "none"]
        proc = subprocess.run(
            # It tries to unmount what hides the bus first: it holds no
            # capability over the mount namespace that does (the inner user namespace).
            [*argv, "--", "sh", "-c", 'python3 -c "$3" "$1"; exec python3 -c "$2" "$1"', "sh", bus, PROBE, UMOUNT],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        listener.close()
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(proc.stdout)
        assert seen["sockets"] == {bus: "ConnectionRefusedError"} and not seen["ppid_root"], seen
    finally:
        shutil.rmtree(top, ignore_errors=True)


# -- under a real manager: the harness (user) and the VM lane (both) -----------


def _manager_channels() -> dict:
    """The real channels this environment has, as corral finds them: name -> a socket path."""
    from corral_systemd.kernel import handoff

    env = dict(os.environ)
    found = handoff.survey(env)
    listening = handoff.listening_sockets()
    out = {}
    for mask in found.masks:
        if mask.how == "socket" and mask.path in listening and os.access(mask.path, os.W_OK):
            out.setdefault(_channel_of(mask.path), mask.path)
        elif mask.path.endswith("/systemd") and os.path.join(mask.path, "private") in listening:
            out["user-manager"] = os.path.join(mask.path, "private")
    return out


def _channel_of(path: str) -> str:
    if path == "/run/systemd/private":
        return "system-manager"
    if path.startswith("/run/dbus/") or path == "/var/run/dbus/system_bus_socket":
        return "system-bus"
    if path.endswith("/bus"):
        return "session-bus"
    return "user-sockets"


@pytest.mark.systemd
@pytest.mark.parametrize("mode", MANAGER_MODES)
def test_the_managers_and_buses_are_out_of_a_sealed_runs_reach(corral, mode):
    """Each real channel (the manager's private socket, the buses, the
    runtime directory's sockets) answers an unsealed run and refuses a sealed
    one; a user manager's service cannot be sealed (125)."""
    channels = _manager_channels()
    if not channels:
        pytest.skip("no manager or bus socket here")
    paths = sorted(set(channels.values()))
    run = corral(mode_flags(mode) + ["--", "python3", "-c", PROBE, *paths])
    seen = _probe(run)
    reached = {p for p, what in seen["sockets"].items() if what == "connected"}
    assert reached == set(paths), seen
    assert set(channels) <= set(run.record["handoff"]), (channels, run.record["handoff"])
    sealed = corral(mode_flags(mode) + ["--handoff", "deny", "--", "python3", "-c", PROBE, *paths])
    if mode == "service" and MANAGER == "user":
        assert sealed.returncode == 125 and b"user manager's service" in sealed.stderr, sealed.stderr
        return
    seen = _probe(sealed)
    assert set(seen["sockets"].values()) <= HIDDEN, seen
    assert not seen["ppid_root"] and not seen["ppid_netns"] and seen["vars"] == [], seen
    assert sealed.record["handoff"] == "denied"


@pytest.mark.systemd
@pytest.mark.parametrize("unit_type", ["scope", "service"])
def test_through_the_corral_service_a_sealed_run_is_the_same(service, tmp_path, unit_type, client):
    """The served path gives the same sealed run, or declines: a sealed scope
    runs in the client's corral (its child seals itself), a system manager's
    service is sealed by the service as in-process, a user manager's refused."""
    channels = _manager_channels()
    if not channels:
        pytest.skip("no manager or bus socket here")
    paths = sorted({*channels.values(), service.path})  # the corral service's socket too
    args = ["--unit-type", unit_type, "--handoff", "deny", "--json", "r.json", "--", "python3", "-c", PROBE, *paths]
    proc = run_corral(service, client=client, args=args, cwd=tmp_path)
    if unit_type == "service" and MANAGER == "user":
        assert proc.returncode == 125 and b"user manager's service" in proc.stderr, proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert set(seen["sockets"].values()) <= HIDDEN and seen["vars"] == [], seen
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["handoff"] == "denied"
    assert record["via"] == ("service" if unit_type == "service" else "cli"), record["via"]


@pytest.mark.systemd
@pytest.mark.parametrize("mode", MANAGER_MODES)
def test_network_none_holds_against_systemd_run(corral, mode):
    """The issue's first bypass: `systemd-run --wait -P ip -o link` from inside
    --network none got the host's interfaces through the manager (here: the
    host's network namespace, which a machine without network shows too)."""
    if shutil.which("systemd-run") is None:
        pytest.skip("systemd-run")
    if mode == "service" and MANAGER == "user":
        pytest.skip("refused: test_network")
    # What the manager starts runs in the manager's network namespace: the host's.
    ask = ["systemd-run", *scope_flag(), "--wait", "-q", "-P", "readlink", "/proc/self/ns/net"]
    host = os.readlink("/proc/self/ns/net").encode()
    open_run = corral(mode_flags(mode) + ["--", *ask])
    assert open_run.returncode == 0 and open_run.stdout.strip() == host, open_run.stderr  # the probe can tell
    run = corral(mode_flags(mode) + ["--network", "none", "--", "sh", "-c", " ".join(ask) + "; echo asked=$?"])
    assert run.returncode == 0, run.stderr
    assert host not in run.stdout and run.stdout.splitlines()[-1] != b"asked=0", run.stdout


def moved_out_script(unit: str, seconds: str) -> str:
    """A command whose `sleep SECONDS` moves itself out of the run into the
    manager's scope UNIT.scope (`systemd-run --scope`), then waits until the
    manager has that scope (within a scaled bound) and a little more."""
    flag = " ".join(scope_flag())
    bound = int(300 * TIME_SCALE)
    return (
        f"systemd-run {flag} --scope -q --unit {unit} sleep {seconds} & "
        f"i=0; until systemctl {flag} is-active -q {unit}.scope || [ $i -ge {bound} ]; do sleep 0.1; i=$((i+1)); done; "
        "sleep 0.5"
    )


@pytest.mark.systemd
@pytest.mark.parametrize("mode", MANAGER_MODES)
def test_a_process_the_manager_moves_out_is_a_hand_off_named(corral, mode):
    """`systemd-run --scope` inside the run moves itself into a scope of the
    manager's: seen (a process corral tracked as the run's, now in another
    unit of the same manager, by GetUnitByPID), 120, the unit named."""
    if shutil.which("systemd-run") is None:
        pytest.skip("systemd-run")
    unit = f"handoff-test-{uuid.uuid4().hex[:8]}"
    run = corral(mode_flags(mode) + ["--", "sh", "-c", moved_out_script(unit, "1007")])
    if mode == "fallback":
        # No manager watched: the moved process is still below corral, stopped
        # and proven gone with the rest; nothing is attributed.
        assert run.returncode == 0 and run.record["handed_off"] == [], run.stderr
        return
    assert run.returncode == 120, run.stderr
    assert run.record["handed_off"] == [f"{unit}.scope"], run.record
    assert f"{unit}.scope (a hand-off" in run.stderr.decode()
    assert run.survivors == []


@pytest.mark.systemd
def test_a_service_asked_for_by_name_is_listed_not_attributed(corral):
    """What systemd 252 does not record cannot be attributed: a service the
    command asks the manager for (`systemd-run --unit`) runs on; the record
    says the run could reach the manager, and the summary "tree-only"."""
    if shutil.which("systemd-run") is None:
        pytest.skip("systemd-run")
    unit = f"handoff-test-{uuid.uuid4().hex[:8]}"
    try:
        run = corral(["--", "systemd-run", *scope_flag(), "-q", "--unit", unit, "sleep", "1006"])
        assert run.returncode == 0, run.stderr
        assert ("user-manager" if MANAGER == "user" else "system-manager") in run.record["handoff"]
        assert run.stderr.decode().rstrip().endswith(f"; tree-only; guarantee {run.record['guarantee']}")
    finally:
        subprocess.run(["systemctl", *scope_flag(), "stop", f"{unit}.service"], capture_output=True, timeout=60)


def test_python_probe_runs_here():
    """The probe itself: it connects where something listens (else every
    sealed-run assertion above would pass vacuously)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s")
        with _listen(path):
            out = subprocess.run([sys.executable, "-c", PROBE, path], capture_output=True, text=True, timeout=30)
    assert json.loads(out.stdout)["sockets"] == {path: "connected"}, out


def test_the_survey_finds_spools_and_names_what_a_bus_address_hides(tmp_path, monkeypatch):
    """atd's and cron's spools (fixed paths: given here as directories of this
    test's own) are channels when they exist, hidden read-only; a bus address's
    unix path is masked, an abstract socket or TCP cannot be."""
    from corral_systemd.kernel import handoff

    atjobs, crontabs = tmp_path / "atjobs", tmp_path / "crontabs"
    atjobs.mkdir()
    monkeypatch.setattr(handoff, "_ATD_SPOOLS", (str(atjobs), str(tmp_path / "absent")))
    monkeypatch.setattr(handoff, "_CRON_SPOOLS", (str(crontabs),))
    found = handoff.survey({"XDG_RUNTIME_DIR": str(tmp_path / "none")}, listening=set())
    assert "atd" in found.open and "cron" not in found.open, found
    assert handoff.Mask(str(atjobs), "spool") in found.masks
    assert not any(m.path.startswith(str(crontabs)) for m in found.masks)
    paths, unmaskable = handoff.bus_paths("unix:path=/run/a%20b,guid=1;unix:abstract=/tmp/x;tcp:host=h,port=1")
    assert paths == ["/run/a b"] and unmaskable == ["unix:abstract=/tmp/x", "tcp:host=h,port=1"]
