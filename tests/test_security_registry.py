"""Issue 14: the run's own uid is the adversary (host, fallback mode).

The command under corral runs as corral's user and can rewrite the state
directory, its entry and its log. Nothing found there alone may make
corralctl signal a process or remove a path, nor make status more
permissive than the kernel says. Each test reproduces one observed attack.
"""

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_registry import SECRET, _secret_file, ctl, env_for, events, markers, run_ids, state, wait_for  # noqa: F401

from conftest import CORRAL
from corral_systemd import ctl as CTL
from corral_systemd.core.spec import new_run_id
from corral_systemd.state import journal as J
from corral_systemd.state import registry as REG
from procscan import marked_pids

FB = ["--cgroup-mode", "fallback"]


def _starttime(pid: int) -> int:
    return REG.proc_stat(pid)[4]


def _alive(proc) -> bool:
    return proc.poll() is None


@pytest.fixture
def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def bystanders():
    """Processes the tests start as bystanders, killed by pid afterwards."""
    made = []

    def start(argv, **kwargs):
        made.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs))
        return made[-1]

    yield start
    for proc in made:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def forge_entry(state: Path, *, owner_pid: int, owner_start, state_name="active", mode="fallback", **extra) -> str:
    """An entry written by hand, as the run's uid can."""
    run_id = new_run_id()
    now, mono = time.time(), time.monotonic()
    entry = {
        "version": 1,
        "run_id": run_id,
        "state": state_name,
        "mode": mode,
        "unit": None,
        "control_group": None,
        "owner": {
            "pid": owner_pid,
            "starttime": owner_start,
            "pgid": owner_pid,
            "sid": owner_pid,
            "uid": os.geteuid(),
            "boot_id": REG.boot_id(),
            "kind": "corral",
        },
        "registered_at": now - 1,
        "registered_monotonic": mono - 1,
        "wall": None,
        "grace": 0.2,
        "verify_timeout": 0.5,
        "deadline_at": None,
        "deadline_monotonic": None,
        "command": ["sleep", "60"],
        "cwd": "/",
        "environment": None,
        "credentials": [],
        "credentials_delivery": None,
        "credentials_directory": None,
        "helper_pids": [],
        **extra,
    }
    log = REG.EventLog(REG.log_path(str(state), run_id), run_id, create=True)
    reg = REG.Registration(str(state), entry, log)  # no token: only the real owner has one
    reg.event("registered", {"owner": entry["owner"]})
    reg.save()
    return run_id, reg


# -- forged entries must not drive destructive actions ----------------------------------------------
@pytest.mark.parametrize("kind", ["plain", "corral"])
def test_stop_never_signals_a_bystander_named_as_owner(state, tmp_path, bystanders, kind):
    """A forged active entry naming a bystander's pid and start time (a plain process, or
    another user's... another run's own corral) as its owner: stop signals no one."""
    if kind == "plain":
        victim = bystanders(["sleep", "60"])
    else:  # a real corral of another run, in another registry: it looks like a corral, holds no token for ours
        other = tmp_path / "other-state"
        victim = bystanders([*CORRAL, *FB, "--", "sleep", "60"], env=env_for(other))
        wait_for(lambda: list(other.glob("*.json")))
    wait_for(lambda: REG.proc_stat(victim.pid) is not None)
    run_id, reg = forge_entry(state, owner_pid=victim.pid, owner_start=_starttime(victim.pid))
    reg.close()
    r = ctl(state, "status", run_id)
    assert r.returncode == 10, r.stdout  # never active on the entry's word alone
    assert "no token" in r.stdout
    r = ctl(state, "stop", run_id)
    time.sleep(0.3)
    assert _alive(victim), r.stdout + r.stderr
    assert "not signalling" in r.stderr


def test_gc_forged_dead_owner_entry_touches_no_bystander_session_nor_directory(state, tmp_path, bystanders, dead_pid):
    """A forged fallback entry, its owner dead, its log naming a bystander's session, its
    credentials_directory an unrelated directory: gc signals nothing, removes nothing."""
    victim = bystanders(["sleep", "60"], start_new_session=True)
    wait_for(lambda: REG.proc_stat(victim.pid) is not None)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep").write_text("mine")
    run_id, reg = forge_entry(
        state,
        owner_pid=dead_pid,
        owner_start=1,
        credentials_directory=str(precious),
        mark_sha256=hashlib.sha256(b"whatever").hexdigest(),
    )
    start = _starttime(victim.pid)
    reg.event("started", {"pid": victim.pid, "pgid": victim.pid, "sid": victim.pid, "starttime": start})
    reg.event("detached", {"pid": victim.pid, "starttime": start, "sid": victim.pid, "pgid": victim.pid})
    reg.save()
    reg.close()
    dry = ctl(state, "gc", "--dry-run")
    assert "left alone" in dry.stdout and "SIGTERM" not in dry.stdout and "remove" not in dry.stdout, dry.stdout
    r = ctl(state, "gc")
    time.sleep(0.3)
    assert _alive(victim), r.stdout
    assert (precious / "keep").read_text() == "mine", r.stdout
    entry = REG.read_entry(str(state), run_id)
    assert entry["state"] == "finished" and entry["outcome"] == "reclaimed"


# -- a run cannot hide ----------------------------------------------------------------------
def test_a_run_cannot_hide_by_rewriting_its_entry_as_finished(state, markers):
    marker = markers()
    proc = subprocess.Popen(
        [*CORRAL, *FB, "--wall", "60s", "--", "sleep", "60"],
        env=env_for(state, marker),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        [run_id] = wait_for(lambda: run_ids(state))
        wait_for(lambda: any(e["event"] == "started" for e in events(state, run_id)))
        path = state / f"{run_id}.json"
        entry = json.loads(path.read_text())
        entry.update(state="finished", exit_code=0, outcome="exit", verified=True, finished_at=time.time())
        path.write_text(json.dumps(entry))  # what the command itself can do
        r = ctl(state, "status", run_id)
        assert r.returncode == 0, r.stdout  # active, not 11
        assert "entry claims finished but its owner" in r.stdout
        rows = json.loads(ctl(state, "ps", "--json").stdout)
        assert [row["run_id"] for row in rows] == [run_id]
        r = ctl(state, "stop", run_id)
        assert r.returncode == 0 and "verified" in r.stdout and "already finished" not in r.stdout, r.stdout
        proc.wait(timeout=20)
        assert marked_pids(marker) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_run_past_its_deadline_cannot_rewrite_itself_active(state, markers):
    """Past the deadline, in the grace period (the command ignores SIGTERM), the command
    rewrites its entry: state active, a deadline an hour away. status stays expired."""
    marker = markers()
    proc = subprocess.Popen(
        [*CORRAL, *FB, "--wall", "1s", "--grace", "30s", "--", "sh", "-c", "trap '' TERM; sleep 60"],
        env=env_for(state, marker),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        [run_id] = wait_for(lambda: run_ids(state))
        wait_for(lambda: any(e["event"] == "term_sent" for e in events(state, run_id)), timeout=20)
        path = state / f"{run_id}.json"
        entry = json.loads(path.read_text())
        entry.update(state="active", deadline_monotonic=time.monotonic() + 3600, deadline_at=time.time() + 3600)
        path.write_text(json.dumps(entry))
        r = ctl(state, "status", run_id)
        assert r.returncode == 10, r.stdout  # expired, as its corral says
        assert "entry claims active but its owner" in r.stdout, r.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def test_status_of_a_finished_run_after_its_corral_ended_is_finished(state):
    r = subprocess.run([*CORRAL, *FB, "--", "true"], env=env_for(state), capture_output=True, timeout=30)
    assert r.returncode == 0
    [run_id] = run_ids(state)
    assert ctl(state, "status", run_id).returncode == 11


# -- gc and live credentials -----------------------------------------------------------------
def test_gc_leaves_the_credentials_of_a_live_unregistered_run(state, tmp_path):
    src = _secret_file(tmp_path)
    ready, go = tmp_path / "ready", tmp_path / "go"
    script = f'touch {ready}; while [ ! -e {go} ]; do sleep 0.02; done; cat "$CREDENTIALS_DIRECTORY/api"'
    proc = subprocess.Popen(
        [*CORRAL, *FB, "--no-registry", "--credential", f"api={src}", "--", "sh", "-c", script],
        env=env_for(state),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(ready.exists, timeout=20)
        r = ctl(state, "gc", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads(r.stdout)["reclaimed"] == []
        go.touch()
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and SECRET in out, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_gc_removes_the_credentials_a_dead_run_left(state, tmp_path):
    """The last resort still works: an unlocked directory named as a run, in corral's base."""
    base = state / "credentials"
    base.mkdir(mode=0o700)
    stray = base / new_run_id()
    stray.mkdir(mode=0o700)
    (stray / "api").write_text("x")
    r = ctl(state, "gc")
    assert r.returncode == 0 and not stray.exists(), r.stdout


# -- predictable paths -------------------------------------------------------------------------
def _as_user(uid: int, argv, env, **kwargs):
    if os.environ.get("PYTHONPATH"):
        env = dict(env, PYTHONPATH=os.environ["PYTHONPATH"])
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        **kwargs,
    )


@pytest.fixture
def other_uid():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as other users")
    uid = random.randrange(50000, 60000)
    yield uid
    for path in Path("/dev/shm").glob(f"corral-{uid}*"):
        if path.is_symlink() or not path.is_dir():
            path.unlink()
        else:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def user_home(other_uid):
    """A home directory for ``other_uid`` where that user can reach it (pytest's tmp_path is root's, 0700)."""
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="corral-test-home-", dir="/tmp"))
    top.chmod(0o755)
    home = top / "home"
    home.mkdir(mode=0o700)
    os.chown(home, other_uid, other_uid)
    yield home
    shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("squat", ["other_owner", "symlink", "world_writable"])
def test_a_foreign_dev_shm_directory_is_refused_and_a_private_one_used(tmp_path, other_uid, user_home, squat):
    uid = other_uid
    shared = Path(f"/dev/shm/corral-{uid}")
    if squat == "other_owner":
        shared.mkdir(mode=0o777)
        os.chown(shared, uid + 1, uid + 1)
    elif squat == "symlink":
        target = user_home / "elsewhere"
        target.mkdir()
        os.chown(target, uid, uid)
        shared.symlink_to(target)
    else:
        shared.mkdir()
        os.chown(shared, uid, uid)
        shared.chmod(0o777)
    home = user_home
    state = home / "state"  # on disk: the credentials go to /dev/shm
    src = home / "api.token"
    src.write_text(SECRET)
    os.chown(src, uid, uid)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CORRAL_STATE_DIR": str(state)}
    r = _as_user(
        uid,
        [
            *CORRAL,
            *FB,
            "--credential",
            f"api={src}",
            "--",
            "sh",
            "-c",
            'cat "$CREDENTIALS_DIRECTORY/api"; echo; echo "$CREDENTIALS_DIRECTORY"',
        ],
        env,
        cwd=str(home),
    )
    assert r.returncode == 0, r.stderr
    secret, where = r.stdout.splitlines()
    assert secret == SECRET
    assert where.startswith(f"/dev/shm/corral-{uid}.") and not Path(where).exists()
    assert f"corral-{uid}" in r.stderr and "instead" in r.stderr
    if squat == "other_owner":
        assert os.stat(shared).st_uid == uid + 1  # untouched


def test_user_without_xdg_runtime_dir_gets_a_private_state_directory(other_uid, user_home):
    uid = other_uid
    assert not Path(f"/run/user/{uid}").exists()
    home = user_home
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}  # cron, su -c: no XDG_RUNTIME_DIR
    r = _as_user(uid, [*CORRAL, *FB, "--", "true"], env, cwd=str(home))
    assert r.returncode == 0, r.stderr
    state = home / ".local" / "state" / "corral"
    assert state.is_dir() and state.stat().st_mode & 0o777 == 0o700 and state.stat().st_uid == uid
    [entry] = state.glob("*.json")
    r = _as_user(uid, [sys.executable, "-m", "corral_systemd.ctl", "status", entry.stem], env, cwd=str(home))
    assert r.returncode == 11, r.stdout + r.stderr


@pytest.mark.parametrize("how", ["world_writable", "other_owner", "symlink"])
def test_an_unsafe_state_directory_is_125_one_line(tmp_path, how):
    state = tmp_path / "state"
    if how == "symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        state.symlink_to(tmp_path / "real")
    else:
        state.mkdir()
        state.chmod(0o777 if how == "world_writable" else 0o700)
        if how == "other_owner":
            if os.geteuid() != 0:
                pytest.skip("needs root to chown")
            os.chown(state, 54321, 54321)
    witness = tmp_path / "ran"
    r = subprocess.run(
        [*CORRAL, *FB, "--", "touch", str(witness)],
        env=env_for(state),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 125 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "refusing" in r.stderr
    assert not witness.exists()


# -- the audit trail and the journal -------------------------------------------------------------
def test_journal_datagram_format():
    data = J.encode([("MESSAGE", "hello"), ("CORRAL_LINE", "a\nb"), ("EMPTY", "")])
    assert data.startswith(b"MESSAGE=hello\nCORRAL_LINE\n" + (3).to_bytes(8, "little") + b"a\nb\nEMPTY=\n")
    assert J.decode(data) == {"MESSAGE": b"hello", "CORRAL_LINE": b"a\nb", "EMPTY": b""}


@pytest.fixture
def fake_journal(tmp_path, monkeypatch):
    """A datagram socket standing in for journald's; records what corral sends, with the
    trusted fields journald would add (_PID, _UID from SO_PEERCRED are not available on a
    datagram: this process is the only sender here)."""
    path = str(tmp_path / "journal.socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    monkeypatch.setattr(J, "SOCKET", path)
    monkeypatch.setattr(J, "_senders", {})

    def received() -> list[dict]:
        out = []
        while True:
            try:
                data = sock.recv(1 << 20)
            except BlockingIOError:
                return out
            fields = {k: v.decode() for k, v in J.decode(data).items()}
            fields.update(_PID=str(os.getpid()), _UID=str(os.geteuid()), _CMDLINE="corral")
            out.append(fields)

    yield received
    sock.close()


def _register_and_finish(state, exit_code=124, outcome="timeout") -> str:
    from types import SimpleNamespace

    spec = SimpleNamespace(run_id=new_run_id(), wall=1.0, grace=0.2, verify_timeout=0.2, argv=["sleep", "5"], cwd="/")
    reg = REG.register(spec, mode="fallback", directory=str(state))
    obs = REG.RegistryObserver(reg)
    obs.event("started", {"pid": os.getpid()})
    obs.event("deadline_expired", {})
    obs.event("verified", {})
    obs.event("finished", {"exit_code": exit_code, "outcome": outcome})
    return spec.run_id


def test_every_event_goes_to_the_journal_line_for_line(state, fake_journal):
    run_id = _register_and_finish(state)
    got = fake_journal()
    lines = (state / f"{run_id}.log").read_text().splitlines()
    assert [r["CORRAL_LINE"] for r in got] == lines
    assert [r["CORRAL_EVENT"] for r in got] == ["registered", "started", "deadline_expired", "verified", "finished"]
    assert all(r["CORRAL_RUN_ID"] == run_id and r["SYSLOG_IDENTIFIER"] == "corral" for r in got)
    assert got[0]["MESSAGE"] == f"corral run {run_id}: registered" and got[-1]["CORRAL_SEQ"] == "4"


def _rewrite_as_exit_0(state, run_id):
    """What the run's uid can do: rewrite the log (exit 0), recompute the chain and the anchor."""
    path = state / f"{run_id}.log"
    prev, out = REG.ZERO_HASH, []
    for raw in path.read_text().splitlines():
        line = json.loads(raw)
        line.pop("hash")
        if line["event"] == "deadline_expired":
            line["event"], line["data"] = "command_exited", {"exit_status": 0}
        if line["event"] == "finished":
            line["data"] = {"exit_code": 0, "outcome": "exit"}
        line["prev"] = prev
        line["hash"] = prev = hashlib.sha256(REG._canonical(line)).hexdigest()
        out.append(json.dumps(line, sort_keys=True, separators=(",", ":")))
    path.write_text("\n".join(out) + "\n")
    entry = REG.read_entry(str(state), run_id)
    entry.update(exit_code=0, outcome="exit", log={"lines": len(out), "head": prev})
    (state / f"{run_id}.json").write_text(json.dumps(entry))


def test_audit_verify_catches_a_rewritten_chain_against_the_journal(state, fake_journal, monkeypatch, capsys):
    run_id = _register_and_finish(state)
    records = fake_journal()
    _rewrite_as_exit_0(state, run_id)
    monkeypatch.setattr(J, "available", lambda: True)
    monkeypatch.setattr(J, "read_records", lambda rid, timeout=30.0: [r for r in records if r["CORRAL_RUN_ID"] == rid])
    assert CTL.audit_verify(run_id, str(state)) == 1
    out = capsys.readouterr().out
    assert f"{run_id}.log:3: BAD: differs from the journal" in out and "deadline_expired" in out, out
    assert f"{run_id}.log:5: BAD" in out
    # Lines someone else sent to the journal in the run's name are not corral's: ignored.
    forged = [dict(r, _PID="1") for r in records]
    monkeypatch.setattr(J, "read_records", lambda rid, timeout=30.0: forged + records)
    assert CTL.audit_verify(run_id, str(state)) == 1


def test_audit_verify_without_a_journal_says_what_the_chain_cannot_tell(state, monkeypatch, capsys):
    monkeypatch.setattr(J, "SOCKET", "/nonexistent/journal.socket")
    monkeypatch.setattr(J, "_senders", {})
    run_id = _register_and_finish(state)
    _rewrite_as_exit_0(state, run_id)
    assert CTL.audit_verify(run_id, str(state)) == 0  # the chain alone cannot tell
    assert "no journal to compare with" in capsys.readouterr().out


@pytest.mark.booted
def test_audit_verify_against_the_real_journal(state):
    if not os.path.exists("/run/systemd/journal/socket") or shutil.which("journalctl") is None:
        pytest.skip("needs journald (/run/systemd/journal/socket): the VM lane")
    subprocess.run(
        [*CORRAL, *FB, "--wall", "300ms", "--", "sleep", "5"], env=env_for(state), capture_output=True, timeout=30
    )
    [run_id] = run_ids(state)
    subprocess.run(["journalctl", "--sync"], capture_output=True, timeout=30)  # root only; harmless otherwise
    wait_for(lambda: ctl(state, "audit", "verify", run_id).stdout.count("matches the journal"), timeout=10, every=0.2)
    _rewrite_as_exit_0(state, run_id)
    r = ctl(state, "audit", "verify", run_id)
    assert r.returncode == 1 and "differs from the journal" in r.stdout, r.stdout


def test_stop_waits_for_the_entry_when_the_owners_token_is_ahead(tmp_path, monkeypatch, capsys):
    """The owner writes its entry, then its token: corralctl can read the
    entry (still active), then a token that already says finished. It must
    read the entry again, not report the stale one ("exit None, NOT
    verified": seen once in the VM lane)."""
    import importlib

    from corral_systemd.state import registry as REG

    ctl_stop = importlib.import_module("corral_systemd.ctl.stop")  # the package re-exports the function

    active = {"run_id": "0123456789ab", "state": "active"}
    final = dict(active, state="finished", exit_code=143, verified=True, remaining_pids=[])
    reads = iter([active, final])
    monkeypatch.setattr(REG, "read_entry", lambda directory, run_id: next(reads, final))
    monkeypatch.setattr(REG, "effective_state", lambda entry, **kw: ("finished", "its owner says so"))
    assert ctl_stop._await_finished(str(tmp_path), active, 5.0, "stopped by its corral", "its corral") == 0
    assert "exit 143, verified" in capsys.readouterr().out


@pytest.mark.parametrize("option", ["--json", "--output-file"])
def test_an_output_path_the_user_cannot_reach_is_125_one_line(other_uid, user_home, option):
    """A path under a directory the user cannot search (EACCES from lstat):
    one line and 125, not a traceback; nothing runs."""
    env = {"PATH": os.environ["PATH"], "HOME": str(user_home)}
    witness = user_home / "ran"
    r = _as_user(
        other_uid,
        [*CORRAL, *FB, "--no-registry", option, "/root/corral-out", "--", "touch", str(witness)],
        env,
        cwd=str(user_home),
    )
    assert r.returncode == 125, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Permission denied" in lines[0], lines
    assert not witness.exists()
