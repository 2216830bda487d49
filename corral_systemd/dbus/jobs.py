"""Waiting for the manager: its signals, and the end of a job.

The part of systemd's ``bus-wait-for-jobs.c`` that corral needs, over the
synchronous connection (``connection.py``) or a Runner's channel
(``mux.Channel``): make sure the manager's signals reach a connection
(``subscribe``), feed them to a handler until a condition holds
(``pump_signals``), and wait for a job's JobRemoved (``wait_job``).
"""

import time

from ..common.errors import SetupError
from .connection import Connection, wait_fd
from .systemd1 import MANAGER, PROPS, Manager

#: How long a start job may take before corral gives up on it.
START_TIMEOUT = 10.0


def subscribe(conn: Connection, manager: Manager, *, all_units: bool = False) -> None:
    """Make sure the manager's signals reach ``conn``, once per connection
    (before any start). A private connection gets them all unasked. On a
    bus: match JobRemoved (and, for a shared connection, every unit's
    PropertiesChanged and UnitRemoved) and Subscribe."""
    if conn.subscribed:
        return
    if conn.unique_name is not None:
        manager.add_match(f"type='signal',sender='org.freedesktop.systemd1',interface='{MANAGER}',member='JobRemoved'")
        if all_units:
            manager.add_match(
                f"type='signal',sender='org.freedesktop.systemd1',interface='{MANAGER}',member='UnitRemoved'"
            )
            manager.add_match(
                "type='signal',sender='org.freedesktop.systemd1',interface='"
                + PROPS
                + "',member='PropertiesChanged',path_namespace='/org/freedesktop/systemd1/unit'"
            )
        manager.subscribe()
    conn.subscribed = True


def pump_signals(conn, handle, done, timeout: float) -> bool:
    """Feed ``conn``'s signals to ``handle`` until ``done()`` or ``timeout``; return ``done()``."""
    end = time.monotonic() + timeout
    while True:
        while conn.signals and not done():
            handle(conn.signals.popleft())
        if done():
            return True
        left = end - time.monotonic()
        if left <= 0 or not wait_fd(conn.fileno(), left):
            return done()
        conn.read_pending()


def wait_job(conn, job: str, other=lambda msg: None, *, what: str) -> str:
    """Wait for JobRemoved of ``job``; pass other signals to ``other``."""
    result = []

    def handle(msg):
        if msg.member == "JobRemoved" and msg.body[1] == job:
            result.append(msg.body[3])
        else:
            other(msg)

    if not pump_signals(conn, handle, lambda: bool(result), START_TIMEOUT):
        raise SetupError(f"systemd did not start {what} within {START_TIMEOUT:g}s")
    return result[0]
