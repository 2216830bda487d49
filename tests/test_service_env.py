"""Issue 13, item 17: exactly what a service's environment has that the caller's has not.

A scope's command gets corral's environment exactly. A service is started by
the manager, which adds INVOCATION_ID, SYSTEMD_EXEC_PID and (a user manager
only) MANAGERPID, and every variable of its own environment (``systemctl [--user]
show-environment``: a user manager's HOME, USER, LOGNAME, SHELL, LANG, ...)
that the caller does not set. With --env-clear/--env-keep/--env-drop corral
unsets all of those it can (UnsetEnvironment=); only SYSTEMD_EXEC_PID (and
MANAGERPID) are then added (systemd 252 sets them after applying it). The
system manager sets no MANAGERPID (seen in the VM lane).
"""

import os

import pytest

from modes import MANAGER, mode_flags, systemctl
from procscan import MARKER_ENV

pytestmark = pytest.mark.systemd
NOT_REMOVABLE = {"SYSTEMD_EXEC_PID"} | ({"MANAGERPID"} if MANAGER == "user" else set())
ALWAYS = {"INVOCATION_ID"} | NOT_REMOVABLE


def _env_of(run) -> dict:
    assert run.returncode == 0, run.stderr
    return dict(item.split("=", 1) for item in run.stdout.decode().split("\0") if item)


def _manager_environment() -> dict:
    out = systemctl("show-environment", check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _caller(run, env=None) -> dict:
    """What the command is given: the caller's environment, and the run's id (common/nesting.py)."""
    return dict(os.environ if env is None else env, **{MARKER_ENV: run.marker, "CORRAL_RUN_ID": run.record["run_id"]})


def test_what_a_service_adds(corral):
    manager = _manager_environment()
    run = corral(mode_flags("service") + ["--", "env", "-0"])
    got, caller = _env_of(run), _caller(run)
    added = set(got) - set(caller)
    assert added == ALWAYS | (set(manager) - set(caller)), sorted(added)
    assert set(caller) <= set(got)  # nothing of the caller's is lost ...
    assert {k: got[k] for k in caller} == caller  # ... or changed: the caller's values win
    for name in set(manager) - set(caller):
        if "\\" not in manager[name] and "$" not in manager[name]:  # show-environment quotes those
            assert got[name] == manager[name], name
    assert got["SYSTEMD_EXEC_PID"].isdigit() and got.get("MANAGERPID", "1").isdigit()
    assert len(got["INVOCATION_ID"]) == 32
    assert got["INVOCATION_ID"] == run.record["engine"]["invocation_id"].replace("-", "")


def test_an_explicit_environment_gets_only_what_cannot_be_removed(corral):
    run = corral(mode_flags("service") + ["--env-clear", "--", "/usr/bin/env", "-0"])
    assert set(_env_of(run)) == NOT_REMOVABLE | {"CORRAL_RUN_ID"}
    run = corral(mode_flags("service") + ["--env-drop", "CORRAL_NO_SUCH_VARIABLE", "--", "env", "-0"])
    got, caller = _env_of(run), _caller(run)
    assert set(got) - set(caller) == NOT_REMOVABLE
    assert {k: got[k] for k in caller} == caller


def test_a_scope_adds_nothing(corral):
    run = corral(mode_flags("scope") + ["--", "env", "-0"])
    assert _env_of(run) == _caller(run)
