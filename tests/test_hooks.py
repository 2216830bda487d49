"""Issue 39 (hooks): ``corralctl hook claude-code | codex`` fed the documented hook JSON.

A stand-in agent (a Python process, as Claude Code's and Codex's are long-lived
processes) runs each hook through ``sh -c`` with the payload on stdin, and runs
each rewritten command with ``bash -c``, as the agent's shell tool would. What
is proven comes from /proc: the session's owner is the agent's pid, and no
process carrying a call's marker is left once the call (or the session) ends.

Payloads are copied from:
- Claude Code: https://code.claude.com/docs/en/hooks ("Hooks reference", as published for
  Claude Code v2.1.239, 2026-08-22): SessionStart input, the PreToolUse Bash example under
  "Common input fields", SessionEnd input.
- Codex: https://developers.openai.com/codex/hooks and its schema
  https://github.com/openai/codex/blob/main/codex-rs/hooks/schema/generated/pre-tool-use.command.input.schema.json
  (the required fields; the values are ours).
"""

import json
import os
import subprocess
import sys
import time

import pytest

from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

CTL = [sys.executable, "-m", "corral_systemd.ctl"]
HOOK = " ".join([*CTL, "hook"])

# https://code.claude.com/docs/en/hooks#sessionstart-input
CC_SESSION_START = {
    "session_id": "abc123",
    "transcript_path": "/Users/.../.claude/projects/.../00893aaf-19fa-41d2-8238-13269b9b3ca0.jsonl",
    "cwd": "/Users/...",
    "hook_event_name": "SessionStart",
    "source": "startup",
    "model": "claude-sonnet-5",
}
# https://code.claude.com/docs/en/hooks#common-input-fields (a PreToolUse hook for a Bash command)
CC_PRE_TOOL_USE = {
    "session_id": "abc123",
    "prompt_id": "550e8400-e29b-41d4-a716-446655440000",
    "transcript_path": "/home/user/.claude/projects/.../transcript.jsonl",
    "cwd": "/home/user/my-project",
    "permission_mode": "default",
    "hook_event_name": "PreToolUse",
    "tool_name": "Bash",
    "tool_input": {
        "command": "npm test",
        "description": "Run test suite",
        "timeout": 120000,
        "run_in_background": False,
    },
    "tool_use_id": "toolu_01ABC123...",
}
# https://code.claude.com/docs/en/hooks#sessionend-input
CC_SESSION_END = {
    "session_id": "abc123",
    "transcript_path": "/Users/.../.claude/projects/.../00893aaf-19fa-41d2-8238-13269b9b3ca0.jsonl",
    "cwd": "/Users/...",
    "hook_event_name": "SessionEnd",
    "reason": "other",
}
# https://developers.openai.com/codex/hooks (SessionStart: common fields and source)
CODEX_SESSION_START = {
    "session_id": "thread-1",
    "transcript_path": None,
    "cwd": "/home/user/my-project",
    "hook_event_name": "SessionStart",
    "model": "gpt-5-codex",
    "permission_mode": "default",
    "source": "startup",
}
# codex-rs/hooks/schema/generated/pre-tool-use.command.input.schema.json (every required field)
CODEX_PRE_TOOL_USE = {
    "cwd": "/home/user/my-project",
    "hook_event_name": "PreToolUse",
    "model": "gpt-5-codex",
    "permission_mode": "default",
    "session_id": "thread-1",
    "tool_input": {"command": "ls"},
    "tool_name": "Bash",
    "tool_use_id": "call-1",
    "transcript_path": None,
}

#: The stand-in agent: each stdin line is a request, each stdout line its answer.
AGENT = r"""
import json, subprocess, sys
hook = sys.argv[1]
for line in sys.stdin:
    ask = json.loads(line)
    if "hook" in ask:
        p = subprocess.run(["sh", "-c", hook + " " + ask["agent"]], input=ask["hook"], capture_output=True, text=True)
    else:
        try:  # a bound for a broken rewrite (an unwrapped background command never returns), not a timing
            p = subprocess.run(
                ["bash", "-c", ask["bash"]], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60
            )
        except subprocess.TimeoutExpired:
            print(json.dumps({"rc": "timeout", "stdout": "", "stderr": ""}), flush=True)
            continue
    print(json.dumps({"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}), flush=True)
"""


@pytest.fixture
def agent(tmp_path):
    """A running stand-in agent with a private state directory; what it left is killed after."""
    state = tmp_path / "state"
    env = dict(os.environ, CORRAL_STATE_DIR=str(state), CORRAL_HOOK_CONFIG=str(tmp_path / "hooks.toml"))
    env.pop("CORRAL_SESSION", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", AGENT, HOOK], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    markers: list[str] = []

    class Agent:
        pid = proc.pid
        directory = state
        config = tmp_path / "hooks.toml"

        def ask(self, request: dict) -> dict:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            return json.loads(proc.stdout.readline())

        def hook(self, payload, who: str = "claude-code") -> dict:
            text = payload if isinstance(payload, str) else json.dumps(payload)
            return self.ask({"hook": text, "agent": who})

        def bash(self, command: str) -> dict:
            return self.ask({"bash": command})

        def marker(self) -> str:
            markers.append(new_marker())
            return markers[-1]

        def ctl(self, *args):
            return subprocess.run([*CTL, *args], env=env, capture_output=True, text=True, timeout=120)

        def session(self, sid: str) -> dict:
            return json.loads((state / "sessions" / f"{sid}.json").read_text())

        def records(self) -> list[dict]:
            return [json.loads(p.read_text()) for p in sorted((state / "hooks").glob("*.json"))]

        def kill(self):
            proc.kill()
            proc.wait()

    yield Agent()
    if proc.poll() is None:
        proc.stdin.close()
        proc.wait()
    for entry in state.glob("sessions/*.json"):
        if json.loads(entry.read_text()).get("state") != "ended":
            subprocess.run([*CTL, "session", "end", entry.stem], env=env, capture_output=True, timeout=120)
    for m in markers:
        kill_marked(m)


def start(agent, payload=CC_SESSION_START, who="claude-code") -> str:
    r = agent.hook(payload, who)
    assert r["rc"] == 0 and r["stderr"] == "", r
    answer = json.loads(r["stdout"])
    assert answer["hookSpecificOutput"]["hookEventName"] == "SessionStart"
    (record,) = [rec for rec in agent.records() if rec["agent_session"] == payload["session_id"]]
    return record["corral_session"]


def rewrite(agent, command: str, payload=CC_PRE_TOOL_USE, who="claude-code", **tool_input) -> dict:
    payload = {**payload, "tool_input": {**payload["tool_input"], "command": command, **tool_input}}
    r = agent.hook(payload, who)
    assert r["rc"] == 0, r
    return json.loads(r["stdout"])["hookSpecificOutput"]


def leaky(marker: str) -> str:
    """A build step that leaves a daemon: its own session, its own process group, the marker."""
    return f"export {MARKER_ENV}={marker}; setsid sleep 300 </dev/null >/dev/null 2>&1 & echo built"


def daemon_and_main(marker: str) -> str:
    """A background command: a setsid daemon beside its main process (the run lives while that does)."""
    return f"export {MARKER_ENV}={marker}; setsid sleep 300 </dev/null >/dev/null 2>&1 & exec sleep 300"


def wait_ended(agent, sid: str, within: float = 30) -> dict:
    end = time.monotonic() + within
    while (entry := agent.session(sid)).get("state") != "ended" and time.monotonic() < end:
        time.sleep(0.05)
    return entry


def gone_within(marker: str, within: float = 10) -> list[int]:
    end = time.monotonic() + within
    while (left := marked_pids(marker)) and time.monotonic() < end:
        time.sleep(0.05)
    return left


def test_session_start_owned_by_the_agent(agent):
    sid = start(agent)
    entry = agent.session(sid)
    assert entry["owner"]["pid"] == agent.pid  # past the hook's `sh -c`: the agent itself
    listed = json.loads(agent.ctl("session", "ls", "--json").stdout)
    assert [s["session"] for s in listed if s["state"] == "open"] == [sid]
    assert start(agent) == sid  # SessionStart again (resume, compact): the same open session


def test_pre_tool_use_runs_the_command_in_the_session_and_leaves_nothing(agent):
    sid = start(agent)
    marker = agent.marker()
    out = rewrite(agent, leaky(marker) + '; echo "session=$CORRAL_SESSION run=$CORRAL_RUN_ID"')
    assert out["permissionDecision"] == "ask"  # permission_mode "default": the user still approves
    updated = out["updatedInput"]
    assert {k: v for k, v in updated.items() if k != "command"} == {
        "description": "Run test suite",
        "timeout": 120000,
        "run_in_background": False,
    }
    r = agent.bash(updated["command"])
    assert r["rc"] == 0, r
    assert marked_pids(marker) == []  # the daemon the command left is gone when the call returns
    lines = r["stdout"].splitlines()
    assert lines[0] == "built"
    run_id = lines[1].split("run=")[1]
    assert lines[1].startswith(f"session={sid} ")
    status = agent.ctl("status", run_id)
    assert status.returncode == 11, status  # a registered run of corral's, finished


def test_bypass_permissions_allows(agent):
    start(agent)
    out = rewrite(agent, "true", payload={**CC_PRE_TOOL_USE, "permission_mode": "bypassPermissions"})
    assert out["permissionDecision"] == "allow"


NASTY = """printf '%s\\n' "it's" '$HOME' "a\\\\b" 'tab\there' "$((6*7))"
echo 'two
lines' "\\"quoted\\"" `echo back` $(echo dollar) ; echo '\\'"""


def test_quoting_survives_a_nasty_command(agent):
    start(agent)
    direct = subprocess.run(["bash", "-c", NASTY], capture_output=True, text=True)
    assert direct.returncode == 0 and direct.stdout.count("\n") == 8, direct
    r = agent.bash(rewrite(agent, NASTY)["updatedInput"]["command"])
    assert r["rc"] == 0, r
    assert r["stdout"] == direct.stdout


def test_background_call_becomes_a_background_run_ended_with_the_session(agent):
    sid = start(agent)
    marker = agent.marker()
    out = rewrite(agent, f"export {MARKER_ENV}={marker}; exec sleep 300", run_in_background=True)
    assert out["updatedInput"]["run_in_background"] is False  # corral --background returns once started
    assert " --background " in out["updatedInput"]["command"]
    r = agent.bash(out["updatedInput"]["command"])
    assert r["rc"] == 0, r
    run_id = r["stdout"].strip()
    runs = json.loads(agent.ctl("ps", "--session", sid, "--json").stdout)
    assert [run["run_id"] for run in runs] == [run_id]
    assert marked_pids(marker)  # it outlives the call
    r = agent.hook(CC_SESSION_END)
    assert r["rc"] == 0 and r["stdout"] == "", r
    assert marked_pids(marker) == []  # SessionEnd answered after the session's end was proven
    assert agent.session(sid)["state"] == "ended"
    assert agent.records() == []


def test_session_end_leaves_nothing(agent):
    sid = start(agent)
    daemon = agent.marker()
    agent.bash(rewrite(agent, daemon_and_main(daemon), run_in_background=True)["updatedInput"]["command"])
    assert marked_pids(daemon)
    r = agent.hook(CC_SESSION_END)
    assert r["rc"] == 0 and r["stdout"] == "", r
    assert marked_pids(daemon) == []
    assert agent.session(sid)["state"] == "ended"
    assert agent.records() == []


def test_agent_sigkilled_ends_the_session(agent):
    sid = start(agent)
    marker = agent.marker()
    r = agent.bash(rewrite(agent, daemon_and_main(marker), run_in_background=True)["updatedInput"]["command"])
    assert r["rc"] == 0, r
    assert marked_pids(marker)
    agent.kill()
    assert wait_ended(agent, sid)["state"] == "ended"
    assert gone_within(marker) == []


def test_codex_session_and_rewrite(agent):
    sid = start(agent, CODEX_SESSION_START, "codex")
    marker = agent.marker()
    out = rewrite(agent, leaky(marker), payload=CODEX_PRE_TOOL_USE, who="codex")
    assert out["permissionDecision"] == "allow"  # Codex applies updatedInput only with "allow"
    assert set(out["updatedInput"]) == {"command"}
    r = agent.bash(out["updatedInput"]["command"])
    assert r["rc"] == 0 and r["stdout"] == "built\n", r
    assert marked_pids(marker) == []
    assert agent.session(sid)["owner"]["pid"] == agent.pid


def test_codex_pre_tool_use_without_session_start_starts_one(agent):
    out = rewrite(agent, "echo $CORRAL_SESSION", payload=CODEX_PRE_TOOL_USE, who="codex")
    (record,) = agent.records()
    r = agent.bash(out["updatedInput"]["command"])
    assert r["stdout"].strip() == record["corral_session"]
    assert agent.session(record["corral_session"])["owner"]["pid"] == agent.pid


def test_limits_from_the_config(agent):
    agent.config.write_text('mem = "512M"\npids = 64\nwall = "1h"\n')
    start(agent)
    command = rewrite(agent, "sleep 5", timeout=1500)["updatedInput"]["command"]
    assert " --wall 1.5s " in command and " --mem 512M " in command and " --pids 64 " in command
    r = agent.bash(command)
    assert r["rc"] == 124, r  # the call's own timeout: stopped by corral, not left running


MALFORMED = [
    "not json",
    "[]",
    json.dumps({"hook_event_name": "PreToolUse"}),  # no session_id
    json.dumps({**CC_PRE_TOOL_USE, "tool_name": "Write"}),
    json.dumps({**CC_PRE_TOOL_USE, "tool_input": {"command": 42}}),
    json.dumps({**CC_PRE_TOOL_USE, "tool_input": "ls"}),
    json.dumps({**CC_SESSION_END, "hook_event_name": "Stop"}),
    json.dumps({**CC_SESSION_END, "session_id": "never-started"}),
]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_input_passes_the_call_through(agent, text):
    r = agent.hook(text)
    assert (r["rc"], r["stdout"]) == (0, "")  # nothing that changes the call, never a block
    assert len(r["stderr"].splitlines()) == 1 and r["stderr"].startswith("corralctl hook: "), r


def test_a_bad_config_passes_the_call_through(agent):
    agent.config.write_text('mem = "lots"\n')
    r = agent.hook(CC_PRE_TOOL_USE)
    assert (r["rc"], r["stdout"]) == (0, "")
    assert "hooks.toml" in r["stderr"] and len(r["stderr"].splitlines()) == 1, r


def test_settings_snippet(agent):
    for who, events in (
        ("claude-code", ["SessionStart", "PreToolUse", "SessionEnd"]),
        ("codex", ["SessionStart", "PreToolUse"]),
    ):
        r = agent.ctl("hook", who, "--print-settings")
        hooks = json.loads(r.stdout)["hooks"]
        assert list(hooks) == events
        assert hooks["PreToolUse"][0]["matcher"] == "Bash"
        assert hooks["PreToolUse"][0]["hooks"][0]["command"].endswith(f"hook {who}")
        assert json.loads(agent.hook("", who)["stdout"]) == {"hooks": hooks}  # no payload: the snippet too
    bad = agent.ctl("hook", "gemini")
    assert bad.returncode == 125 and bad.stderr.count("\n") == 1
