"""Issue 27: a session's background run is started by the session's holder (its child,
so everything it starts stays below the holder), and still gets its caller's context.

The caller (``context_probe.py wrap``) sets up a context and runs ``corral --background``
in a session; the probe, as the background command, reports what it got; the same
caller runs the probe bare. What the holder's child can be given (rlimits, nice,
affinity, oom_score_adj, ignored signals, the signal mask, environment, umask, cwd)
must read as the bare command's, and the run's corral must be the holder's child.
What it cannot be given without privilege or at all (no-new-privs, a seccomp
filter, other groups or namespaces) makes the front start the run itself, as a
run outside a session is started, and say so: the context is still the caller's.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from context_probe import CAPABILITIES
from serving import compiled_client  # noqa: F401  (fixture)
from test_context_parity import PROBE, ROWS

from conftest import CORRAL
from modes import mode_flags
from procscan import MARKER_ENV, kill_marked, new_marker

HERE = Path(__file__).resolve().parent
CTL = [sys.executable, "-m", "corral_systemd.ctl"]
ROOT = os.geteuid() == 0
CARRIED = "rlimits,nice,affinity,oom,signals,env,umask,cwd"
CARRIED_ROWS = [
    *(name for name in ROWS if name.startswith("rlimit ")),
    "nice",
    "cpu affinity",
    "oom_score_adj",
    "signal mask",
    "signal dispositions",
    "environment",
    "umask",
    "cwd",
    "a session of its own",
]
#: A setting the holder's child cannot be given -> (the row that checks it, what the warning names).
DECLINED = {
    "nnp": ("no-new-privs", "NoNewPrivs"),
    "seccomp": ("seccomp", "Seccomp"),
    **({"groups": ("groups", "Groups")} if ROOT else {}),
}
#: Where each mode's session lives (as tests/test_sessions.py).
SESSION_MODE = {"fallback": "fallback", "scope": "enforced"}
MODES = ["fallback", pytest.param("scope", marks=pytest.mark.systemd)]


def _start_session(env: dict, mode: str) -> str:
    r = subprocess.run(
        [*CTL, "session", "start", "--cgroup-mode", SESSION_MODE[mode]], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _wrapped(tmp: Path, settings: str, argv: list[str], env: dict) -> tuple[subprocess.CompletedProcess, Path]:
    """The caller with ``settings`` runs ``argv`` (the probe's OUT appended, as ``context_probe`` does)."""
    tmp.mkdir()
    out = tmp / "probe.json"
    proc = subprocess.run(
        [sys.executable, str(HERE / "context_probe.py"), "wrap", str(out), settings, "--", *argv, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )
    return proc, out


#: The clients: the Python one (its own corral is the front), the compiled one (the
#: session's holder forks its front, made its context: ``Spawner.front``).
CLIENTS = ["python", "compiled"]


def _client(request, client: str) -> list[str]:
    return list(CORRAL) if client == "python" else request.getfixturevalue("compiled_client")


def _case(tmp_path, mode: str, settings: str, client: list[str] = CORRAL):
    """(the bare probe's report, the background run's, the start record, what the
    front said on stderr, what the caller was). CORRAL_SERVICE_DEBUG: a compiled
    client whose holder would not be its front says so."""
    marker = new_marker()
    state = tmp_path / "state"
    env = dict(os.environ, CORRAL_STATE_DIR=str(state), CTX_CWD=str(tmp_path), CTX_MOUNT_DIR=str(tmp_path))
    if client != CORRAL:
        env["CORRAL_SERVICE_DEBUG"] = "1"
    sid = _start_session(env, mode)
    env.update({"CORRAL_SESSION": sid, MARKER_ENV: marker})
    try:
        bare, bare_out = _wrapped(tmp_path / "bare", settings, PROBE, env)
        assert bare.returncode == 0, bare.stderr
        front, out = _wrapped(
            tmp_path / "bg", settings, [*client, *mode_flags(mode), "--background", "--json", "-", "--", *PROBE], env
        )
        assert front.returncode == 0, front.stderr
        started = json.loads(front.stdout)
        wait = subprocess.run([*CTL, "wait", started["run_id"]], env=env, capture_output=True, text=True)
        assert wait.returncode == 0, wait.stderr + (state / f"{started['run_id']}.out").read_text()
        caller = json.loads(Path(f"{out}.caller").read_text())
        return json.loads(bare_out.read_text()), json.loads(out.read_text()), started, front.stderr, caller
    finally:
        subprocess.run([*CTL, "session", "end", sid], env=env, capture_output=True)
        kill_marked(marker)


def _wrong(rows: list[str], got: dict, bare: dict, started: dict, caller: dict) -> list[str]:
    ctx = {"record": {"run_id": started["run_id"]}, "caller": caller, "wrap": {}}
    wrong = []
    for name in rows:
        seen, want = ROWS[name][1](got, bare, ctx)
        if seen != want:
            wrong.append(f"{name}: {seen!r} != {want!r}")
    return wrong


def capabilities_differ(got: dict, bare: dict) -> list[str]:
    """The capability sets the command started with that are not its caller's own
    command's (a holder with more, as systemd 257's user manager gives its services
    CapInh, lowers them in its child: never more, never less)."""
    return [f"{k}: {got.get(k)} != {bare.get(k)}" for k in CAPABILITIES if got.get(k) != bare.get(k)]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("mode", MODES)
def test_a_background_run_is_the_holders_child_with_the_callers_context(tmp_path, mode, client, request):
    bare, got, started, stderr, caller = _case(tmp_path, mode, CARRIED, _client(request, client))
    assert started["started_by"] == "holder" and started["warnings"] == [], stderr
    assert "warning" not in stderr  # the compiled client's front: the holder's, none declined
    wrong = _wrong(CARRIED_ROWS, got, bare, started, caller)
    wrong += capabilities_differ(got["status"], bare["status"])
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("setting", list(DECLINED))
def test_what_the_holder_cannot_give_the_front_keeps(tmp_path, mode, setting, client, request):
    row, named = DECLINED[setting]
    bare, got, started, stderr, caller = _case(tmp_path, mode, setting, _client(request, client))
    if client == "compiled":  # the holder declined to be its front, for the same reason
        assert "the session's holder is not this run's front" in stderr and named in stderr, stderr
    assert started["started_by"] == "front", started
    assert len(started["warnings"]) == 1 and named in started["warnings"][0], started["warnings"]
    assert "corral: warning: started by this corral, not by session" in stderr
    wrong = _wrong([row, "a session of its own"], got, bare, started, caller)
    assert not wrong, "\n".join(wrong)


@pytest.mark.skipif(not ROOT, reason="a network namespace of its own needs root here")
def test_a_caller_in_another_network_namespace_cannot_join(tmp_path):
    """The holder's address is its network namespace's (an abstract socket): a corral
    in another one cannot reach it, and says so in one line (125), nothing started."""
    state = tmp_path / "state"
    env = dict(os.environ, CORRAL_STATE_DIR=str(state))
    sid = _start_session(env, "fallback")
    try:
        for extra in (["--background"], []):
            r = subprocess.run(
                ["unshare", "-n", *CORRAL, "--session", sid, *extra, "--", "true"],
                env=env,
                capture_output=True,
                text=True,
            )
            assert r.returncode == 125, r.stderr
            assert r.stderr.strip().splitlines() == [
                f"corral: session {sid}'s holder is in another network namespace (its address is that "
                "namespace's): a run here cannot join it"
            ], r.stderr
    finally:
        subprocess.run([*CTL, "session", "end", sid], env=env, capture_output=True)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("mode", MODES)
def test_the_environment_options_of_a_session_run_are_read_with_the_callers_environment(
    tmp_path, mode, client, request
):
    """--env-clear --env-keep PATH in a session: the run's corral reads the command line
    with the caller's whole environment (so the registry it names, CORRAL_STATE_DIR, is
    the one used, and the record says what was dropped), and the command gets PATH alone."""
    state = tmp_path / "state"
    marker = new_marker()
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_SESSION"}
    env.update(CORRAL_STATE_DIR=str(state), **{MARKER_ENV: marker})
    sid = _start_session(env, mode)
    try:
        front = subprocess.run(
            [*_client(request, client), *mode_flags(mode), "--session", sid, "--background", "--json", "-"]
            + ["--env-clear", "--env-keep", "PATH", "--", "sh", "-c", 'echo "[${HOME-unset}]"'],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert front.returncode == 0, front.stderr
        started = json.loads(front.stdout)
        assert started["started_by"] == "holder", started
        wait = subprocess.run([*CTL, "wait", started["run_id"]], env=env, capture_output=True, text=True)
        assert wait.returncode == 0, wait.stderr
        record = json.loads((state / f"{started['run_id']}.json").read_text())  # this registry's, not another's
        assert record["environment"]["kept"] == ["PATH"] and "CORRAL_STATE_DIR" in record["environment"]["dropped"]
        assert "[unset]" in (state / f"{started['run_id']}.out").read_text().splitlines()
    finally:
        subprocess.run([*CTL, "session", "end", sid], env=env, capture_output=True)
        kill_marked(marker)
