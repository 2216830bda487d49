"""A run's connection to its manager, and what happens when it ends.

A run of its own (the CLI) opens a connection of its own, subscribed to its
unit's signals before anything is started, so no JobRemoved or
PropertiesChanged is missed. That connection can end under the run: a
manager's daemon-reexec closes every private connection, and a busy manager
has reset one mid-call (seen once in CI). Then:

- during the start (``start_unit``, ``wait_started``), ``replace()`` opens
  another at once, and the manager's word says whether its request had been
  taken: not taken, it is made again; taken, the strategy decides;
- once the unit runs, ``reconnect()`` tries again on the watch loop's clock,
  one bounded attempt every RECONNECT_EVERY, so the deadline and the limits
  are never held up; ``within_window()`` says whether to keep waiting for a
  manager that is coming back (RECONNECT_WINDOW).

A library Runner's link is its session's channel (``session.channel``):
never replaced here. Its loss is final for this run; the Runner reconnects
for later runs.
"""

import time
from collections.abc import Callable

from ...common.errors import SetupError
from ...dbus.connection import BusDisconnected, BusError
from ...dbus.discovery import connect_manager
from ...dbus.discovery import describe_error as _why
from ...dbus.jobs import START_TIMEOUT, subscribe, wait_job
from ...dbus.systemd1 import PROPS, UNIT, Manager

#: Once the unit runs, a call that gets no answer within this is a lost manager.
RUNTIME_CALL_TIMEOUT = 1.0
#: How long a run whose own connection ended keeps trying to connect again
#: before it calls the manager lost; one attempt every RECONNECT_EVERY, each
#: bounded by RECONNECT_TIMEOUT.
RECONNECT_WINDOW = 60.0
RECONNECT_EVERY = 0.5
RECONNECT_TIMEOUT = 0.5


class ManagerLink:
    """``conn`` and ``manager`` for one run's unit; ``dead`` once the
    connection ended (``lost_at``: when, monotonic; ``manager.lost``: why)."""

    def __init__(self, spec, unit: str, unit_path: str, session=None):
        self.spec = spec
        self.unit = unit
        self.session = session
        self._unit_match = (
            "type='signal',sender='org.freedesktop.systemd1',"
            f"path='{unit_path}',interface='{PROPS}',member='PropertiesChanged'"
        )
        if session is None:
            self.open()
        else:
            self.manager_kind, self.conn = session.manager_kind, session.channel(unit, unit_path)
            self.manager = Manager(self.conn, session.apis)  # its version read once, by the session
        #: A peer-to-peer connection to the manager: no bus name, so no
        #: AddRef/UnrefUnit; the unit may be collected as soon as it ends,
        #: and what we need of it arrives in PropertiesChanged before UnitRemoved.
        self.direct = self.conn.unique_name is None
        self.dead = False
        self.lost_at: float | None = None
        self._next_attempt = 0.0
        self.closed = False

    def open(self, timeout: float = START_TIMEOUT) -> None:
        """A connection of this run's own, subscribed to the unit's signals.
        SetupError when the manager cannot be had or used."""
        self.manager_kind, self.conn = connect_manager(self.spec.manager, timeout)
        self.manager = Manager(self.conn)
        try:
            subscribe(self.conn, self.manager)
            self.manager.add_match(self._unit_match)
        except BusError as exc:
            self.conn.close()
            raise SetupError(f"{self.manager_kind} manager not usable: {_why(exc)}") from None

    @property
    def replaceable(self) -> bool:
        """The connection is this run's own (a session's is the session's to restore)."""
        return self.session is None

    def replace(self, first: str, may_have_run: str) -> None:
        """During the start: a new connection for the one that ended
        (``first`` says how). SetupError if none can be had."""
        self.conn.close()
        try:
            self.open()
        except SetupError as exc:
            raise SetupError(f"{first}, and a new one failed: {exc}{may_have_run}") from None

    # -- the start, across a connection that ends under it --------------
    def start_unit(self, props, aux, fds, tether_unit: str, strategy, warnings: list[str]) -> str | None:
        """StartTransientUnit (the start job's path); once more on a fresh
        connection if ours ended under the call.

        A connection of the CLI's own can end mid-call (seen once in CI:
        ECONNRESET from the private socket, the manager busy with 8 runs).
        The command never starts twice: whether the first request reached
        the manager is read from this run's tether scope, created by the
        same call and kept while our tether process lives (the unit itself
        may already be collected if its command exited at once). Not taken:
        the call is made again. Taken: the strategy decides
        (``request_taken_reply_lost``: a scope's command is still held at
        its gate, never ran: 125; a service was started by that request:
        adopted, and None is returned). A Runner's shared connection is not
        retried: the session counts as lost, and the Runner reconnects for
        later runs.
        """
        try:
            return self.manager.start_transient_unit(self.unit, props, aux, fds=fds)
        except BusDisconnected as exc:
            if not self.replaceable:
                raise
            first = f"the manager connection ended while starting {self.unit} ({exc})"
        direct = self.direct
        self.replace(first, strategy.may_have_run)
        unknown = ""
        try:
            taken = self.manager.unit_loaded(tether_unit)
        except BusError as exc:
            taken = None
            unknown = f"{first}; whether the manager had taken it could not be asked ({_why(exc)})"
        if taken is False:
            if (self.conn.unique_name is None) != direct:
                # The unit's properties were chosen for the first transport (AddRef only on the bus).
                raise SetupError(
                    f"{first}; the manager had not taken it, and it is not asked again: a new "
                    "connection would use another transport"
                )
            job = self.manager.start_transient_unit(self.unit, props, aux, fds=fds)
            warnings.append(f"{first}; the manager had not taken the request: asked again on a new connection")
            return job
        strategy.request_taken_reply_lost(first, taken, unknown)
        return None

    def wait_started(self, job: str, handle_signal: Callable, strategy, replaced: Callable[[], None]) -> str | None:
        """The start job's result; None when the connection ended while it ran.

        The manager had taken the request (its reply named the job), so the
        unit exists: on a new connection (``replaced()`` told, for the
        record, before anything may raise) the strategy decides as after a
        lost reply (see ``start_unit``)."""
        try:
            return wait_job(self.conn, job, handle_signal, what=self.unit)
        except BusDisconnected as exc:
            if not self.replaceable:
                raise
            first = f"the manager connection ended while {self.unit} was starting ({exc})"
        self.replace(first, strategy.may_have_run)
        replaced()
        strategy.request_taken_reply_lost(first, True, "")
        return None

    def unit_state(self) -> tuple[bool, str | None]:
        """(the unit is loaded, its ActiveState if so): BusError if the manager cannot say."""
        loaded = self.manager.unit_loaded(self.unit)
        return loaded, self.manager.get(self.unit, UNIT, "ActiveState") if loaded else None

    def read_pending(self) -> None:
        """What the manager has sent; a connection that ends is marked dead, not raised."""
        try:
            self.conn.read_pending()
        except BusError as exc:
            self.dead = True
            if self.lost_at is None:
                self.lost_at = time.monotonic()
            if self.manager.lost is None:
                self.manager.lost = str(exc)

    def reconnect(self, populated: Callable[[], list[int]]) -> tuple[bool, str | None] | None:
        """Once the unit runs and the connection has ended: one bounded
        attempt at a new one, at most every RECONNECT_EVERY. The unit's
        state as the new manager tells it (a re-executed manager
        deserialises its units), or None while there is no answer to
        believe: no connection, or the unit unknown while ``populated()``
        still lists processes in its group (not collected: a collected
        unit's group is empty and gone; asked again on the next attempt)."""
        if not self.replaceable or time.monotonic() < self._next_attempt:
            return None
        self._next_attempt = time.monotonic() + RECONNECT_EVERY
        lost = self.manager.lost
        try:
            self.conn.close()
        except Exception:
            pass
        try:
            self.open(RECONNECT_TIMEOUT)
            loaded, state = self.unit_state()
        except (BusError, SetupError, OSError) as exc:
            self.manager.lost = lost or str(exc)
            return None
        if not loaded and populated():
            self.conn.close()
            return None
        self.conn.timeout = RUNTIME_CALL_TIMEOUT
        self.dead, self.lost_at = False, None
        return loaded, state

    def within_window(self) -> bool:
        """A run of its own whose connection ended less than RECONNECT_WINDOW ago."""
        return self.replaceable and time.monotonic() - (self.lost_at or 0) < RECONNECT_WINDOW

    def close(self) -> None:
        """A session's channel: just stop routing to it."""
        if not self.closed:
            self.closed = True
            self.conn.close()
