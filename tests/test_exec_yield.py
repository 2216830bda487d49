"""Issue 39 (part): the exec convention in the CLI and the library: ``corral --yield``,
a kept stdin (``--stdin keep``) answered with ``corralctl send`` and
``Session.exec(...).write_stdin``, a run handed back and read on with ``logs --since``.

What is proven is what the kernel shows: a run's processes carry a marker in
their environment (``procscan``), and "gone" means none carrying it is left.
No timed asserts: a wait for output is bounded only so that a hang fails.
"""

import json
import re
import time

import pytest
from test_sessions import agent, gone_within, start_session  # noqa: F401  (the fixture)

from modes import all_modes, mode_flags
from procscan import MARKER_ENV, marked_pids, new_marker

HANDED_BACK = 119


def _session(agent) -> str:  # noqa: F811
    owner = agent.owner()
    r = agent.ctl("session", "start", "--owner", str(owner.pid), "--idle-timeout", "30m")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _handed_back_id(stderr: str) -> tuple[str, int]:
    m = re.search(r"^corral: handed back: ([0-9a-f]+) still running .* from byte (\d+)", stderr, re.M)
    assert m, stderr
    return m.group(1), int(m.group(2))


def _log_until(agent, run_id: str, since: int, want: bytes, bound: float = 30) -> bytes:  # noqa: F811
    """``corralctl logs --since`` until ``want`` is in what it printed (bounded: a hang fails)."""
    end = time.monotonic() + bound
    while True:
        r = agent.ctl("logs", run_id, "--since", str(since))
        assert r.returncode == 0, r.stderr
        if want.decode() in r.stdout or time.monotonic() > end:
            return r.stdout.encode()
        time.sleep(0.05)


def test_a_run_that_ends_within_the_yield_is_a_plain_run(agent, tmp_path):  # noqa: F811
    sid = _session(agent)
    script = "echo out; echo err >&2; sh -c 'sleep 600' & exit 3"
    yielded = agent.corral(["--yield", "60s", "--session", sid, "--json", str(tmp_path / "y.json"), "sh", "-c", script])
    plain = agent.corral(["--session", sid, "--json", str(tmp_path / "p.json"), "sh", "-c", script])
    assert yielded.returncode == plain.returncode == 3, yielded.stderr
    assert sorted(yielded.stdout.splitlines()) == ["err", "out"]  # one stream: stdout and stderr
    y, p = (json.loads((tmp_path / name).read_text()) for name in ("y.json", "p.json"))
    for key in ("outcome", "exit_code", "verified", "guarantee", "mode", "argv"):  # processes_seen: timing
        assert y[key] == p[key], key
    assert y["processes_stopped"] >= 1 and y["remaining_pids"] == []  # the leaked sleep, stopped
    assert yielded.stderr.splitlines()[-1].startswith("corral: ")  # its summary line, on stderr
    assert "exit 3" in yielded.stderr.splitlines()[-1]
    assert gone_within(agent) == []


def test_a_run_that_outlives_the_yield_is_handed_back_and_nothing_is_lost(agent, tmp_path):  # noqa: F811
    sid = _session(agent)
    gate = tmp_path / "go"
    script = f"echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo second; exit 7"
    record = tmp_path / "r.json"
    r = agent.corral(["--yield", "500ms", "--session", sid, "--json", str(record), "sh", "-c", script])
    assert r.returncode == HANDED_BACK, r.stderr
    run_id, cursor = _handed_back_id(r.stderr)
    # (what the yield showed: "first", or nothing yet on a loaded machine)
    assert r.stdout in ("", "first\n") and cursor == len(r.stdout.encode())
    facts = json.loads(record.read_text())
    assert facts == {"run_id": run_id, "running": True, "cursor": cursor, "log": facts["log"]}
    assert marked_pids(r.marker), "handed back: the run goes on"
    gate.touch()
    assert agent.ctl("wait", run_id).returncode == 7
    rest = agent.ctl("logs", run_id, "--since", str(cursor))
    assert r.stdout + rest.stdout == "first\nsecond\n"  # every byte once
    assert json.loads(record.read_text())["exit_code"] == 7  # its record replaced the hand-back facts
    assert gone_within(agent) == []


@pytest.mark.parametrize("mode", all_modes())
def test_a_yielded_run_is_the_same_run_on_every_path(agent, mode, tmp_path):  # noqa: F811
    """One --yield case through each tier (and a manager's scope and service): ended within
    the yield it is the plain run (its exit code, its record's outcome, mode and proof);
    outliving it, 119, every byte once, its exit code from ``corralctl wait`` and its record
    verified with the daemon it left stopped; nothing of either left."""
    flags = mode_flags(mode)
    sid = start_session(agent, mode=mode)
    quick = "echo out; sh -c 'sleep 600' & exit 3"
    yielded = agent.corral(
        [*flags, "--yield", "60s", "--session", sid, "--json", str(tmp_path / "y.json"), "sh", "-c", quick]
    )
    plain = agent.corral([*flags, "--session", sid, "--json", str(tmp_path / "p.json"), "sh", "-c", quick])
    assert yielded.returncode == plain.returncode == 3, yielded.stderr + plain.stderr
    y, p = (json.loads((tmp_path / name).read_text()) for name in ("y.json", "p.json"))
    for key in ("outcome", "exit_code", "verified", "guarantee", "mode", "proof"):
        assert y[key] == p[key], key
    gate = tmp_path / "go"
    slow = f"echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo second; sh -c 'sleep 600' & exit 7"
    record = tmp_path / "r.json"
    r = agent.corral([*flags, "--yield", "500ms", "--session", sid, "--json", str(record), "sh", "-c", slow])
    assert r.returncode == HANDED_BACK, r.stderr
    run_id, cursor = _handed_back_id(r.stderr)
    assert r.stdout in ("", "first\n") and cursor == len(r.stdout.encode())  # "first" or nothing yet, if loaded
    assert marked_pids(r.marker), "handed back: the run goes on"
    gate.touch()
    assert agent.ctl("wait", run_id).returncode == 7
    assert r.stdout + agent.ctl("logs", run_id, "--since", str(cursor)).stdout == "first\nsecond\n"
    done = json.loads(record.read_text())
    assert done["exit_code"] == 7 and done["verified"] is True and done["mode"] == p["mode"], done
    assert done["processes_stopped"] >= 1 and done["remaining_pids"] == []  # the sleep it left
    assert gone_within(agent) == []


def test_a_repl_answered_with_corralctl_send_and_eof(agent):  # noqa: F811
    sid = _session(agent)
    r = agent.corral(["--yield", "300ms", "--session", sid, "--stdin", "keep", "cat"])
    assert r.returncode == HANDED_BACK, r.stderr
    run_id, cursor = _handed_back_id(r.stderr)
    assert agent.ctl("send", run_id, "hello", "--line").returncode == 0
    assert _log_until(agent, run_id, cursor, b"hello\n") == b"hello\n"
    sent = agent.ctl("send", run_id, "--eof")
    assert sent.returncode == 0, sent.stderr
    assert agent.ctl("wait", run_id).returncode == 0  # cat read end of file
    assert gone_within(agent) == []


def test_a_repl_answered_through_the_library(agent, monkeypatch):  # noqa: F811
    from corral_systemd.session import HandedBack, Session

    monkeypatch.setenv("CORRAL_STATE_DIR", str(agent.directory))
    marker = new_marker()
    with Session(idle_timeout="30m") as session:
        run = session.exec(["python3", "-i", "-q"], yield_=0.3, env={**agent.env, MARKER_ENV: marker})
        assert isinstance(run, HandedBack)
        run.write_stdin("print(6 * 7)\n")
        seen, cursor = b"", run.cursor
        end = time.monotonic() + 30
        while b"42\n" not in seen and time.monotonic() < end:  # the line whole: it may come in two reads
            data, cursor = run.read_output()
            seen += data
        assert b"42\n" in seen
        assert marked_pids(marker)
        run.write_stdin("", eof=True)
        assert run.wait() == 0
        ended = session.exec("echo done; exit 5", yield_=60, env={**agent.env, MARKER_ENV: marker})
        assert (ended.exit_code, ended.stdout, ended.verified) == (5, b"done\n", True)
    assert marked_pids(marker) == []


def test_a_repl_on_a_pty_answered_with_corralctl_send_and_ended_with_its_session(agent):  # noqa: F811
    """``--pty`` handed back: its terminal's input kept by its corral, typed into with
    ``corralctl send``; what the REPL printed read back from its log (a computed marker:
    the terminal's echo of the line typed does not contain it); the session's end leaves
    no process carrying the run's marker."""
    sid = _session(agent)
    r = agent.corral(["--yield", "0", "--session", sid, "--pty", "python3", "-q", "-i"])
    assert r.returncode == HANDED_BACK, r.stderr
    run_id, cursor = _handed_back_id(r.stderr)
    line = "print('pty' + '-' + str(__import__('os').isatty(0)))"
    sent = agent.ctl("send", run_id, line, "--line")
    assert sent.returncode == 0, sent.stderr
    assert b"pty-True" in _log_until(agent, run_id, cursor, b"pty-True")  # answered, on a terminal
    assert marked_pids(r.marker)
    assert agent.ctl("session", "end", sid).returncode == 0
    assert marked_pids(r.marker) == []


def test_the_session_ends_a_run_waiting_on_its_kept_stdin(agent):  # noqa: F811
    sid = _session(agent)
    r = agent.corral(["--yield", "300ms", "--session", sid, "--stdin", "keep", "sh", "-c", "setsid sleep 600 & cat"])
    assert r.returncode == HANDED_BACK, r.stderr
    run_id, _ = _handed_back_id(r.stderr)
    assert len(marked_pids(r.marker)) >= 2
    assert agent.ctl("session", "end", sid).returncode == 0
    assert marked_pids(r.marker) == []
    gone = agent.ctl("send", run_id, "x")  # its stdin went with its corral
    assert gone.returncode == 125 and len(gone.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    "args, said",
    [
        (["--yield", "soon", "--session", "x", "true"], "invalid --yield"),
        (["--yield", "1s", "true"], "needs a session"),
        (["--stdin", "keep", "true"], "--stdin keep is for"),
        (["--yield", "1s", "--session", "x", "--background", "true"], "one or the other"),
    ],
)
def test_bad_yield_input_is_one_line_and_125(agent, args, said):  # noqa: F811
    r = agent.corral(args, env={"CORRAL_SESSION": ""})
    assert r.returncode == 125 and said in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_send_to_an_unknown_run_or_one_without_kept_stdin_is_125(agent):  # noqa: F811
    sid = _session(agent)
    unknown = agent.ctl("send", "nosuchrun", "x")
    assert unknown.returncode == 125 and len(unknown.stderr.splitlines()) == 1
    bg = agent.corral(["--background", "--session", sid, "sleep", "600"])
    assert bg.returncode == 0, bg.stderr
    without = agent.ctl("send", bg.stdout.strip(), "x")
    assert without.returncode == 125 and "keeps no stdin" in without.stderr
    assert len(without.stderr.splitlines()) == 1
    both = agent.ctl("send", bg.stdout.strip(), "x", "--file", "/dev/null")
    assert both.returncode == 125 and len(both.stderr.splitlines()) == 1
