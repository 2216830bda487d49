"""Issue 27 (part): sessions: ``corralctl session start/ls/end``, ``--session``/``CORRAL_SESSION``,
ended by ``session end``, by its owner's exit and by its idle timeout; the cap; forged entries.

Each ending is proven from /proc: no process carrying any of the session's
runs' markers is left, and a server's port is free again.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from test_background import READY_TIMEOUT, SERVER, free_port, port_accepts

from conftest import CORRAL, TIME_SCALE
from modes import all_modes, manager_reachable, mode_flags
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

CTL = [sys.executable, "-m", "corral_systemd.ctl"]


@pytest.fixture
def agent(tmp_path):
    """A stand-in agent: a private state directory, corral and corralctl calls, cleanup of what it started."""
    markers: list[str] = []
    procs: list[subprocess.Popen] = []

    class Agent:
        directory = tmp_path / "state"
        env = dict(os.environ, CORRAL_STATE_DIR=str(tmp_path / "state"))

        def ctl(self, *args, env=None, timeout=120 * TIME_SCALE):
            return subprocess.run(
                [*CTL, *args], env=dict(self.env, **(env or {})), capture_output=True, text=True, timeout=timeout
            )

        def corral(self, args, *, env=None, timeout=60 * TIME_SCALE):
            marker = new_marker()
            markers.append(marker)
            if "--background" in args and "--ready-timeout" not in args:  # its 30 s, scaled for emulation
                args = [*READY_TIMEOUT, *args]
            proc = subprocess.run(
                [*CORRAL, *args],
                env=dict(self.env, **(env or {}), **{MARKER_ENV: marker}),
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
            proc.marker = marker
            return proc

        def owner(self):
            p = subprocess.Popen(["sleep", "1000"])
            procs.append(p)
            return p

        def alive(self) -> list[int]:
            return [pid for m in markers for pid in marked_pids(m)]

        def session_entry(self, sid: str) -> dict:
            return json.loads((self.directory / "sessions" / f"{sid}.json").read_text())

        def wait_ended(self, sid: str, within: float = 30) -> dict:
            end = time.monotonic() + within
            while time.monotonic() < end:
                entry = self.session_entry(sid)
                if entry.get("state") == "ended":
                    return entry
                time.sleep(0.05)
            raise AssertionError(f"session {sid} did not end within {within}s")

    agent = Agent()
    yield agent
    for p in procs:
        p.kill()
        p.wait()
    for entry in agent.directory.glob("sessions/*.json"):  # a session a test left open (its units, its holder)
        if json.loads(entry.read_text()).get("state") != "ended":
            agent.ctl("session", "end", entry.stem)
    for m in markers:
        kill_marked(m)


def gone_within(agent, seconds: float = 5) -> list[int]:
    end = time.monotonic() + seconds
    while (left := agent.alive()) and time.monotonic() < end:
        time.sleep(0.05)
    return left


#: Where a session of each run mode's tests lives: a fallback run's in a holder
#: process, a unit's in a slice with a holder unit (so the mode tests each world);
#: a --cgroup-parent run joins whichever the machine gives.
SESSION_MODE = {
    "fallback": "fallback",
    "pidns": "fallback",
    "scope": "enforced",
    "service": "enforced",
    "cgroup-parent": "auto",
}


def start_session(agent, *args, mode: str | None = None) -> str:
    flags = ["--cgroup-mode", SESSION_MODE[mode]] if mode is not None else []
    r = agent.ctl("session", "start", *flags, *args)
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()
    # A unit session's id is random (12 digits); a fallback session's, its holder's commitment (24).
    assert len(sid) == (24 if "fallback" in flags or not os.environ.get("CORRAL_REQUIRE_SYSTEMD") else 12), sid
    return sid


def in_slice(mode: str) -> bool:
    """Are a run of ``mode``'s processes in its session's slice (systemd mode)?"""
    return SESSION_MODE[mode] == "enforced"


def the_agents_day(agent, mode, sid: str) -> int:
    """A server, a page fetched from it, its log, a leaked TERM-ignoring daemon, a run waited for."""
    flags = mode_flags(mode)
    port = free_port()
    env = {"CORRAL_SESSION": sid}
    server = agent.corral(
        [*flags, "--background", "--name", "web", "--ready-port", str(port), "--", *SERVER, str(port)], env=env
    )
    assert server.returncode == 0, server.stderr
    fetch = agent.corral(
        [
            *flags,
            "--",
            sys.executable,
            "-c",
            f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/').status)",
        ],
        env=env,
    )
    assert fetch.stdout.strip() == "200", fetch.stderr
    deadline = time.monotonic() + 10
    while '"GET / HTTP' not in agent.ctl("logs", "web").stdout and time.monotonic() < deadline:
        time.sleep(0.05)
    assert '"GET / HTTP/1.1" 200' in agent.ctl("logs", "web").stdout
    leak = agent.corral(
        [
            *flags,
            "--session",
            sid,
            "--background",
            "--",
            "sh",
            "-c",
            "setsid sh -c 'trap \"\" TERM; while :; do sleep 1; done' & trap '' TERM; sleep 1000",
        ]
    )
    assert leak.returncode == 0, leak.stderr
    third = agent.corral([*flags, "--background", "--", "sh", "-c", "sleep 0.3; exit 4"], env=env)
    assert agent.ctl("wait", third.stdout.strip()).returncode == 4
    assert agent.alive(), "the session's background runs are gone before it ended"
    return port


@pytest.mark.parametrize("mode", all_modes())
def test_session_end_leaves_nothing(agent, mode):
    owner = agent.owner()
    sid = start_session(agent, "--owner", str(owner.pid), "--name", "agent-1", mode=mode)
    port = the_agents_day(agent, mode, sid)
    ls = json.loads(agent.ctl("session", "ls", "--json").stdout)
    assert [s["session"] for s in ls] == [sid] and ls[0]["runs"] == 2 and ls[0]["owner"] == owner.pid
    end = agent.ctl("session", "end", "agent-1")
    assert end.returncode == 0, end.stdout + end.stderr
    assert "every process proven gone" in end.stdout
    assert agent.alive() == []
    assert not port_accepts(port)
    assert agent.session_entry(sid)["state"] == "ended"
    joined_late = agent.corral(["--session", sid, "--", "true"])
    assert joined_late.returncode == 125 and f"session {sid} has ended" in joined_late.stderr


@pytest.mark.parametrize("mode", all_modes())
def test_the_agent_killed_ends_its_session(agent, mode):
    owner = agent.owner()
    sid = start_session(agent, "--owner", str(owner.pid), mode=mode)
    port = the_agents_day(agent, mode, sid)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    entry = agent.wait_ended(sid)
    assert entry["why"] == f"its owner (pid {owner.pid}) exited" and entry["not_proven"] == []
    assert gone_within(agent) == []
    assert not port_accepts(port)


@pytest.mark.parametrize("mode", all_modes())
def test_an_idle_session_ends(agent, mode):
    idle = f"{4 * TIME_SCALE:g}s"  # more than a corral's start-up under load: the runs join in time
    sid = start_session(agent, "--idle-timeout", idle, mode=mode)
    port = the_agents_day(agent, mode, sid)
    entry = agent.wait_ended(sid, within=30 * TIME_SCALE)
    assert entry["why"] == f"idle for {idle}"
    assert gone_within(agent) == []
    assert not port_accepts(port)


def test_a_foreground_run_keeps_a_session_busy(agent):
    idle = 3 * TIME_SCALE  # more than a corral's start-up under load: the run joins in time
    sid = start_session(agent, "--idle-timeout", f"{idle:g}s")
    r = agent.corral(["--session", sid, "--", "sh", "-c", f"sleep {2 * idle:g}; echo $CORRAL_SESSION"])
    assert r.returncode == 0 and r.stdout.strip() == sid, r.stderr
    assert agent.session_entry(sid)["state"] == "open"  # idle for its timeout, but the run went on for twice that
    assert agent.wait_ended(sid)["why"] == f"idle for {idle:g}s"


def test_a_nested_corral_joins_the_session(agent):
    """CORRAL_SESSION is in every command's environment: a corral inside a run joins too."""
    sid = start_session(agent)
    outer = agent.corral(["--background", "--session", sid, "--", *CORRAL, "--", "sleep", "1000"])
    assert outer.returncode == 0, outer.stderr
    deadline = time.monotonic() + 20
    while len(entries := [json.loads(p.read_text()) for p in agent.directory.glob("*.json")]) < 2:
        assert time.monotonic() < deadline, "the nested corral never registered"
        time.sleep(0.05)
    assert {e["session"] for e in entries} == {sid}
    assert agent.ctl("session", "end", sid).returncode == 0
    assert agent.alive() == []


@pytest.mark.pidns
def test_a_corral_in_a_pid_namespace_joins_only_a_session_it_runs_in(agent):
    """A corral nested in a pidns run does not see any holder: the holder admits it
    only if it descends from one of the session's own runs (whose stop ends it)."""
    mode_flags("pidns")
    if manager_reachable():
        pytest.skip("a manager answers: auto takes a unit here")
    sid = start_session(agent)
    r = agent.corral(["--", *CORRAL, "--session", sid, "--", "true"])
    assert r.returncode == 125, r.stderr
    assert "only a corral inside one of the session's runs may join" in r.stderr, r.stderr
    inside = agent.corral(["--session", sid, "--", *CORRAL, "--json", "-", "--", "true"])
    assert inside.returncode == 0, inside.stderr
    nested = [json.loads(p.read_text()) for p in agent.directory.glob("*.json")]
    assert [e.get("session_within") for e in nested if e.get("session_within")], nested
    assert agent.ctl("session", "end", sid).returncode == 0


def test_the_sessions_cap(agent):
    env = {"CORRAL_MAX_SESSIONS": "2"}
    first, second = (start_session(agent) for _ in range(2))
    r = agent.ctl("session", "start", env=env)
    assert r.returncode == 125 and r.stderr.count("\n") == 1 and "CORRAL_MAX_SESSIONS=2" in r.stderr
    assert agent.ctl("session", "end", first).returncode == 0
    assert agent.ctl("session", "start", env=env).returncode == 0
    assert agent.ctl("session", "end", second).returncode == 0


def test_max_runs(agent):
    sid = start_session(agent, "--max-runs", "1")
    one = agent.corral(["--session", sid, "--background", "--", "sleep", "1000"])
    assert one.returncode == 0, one.stderr
    time.sleep(0.5)  # the holder has seen it join
    two = agent.corral(["--session", sid, "--", "true"])
    assert two.returncode == 125 and "--max-runs" in two.stderr
    assert agent.ctl("session", "end", sid).returncode == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--session", "nosuch", "--", "true"], "no session 'nosuch'"),
        (["--session", "x", "--no-registry", "--", "true"], "needs the registry"),
    ],
)
def test_bad_session_input(agent, args, says):
    r = agent.corral(args)
    assert r.returncode == 125 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr


@pytest.mark.parametrize(
    "args",
    [["--owner", "0"], ["--owner", str(2**22 + 5)], ["--max-runs", "0"], ["--idle-timeout", "soon"], ["--name", "-x"]],
)
def test_bad_session_start_input(agent, args):
    r = agent.ctl("session", "start", *args)
    assert r.returncode == 125 and r.stderr.count("\n") == 1, r.stderr
    assert agent.ctl("session", "ls", "--json").stdout.strip() in ("[]", "")


def test_a_run_relabelled_into_a_session_is_not_stopped_with_it(agent):
    """A run's entry is its uid's to rewrite: labelling another session's run, or a
    run of no session, as this session's makes session end act on nothing of it."""
    sid = start_session(agent)
    other = start_session(agent)
    bystander = agent.corral(["--session", other, "--background", "--", "sleep", "1000"])
    lone = agent.corral(["--background", "--", "sleep", "1000"])
    for r in (bystander, lone):
        assert r.returncode == 0, r.stderr
        path = agent.directory / f"{r.stdout.strip()}.json"
        entry = json.loads(path.read_text())
        entry["session"] = sid
        path.write_text(json.dumps(entry))
    assert agent.ctl("session", "end", sid).returncode == 0
    assert marked_pids(bystander.marker) and marked_pids(lone.marker)
    assert agent.ctl("session", "end", other).returncode == 0
    assert marked_pids(bystander.marker) == []
    assert agent.ctl("stop", lone.stdout.strip()).returncode == 0


def test_a_forged_session_entry_opens_nothing(agent):
    """A session entry naming a live process that holds no session token: no run joins it,
    and session end signals nothing; it cannot tell that session's end from its holder's
    death (both leave only an entry), so it says what it cannot prove (120)."""
    sid = start_session(agent)
    decoy = agent.owner()
    path = agent.directory / "sessions" / f"{sid}.json"
    forged = json.loads(path.read_text())
    assert agent.ctl("session", "end", sid).returncode == 0
    st = open(f"/proc/{decoy.pid}/stat").read().rsplit(")", 1)[1].split()
    forged.update(state="open", holder={"pid": decoy.pid, "starttime": int(st[19])})
    path.write_text(json.dumps(forged))
    r = agent.corral(["--session", sid, "--", "true"])
    assert r.returncode == 125 and "has ended" in r.stderr
    end = agent.ctl("session", "end", sid)
    assert end.returncode == 120 and "no holder holds the session" in end.stderr, end.stdout + end.stderr
    assert decoy.poll() is None  # not signalled


@pytest.mark.parametrize("mode", all_modes())
def test_a_background_runs_corral_killed_is_still_ended_with_the_session(agent, mode):
    """SIGKILL of the corral that supervises a background run: its engine's
    tether or unit stops the run, and the session's end proves it (or reclaims it)."""
    sid = start_session(agent, mode=mode)
    r = agent.corral(
        [
            *mode_flags(mode),
            "--session",
            sid,
            "--background",
            "--json",
            "-",
            "--",
            "sh",
            "-c",
            "setsid sh -c 'trap \"\" TERM; while :; do sleep 1; done' & sleep 1000",
        ]
    )
    assert r.returncode == 0, r.stderr
    started = json.loads(r.stdout)
    time.sleep(0.5)  # the holder has seen it join
    os.kill(started["corral_pid"], signal.SIGKILL)
    end = agent.ctl("session", "end", sid)
    assert end.returncode == 0, end.stdout + end.stderr
    assert gone_within(agent) == []


def test_a_removed_session_entry_is_written_again_by_its_holder(agent):
    sid = start_session(agent)
    r = agent.corral(["--session", sid, "--background", "--", "sleep", "1000"])
    assert r.returncode == 0, r.stderr
    (agent.directory / "sessions" / f"{sid}.json").unlink()
    deadline = time.monotonic() + 10
    while not (agent.directory / "sessions" / f"{sid}.json").exists():
        assert time.monotonic() < deadline, "the holder did not write its entry again"
        time.sleep(0.05)
    assert agent.ctl("session", "end", sid).returncode == 0
    assert agent.alive() == []


def test_ps_of_a_session(agent):
    sid = start_session(agent)
    mine = agent.corral(["--session", sid, "--background", "--name", "w", "--", "sleep", "1000"])
    other = agent.corral(["--background", "--", "sleep", "1000"])
    rows = json.loads(agent.ctl("ps", "--session", sid, "--json").stdout)
    assert [(r["run_id"], r["name"], r["session"]) for r in rows] == [(mine.stdout.strip(), "w", sid)]
    # inside the session, a name means that session's run
    assert agent.ctl("logs", "w", env={"CORRAL_SESSION": "0" * 12}).returncode == 125
    assert agent.ctl("session", "end", sid).returncode == 0
    assert agent.ctl("stop", other.stdout.strip()).returncode == 0
    assert agent.alive() == []


def test_the_library_session(agent, monkeypatch):
    """corral_systemd.Session: a server started in the background, a foreground run
    fetching from it, its logs, a run waited for; leaving the block ends it all."""
    import asyncio

    import corral_systemd as corral

    monkeypatch.setenv("CORRAL_STATE_DIR", str(agent.directory))
    marker = new_marker()
    env = dict(os.environ, **{MARKER_ENV: marker})
    port = free_port()
    with corral.Session(idle_timeout="5m") as session:
        web = session.start([*SERVER, str(port)], ready={"port": port}, env=env, name="web")
        fetch = [
            sys.executable,
            "-c",
            f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/').status)",
        ]
        assert session.run(fetch, env=env).stdout == b"200\n"
        assert '"GET / HTTP/1.1" 200' in web.logs()
        quick = session.start(["sh", "-c", "sleep 0.3; exit 5"], env=env)
        assert quick.wait() == 5
        with pytest.raises(TimeoutError):
            session.start(["sleep", "100"], env=env).wait(timeout=0.1)
        assert marked_pids(marker)
    assert marked_pids(marker) == []
    assert not port_accepts(port)

    async def agent_day():
        async with corral.Session() as s:
            await s.astart(["sleep", "100"], env=env)
            assert (await s.arun(["sh", "-c", "echo $CORRAL_SESSION"], env=env)).stdout.decode().strip() == s.id
            assert marked_pids(marker)
            # The run's own async faces leave the event loop free: a ticker goes on through each.
            ticks = 0

            async def tick():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            ticker = asyncio.create_task(tick())
            stubborn = await s.astart(["sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.1; done"], env=env)
            before = ticks
            await stubborn.astop()  # its grace period (SIGTERM ignored), waited out in a thread
            assert ticks > before
            assert "up" in await stubborn.alogs()
            assert await (await s.astart(["sh", "-c", "exit 7"], env=env)).await_exit() == 7
            ticker.cancel()

    asyncio.run(agent_day())
    assert marked_pids(marker) == []
    with pytest.raises(corral.UsageError):
        corral.Session().start(["true"])  # not started


@pytest.mark.systemd
@pytest.mark.manager_kill  # re-executes the manager: a step of its own
@pytest.mark.parametrize("unit_type", ["scope", "service"])
def test_a_session_across_daemon_reexec(agent, unit_type):
    """daemon-reexec (a systemd upgrade) while a session's background run lives:
    its corral reconnects, and the session's end still proves it gone."""
    from modes import systemctl

    sid = start_session(agent)
    r = agent.corral(
        [*mode_flags(unit_type), "--session", sid, "--background", "--", "sh", "-c", "trap '' TERM; sleep 1000"]
    )
    assert r.returncode == 0, r.stderr
    assert systemctl("daemon-reexec", timeout=120).returncode == 0
    time.sleep(1)
    end = agent.ctl("session", "end", sid)
    assert end.returncode == 0, end.stdout + end.stderr
    assert gone_within(agent) == []


def test_a_background_run_for_an_ended_session_is_one_line_and_125(agent):
    sid = start_session(agent)
    assert agent.ctl("session", "end", sid).returncode == 0
    r = agent.corral(["--session", sid, "--background", "--", "sleep", "100"])
    assert r.returncode == 125 and r.stderr == f"corral: session {sid} has ended\n"
    assert not any(agent.directory.glob("*.out"))


def test_gc_ends_a_session_whose_holder_died(agent):
    """A fallback session whose holder was SIGKILLed: gc ends it (its run stopped and
    proven by its own corral), but says what no one can prove any more: what the holder
    held (a background run's orphans re-parented to it) -- never "every process proven gone"."""
    sid = start_session(agent)
    r = agent.corral(["--session", sid, "--background", "--", "sh", "-c", "trap '' TERM; sleep 1000"])
    assert r.returncode == 0, r.stderr
    time.sleep(0.5)
    holder = agent.session_entry(sid)["holder"]["pid"]
    os.kill(holder, signal.SIGKILL)
    dry = agent.ctl("gc", "--dry-run")
    assert f"session {sid}: its holder is gone: would end it" in dry.stdout
    gc = agent.ctl("gc")
    assert gc.returncode != 0, gc.stdout + gc.stderr
    assert f"session {sid}: its holder is gone: ended:" in gc.stdout and "NOT proven: no holder holds" in gc.stdout
    assert "every process proven gone" not in gc.stdout
    assert gone_within(agent) == []
    assert agent.session_entry(sid)["state"] == "ended"


def modes_outside_slices() -> list:
    return [m for m in all_modes() if not in_slice(m if isinstance(m, str) else m.values[0])]


@pytest.mark.parametrize("mode", modes_outside_slices())
def test_a_session_whose_holder_is_killed_ends_its_runs(agent, mode):
    """Every way the session ends ends its runs: its holder SIGKILLed too (each
    member's corral watches the holder through a pidfd), for runs no slice holds."""
    sid = start_session(agent, mode=mode)
    bg_run = agent.corral(
        [*mode_flags(mode), "--session", sid, "--background", "--", "sh", "-c", "trap '' TERM; sleep 1000"]
    )
    assert bg_run.returncode == 0, bg_run.stderr
    marker = new_marker()
    fg = subprocess.Popen(
        [*CORRAL, *mode_flags(mode), "--session", sid, "--grace", "0.5s", "--", "sleep", "1000"],
        env=dict(agent.env, **{MARKER_ENV: marker}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while len(list(agent.directory.glob("*.json"))) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(agent.session_entry(sid)["holder"]["pid"], signal.SIGKILL)
        _, err = fg.communicate(timeout=60 * TIME_SCALE)
        assert fg.returncode == 143, err
        assert f"its session ended (session {sid}'s holder exited)" in err
        assert agent.ctl("wait", bg_run.stdout.strip()).returncode == 143
        assert gone_within(agent) == [] and marked_pids(marker) == []
    finally:
        fg.kill()
        kill_marked(marker)


@pytest.mark.systemd
@pytest.mark.parametrize("unit_type", ["scope", "service"])
def test_a_killed_holder_unit_comes_back_and_the_session_goes_on(agent, unit_type):
    """systemd mode: the session is its slice and its holder unit, no process of the
    caller's. The holder SIGKILLed is started again by the manager and takes the
    session up: its runs go on in the slice, gc does not end it meanwhile, new runs
    join, and ending it still stops everything."""
    from modes import systemctl

    sid = start_session(agent, "--name", "kept", mode=unit_type)
    flags = mode_flags(unit_type)
    bg_run = agent.corral([*flags, "--session", sid, "--background", "--", "sleep", "1000"])
    assert bg_run.returncode == 0, bg_run.stderr
    first = agent.session_entry(sid)["holder"]["pid"]
    time.sleep(0.5)  # the holder has seen it join
    os.kill(first, signal.SIGKILL)
    assert "holder is gone" not in agent.ctl("gc").stdout  # the manager is bringing it back
    deadline = time.monotonic() + 30 * TIME_SCALE
    while (entry := agent.session_entry(sid))["holder"]["pid"] == first or entry.get("state") != "open":
        assert time.monotonic() < deadline, f"the holder unit did not come back: {entry}"
        time.sleep(0.05)
    assert systemctl("is-active", f"corral-session_{sid}.service").stdout.strip() == "active"
    assert agent.alive(), "the session's run ended with its holder"
    late = agent.corral([*flags, "--session", "kept", "--", "sh", "-c", "cat /proc/self/cgroup"])
    assert late.returncode == 0 and f"/corral-session_{sid}.slice/" in late.stdout, late.stderr
    end = agent.ctl("session", "end", sid)
    assert end.returncode == 0, end.stdout + end.stderr
    assert gone_within(agent) == []
    assert agent.ctl("wait", bg_run.stdout.strip()).returncode == 143


# -- systemd mode: the session's slice and holder unit, its aggregate limits -------------------
@pytest.mark.systemd
@pytest.mark.parametrize("unit_type", ["scope", "service"])
def test_a_sessions_runs_are_in_its_slice_and_both_units_go_with_it(agent, unit_type):
    from modes import systemctl

    sid = start_session(agent, mode=unit_type)
    entry = agent.session_entry(sid)
    units = (f"corral-session_{sid}.slice", f"corral-session_{sid}.service")
    assert (entry["engine"], entry["slice"], entry["holder_unit"]) == ("systemd", *units)
    assert [systemctl("is-active", u).stdout.strip() for u in units] == ["active", "active"]
    flags = mode_flags(unit_type)
    fg = agent.corral([*flags, "--session", sid, "--", "cat", "/proc/self/cgroup"])
    assert fg.returncode == 0 and f"/corral-session_{sid}.slice/corral-" in fg.stdout, fg.stdout + fg.stderr
    bg = agent.corral([*flags, "--session", sid, "--background", "--", "sh", "-c", "trap '' TERM; sleep 1000"])
    assert bg.returncode == 0, bg.stderr
    # The holder runs beside the slice (its own memory and tasks are not the session's).
    holder_cg = open(f"/proc/{entry['holder']['pid']}/cgroup").read()
    assert f"/corral.slice/corral-session_{sid}.service" in holder_cg and f"session_{sid}.slice" not in holder_cg
    end = agent.ctl("session", "end", sid)
    assert end.returncode == 0, end.stdout + end.stderr
    assert gone_within(agent) == []
    deadline = time.monotonic() + 10 * TIME_SCALE
    while any(systemctl("is-active", u).stdout.strip() in ("active", "activating", "deactivating") for u in units):
        assert time.monotonic() < deadline, "the session's units are still there after its end"
        time.sleep(0.05)


@pytest.mark.systemd
@pytest.mark.parametrize("ended_by", ["its owner", "session end, its holder gone"])
def test_whatever_is_in_a_sessions_slice_ends_with_it(agent, ended_by):
    """Ending a session stops its slice, so a unit put there by other means than a
    corral run of it (here systemd-run) is stopped with it and proven gone too:
    by the holder (its owner exits), or by ``session end`` when the holder unit
    is gone for good (SIGKILLed, then stopped before the manager restarted it)."""
    from modes import scope_flag, systemctl

    owner = agent.owner()
    sid = start_session(agent, "--owner", str(owner.pid), mode="scope")
    marker = new_marker()
    started = subprocess.run(
        ["systemd-run", *scope_flag(), f"--slice=corral-session_{sid}.slice", "-q", f"--setenv={MARKER_ENV}={marker}"]
        + ["sleep", "1000"],
        capture_output=True,
        text=True,
    )
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 10 * TIME_SCALE
        while not marked_pids(marker):
            assert time.monotonic() < deadline, "the stray unit never started"
            time.sleep(0.05)
        if ended_by == "its owner":
            owner.kill()
            assert agent.wait_ended(sid, within=30 * TIME_SCALE)["not_proven"] == []
        else:
            os.kill(agent.session_entry(sid)["holder"]["pid"], signal.SIGKILL)
            systemctl("stop", f"corral-session_{sid}.service")
            assert marked_pids(marker), "the slice went with its holder unit"
            end = agent.ctl("session", "end", sid)
            assert end.returncode == 0, end.stdout + end.stderr
        assert marked_pids(marker) == []
        assert systemctl("is-active", f"corral-session_{sid}.slice").stdout.strip() != "active"
    finally:
        kill_marked(marker)


def hog(megabytes: int) -> list[str]:
    """A command that holds ``megabytes`` of touched memory, then prints "held" and waits."""
    return [
        sys.executable,
        "-c",
        f"import sys, time; b = bytearray({megabytes} << 20); print('held', flush=True); time.sleep(1000)",
    ]


@pytest.mark.systemd
@pytest.mark.parametrize("unit_type", ["scope", "service"])
def test_a_sessions_mem_stops_the_run_that_crosses_it(agent, unit_type):
    """--mem of a session: the kernel holds it over all its runs (the slice's MemoryMax).
    A run that crosses it with the others' memory is OOM-killed: 121 for it, its
    siblings untouched (the kernel's victim is the largest process)."""
    from modes import KERNEL_LIMITS

    sid = start_session(agent, "--mem", "160M", mode=unit_type)
    entry = agent.session_entry(sid)
    if not KERNEL_LIMITS:  # the unified harness layout: no memory controller, and the session says so
        assert entry["limits_enforced"] == {"mem": "none"}
        assert agent.ctl("session", "end", sid).returncode == 0
        return
    assert entry["limits_enforced"] == {"mem": "kernel"}
    flags = mode_flags(unit_type)
    held = agent.corral([*flags, "--session", sid, "--background", "--ready-log", "^held", "--", *hog(60)])
    assert held.returncode == 0, held.stderr
    crosser = agent.corral([*flags, "--session", sid, "--json", "-", "--", *hog(120)])
    assert crosser.returncode == 121, crosser.stderr
    assert '"outcome": "memory"' in crosser.stdout and "memory limit exceeded" in crosser.stderr
    alone = agent.corral([*flags, "--session", sid, "--", *hog(50)[:2], "print('fits')"])
    assert alone.returncode == 0 and alone.stdout.strip() == "fits", alone.stderr
    ps = json.loads(agent.ctl("ps", "--session", sid, "--json").stdout)
    assert [r["run_id"] for r in ps if r["state"] == "active"] == [held.stdout.strip()]
    assert agent.ctl("session", "end", sid).returncode == 0
    assert gone_within(agent) == []


@pytest.mark.systemd
def test_a_sessions_pids_and_cpus_are_the_slices(agent):
    """--pids and --cpus of a session: TasksMax= and CPUQuota= of its slice, read back from the kernel."""
    from modes import KERNEL_LIMITS, systemctl

    sid = start_session(agent, "--pids", "12", "--cpus", "0.5", mode="scope")
    entry = agent.session_entry(sid)
    if not KERNEL_LIMITS:
        assert entry["limits_enforced"] == {"pids": "none", "cpus": "none"}
        assert agent.ctl("session", "end", sid).returncode == 0
        return
    assert entry["limits_enforced"] == {"pids": "kernel", "cpus": "kernel"}
    assert systemctl("show", "-P", "TasksMax", f"corral-session_{sid}.slice").stdout.strip() == "12"
    keep = agent.corral(["--session", sid, "--background", "--", "sh", "-c", "sleep 1000 & sleep 1000 & wait"])
    assert keep.returncode == 0, keep.stderr
    forks = agent.corral(
        [
            "--session",
            sid,
            "--",
            sys.executable,
            "-c",
            "import os, time\nn = 0\nfor _ in range(30):\n    try:\n        pid = os.fork()\n"
            "    except OSError:\n        continue\n    if pid == 0:\n        time.sleep(30); os._exit(0)\n"
            "    n += 1\nprint(n)",
        ]
    )
    assert forks.returncode == 0, forks.stderr
    # 12 tasks in the whole session: the 3 of the background run and the python itself leave at most 8.
    assert 0 < int(forks.stdout) <= 8
    assert agent.ctl("session", "end", sid).returncode == 0
    assert gone_within(agent) == []


def test_a_fallback_sessions_limits_are_said_not_enforced(agent):
    r = agent.ctl("session", "start", "--cgroup-mode", "fallback", "--mem", "100M", "--pids", "50")
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()
    assert r.stderr.count("\n") == 1 and "--mem, --pids not enforced: no service manager" in r.stderr
    entry = agent.session_entry(sid)
    assert entry["engine"] == "fallback" and entry["limits_enforced"] == {"mem": "none", "pids": "none"}
    run = agent.corral(["--session", sid, "--json", "-", "--", "true"])
    assert run.returncode == 0, run.stderr
    said = f"session {sid}'s limits (--mem 100M, --pids 50) do not hold this run"
    assert said in run.stderr and said in run.stdout
    assert agent.ctl("session", "end", sid).returncode == 0


@pytest.mark.parametrize(
    "args, says",
    [
        (["--mem", "lots"], "--mem"),
        (["--pids", "0"], "--pids '0'"),
        (["--cpus", "-1"], "--cpus"),
        (["--cgroup-mode", "sometimes"], "--cgroup-mode 'sometimes'"),
    ],
)
def test_bad_session_limits(agent, args, says):
    r = agent.ctl("session", "start", *args)
    assert r.returncode == 125 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    assert not list(agent.directory.glob("sessions/*.json"))


def test_an_enforced_session_without_a_manager_is_refused(agent):
    from modes import manager_reachable

    if manager_reachable():
        pytest.skip("a manager answers here: enforced is had")
    r = agent.ctl("session", "start", "--cgroup-mode", "enforced")
    assert r.returncode == 125 and r.stderr.count("\n") == 1 and "--cgroup-mode enforced" in r.stderr, r.stderr


# -- background runs started by the session's holder -------------------------------------------
@pytest.mark.parametrize("mode", all_modes())
def test_a_background_runs_corral_is_the_holders_child(agent, mode):
    """In a session, the front asks the holder to start the run's corral: it is the
    holder's child (in systemd mode, in the holder's unit), not the caller's."""
    sid = start_session(agent, mode=mode)
    r = agent.corral([*mode_flags(mode), "--session", sid, "--background", "--json", "-", "--", "sleep", "1000"])
    assert r.returncode == 0, r.stderr
    started = json.loads(r.stdout)
    holder = agent.session_entry(sid)["holder"]["pid"]
    assert started["started_by"] == "holder", started
    with open(f"/proc/{started['corral_pid']}/stat") as f:
        assert int(f.read().rsplit(")", 1)[1].split()[1]) == holder
    if SESSION_MODE[mode] != "fallback" and agent.session_entry(sid).get("engine") == "systemd":
        with open(f"/proc/{started['corral_pid']}/cgroup") as f:
            assert f"/corral-session_{sid}.service" in f.read()
    assert agent.ctl("session", "end", sid).returncode == 0
    assert gone_within(agent) == []


def test_what_a_killed_background_corral_left_ends_with_the_session(agent, tmp_path):
    """Fallback: a background run's corral and its tether SIGKILLed, its command's
    daemon with a scrubbed environment (no run mark) is found by nothing of the run's
    own: it is below the session's holder (a subreaper), which stops it at the end."""
    from corral_systemd.kernel.procfs import read_stat

    sid = start_session(agent, mode="fallback")
    pidfile = tmp_path / "daemon.pid"
    r = agent.corral(
        ["--cgroup-mode", "fallback", "--session", sid, "--background", "--json", "-", "--"]
        + ["sh", "-c", f"env -i setsid sleep 1000 & echo $! > {pidfile}; sleep 1000"]
    )
    assert r.returncode == 0, r.stderr
    started = json.loads(r.stdout)
    deadline = time.monotonic() + 10 * TIME_SCALE
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    daemon = read_stat(int(pidfile.read_text()))
    assert daemon is not None
    try:
        entry = json.loads((agent.directory / f"{started['run_id']}.json").read_text())
        for pid in [started["corral_pid"], *entry.get("helper_pids", [])]:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        again = read_stat(daemon.pid)
        assert again is not None and again.starttime == daemon.starttime, "the daemon did not outlive its corral"
        end = agent.ctl("session", "end", sid)
        assert end.returncode == 0, end.stdout + end.stderr
        again = read_stat(daemon.pid)
        assert again is None or again.starttime != daemon.starttime or again.state == "Z", (
            "the daemon outlived its session"
        )
    finally:
        again = read_stat(daemon.pid)
        if again is not None and again.starttime == daemon.starttime:
            os.kill(daemon.pid, signal.SIGKILL)


def test_the_library_sessions_limits(agent, monkeypatch):
    import corral_systemd as corral

    monkeypatch.setenv("CORRAL_STATE_DIR", str(agent.directory))
    with corral.Session(limits={"mem": "64M", "pids": 100}, cgroup_mode="fallback") as session:
        entry = agent.session_entry(session.id)
        assert entry["limits"] == {"mem": 64 << 20, "pids": 100} and entry["engine"] == "fallback"
        assert len(session.warnings) == 1 and "not enforced" in session.warnings[0]
    with pytest.raises(corral.UsageError):
        corral.Session(limits={"wall": "1s"}).open()


@pytest.mark.parametrize("mode", [m for m in all_modes() if (m if isinstance(m, str) else m.values[0]) != "service"])
def test_a_removed_state_directory_does_not_keep_a_session_from_ending(agent, mode):
    """The runs' uid removes the whole state directory mid-session (every entry, log and
    the holder's socket): the holder writes its entry again, and ending the session
    still stops every run of it (their marks, its slice, what is below the holder)."""
    import shutil

    sid = start_session(agent, mode=mode)
    flags = mode_flags(mode)
    bg = agent.corral([*flags, "--session", sid, "--background", "--", "sh", "-c", "trap '' TERM; sleep 1000"])
    assert bg.returncode == 0, bg.stderr
    marker = new_marker()
    fg = subprocess.Popen(
        [*CORRAL, *flags, "--session", sid, "--grace", "0.5s", "--", "sleep", "1000"],
        env=dict(agent.env, **{MARKER_ENV: marker}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30 * TIME_SCALE
        while len(list(agent.directory.glob("*.json"))) < 2 or not marked_pids(marker):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)  # the holder has seen both join
        shutil.rmtree(agent.directory)
        deadline = time.monotonic() + 10 * TIME_SCALE
        while not (agent.directory / "sessions" / f"{sid}.json").exists():
            assert time.monotonic() < deadline, "the holder did not write its entry again"
            time.sleep(0.05)
        # and listens again: a background run started now is still the holder's child
        again = agent.corral([*flags, "--session", sid, "--background", "--json", "-", "--", "sleep", "1000"])
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["started_by"] == "holder", again.stdout + again.stderr
        end = agent.ctl("session", "end", sid)
        assert end.returncode == 0, end.stdout + end.stderr
        assert gone_within(agent) == [] and marked_pids(marker) == []
        fg.wait(timeout=60 * TIME_SCALE)
    finally:
        fg.kill()
        kill_marked(marker)


#: A command that asks a session's holder to start a process: it waits for the
#: session's id in a file, connects to the holder's address and sends a Spawn call.
ASK_HOLDER = r"""
import json, os, socket, sys, time
path = sys.argv[1]
end = time.monotonic() + 60
while time.monotonic() < end and not (os.path.exists(path) and open(path).read().strip()):
    time.sleep(0.02)
sid = open(path).read().strip()
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(f"\0corral-session/{os.geteuid()}/{sid}")
except OSError as exc:
    print("unreachable", exc.errno)
    sys.exit(0)
call = {"method": "io.corral.SessionHolder.Spawn", "parameters": {"run_id": "aaaaaaaaaaaa"}}
s.sendall(json.dumps(call).encode() + b"\0")
print("reply", s.recv(65536).split(b"\0")[0].decode())
"""


def test_a_sessions_holder_is_a_hand_off_channel(agent, tmp_path):
    """The holder starts background runs outside the caller's tree: a run's record lists
    it as a channel (``corral-session``), and it serves a plain run's command."""
    sid = start_session(agent, mode="fallback")
    (tmp_path / "sid").write_text(sid)
    probe = agent.corral(
        ["--cgroup-mode", "fallback", "--json", "-", "--", sys.executable, "-c", ASK_HOLDER, str(tmp_path / "sid")]
    )
    assert probe.returncode == 0 and probe.stdout.startswith("reply"), probe.stderr
    assert "InvalidParameter" in probe.stdout  # served: refused only for what it asked
    assert "corral-session" in json.loads(probe.stdout.split("\n", 1)[1])["handoff"]
    assert agent.ctl("session", "end", sid).returncode == 0


SEALED_TIERS = [
    pytest.param(["--guarantee", "subreaper", "--handoff", "deny"], id="subreaper"),
    pytest.param(["--guarantee", "pidns", "--handoff", "deny"], id="pidns", marks=pytest.mark.pidns),
    pytest.param(["--guarantee", "subreaper", "--network", "none"], id="network-none"),
]


@pytest.mark.parametrize("sealed", SEALED_TIERS)
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_sealed_run_reaches_no_sessions_holder(agent, tmp_path, sealed, when):
    """A sealed run asks a session's holder to start a process outside it: the holder's
    address has no path to rename or re-create, and the holder refuses every caller in
    another user namespace (a sealed command's always is) -- for a session that was open
    when the run began and for one started after it."""
    sid_file = tmp_path / "sid"
    sid_file.write_text("")
    if when == "before":
        sid_file.write_text(start_session(agent, mode="fallback"))
    marker = new_marker()
    run = subprocess.Popen(
        [*CORRAL, *sealed, "--wall", "60s", "--", sys.executable, "-c", ASK_HOLDER, str(sid_file)],
        env=dict(agent.env, **{MARKER_ENV: marker}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if when == "after":
            time.sleep(0.5)
            sid_file.write_text(start_session(agent, mode="fallback"))
        out, err = run.communicate(timeout=90 * TIME_SCALE)
        assert run.returncode == 0, err
        sid = sid_file.read_text()
        token = json.loads(agent.ctl("session", "ls", "--json").stdout)
        assert any(r["session"] == sid and r["state"] == "open" for r in token), token
        # Reached (no network namespace of its own) and refused, or not reached at all.
        assert out.startswith("unreachable") or "PermissionDenied" in out, out + err
        assert "PermissionDenied" in out or "--network" in sealed, out
        end = agent.ctl("session", "end", sid)
        assert end.returncode == 0, end.stderr
        assert "0 runs" in end.stdout  # nothing was started in the session for the sealed run
    finally:
        run.kill()
        kill_marked(marker)


# -- what a run's own uid can do to its session (each a way a session said "gone" while a process lived)
def _starttime(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive_as(pid: int, starttime: int) -> bool:
    """The process ``pid`` that started at ``starttime`` is alive (not a zombie): a
    process with its environment cleared carries no marker, so it is named this way."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X") and _starttime(pid) == starttime


def _written_pids(path) -> list[tuple[int, int]]:
    try:
        lines = path.read_text().split()
    except OSError:
        return []
    return [(int(p), int(s)) for p, s in (line.split(":") for line in lines if ":" in line)]


def _kill_written(path) -> None:
    for pid, start in _written_pids(path):
        if _alive_as(pid, start):
            os.kill(pid, signal.SIGKILL)


#: A background run's command that leaves a process with its environment cleared, in a
#: session of its own, then kills its corral ($PPID) and, with ``holder``, the session's
#: holder (its corral's parent): the process writes "pid:starttime" to argv[1].
#: ``chain``: the process is a fork-and-exit chain (each hop writes itself); ``stop``:
#: it SIGSTOPs the holder.
LEAVE_BEHIND = r"""
import os, signal, sys, time
path, what, holder = sys.argv[1], sys.argv[2], int(sys.argv[3])
def me():
    start = open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]
    with open(path, "a") as f:
        f.write(f"{os.getpid()}:{start}\n")
if len(sys.argv) > 4:  # the process left behind: environment empty, its own session
    corral = int(sys.argv[4])
    if what == "chain":
        os.kill(corral, signal.SIGKILL)
        while True:
            if os.fork():
                os._exit(0)
            me()
            time.sleep(0.002)
    me()
    os.kill(corral, signal.SIGKILL)
    time.sleep(0.5)  # re-parented to the holder by now
    if what == "holder":
        os.kill(holder, signal.SIGKILL)
    if what == "stop":
        os.kill(holder, signal.SIGSTOP)
    time.sleep(1000)
corral = os.getppid()
assert int(open(f"/proc/{corral}/stat").read().rsplit(")", 1)[1].split()[1]) == holder, "not the holder's"
for _ in range(6000):  # the test says go once its front has returned (else: "ended before it was ready")
    if os.path.exists(path + ".go"):
        break
    time.sleep(0.01)
if os.fork() == 0:
    os.setsid()
    if os.fork():
        os._exit(0)
    os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:4], str(corral)], {})
time.sleep(1000)
"""


def _leave_behind(agent, sid: str, path, what: str):
    """A background run whose command kills its own corral (and the holder, ``what``):
    the subreaper tier, where the command sees both (auto's pidns hides them:
    ``test_a_session_runs_command_sees_neither_its_corral_nor_the_holder``)."""
    script = path.parent / "leave_behind.py"
    script.write_text(LEAVE_BEHIND)
    holder = str(agent.session_entry(sid)["holder"]["pid"])
    r = agent.corral(
        ["--session", sid, "--guarantee", "subreaper", "--background", "--json", "-", "--"]
        + [sys.executable, str(script), str(path), what, holder]
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["started_by"] == "holder", r.stdout
    (path.parent / (path.name + ".go")).touch()
    deadline = time.monotonic() + 20 * TIME_SCALE
    while not _written_pids(path):
        assert time.monotonic() < deadline, "the left-behind process never started"
        time.sleep(0.05)
    time.sleep(1.0)  # its corral (and holder) killed
    return r


def test_a_holder_killed_by_what_it_held_is_not_proven_ended(agent, tmp_path):
    """A background run leaves a daemon with its environment cleared, SIGKILLs its
    corral (the daemon re-parents to the holder), and the daemon SIGKILLs the holder:
    nothing holds the daemon any more, so session end cannot prove it gone -- 120,
    saying so, never "every process proven gone"."""
    sid = start_session(agent, mode="fallback")
    path = tmp_path / "left"
    try:
        _leave_behind(agent, sid, path, "holder")
        (pid, start), *_ = _written_pids(path)
        end = agent.ctl("session", "end", sid)
        assert end.returncode == 120, end.stdout + end.stderr
        assert "NOT proven ended" in end.stderr and "no holder holds the session" in end.stderr
        assert "proven gone" not in end.stdout
        assert _alive_as(pid, start)  # the case itself: the daemon did outlive its holder
    finally:
        _kill_written(path)


def test_a_holder_stopped_by_what_it_held_still_ends_its_session(agent, tmp_path):
    """The subreaper tier, where a run's command sees the holder: a process it left
    behind kills its corral (no member is left to continue the holder) and SIGSTOPs
    the holder. The holder's own timer continues it: the session still ends at its
    idle timeout, and the process is gone with it. (One that stops it again and
    again only delays it: docs/sessions.md.)"""
    idle = 2 * TIME_SCALE
    sid = start_session(agent, "--idle-timeout", f"{idle:g}s", mode="fallback")
    holder = agent.session_entry(sid)["holder"]["pid"]
    path = tmp_path / "left"
    try:
        _leave_behind(agent, sid, path, "stop")
        (pid, start), *_ = _written_pids(path)
        ended = agent.wait_ended(sid, within=30 * TIME_SCALE)
        assert ended["why"] == f"idle for {idle:g}s", ended
        deadline = time.monotonic() + 10 * TIME_SCALE
        while _alive_as(pid, start) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive_as(pid, start), "the process that stopped the holder outlived the session"
    finally:
        _kill_written(path)
        try:
            os.kill(holder, signal.SIGCONT)  # the red case: do not leave it stopped
        except ProcessLookupError:
            pass


#: A process that binds a dead holder's address and answers ``End`` in its name:
#: "ended, every process proven gone" (the Varlink frame a holder sends).
IMPERSONATOR = """
import json, socket, sys
from corral_systemd.state import sessions as S
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(S.holder_address(sys.argv[1]))
sock.listen(8)
print("bound", flush=True)
while True:
    conn, _ = sock.accept()
    conn.settimeout(5)
    try:
        conn.recv(65536)
        said = {"members": [], "not_proven": [], "why": "ended by corralctl session end"}
        if len(sys.argv) > 2:
            said["verdict"] = json.loads(sys.argv[2])
        conn.sendall(json.dumps({"parameters": said}).encode() + b"\\0")
    except OSError:
        pass
    conn.close()
"""

#: A verdict of the holder's form but not its secret (what a forger can write).
FORGED_VERDICT = {"proven": True, "secret": "00" * 32, "other": "11" * 32}


@pytest.mark.parametrize("verdict", [None, FORGED_VERDICT], ids=["no-verdict", "forged-verdict"])
def test_a_process_answering_at_a_dead_holders_address_proves_nothing(agent, tmp_path, verdict):
    """The daemon a background run left SIGKILLs the holder, then binds the holder's
    address and answers End "every process proven gone": it cannot give the holder's
    verdict (a secret committed to in the session's id), so session end says 120."""
    sid = start_session(agent, mode="fallback")
    path = tmp_path / "left"
    impostor = None
    try:
        _leave_behind(agent, sid, path, "holder")
        (pid, start), *_ = _written_pids(path)
        args = [sid] if verdict is None else [sid, json.dumps(verdict)]
        impostor = subprocess.Popen(
            [sys.executable, "-c", IMPERSONATOR, *args], stdout=subprocess.PIPE, text=True, env=agent.env
        )
        assert impostor.stdout.readline().strip() == "bound"
        end = agent.ctl("session", "end", sid)
        assert end.returncode == 120, end.stdout + end.stderr
        assert "without its holder's verdict" in end.stderr, end.stderr
        assert "proven gone" not in end.stdout
        assert _alive_as(pid, start)  # the case itself: the daemon outlived its holder
    finally:
        if impostor is not None:
            impostor.kill()
            impostor.wait()
        _kill_written(path)


def test_a_forged_ended_entry_after_the_holders_death_proves_nothing(agent, tmp_path):
    """The holder SIGKILLed by what it held, the session's entry rewritten to say it
    ended with nothing left: no holder's verdict in it, so session end says 120."""
    sid = start_session(agent, mode="fallback")
    path = tmp_path / "left"
    try:
        _leave_behind(agent, sid, path, "holder")
        (pid, start), *_ = _written_pids(path)
        entry_path = agent.directory / "sessions" / f"{sid}.json"
        forged = json.loads(entry_path.read_text())
        forged.update(state="ended", why="idle for 1s", not_proven=[], verdict=FORGED_VERDICT)
        entry_path.write_text(json.dumps(forged))
        end = agent.ctl("session", "end", sid)
        assert end.returncode == 120, end.stdout + end.stderr
        assert "without its holder's verdict" in end.stderr, end.stderr
        assert _alive_as(pid, start)
    finally:
        _kill_written(path)


def test_a_session_its_holder_ended_is_ended_again_with_its_verdict(agent):
    """The genuine case the verdict must not spoil: a fallback session its holder
    ended (idle) ends again with 0, by the verdict its holder left in its entry."""
    sid = start_session(agent, "--idle-timeout", "1s", mode="fallback")
    entry = agent.wait_ended(sid)
    assert entry["verdict"]["proven"] is True, entry
    end = agent.ctl("session", "end", sid)
    assert end.returncode == 0, end.stdout + end.stderr
    assert "had already ended (idle for 1s)" in end.stdout


def test_session_ls_names_a_stopped_holder_as_not_answering(agent):
    sid = start_session(agent, mode="fallback")
    holder = agent.session_entry(sid)["holder"]["pid"]
    os.kill(holder, signal.SIGSTOP)
    try:
        ls = agent.ctl("session", "ls", "--json")
        assert ls.returncode == 0, ls.stderr
        (row,) = [r for r in json.loads(ls.stdout) if r["session"] == sid]
        assert row["state"] == "not answering", row
    finally:
        os.kill(holder, signal.SIGCONT)


def test_a_fork_chain_below_the_holder_is_proven_gone(agent, tmp_path):
    """A background run starts a fork-and-exit chain with its environment cleared, in a
    session of its own, and SIGKILLs its corral: the chain re-parents to the holder, a
    child subreaper, which kills below itself until waitpid says no child is left."""
    sid = start_session(agent, mode="fallback")
    path = tmp_path / "chain"
    try:
        _leave_behind(agent, sid, path, "chain")
        end = agent.ctl("session", "end", sid)
        assert end.returncode == 0, end.stdout + end.stderr
        hops = len(_written_pids(path))
        time.sleep(0.5)
        assert len(_written_pids(path)) == hops, "the chain still forks"
        assert not any(_alive_as(p, s) for p, s in _written_pids(path)[-5:])
    finally:
        _kill_written(path)


@pytest.mark.parametrize("mode", ["fallback", pytest.param("scope", marks=pytest.mark.systemd)])
def test_a_stopped_holder_with_a_forged_entry_is_still_ended(agent, mode):
    """The run's uid SIGSTOPs the holder and rewrites the session's entry to name pid 1:
    session end finds the holder through its address (the kernel's word), continues and
    ends it: the holder gone, its runs gone, no run joins after."""
    sid = start_session(agent, mode=mode)
    bg = agent.corral([*mode_flags(mode), "--session", sid, "--background", "--", "sleep", "1000"])
    assert bg.returncode == 0, bg.stderr
    holder = agent.session_entry(sid)["holder"]["pid"]
    start = _starttime(holder)
    path = agent.directory / "sessions" / f"{sid}.json"
    try:
        os.kill(holder, signal.SIGSTOP)
        forged = json.loads(path.read_text())
        forged["holder"] = {"pid": 1, "starttime": _starttime(1)}
        path.write_text(json.dumps(forged))
        end = agent.ctl("session", "end", sid, timeout=60 * TIME_SCALE)
        assert end.returncode == 0, end.stdout + end.stderr
        assert not _alive_as(holder, start)
        assert gone_within(agent) == []
        again = agent.corral([*mode_flags(mode), "--session", sid, "--", "true"])
        assert again.returncode == 125, again.stderr
    finally:
        if _alive_as(holder, start):
            os.kill(holder, signal.SIGCONT)


def test_a_run_relabelled_into_a_session_whose_holder_died_is_not_stopped(agent):
    """A run of no session has its entry rewritten to name the session, and the holder is
    killed: session end works without its holder, and still stops only runs whose own
    live corral says they are the session's."""
    sid = start_session(agent)
    lone = agent.corral(["--background", "--", "sleep", "1000"])
    assert lone.returncode == 0, lone.stderr
    path = agent.directory / f"{lone.stdout.strip()}.json"
    entry = json.loads(path.read_text())
    entry["session"] = sid
    path.write_text(json.dumps(entry))
    os.kill(agent.session_entry(sid)["holder"]["pid"], signal.SIGKILL)
    end = agent.ctl("session", "end", sid)
    assert "0 runs" in end.stdout + end.stderr or end.returncode == 120, end.stdout + end.stderr
    assert lone.stdout.strip() not in end.stdout + end.stderr
    assert marked_pids(lone.marker), "a run that never joined was stopped with the session"
    assert agent.ctl("stop", lone.stdout.strip()).returncode == 0


def test_max_runs_holds_under_concurrent_joiners(agent):
    """Twelve corrals join a --max-runs 1 session at once (its holder stopped while they
    come, so that all ask before it answers any): the holder admits one."""
    sid = start_session(agent, "--max-runs", "1")
    holder = agent.session_entry(sid)["holder"]["pid"]
    marker = new_marker()
    os.kill(holder, signal.SIGSTOP)
    try:
        procs = [
            subprocess.Popen(
                [*CORRAL, "--session", sid, "--", "sleep", "3"],
                env=dict(agent.env, **{MARKER_ENV: marker}),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(12)
        ]
        time.sleep(2.5)
        os.kill(holder, signal.SIGCONT)
        codes = [(p.wait(timeout=60 * TIME_SCALE), p.stderr.read()) for p in procs]
        assert sorted(c for c, _ in codes) == [0] + [125] * 11, codes
        assert all("--max-runs" in err for c, err in codes if c == 125), codes
    finally:
        os.kill(holder, signal.SIGCONT)
        for p in procs:
            p.kill()
        kill_marked(marker)
    assert agent.ctl("session", "end", sid).returncode == 0


def test_a_rewritten_entry_does_not_keep_a_session_busy(agent):
    """An entry naming the session, rewritten every 0.2 s, is not a run of it: the
    session still ends when idle for its idle timeout."""
    sid = start_session(agent, "--idle-timeout", "2s")
    fake = agent.directory / "aaaaaaaaaaaa.json"
    deadline = time.monotonic() + 20 * TIME_SCALE
    n = 0
    while agent.session_entry(sid).get("state") != "ended":
        assert time.monotonic() < deadline, "a rewritten entry kept the session open"
        n += 1
        fake.write_text(json.dumps({"run_id": "aaaaaaaaaaaa", "session": sid, "state": "active", "n": n}))
        time.sleep(0.2)
    assert agent.session_entry(sid)["why"] == "idle for 2s"


def test_the_owners_death_ends_a_run_while_the_holder_is_stopped(agent, tmp_path):
    """The run's uid SIGSTOPs the holder, then the session's owner dies: each run's
    corral watches the owner too, so the run still ends (143, saying why), and
    continues the holder as it leaves: the session ends too."""
    owner = agent.owner()
    sid = start_session(agent, "--owner", str(owner.pid), mode="fallback")
    holder = agent.session_entry(sid)["holder"]["pid"]
    marker = new_marker()
    fg = subprocess.Popen(
        [*CORRAL, "--session", sid, "--grace", "0.5s", "--", "sh", "-c", f"touch {tmp_path}/up; exec sleep 1000"],
        env=dict(agent.env, **{MARKER_ENV: marker}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30 * TIME_SCALE
        while not (tmp_path / "up").exists():  # admitted, and running
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(holder, signal.SIGSTOP)
        owner.kill()
        owner.wait()
        _, err = fg.communicate(timeout=30 * TIME_SCALE)
        assert fg.returncode == 143, err
        assert f"session {sid}'s owner, pid {owner.pid}, exited" in err
        assert marked_pids(marker) == []
        # The run leaving continued its holder, which ends the session on its owner's death itself.
        assert agent.wait_ended(sid)["why"] == f"its owner (pid {owner.pid}) exited"
    finally:
        os.kill(holder, signal.SIGCONT)
        fg.kill()
        kill_marked(marker)


@pytest.mark.systemd
def test_a_stopped_holder_unit_is_restarted_by_the_managers_watchdog(agent):
    """systemd mode: the run's uid SIGSTOPs the holder; it stops pinging its unit's
    watchdog, so the manager kills it and starts it again, and the session's idle
    timeout still ends it (its background run with it)."""
    agent.env = dict(agent.env, CORRAL_HOLDER_WATCHDOG_SEC=f"{2 * TIME_SCALE:g}")  # 30 s otherwise
    sid = start_session(agent, "--idle-timeout", f"{3 * TIME_SCALE:g}s", mode="scope")
    bg = agent.corral([*mode_flags("scope"), "--session", sid, "--background", "--", "sleep", "1000"])
    assert bg.returncode == 0, bg.stderr
    first = agent.session_entry(sid)["holder"]["pid"]
    os.kill(first, signal.SIGSTOP)
    try:
        entry = agent.wait_ended(sid, within=60 * TIME_SCALE)
    finally:
        try:
            os.kill(first, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert entry["holder"]["pid"] != first, entry  # a new holder ended it
    assert entry["why"].startswith("idle for"), entry
    assert gone_within(agent) == []


REACH_FOR_CORRAL = r"""
import json, os, signal, sys
directory, holder = sys.argv[1], int(sys.argv[2])
pids = {"holder": holder}
for name in os.listdir(directory):  # every corral the state directory names
    if name.endswith(".json"):
        owner = json.load(open(os.path.join(directory, name))).get("owner") or {}
        if type(owner.get("pid")) is int:
            pids["corral " + name] = owner["pid"]
said = {}
for what, pid in pids.items():
    try:
        os.kill(pid, signal.SIGSTOP)
        said[what] = "stopped"
    except OSError as exc:
        said[what] = exc.strerror
print(json.dumps(said), flush=True)
signal.pause()
"""


@pytest.mark.pidns
def test_a_session_run_whose_command_can_reach_the_holder_says_so(agent):
    """Where the command shares the holder's pid namespace (the subreaper tier) it can
    stop the holder, which a process of the same uid may: the run says what that costs
    the session; in a pid namespace of its own it cannot, and nothing is said."""
    mode_flags("pidns")  # skips where no pid namespace can be had
    if manager_reachable():
        pytest.skip("a manager answers: the session's holder is a unit, its watchdog the manager's")
    sid = start_session(agent, mode="fallback")
    said = {}
    for tier in ("subreaper", "pidns"):
        r = agent.corral(["--session", sid, "--guarantee", tier, "--", "true"])
        assert r.returncode == 0, r.stderr
        said[tier] = "can reach the session's holder" in r.stderr
    assert said == {"subreaper": True, "pidns": False}, said
    assert agent.ctl("session", "end", sid).returncode == 0


@pytest.fixture
def run_group_parent():
    """A cgroup v2 directory for ``--cgroup-parent`` (the harness's, or one made below
    this host's cgroup2 mount as root, its groups killed and removed after)."""
    import uuid

    import delegated

    from corral_systemd.kernel.cgroupfs import Mounts
    from modes import delegated_cgroup_parent

    if (given := delegated_cgroup_parent()) is not None:
        yield given
        return
    if (why := delegated.unavailable()) is not None:
        pytest.skip(why)
    path = os.path.join(Mounts().unified, f"corral-test-{uuid.uuid4().hex[:12]}")
    os.mkdir(path)
    try:
        yield path
    finally:
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
        for _ in range(100):
            subprocess.run(["find", path, "-mindepth", "1", "-depth", "-type", "d", "-delete"], capture_output=True)
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.05)


@pytest.mark.pidns
@pytest.mark.parametrize("tier", ["pidns", "cgroup"])
def test_a_session_runs_command_sees_neither_its_corral_nor_the_holder(agent, tmp_path, tier, request):
    """auto takes the pidns tier for a session's run too, and the cgroup tier gives its
    run a pid namespace where it can: its command cannot stop (or kill) the session's
    holder or any corral, so the session still ends at its idle timeout -- a holder
    stopped by what it held, with no member left to continue it, would keep the
    session open forever (the subreaper tier's gap)."""
    mode_flags("pidns")  # skips where no pid namespace can be had
    if manager_reachable():
        pytest.skip("a manager answers: auto takes a unit here")
    flags = ["--cgroup-parent", request.getfixturevalue("run_group_parent")] if tier == "cgroup" else []
    idle = 2 * TIME_SCALE
    sid = start_session(agent, "--idle-timeout", f"{idle:g}s", mode="pidns")
    holder = agent.session_entry(sid)["holder"]["pid"]
    script = tmp_path / "reach.py"
    script.write_text(REACH_FOR_CORRAL)
    r = agent.corral(
        ["--session", sid, *flags, "--background", "--json", "-", "--"]
        + [sys.executable, str(script), str(agent.directory), str(holder)]
    )
    assert r.returncode == 0, r.stderr
    started = json.loads(r.stdout)
    try:
        entry = json.loads((agent.directory / f"{started['run_id']}.json").read_text())
        assert entry["mode"] == ("cgroup" if tier == "cgroup" else "pidns"), entry["mode"]
        deadline = time.monotonic() + 20 * TIME_SCALE
        while not (said := agent.ctl("logs", started["run_id"]).stdout.strip()):
            assert time.monotonic() < deadline, "the command never said what it reached"
            time.sleep(0.05)
        reached = json.loads(said)
        assert reached and set(reached.values()) == {"No such process"}, reached
        ended = agent.wait_ended(sid, within=30 * TIME_SCALE)
        assert ended["why"] == f"idle for {idle:g}s", ended
        assert gone_within(agent) == []
    finally:
        os.kill(holder, signal.SIGCONT)  # the red case: do not leave it stopped
