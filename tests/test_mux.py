"""The shared manager connection of a library Runner (dbus/mux.py, the session).

After ``systemctl daemon-reexec`` returns, the old manager's private
connections are closed, but the Runner's reader thread may not have run
since: a run started on that session then failed (seen in CI as
``test_runner_survives_a_manager_reexec``, once in a while). The session
counts as lost as soon as the kernel says the manager's end is closed.
"""

import socket
import threading
from collections import deque

from corral_systemd.dbus.connection import BusDisconnected
from corral_systemd.dbus.mux import Multiplexer
from corral_systemd.engines.systemd.session import SystemdSession


class _HeldReaderConnection:
    """What a Multiplexer uses of a Connection, over a socketpair. Its
    reader is held in ``read_pending`` until released: a reader thread that
    has not been scheduled yet."""

    unique_name = None

    def __init__(self):
        self.sock, self.peer = socket.socketpair()
        self.signals: deque = deque()
        self._replies: dict = {}
        self.release = threading.Event()

    def read_pending(self) -> None:
        self.release.wait(30)
        if not self.sock.recv(4096):
            raise BusDisconnected("the bus closed the connection")

    def close(self) -> None:
        self.sock.close()


def test_a_session_is_lost_once_the_manager_closed_its_end_before_the_reader_saw_it():
    conn = _HeldReaderConnection()
    mux = Multiplexer(conn)  # type: ignore[arg-type]
    session = object.__new__(SystemdSession)
    session._mux = mux
    try:
        assert not session.lost
        conn.peer.close()  # daemon-reexec: the manager's end goes away
        assert mux.lost is None  # the reader has not got there
        assert session.lost
    finally:
        conn.release.set()
        mux.close()
    assert mux.lost is not None and session.lost
