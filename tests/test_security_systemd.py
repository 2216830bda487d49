"""Issue 14 against a real manager: corralctl stops only units corral started, by
corral's own marks (name, BindsTo= its tether, Description), never by name alone
(run under tests/harness/with-user-manager)."""

import json
import os
import subprocess
import time

import pytest
from test_registry import ctl, state  # noqa: F401
from test_security_registry import forge_entry

from corral_systemd.core.spec import new_run_id
from modes import unit_property

pytestmark = pytest.mark.systemd


def _systemctl(*args):
    scope = [] if os.environ.get("CORRAL_TEST_MANAGER") == "system" else ["--user"]
    return subprocess.run(["systemctl", *scope, *args], capture_output=True, text=True, timeout=30)


def _systemd_run(unit, *args):
    scope = [] if os.environ.get("CORRAL_TEST_MANAGER") == "system" else ["--user"]
    r = subprocess.run(
        ["systemd-run", *scope, "-q", f"--unit={unit}", *args, "sleep", "120"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    return unit if "." in unit else unit + ".service"


@pytest.fixture
def user_units():
    made = []
    yield made
    for unit in made:
        _systemctl("stop", unit)


def _state(unit):
    return unit_property(unit, "ActiveState") or "gone"


def test_gc_leaves_units_that_are_only_named_like_corrals(state, user_units):
    """A user's own `systemd-run --unit=corral-mybackup`, and even one named as a run id
    (corral-<hex>), without corral's tether: gc stops neither."""
    user_units.append(_systemd_run("corral-mybackup"))
    user_units.append(_systemd_run(f"corral-{new_run_id()}", "--description=corral: lookalike"))
    for unit in user_units:
        assert _state(unit) == "active"
    r = ctl(state, "gc", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    # None of these. (A concurrent test's corral that died may have left a
    # real run's unit, tether gone: reclaiming that one is gc's job.)
    reclaimed = [item.get("unit") for item in json.loads(r.stdout)["reclaimed"]]
    assert not set(reclaimed) & set(user_units), r.stdout
    time.sleep(0.2)
    for unit in user_units:
        assert _state(unit) == "active", unit


def test_stop_of_a_forged_entry_leaves_the_unit_it_names(state, user_units):
    """A forged entry (owner dead) naming a unit of the user's own: stop does not StopUnit it."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    unit = _systemd_run("mybackup")
    user_units.append(unit)
    run_id, reg = forge_entry(state, owner_pid=dead.pid, owner_start=1, mode="systemd", unit=unit)
    reg.close()
    r = ctl(state, "stop", run_id)
    time.sleep(0.2)
    assert _state(unit) == "active", r.stdout + r.stderr
    assert "left alone" in r.stdout + r.stderr
    # Named as this run's unit but not corral's (no tether): left alone too.
    lookalike = _systemd_run(f"corral-{run_id}")
    user_units.append(lookalike)
    run_id2, reg = forge_entry(state, owner_pid=dead.pid, owner_start=1, mode="systemd", unit=lookalike)
    reg.close()
    ctl(state, "stop", run_id2)
    assert _state(lookalike) == "active"
