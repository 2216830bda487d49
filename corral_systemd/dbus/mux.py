"""One manager connection shared by many concurrent runs.

A library ``Runner`` keeps one connection to the manager for all its runs.
A reader thread owns the receiving side: it routes each reply to the call
waiting for its serial and each signal to the ``Channel`` of the unit it is
about (PropertiesChanged by object path; JobRemoved, UnitRemoved by unit
name). Signals about other units are dropped after one unmarshal. That
matters on the manager's private socket, where every connection receives
every unit's signals: with a connection per run, 8 runs in flight would
each unmarshal all 8 runs' signals.

A ``Channel`` looks like a ``Connection`` to the engine: ``call``,
``signals``, ``read_pending``, ``fileno`` (an eventfd that turns readable
when a signal for its unit is queued), ``timeout``, ``close``.

Failure modes: when the connection ends (manager gone, EOF, error), every
pending and later call raises ``BusError`` with ``name=None`` (which the
``Manager`` wrapper takes as "manager lost"), and every channel's fd turns
readable so its supervisor notices at once.
"""

import os
import select
import threading
from collections import deque

from ..common import baton
from ._dbus_fast import Message, MessageType
from .connection import BusDisconnected, BusError, Connection

_MANAGER_PATH = "/org/freedesktop/systemd1"
#: Manager signals whose first string argument names the unit ...
_BY_FIRST_ARG = {"UnitNew": 0, "UnitRemoved": 0}
#: ... or whose third does (JobNew/JobRemoved: id, job path, unit[, result]).
_BY_THIRD_ARG = {"JobNew": 2, "JobRemoved": 2}


class _PendingCall:
    __slots__ = ("event", "reply")

    def __init__(self):
        self.event = threading.Event()
        self.reply: Message | None = None


class Multiplexer:
    """Share ``conn`` between threads. Takes ownership of ``conn``."""

    def __init__(self, conn: Connection):
        self._conn = conn
        self.unique_name = conn.unique_name
        self._lock = threading.Lock()
        self._pending: dict[int, _PendingCall] = {}
        self._by_unit: dict[str, Channel] = {}
        self._by_path: dict[str, Channel] = {}
        self.lost: str | None = None
        self._thread = threading.Thread(target=self._read_loop, name="corral-dbus-reader", daemon=True)
        self._thread.start()

    # -- used by channels ------------------------------------------------
    def channel(self, unit: str, path: str) -> "Channel":
        chan = Channel(self, unit, path)
        with self._lock:
            self._by_unit[unit] = chan
            self._by_path[path] = chan
        return chan

    def _drop_locked(self, chan: "Channel") -> None:
        if self._by_unit.get(chan.unit) is chan:
            del self._by_unit[chan.unit]
        if self._by_path.get(chan.path) is chan:
            del self._by_path[chan.path]

    def _call(self, msg: Message, timeout: float) -> Message:
        pending = _PendingCall()

        def register(serial: int) -> None:
            # Under the send lock, before the bytes leave: the reply cannot
            # reach the reader before its serial is known.
            with self._lock:
                if self.lost is not None:
                    raise BusDisconnected(f"the bus connection ended: {self.lost}")
                self._pending[serial] = pending

        serial = None
        try:
            serial = self._conn.send(msg, on_serial=register)
            if not baton.wait_event(pending.event, timeout):  # the baton is free meanwhile
                raise BusError(f"no reply from the bus within {timeout:g}s")
        finally:
            if serial is not None:
                with self._lock:
                    self._pending.pop(serial, None)
        if pending.reply is None:
            raise BusDisconnected(f"the bus connection ended: {self.lost}")
        return pending.reply

    # -- the reader thread -------------------------------------------------
    def _read_loop(self) -> None:
        conn = self._conn
        poller = select.poll()  # not select(): the host may hold fds >= FD_SETSIZE
        poller.register(conn.sock, select.POLLIN)
        try:
            while True:
                poller.poll()
                conn.read_pending()
                self._route(conn)
        except Exception as exc:  # any failure ends the connection for all runs, loudly
            reason = f"{type(exc).__name__}: {exc}" if not isinstance(exc, BusError) else str(exc)
        try:
            self._route(conn)
        except Exception:
            pass
        with self._lock:
            self.lost = reason
            pending, self._pending = list(self._pending.values()), {}
            for call in pending:
                call.event.set()
            for chan in self._by_unit.values():
                chan._wake()

    def _route(self, conn: Connection) -> None:
        if conn._replies:
            replies, conn._replies = conn._replies, {}
            with self._lock:
                for serial, reply in replies.items():
                    call = self._pending.get(serial)
                    if call is not None:
                        call.reply = reply
                        call.event.set()
        while conn.signals:
            msg = conn.signals.popleft()
            with self._lock:  # a channel is closed (its eventfd too) only under this lock
                chan = self._channel_for(msg)
                if chan is not None:
                    chan._deliver(msg)

    def _channel_for(self, msg: Message) -> "Channel | None":
        member = msg.member
        if member is None or msg.path is None:
            return None
        if member == "PropertiesChanged":
            return self._by_path.get(msg.path)
        if msg.path != _MANAGER_PATH:
            return None
        index = _BY_FIRST_ARG.get(member, _BY_THIRD_ARG.get(member))
        if index is None:
            return None
        try:
            return self._by_unit.get(msg.body[index])
        except (IndexError, TypeError):
            return None

    def peer_closed(self) -> bool:
        """The manager's end of the connection is closed, as the kernel says
        now, whether or not the reader thread has got to it yet. After
        ``systemctl daemon-reexec`` returns, every private connection of the
        old manager is closed, but the reader may not have run since: a run
        started on it then would fail."""
        poller = select.poll()
        poller.register(self._conn.sock, select.POLLRDHUP)  # POLLHUP and POLLERR come unasked
        return bool(poller.poll(0))

    def close(self) -> None:
        """End the reader thread and the connection (idempotent)."""
        import socket

        try:
            self._conn.sock.shutdown(socket.SHUT_RDWR)  # the reader sees EOF
        except OSError:
            pass
        self._thread.join(5.0)
        self._conn.close()


class Channel:
    """One unit's view of a shared connection, with Connection's interface."""

    def __init__(self, mux: Multiplexer, unit: str, path: str):
        self._mux = mux
        self.unit = unit
        self.path = path
        self.unique_name = mux.unique_name
        self.timeout = 10.0
        self.signals: deque[Message] = deque()
        self._efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)

    def call(self, destination, path, interface, member, signature="", body=(), *, fds=(), timeout=None) -> Message:
        msg = Message(
            destination=destination,
            path=path,
            interface=interface,
            member=member,
            signature=signature,
            body=list(body),
            unix_fds=list(fds),
        )
        reply = self._mux._call(msg, self.timeout if timeout is None else timeout)
        if reply.message_type == MessageType.ERROR:
            text = reply.body[0] if reply.body else reply.error_name
            raise BusError(f"{member}: {text}", reply.error_name)
        return reply

    def call_no_reply(self, destination, path, interface, member, signature="", body=()) -> None:
        if self._mux.lost is not None:
            raise BusDisconnected(f"the bus connection ended: {self._mux.lost}")
        self._mux._conn.call_no_reply(destination, path, interface, member, signature, body)

    def _deliver(self, msg: Message) -> None:  # reader thread
        self.signals.append(msg)
        self._wake()

    def _wake(self) -> None:  # under the multiplexer's lock
        if self._efd >= 0:
            os.eventfd_write(self._efd, 1)

    def read_pending(self) -> None:
        """Signals are already queued by the reader; clear the wakeup."""
        try:
            os.eventfd_read(self._efd)
        except (BlockingIOError, OSError):
            pass
        if self._mux.lost is not None and not self.signals:
            raise BusDisconnected(f"the bus connection ended: {self._mux.lost}")

    def fileno(self) -> int:
        return self._efd

    def close(self) -> None:
        with self._mux._lock:  # never while the reader writes to the eventfd
            self._mux._drop_locked(self)
            if self._efd >= 0:
                os.close(self._efd)
                self._efd = -1
