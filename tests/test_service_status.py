"""A service's exit status, as the manager tells it, when the unit is stopped from outside.

`systemctl stop` of a run's service (Type=exec, ExitType=cgroup): the manager
sends SIGTERM, the main process dies of it, the group empties, the unit goes
inactive and, with nothing holding it, is collected at once. corral learns
the status from the Service interface's PropertiesChanged (ExecMainCode 2,
ExecMainStatus 15) or, once ActiveState says "deactivating" with no status
yet, by asking. A question about a collected unit loads a new, empty one of
that name (systemd's bus object lookup: ``manager_load_unit_from_dbus_path``),
whose ExecMainCode and ExecMainStatus are 0. Seen once on systemd 257's system
manager: "command exited 0" for a command killed by SIGTERM.

Here the engine is driven with no manager: a fake answers its questions as
systemd does around the collection, and the signals arrive in systemd's order
(a unit's type interface first, then Unit; UnitRemoved last).
"""

import os
import signal
import types

import pytest
from test_accounting import _FakeSession

from corral_systemd.dbus.systemd1 import ManagerAPIs, unit_path

SERVICE, UNIT = "org.freedesktop.systemd1.Service", "org.freedesktop.systemd1.Unit"
KILLED_BY_TERM = {"ExecMainPID": 4242, "ExecMainCode": 2, "ExecMainStatus": int(signal.SIGTERM)}  # CLD_KILLED
#: What a question about the unit's name gets once it is collected: a new unit, loaded empty.
RELOADED = {"ExecMainPID": 0, "ExecMainCode": 0, "ExecMainStatus": 0, "Result": "success"}


class _CollectedAfter:
    """The manager's answers about a service whose main process has died: the
    first ``answers`` questions see the unit as it ended, every later one a
    unit of that name loaded anew (it was collected in between)."""

    def __init__(self, answers: int):
        self.apis = ManagerAPIs(None)
        self.left = answers
        self.asked: list[str] = []

    def _props(self) -> dict:
        live, self.left = self.left > 0, self.left - 1
        return {**KILLED_BY_TERM, "Result": "signal"} if live else dict(RELOADED)

    def get(self, name, interface, prop):
        self.asked.append(f"Get {prop}")
        return self._props()[prop]

    def get_all(self, name, interface):
        self.asked.append("GetAll")
        return self._props()


def _message(path: str, member: str, *body):
    return types.SimpleNamespace(path=path, member=member, body=list(body))


def _changed(path: str, interface: str, props: dict):
    values = {k: types.SimpleNamespace(value=v) for k, v in props.items()}
    return _message(path, "PropertiesChanged", interface, values, [])


def _engine(manager):
    from corral_systemd.core.spec import RunSpec
    from corral_systemd.engines.systemd import SystemdEngine

    engine = SystemdEngine(RunSpec(argv=["sh"], unit_type="service"), _FakeSession())
    engine.link.manager = manager
    engine._started = True
    return engine


@pytest.mark.parametrize(
    "answers",
    [
        pytest.param(1, id="collected-between-two-questions"),
        pytest.param(0, id="collected-before-corral-asks"),
    ],
)
def test_a_service_stopped_from_outside_died_of_its_signal(answers):
    """The stop's signals in systemd's order; corral asks when it sees
    "deactivating" without a status. Whenever the collection falls, the status
    is SIGTERM's, never an exit 0 made of a live unit's ExecMainCode and an
    empty one's ExecMainStatus."""
    manager = _CollectedAfter(answers)
    engine = _engine(manager)
    path = unit_path(engine.unit)
    stop = [
        _changed(path, SERVICE, {"ExecMainPID": 4242, "ExecMainCode": 0, "ExecMainStatus": 0}),
        _changed(path, UNIT, {"ActiveState": "deactivating", "SubState": "stop-sigterm"}),
    ]
    end = [
        _changed(path, SERVICE, {**KILLED_BY_TERM, "ExecMainPID": 0, "Result": "success"}),
        _changed(path, UNIT, {"ActiveState": "inactive", "SubState": "dead"}),
        _message("/org/freedesktop/systemd1", "UnitRemoved", engine.unit, path),
    ]
    engine.conn.signals.extend(stop)
    engine.poll_events()  # "deactivating", no status: it asks (the main process has died by now)
    assert manager.asked, "corral did not ask the manager"
    engine.conn.signals.extend(end)
    engine.poll_events()
    status = engine.main_status()
    assert status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, (
        status,
        manager.asked,
    )


def test_a_change_without_the_status_is_no_exit():
    """ExecMainCode without ExecMainStatus in one answer says nothing of how
    the process ended: no status is made of it (a CLD_KILLED read with a
    missing status 0 would be "exited 0")."""
    engine = _engine(_CollectedAfter(0))
    path = unit_path(engine.unit)
    engine.conn.signals.append(_changed(path, SERVICE, {"ExecMainCode": 2}))
    engine.poll_events()
    assert engine.main_status() is None
    engine.conn.signals.append(_changed(path, SERVICE, KILLED_BY_TERM))
    engine.poll_events()
    assert os.WTERMSIG(engine.main_status()) == signal.SIGTERM
