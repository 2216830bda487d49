"""Issue 5: run registry, audit log, corralctl, environment and credentials (host, fallback mode)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from tethers import tether_kind  # noqa: F401  (the fixture: both tether programs)

from conftest import CORRAL, TIME_SCALE
from corral_systemd.core.spec import new_run_id
from corral_systemd.state import registry as REG
from corral_systemd.state.registry.audit import verify_log
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

CTL = [sys.executable, "-m", "corral_systemd.ctl"]
FB = ["--cgroup-mode", "fallback"]
SECRET = "s3cr3t-" + os.urandom(8).hex()


@pytest.fixture
def state(request):
    """A private state directory on a tmpfs (credentials need one)."""
    path = Path(tempfile.mkdtemp(prefix="corral-test-state-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def markers():
    made = []

    def make():
        made.append(new_marker())
        return made[-1]

    yield make
    for marker in made:
        kill_marked(marker)


def env_for(state, marker=None, **extra):
    env = dict(os.environ, CORRAL_STATE_DIR=str(state), **extra)
    if marker:
        env[MARKER_ENV] = marker
    return env


def ctl(state, *args, timeout=30):
    return subprocess.run([*CTL, *args], env=env_for(state), capture_output=True, text=True, timeout=timeout)


def run_ids(state) -> list[str]:
    return sorted(p.stem for p in state.glob("*.json"))


def wait_for(predicate, timeout=10.0, every=0.01):
    """The predicate's first true value; AssertionError after ``timeout``
    seconds (times TIME_SCALE: a give-up bound, it costs nothing when met)."""
    end = time.monotonic() + timeout * TIME_SCALE
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not met in time")


def events(state, run_id) -> list[dict]:
    return [json.loads(line) for line in (state / f"{run_id}.log").read_text().splitlines()]


# -- registry and events ------------------------------------------------------------------
def test_run_is_registered_with_events_and_private_files(state, tmp_path):
    proc = subprocess.run(
        [*CORRAL, *FB, "--json", str(tmp_path / "r.json"), "--", "sh", "-c", "exit 3"],
        env=env_for(state),
        capture_output=True,
        timeout=30,
    )
    assert proc.returncode == 3
    [run_id] = run_ids(state)
    entry = json.loads((state / f"{run_id}.json").read_text())
    assert entry["state"] == "finished" and entry["exit_code"] == 3 and entry["verified"] is True
    assert entry["owner"]["pid"] > 0 and entry["command"] == ["sh", "-c", "exit 3"] and entry["mode"] == "fallback"
    names = [e["event"] for e in events(state, run_id)]
    assert names == ["registered", "started", "command_exited", "verified", "finished"]
    assert state.stat().st_mode & 0o777 == 0o700
    for f in state.iterdir():
        assert f.stat().st_mode & 0o777 == 0o600, f
    assert ctl(state, "audit", "verify", run_id).returncode == 0


def test_registry_write_failure_is_125_command_not_started(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    witness = tmp_path / "ran"
    proc = subprocess.run(
        [*CORRAL, *FB, "--", "touch", str(witness)],
        env=env_for(blocker / "sub"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 125, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "register" in proc.stderr
    assert not witness.exists()
    proc = subprocess.run(
        [*CORRAL, *FB, "--no-registry", "--", "touch", str(witness)],
        env=env_for(blocker / "sub"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0 and witness.exists()


TERM_PROBE = textwrap.dedent("""
    import glob, json, os, signal, sys, time
    state, out = sys.argv[1], sys.argv[2]
    def on_term(*_):
        got = time.time()
        log = open(glob.glob(os.path.join(state, "*.log"))[0]).read()
        entry = json.load(open(glob.glob(os.path.join(state, "*.json"))[0]))
        with open(out, "w") as f:
            json.dump({"got": got, "logged": '"deadline_expired"' in log, "state": entry["state"]}, f)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    open(out + ".ready", "w").close()
    while True:
        time.sleep(0.005)
""")


def test_deadline_expired_is_on_disk_before_the_first_signal(state, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(TERM_PROBE)
    out = tmp_path / "term.json"
    proc = subprocess.run(
        [*CORRAL, *FB, "--wall", "700ms", "--", sys.executable, str(probe), str(state), str(out)],
        env=env_for(state),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 124, proc.stderr
    seen = json.loads(out.read_text())
    [run_id] = run_ids(state)
    expired = next(e for e in events(state, run_id) if e["event"] == "deadline_expired")
    term = next(e for e in events(state, run_id) if e["event"] == "term_sent")
    # The command, when SIGTERM reached it, could already read both records.
    assert seen["logged"] and seen["state"] == "expired"
    assert expired["time"] <= seen["got"] and expired["seq"] < term["seq"]


def test_status_flips_active_expired_finished(state, tmp_path, markers):
    marker = markers()
    proc = subprocess.Popen(
        [*CORRAL, *FB, "--wall", "1s", "--grace", "1s", "--", "sh", "-c", "trap '' TERM; sleep 30"],
        env=env_for(state, marker),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run_id = wait_for(lambda: run_ids(state))[0]
        seen = []  # (state, exit code, time)
        while proc.poll() is None or not seen or seen[-1][0] != "finished":
            r = ctl(state, "status", run_id)
            seen.append((r.stdout.split()[0], r.returncode, time.time()))
            if proc.poll() is not None and seen[-1][0] == "finished":
                break
            time.sleep(0.05)
    finally:
        proc.wait(timeout=30)
    states = [s for s, _, _ in seen]
    order = [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s]
    assert order == ["active", "expired", "finished"], states
    assert {s: c for s, c, _ in seen} == {"active": 0, "expired": 10, "finished": 11}
    entry = json.loads((state / f"{run_id}.json").read_text())
    first_expired = next(t for s, _, t in seen if s == "expired")
    last_active = max(t for s, _, t in seen if s == "active")
    assert last_active < entry["deadline_at"] + 0.05 and first_expired >= entry["deadline_at"] - 0.05


def test_status_expires_on_the_clock_even_if_corral_is_stuck(state, markers):
    proc = subprocess.Popen(
        # The wall leaves time for the first status (a Python start-up: seconds on a loaded machine).
        [*CORRAL, *FB, "--wall", "4s", "--", "sleep", "30"],
        env=env_for(state, markers()),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run_id = wait_for(lambda: run_ids(state))[0]
        os.kill(proc.pid, signal.SIGSTOP)
        assert ctl(state, "status", run_id).returncode == 0
        entry = json.loads((state / f"{run_id}.json").read_text())
        time.sleep(max(0.0, entry["deadline_at"] - time.time()) + 0.05)
        r = ctl(state, "status", run_id)
        assert r.returncode == 10, r.stdout
        assert json.loads((state / f"{run_id}.json").read_text())["state"] == "active"  # corral could not say so
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(timeout=30)


def test_redaction_of_secret_looking_arguments(state):
    from corral_systemd.state.registry import redact_argv

    argv = [
        "curl",
        "-H",
        "Authorization: Bearer abc",
        "--password",
        "hunter2",
        "--token=xyz",
        "https://u:pw@example.com/x",
        "API_KEY=k",
        "plain",
    ]
    out = redact_argv(argv)
    assert out == [
        "curl",
        "-H",
        "Authorization: [redacted]",
        "--password",
        "[redacted]",
        "--token=[redacted]",
        "https://u:[redacted]@example.com/x",
        "API_KEY=[redacted]",
        "plain",
    ]
    subprocess.run(
        [*CORRAL, *FB, "--", "true", "--token=" + SECRET], env=env_for(state), capture_output=True, timeout=30
    )
    _assert_secret_nowhere(state)


@pytest.mark.parametrize("run", ["0123456789ab", "corral-0123456789ab.scope", "../../etc/passwd", "xyz"])
def test_status_of_unknown_run(state, run):
    r = ctl(state, "status", run)
    assert r.returncode == 12 and r.stdout.startswith("unknown")


def test_status_owner_gone_is_not_active(state, markers):
    marker = markers()
    proc = subprocess.Popen(
        [*CORRAL, *FB, "--", "sleep", "30"],
        env=env_for(state, marker),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run_id = wait_for(lambda: run_ids(state))[0]
    assert ctl(state, "status", run_id).returncode == 0
    proc.kill()
    proc.wait()
    r = ctl(state, "status", run_id)
    assert r.returncode == 10 and "gone" in r.stdout


# -- audit -------------------------------------------------------------------------------
def _tamper(lines: list[str], how: str) -> list[str]:
    lines = list(lines)
    if how == "changed":
        line = json.loads(lines[2])
        line["data"]["pid"] = line["data"].get("pid", 0) + 1
        lines[2] = json.dumps(line, sort_keys=True, separators=(",", ":"))
    elif how == "removed":
        del lines[2]
    elif how == "reordered":
        lines[2], lines[3] = lines[3], lines[2]
    elif how == "removed_renumbered":  # a careful editor: seq and the line's own hash made consistent
        import hashlib

        del lines[2]
        line = json.loads(lines[2])
        line["seq"] -= 1
        line.pop("hash")
        line["hash"] = hashlib.sha256(json.dumps(line, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        lines[2] = json.dumps(line, sort_keys=True, separators=(",", ":"))
    elif how == "last_removed":
        del lines[-1]
    elif how == "last_changed":
        line = json.loads(lines[-1])
        line["data"]["exit_code"] = 0
        lines[-1] = json.dumps(line, sort_keys=True, separators=(",", ":"))
    return lines


@pytest.mark.parametrize(
    "how,bad_line",
    [
        ("changed", 3),
        ("removed", 3),
        ("reordered", 3),
        ("removed_renumbered", 3),
        ("last_removed", 6),
        ("last_changed", 6),
    ],
)
def test_audit_verify_catches_tampering(state, how, bad_line):
    subprocess.run(
        [*CORRAL, *FB, "--wall", "300ms", "--", "sleep", "5"], env=env_for(state), capture_output=True, timeout=30
    )
    [run_id] = run_ids(state)
    log = state / f"{run_id}.log"
    lines = log.read_text().splitlines()
    assert len(lines) == 6  # registered started deadline_expired term_sent verified finished
    assert ctl(state, "audit", "verify", run_id).returncode == 0
    log.write_text("\n".join(_tamper(lines, how)) + "\n")
    r = ctl(state, "audit", "verify", run_id)
    assert r.returncode == 1 and "BAD" in r.stdout, r.stdout
    assert f"{run_id}.log:{bad_line}:" in r.stdout, r.stdout


# -- ps, stop, gc -----------------------------------------------------------------------------
def test_ps_shows_ten_concurrent_runs(state, tmp_path, markers):
    procs, cwds = [], []
    for i in range(10):
        cwd = tmp_path / f"job{i}"
        cwd.mkdir()
        cwds.append(str(cwd))
        procs.append(
            subprocess.Popen(
                [*CORRAL, *FB, "--wall", "60s", "--", "sh", "-c", f"sleep 60 & sleep 6{i}"],
                env=env_for(state, markers()),
                cwd=cwd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    try:

        def ready():
            r = ctl(state, "ps", "--json")
            rows = json.loads(r.stdout)
            return rows if len(rows) == 10 and all(row["processes"] == 3 for row in rows) else None

        rows = wait_for(ready, timeout=20, every=0.1)
        by_cwd = {row["cwd"]: row for row in rows}
        assert sorted(by_cwd) == sorted(cwds)
        for i, cwd in enumerate(cwds):
            row = by_cwd[cwd]
            assert row["command"] == ["sh", "-c", f"sleep 60 & sleep 6{i}"]
            assert row["mode"] == "fallback" and row["state"] == "active" and row["owner_pid"] == procs[i].pid
            assert 50 < row["time_to_deadline"] <= 60 and 0 <= row["age"] < 20
            assert row["memory"] > 0 and len(row["pids"]) == 3
        table = ctl(state, "ps").stdout.splitlines()
        assert table[0].split()[:3] == ["RUN", "STATE", "MODE"] and len(table) == 11
        # stop through the owner: corral runs its verified stop
        r = ctl(state, "stop", rows[0]["run_id"])
        assert r.returncode == 0 and "verified" in r.stdout, r.stdout + r.stderr
        assert ctl(state, "status", rows[0]["run_id"]).returncode == 11
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)
    assert ctl(state, "ps", "--json").stdout.strip() == "[]"


def test_gc_after_sigkilled_fallback_corral(state, tmp_path, markers, tether_kind):
    """What gc can do for a fallback run whose corral and tether were both
    SIGKILLed (the tether alone stops the run of a SIGKILLed corral:
    test_rough_edges): stop every process that carries the run's mark, in the
    command's session or not -- one that detached after corral died too."""
    marker = markers()
    late = tmp_path / "late"
    proc = subprocess.Popen(
        [
            *CORRAL,
            *FB,
            "--wall",
            "60s",
            "--",
            "sh",
            "-c",
            f"setsid sleep 300 & sleep 300 & (sleep 1.0; setsid sh -c 'echo $$ > {late}; exec sleep 300') & wait",
        ],
        env=env_for(state, marker),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run_id = wait_for(lambda: run_ids(state))[0]
    wait_for(lambda: len(marked_pids(marker)) >= 4)  # corral, its tether, the shell, its sleeps
    (tether,) = json.loads((state / f"{run_id}.json").read_text())["helper_pids"]
    with open(f"/proc/{tether}/stat") as f:
        assert int(f.read().rsplit(")", 1)[1].split()[1]) == proc.pid  # corral's child: ours to kill
    os.kill(tether, signal.SIGKILL)
    proc.kill()
    proc.wait()
    wait_for(late.exists, timeout=5)
    time.sleep(0.05)
    before = set(marked_pids(marker))
    late_pid = int(late.read_text())
    assert late_pid in before and len(before) >= 4
    assert "SIGTERM" in ctl(state, "gc", "--dry-run").stdout
    assert set(marked_pids(marker)) == before  # dry run touched nothing
    r = ctl(state, "gc")
    assert r.returncode == 0 and "verified" in r.stdout, r.stdout + r.stderr
    left = marked_pids(marker)
    assert left == [], (left, r.stdout)  # the late detacher too: it carries the run's mark
    entry = json.loads((state / f"{run_id}.json").read_text())
    assert entry["state"] == "finished" and entry["outcome"] == "reclaimed"
    assert events(state, run_id)[-1]["event"] == "reclaimed"
    assert ctl(state, "audit", "verify", run_id).returncode == 0
    assert "nothing to clean up" in ctl(state, "gc").stdout


# -- retention: pruning finished runs ------------------------------------------------------------
DAY = 86400.0


@pytest.fixture(scope="module")
def dead_pid():
    """The pid of a process that has exited (an owner that is gone)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def make_entry(state, run_state, *, age, dead_pid=None):
    """A run registered through the registry API, left in ``run_state``, its
    files (and, if finished, its finish time) ``age`` seconds old. Its owner is
    this test process unless ``dead_pid`` is given."""
    spec = SimpleNamespace(run_id=new_run_id(), wall=None, grace=0.2, verify_timeout=0.2, argv=["true"], cwd="/")
    reg = REG.register(spec, mode="fallback", directory=str(state))
    when = time.time() - age
    if dead_pid is not None:
        reg.entry["owner"] = dict(reg.entry["owner"], pid=dead_pid, starttime=None)
    if run_state == "finished":
        reg.event("finished", {"exit_code": 0, "outcome": "exit"})
        reg.save(state="finished", finished_at=when, exit_code=0, outcome="exit", verified=True)
    else:
        reg.save(state=run_state)
    reg.close()
    for suffix in (".json", ".log"):
        os.utime(state / (spec.run_id + suffix), (when, when))
    return spec.run_id


def files_of(state, run_id) -> set[str]:
    return {p.suffix for p in state.glob(run_id + ".*")}


def test_gc_removes_old_finished_runs_with_their_logs_keeps_recent_ones(state, dead_pid):
    old = [make_entry(state, "finished", age=3 * DAY, dead_pid=dead_pid) for _ in range(2)]
    recent = make_entry(state, "finished", age=3600, dead_pid=dead_pid)
    # Recorded an hour ago, its file's mtime three days old: the later of the two counts.
    skewed = make_entry(state, "finished", age=3600, dead_pid=dead_pid)
    os.utime(state / f"{skewed}.json", (time.time() - 3 * DAY,) * 2)
    r = ctl(state, "gc", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert sorted(row["run_id"] for row in report["pruned"]) == sorted(old)
    assert report["keep_finished"] == DAY
    assert files_of(state, skewed) == {".json", ".log"}
    for run_id in old:
        assert files_of(state, run_id) == set(), run_id  # entry and event log
        assert ctl(state, "status", run_id).returncode == 12
        assert ctl(state, "audit", "verify", run_id).returncode == 12
    assert files_of(state, recent) == {".json", ".log"}
    assert ctl(state, "audit", "verify", recent).returncode == 0
    # A shorter retention reaches the recent one too.
    r = ctl(state, "gc", "--keep-finished", "30m")
    assert r.returncode == 0 and f"{recent}: finished 1h00m ago" in r.stdout and "removed" in r.stdout, r.stdout
    assert files_of(state, recent) == set()


def test_gc_removes_a_background_runs_output_log_and_report_with_it(state, tmp_path):
    """A background run's output log (and a --yield run's report its front never read)
    go with its entry and event log: nothing of a pruned run is left in the state directory."""
    gate = tmp_path / "go"  # it lasts until told: a run that ended before it was ready would give no id
    script = f"echo hello; while [ ! -e {gate} ]; do sleep 0.05; done"
    argv = [*CORRAL, *FB, "--background", "--", "sh", "-c", script]
    r = subprocess.run(argv, env=env_for(state), capture_output=True)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.decode().strip()
    gate.touch()
    assert ctl(state, "wait", run_id).returncode == 0
    assert "hello" in ctl(state, "logs", run_id).stdout
    (state / f"{run_id}.report").write_text("corral: the run's own lines\n")
    assert files_of(state, run_id) == {".json", ".log", ".out", ".report"}
    r = ctl(state, "gc", "--keep-finished", "0s")
    assert r.returncode == 0 and f"{run_id}: finished" in r.stdout, r.stdout + r.stderr
    assert files_of(state, run_id) == set()


def test_gc_never_removes_active_or_expired_runs_or_live_owners(state, dead_pid):
    active = make_entry(state, "active", age=3 * DAY)  # its owner (this process) runs
    owned = make_entry(state, "finished", age=3 * DAY)  # finished, but its owner still runs
    expired = make_entry(state, "expired", age=3 * DAY, dead_pid=dead_pid)
    r = ctl(state, "gc", "--keep-finished", "0s", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["pruned"] == []
    for run_id in (active, owned, expired):
        assert files_of(state, run_id) == {".json", ".log"}, run_id
    # gc reclaimed the expired run (its owner is gone): finished now, so kept.
    entry = REG.read_entry(str(state), expired)
    assert entry["state"] == "finished" and entry["outcome"] == "reclaimed"
    # The registry function itself, with no retention at all, removes only the
    # finished run whose owner is gone; active and expired runs stay, whoever owned them.
    expired2 = make_entry(state, "expired", age=3 * DAY, dead_pid=dead_pid)
    active2 = make_entry(state, "active", age=3 * DAY, dead_pid=dead_pid)
    assert [row["run_id"] for row in REG.prune_finished(str(state), 0.0)] == [expired]
    for run_id in (active, owned, expired2, active2):
        assert files_of(state, run_id) == {".json", ".log"}, run_id


def test_gc_dry_run_removes_nothing(state, dead_pid):
    old = make_entry(state, "finished", age=3 * DAY, dead_pid=dead_pid)
    before = sorted(p.name for p in state.iterdir())
    r = ctl(state, "gc", "--dry-run")
    assert r.returncode == 0 and f"{old}: finished 72h00m ago" in r.stdout and "would remove" in r.stdout, r.stdout
    assert sorted(p.name for p in state.iterdir()) == before
    assert ctl(state, "audit", "verify", old).returncode == 0


@pytest.mark.parametrize("value", ["3x", "-1h", "", "24"])
def test_gc_bad_keep_finished_is_125(state, value):
    r = ctl(state, "gc", "--keep-finished", value)
    assert r.returncode == 125 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("corralctl: ")


def test_registration_prunes_a_few_stale_runs_at_most_once_per_interval(state, dead_pid):
    stale = {make_entry(state, "finished", age=3 * DAY, dead_pid=dead_pid) for _ in range(REG.PRUNE_BATCH + 3)}
    recent = make_entry(state, "finished", age=3600, dead_pid=dead_pid)
    stamp = state / REG.PRUNE_STAMP
    assert stamp.exists() and stamp.stat().st_mode & 0o777 == 0o600  # made by the first registration
    left = lambda: {run_id for run_id in stale if files_of(state, run_id)}  # noqa: E731
    assert left() == stale  # the stamp is fresh: those registrations did not look

    def corral_run():
        proc = subprocess.run([*CORRAL, *FB, "--", "true"], env=env_for(state), capture_output=True, timeout=30)
        assert proc.returncode == 0, proc.stderr

    os.utime(stamp, (0, 0))  # an hour and more ago
    corral_run()
    assert len(stale - left()) == REG.PRUNE_BATCH  # a bounded batch...
    assert not {".json", ".log"} & set().union(*(files_of(state, i) for i in stale - left()))
    corral_run()
    assert len(stale - left()) == REG.PRUNE_BATCH  # ... not looked for again at the next registration...
    due = stamp.stat().st_mtime + REG.PRUNE_INTERVAL - time.time()
    assert 0 < due <= REG.PRUNE_AGAIN  # ... but PRUNE_AGAIN later
    os.utime(stamp, (0, 0))  # that time has passed
    corral_run()
    assert left() == set()  # the rest
    assert files_of(state, recent) == {".json", ".log"}
    again = make_entry(state, "finished", age=3 * DAY, dead_pid=dead_pid)
    corral_run()
    assert files_of(state, again) == {".json", ".log"}  # the stamp is fresh again: no scan


def test_a_prune_stops_at_its_time_and_looks_again_soon(state, dead_pid, monkeypatch):
    """Registration's look is bounded in time too (PRUNE_BUDGET: reading and removing
    day-old entries, which may be cold on a slow disk): one whose time is up removes
    nothing more and dates the next look PRUNE_AGAIN from now."""
    from corral_systemd.state.registry import retention

    stale = {make_entry(state, "finished", age=3 * DAY, dead_pid=dead_pid) for _ in range(2)}
    stamp = state / REG.PRUNE_STAMP
    os.utime(stamp, (0, 0))
    monkeypatch.setattr(retention, "PRUNE_BUDGET", 0.0)
    now = time.time()
    assert REG.maybe_prune(str(state), now=now) == 0
    assert all(files_of(state, run_id) == {".json", ".log"} for run_id in stale)
    assert stamp.stat().st_mtime == pytest.approx(now - REG.PRUNE_INTERVAL + REG.PRUNE_AGAIN, abs=1.0)
    monkeypatch.setattr(retention, "PRUNE_BUDGET", 10.0)
    os.utime(stamp, (0, 0))
    assert REG.maybe_prune(str(state), now=now) == 2
    assert stamp.stat().st_mtime == pytest.approx(now, abs=1.0)  # nothing left: the next look in an hour


# -- environment ----------------------------------------------------------------------------
def test_env_clear_keep_path_only(state, tmp_path):
    rec = tmp_path / "r.json"
    env = env_for(state, SOME_TOKEN=SECRET)
    proc = subprocess.run(
        [*CORRAL, *FB, "--json", str(rec), "--env-clear", "--env-keep", "PATH", "--", "env"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    # and the fallback run's mark, corral's proof of membership once it is gone (registry.MARK_ENV),
    # and the run's id, by which a corral inside knows it is nested (common/nesting.py)
    names = sorted(line.split("=", 1)[0] for line in proc.stdout.splitlines())
    assert names == ["CORRAL_RUN_ID", "CORRAL_RUN_MARK", "PATH"]
    record = json.loads(rec.read_text())
    assert record["environment"]["kept"] == ["PATH"] and "SOME_TOKEN" in record["environment"]["dropped"]
    [run_id] = run_ids(state)
    assert json.loads((state / f"{run_id}.json").read_text())["environment"]["kept"] == ["PATH"]
    assert SECRET not in rec.read_text() + "".join(p.read_text() for p in state.iterdir() if p.is_file())


def test_env_drop_globs(state):
    env = env_for(state, AWS_SECRET_ACCESS_KEY="x", AWS_REGION="y", KEEPME="z")
    proc = subprocess.run(
        [*CORRAL, *FB, "--env-drop", "AWS_*", "--", "env"], env=env, capture_output=True, text=True, timeout=30
    )
    names = {line.split("=", 1)[0] for line in proc.stdout.splitlines()}
    assert "KEEPME" in names and not {"AWS_SECRET_ACCESS_KEY", "AWS_REGION"} & names
    bad = subprocess.run(
        [*CORRAL, *FB, "--env-keep", "PATH", "--", "true"], env=env, capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 125


# -- credentials ------------------------------------------------------------------------------
CRED_PROBE = 'cmp -s "$CREDENTIALS_DIRECTORY/api" "$1" && echo match; echo "$CREDENTIALS_DIRECTORY" > "$2"; {}'
#: The same check with shell builtins only: the command is one process, so
#: processes_seen counts the run's processes exactly (no cmp to catch or miss).
CRED_PROBE_ONE_PROCESS = (
    'IFS= read -r got < "$CREDENTIALS_DIRECTORY/api"; IFS= read -r want < "$1"; '
    '[ "$got" = "$want" ] && echo match; echo "$CREDENTIALS_DIRECTORY" > "$2"; {}'
)


def _secret_file(tmp_path):
    src = tmp_path / "api.token"
    src.write_text(SECRET)
    src.chmod(0o600)
    return src


def _assert_secret_nowhere(state, *texts):
    for path in state.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
    for text in texts:
        assert SECRET not in text


def test_credential_fallback_readable_then_gone(state, tmp_path):
    src, where, rec = _secret_file(tmp_path), tmp_path / "where", tmp_path / "r.json"
    # the command gets the secret as an argument here only to compare; the argv is redacted below
    proc = subprocess.run(
        [
            *CORRAL,
            *FB,
            "--json",
            str(rec),
            "--credential",
            f"api={src}",
            "--",
            "sh",
            "-c",
            CRED_PROBE.format("exit 0"),
            "probe",
            str(src),
            str(where),
        ],
        env=env_for(state),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "match", proc.stderr
    cred_dir = Path(where.read_text().strip())
    assert cred_dir.is_relative_to(state) and not cred_dir.exists()
    record = json.loads(rec.read_text())
    assert record["credentials"] == ["api"] and record["credentials_delivery"] == "corral"
    [run_id] = run_ids(state)
    entry = json.loads((state / f"{run_id}.json").read_text())
    assert entry["credentials_delivery"] == "corral" and entry["credentials_directory"] == str(cred_dir)
    _assert_secret_nowhere(state, rec.read_text(), proc.stdout, proc.stderr)


def test_credential_service_without_systemd_falls_back_to_corrals_directory(state, tmp_path):
    """auto mode, --unit-type service, no manager: the fallback run gets corral's private
    directory, made after the engine opened; its watcher is not taken for a run process."""
    src, where, rec = _secret_file(tmp_path), tmp_path / "where", tmp_path / "r.json"
    env = {k: v for k, v in env_for(state).items() if k not in ("DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR")}
    proc = subprocess.run(
        [
            *CORRAL,
            "--manager",
            "user",
            "--unit-type",
            "service",
            "--json",
            str(rec),
            "--credential",
            f"api={src}",
            "--",
            "sh",
            "-c",
            CRED_PROBE_ONE_PROCESS.format("exit 0"),
            "probe",
            str(src),
            str(where),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "match", proc.stderr
    record = json.loads(rec.read_text())
    assert record["mode"] in ("fallback", "pidns") and record["credentials_delivery"] == "corral"
    assert record["processes_stopped"] == 0 and record["processes_seen"] == 1, record
    cred_dir = Path(where.read_text().strip())
    assert cred_dir.is_relative_to(state) and not cred_dir.exists()
    bad = subprocess.run(
        [
            *CORRAL,
            "--manager",
            "user",
            "--unit-type",
            "service",
            "--credential",
            f"api={tmp_path}/missing",
            "--",
            "true",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 125 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_credential_contents_in_no_record_or_log(state, tmp_path):
    src, where, rec = _secret_file(tmp_path), tmp_path / "where", tmp_path / "r.json"
    proc = subprocess.run(
        [
            *CORRAL,
            *FB,
            "--wall",
            "300ms",
            "--json",
            str(rec),
            "--credential",
            f"api={src}",
            "--",
            "sh",
            "-c",
            'echo "$CREDENTIALS_DIRECTORY" > "$0"; setsid sleep 30 & sleep 30',
            str(where),
        ],
        env=env_for(state),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 124
    assert not Path(where.read_text().strip()).exists()
    _assert_secret_nowhere(state, rec.read_text(), proc.stdout, proc.stderr)


def test_credential_removed_when_corral_is_sigkilled(state, tmp_path, markers):
    src, where = _secret_file(tmp_path), tmp_path / "where"
    proc = subprocess.Popen(
        [
            *CORRAL,
            *FB,
            "--credential",
            f"api={src}",
            "--",
            "sh",
            "-c",
            'echo "$CREDENTIALS_DIRECTORY" > "$0"; sleep 30',
            str(where),
        ],
        env=env_for(state, markers()),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: where.exists() and where.read_text().strip())
    cred_dir = Path(where.read_text().strip())
    assert (cred_dir / "api").read_text() == SECRET and cred_dir.stat().st_mode & 0o777 == 0o700
    proc.kill()
    proc.wait()
    wait_for(lambda: not cred_dir.exists(), timeout=2)  # the watcher saw corral die
    _assert_secret_nowhere(state)


def test_service_credential_check_script(tmp_path):
    """The ExecStartPre= check a systemd service runs before its command (see credentials.py)."""
    from corral_systemd.state.credentials import CHECK_FAILED, CHECK_SCRIPT

    assert "${" not in CHECK_SCRIPT and "$$" not in CHECK_SCRIPT  # systemd would expand those
    (tmp_path / "api").write_text("x")
    (tmp_path / "adir").mkdir()

    def check(*names, env=None):
        return subprocess.run(
            ["/bin/sh", "-c", CHECK_SCRIPT, "check", *names],
            timeout=10,
            env={"CREDENTIALS_DIRECTORY": str(tmp_path)} if env is None else env,
        ).returncode

    assert check("api") == 0
    assert check("api", "missing") == check("adir") == check("api", env={}) == CHECK_FAILED


def test_credential_bad_input_is_125(state, tmp_path):
    for arg in ("api", "=x", "a/b=/etc/hostname", f"api={tmp_path}/missing", f"api={tmp_path}"):
        proc = subprocess.run(
            [*CORRAL, *FB, "--credential", arg, "--", "true"],
            env=env_for(state),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 125 and len(proc.stderr.strip().splitlines()) == 1, (arg, proc.stderr)


# -- corralctl's presentation (issue 13, item 7) ---------------------------------------------
def test_ps_table_escapes_control_characters(state, markers):
    marker = markers()
    proc = subprocess.Popen(
        [*CORRAL, *FB, "--wall", "60s", "--", "sh", "-c", "sleep 60", "line1\nline2\tx\x1b[2J"],
        env=env_for(state, marker),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: run_ids(state))
        table = ctl(state, "ps").stdout.splitlines()
        assert len(table) == 2, table  # header + one row: the newline did not make a row
        assert table[1].endswith("sh -c 'sleep 60' 'line1\\nline2\\tx\\x1b[2J'"), table[1]
        rows = json.loads(ctl(state, "ps", "--json").stdout)
        assert rows[0]["command"][-1] == "line1\nline2\tx\x1b[2J"  # exact in JSON
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def _finished_entry(state, **fields) -> str:
    run_id = new_run_id()
    entry = {
        "version": 1,
        "run_id": run_id,
        "state": "finished",
        "owner": {"pid": 0},
        "mode": "fallback",
        "registered_at": time.time(),
        **fields,
    }
    (state / f"{run_id}.json").write_text(json.dumps(entry))
    return run_id


def test_status_of_a_reclaimed_run_says_so(state):
    run_id = _finished_entry(state, outcome="reclaimed", exit_code=None, verified=True, remaining_pids=[])
    r = ctl(state, "status", run_id)
    assert r.returncode == 11
    assert "None" not in r.stdout and "reclaimed" in r.stdout and "verified" in r.stdout, r.stdout
    run_id = _finished_entry(state, outcome="reclaimed", exit_code=None, verified=False, remaining_pids=[41, 42])
    r = ctl(state, "status", run_id)
    assert "NOT verified" in r.stdout and "41 42" in r.stdout and "None" not in r.stdout, r.stdout
    run_id = _finished_entry(state, outcome="exited", exit_code=3, verified=True)
    assert ctl(state, "status", run_id).stdout.strip() == "finished (exit 3, exited)"


@pytest.mark.parametrize("args", [[], ["audit"]])
def test_corralctl_alone_prints_help(state, args):
    r = ctl(state, *args)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.startswith(f"Usage: corralctl{' audit' if args else ''} [OPTIONS] COMMAND")
    assert "Commands:" in r.stdout


def test_corralctl_usage_error_is_one_line_125(state):
    r = ctl(state, "status")
    assert r.returncode == 125
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert "Missing argument" in r.stderr and "Usage: corralctl status" in r.stderr


# -- issue 15, "Test strength": each goes red against a mutant the suite let pass ----------------
def test_a_prune_stamp_from_the_future_does_not_stop_pruning(state, dead_pid):
    """A ``.pruned`` dated ahead (the clock was set back) counts as stale: pruning goes on, the stamp is renewed."""
    stale = make_entry(state, "finished", age=3 * DAY, dead_pid=dead_pid)
    stamp = state / REG.PRUNE_STAMP
    now = time.time()
    os.utime(stamp, (now, now))
    assert REG.maybe_prune(str(state), now=now) == 0  # a fresh stamp: no scan
    assert files_of(state, stale) == {".json", ".log"}
    future = now + 30 * DAY
    os.utime(stamp, (future, future))
    assert REG.maybe_prune(str(state), now=now) == 1
    assert files_of(state, stale) == set()
    assert stamp.stat().st_mtime == pytest.approx(now, abs=1.0)  # renewed to now, no longer in the future


def _append_chained_line(log: Path, run_id: str) -> int:
    """Append a line that extends the hash chain correctly (as the run's uid could); return its line number."""
    import hashlib

    lines = log.read_text().splitlines()
    last = json.loads(lines[-1])
    line = {
        "seq": last["seq"] + 1,
        "event": "detached",
        "time": last["time"] + 1,
        "monotonic": last["monotonic"] + 1,
        "run_id": run_id,
        "data": {"pid": 1},
        "prev": last["hash"],
    }
    line["hash"] = hashlib.sha256(json.dumps(line, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    with log.open("a") as f:
        f.write(json.dumps(line, sort_keys=True, separators=(",", ":")) + "\n")
    return len(lines) + 1


def test_audit_verify_catches_lines_appended_after_the_run_finished(state, dead_pid):
    """The chain itself is intact, but the finished entry anchors fewer lines:
    BAD, at the first one it does not anchor."""
    run_id = make_entry(state, "finished", age=60, dead_pid=dead_pid)
    assert ctl(state, "audit", "verify", run_id).returncode == 0
    number = _append_chained_line(state / f"{run_id}.log", run_id)
    ok, message, bad = verify_log(str(state), run_id)
    assert (ok, bad) == (False, number), message
    assert "does not anchor" in message
    r = ctl(state, "audit", "verify", run_id)
    assert r.returncode == 1 and "BAD" in r.stdout and f"{run_id}.log:{number}:" in r.stdout, r.stdout


def test_audit_verify_accepts_lines_appended_while_the_run_is_active(state):
    """An active run's log runs ahead of its entry (events between state changes): not tampering."""
    run_id = make_entry(state, "active", age=0)
    _append_chained_line(state / f"{run_id}.log", run_id)
    ok, message, _ = verify_log(str(state), run_id)
    assert ok, message


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o705])
def test_a_state_directory_of_ours_readable_by_others_is_made_private(tmp_path, mode):
    """Readable (not writable) by others: not refused, but made 0700 before anything is written in it."""
    path = tmp_path / "state"
    path.mkdir()
    path.chmod(mode)
    assert REG.ensure_private_dir(str(path)) == str(path)
    assert path.stat().st_mode & 0o777 == 0o700
    # The CLI too: the run goes ahead and leaves the directory private.
    path.chmod(mode)
    r = subprocess.run(
        [*CORRAL, *FB, "--quiet", "--", "true"],
        env=env_for(path),
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    assert path.stat().st_mode & 0o777 == 0o700
    assert [p.stat().st_mode & 0o777 for p in path.glob("*.json")] == [0o600]


_TOKEN_FORK_PROBE = """
import gc, os, sys
sys.path.insert(0, os.environ["CORRAL_SOURCE"])
from corral_systemd.state.registry.identity import SealedToken, token_address
import _socket
token = SealedToken(sys.argv[1])
token.write({"run_id": "x"})
fd = token.fd
pid = os.fork()
if pid == 0:
    gc.collect()
    try:
        os.fstat(fd)
        open_in_child = True
    except OSError:
        open_in_child = False
    print(token.fd, open_in_child, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
probe.connect(token_address(sys.argv[1]))  # still the parent's, which answers
token.serve()
print(len(probe.recv(4096)) > 0)
probe.close()
token.close()
"""


def test_a_forked_child_closes_its_parents_tokens_without_a_warning():
    """A child forked by a token's owner closes its copy of the listening
    socket (it never answers for the owner; the name stays the owner's), once
    and through its object: dropped, its finalizer closed it with a
    ResourceWarning, and the handler closed the freed number again."""
    from tethers import ROOT

    run = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-W",
            "always::ResourceWarning",
            "-c",
            _TOKEN_FORK_PROBE,
            f"test-fork-{os.getpid()}",
        ],
        env={**os.environ, "CORRAL_SOURCE": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.stderr == ""
    assert run.stdout.split() == ["-1", "False", "True"]
