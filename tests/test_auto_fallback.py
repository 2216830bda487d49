"""Issue 13, item 10: when --cgroup-mode auto falls back, the summary line says why, once."""

import os

import pytest

from corral_systemd.core.spec import RunSpec
from corral_systemd.engines import _system_manager_possible


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR")}
    env.update(extra)
    return env


CASES = [
    pytest.param(["--manager", "user"], _env(), id="user-no-bus"),
    pytest.param(
        ["--manager", "user"], _env(DBUS_SESSION_BUS_ADDRESS="unix:path=/nonexistent/bus"), id="user-unreachable"
    ),
    pytest.param([], _env(DBUS_SESSION_BUS_ADDRESS="unix:path=/nonexistent/bus"), id="auto-unreachable"),
    pytest.param([], _env(), id="auto-no-bus"),
    pytest.param(["--manager", "system"], _env(), id="system"),
]


def _skip_if_a_system_manager_answers(args):
    manager = args[1] if args else "auto"
    if manager != "user" and _system_manager_possible(RunSpec(argv=["true"], manager=manager)):
        pytest.skip("root on a machine booted with systemd: auto uses the system manager")


@pytest.mark.parametrize("args, env", CASES)
def test_summary_says_why_auto_fell_back(corral, args, env):
    _skip_if_a_system_manager_answers(args)
    run = corral(args + ["--", "true"], env=env)
    assert run.returncode == 0, run.stderr
    reason = run.record["engine"]["auto_fallback_reason"]
    # Below the manager: the strongest tier this machine gives (a pid namespace, or the subreaper).
    mode = run.record["mode"]
    assert mode in ("fallback", "pidns") and reason
    lines = run.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"corral: {mode}: command exited 0; exit 0;")
    # "; tree-only" between them where a hand-off channel is open (another test's session holder)
    line = lines[0].replace("; tree-only; guarantee ", "; guarantee ")
    assert line.endswith(f"; auto mode fell back: {reason}; guarantee {run.record['guarantee']}")
    assert run.stderr.decode().count(reason) == 1


@pytest.mark.parametrize("args, env", CASES[:1])
def test_quiet_says_nothing(corral, args, env):
    run = corral(args + ["--quiet", "--", "true"], env=env)
    assert run.returncode == 0 and run.stderr == b""
    assert run.record["engine"]["auto_fallback_reason"]


def test_explicit_fallback_has_no_reason_to_give(corral):
    run = corral(["--cgroup-mode", "fallback", "--", "true"], env=_env())
    assert "auto_fallback_reason" not in run.record["engine"] or not run.record["engine"]["auto_fallback_reason"]
    assert "fell back" not in run.stderr.decode()


def test_a_failed_start_says_why_too(corral):
    run = corral(["--manager", "user", "--", "/nonexistent/command"], env=_env())
    assert run.returncode == 127
    reason = run.record["engine"]["auto_fallback_reason"]
    assert run.stderr.decode().count(f"auto mode fell back: {reason}") == 1


@pytest.mark.parametrize("args", [["--manager", "user"], []], ids=["user", "auto"])
def test_no_user_bus_is_the_reason_given(corral, args):
    """With no user bus and no system manager auto mode could use, that is
    the reason given, not the failure of an attempt on another manager
    (a mutant that let root try the system manager anyway survived the
    engines mutation run). The skip reads the machine itself, not the
    function under test."""
    if os.geteuid() == 0 and os.path.isdir("/run/systemd/system"):
        pytest.skip("root on a machine booted with systemd: auto uses the system manager")
    run = corral(args + ["--", "true"], env=_env())
    assert run.returncode == 0, run.stderr
    assert run.record["engine"]["auto_fallback_reason"].startswith("no user bus"), run.record["engine"]
