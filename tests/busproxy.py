"""A stand-in for the manager's private socket that can end a connection mid-call.

``CuttingProxy(real_socket, directory, cut="before"|"after")`` listens at
``directory/systemd/private`` (point ``XDG_RUNTIME_DIR`` at ``directory``)
and forwards each connection to the real socket byte for byte, both ways,
with the file descriptors a client sends (a service's stdio). With
``slow_begin``, it reads a client's BEGIN 0.5 s late, as a busy manager
would (and whatever the client sent after it in the same read). The *first*
connection whose client sends a StartTransientUnit call is ended there
(``cut=None``: none is):

- ``cut="before"``: the call is never forwarded; the manager never sees it
  (the client's connection ends as with a reset before the request left);
- ``cut="after"``: the call is forwarded and the connection is ended once
  the manager shows the run's tether scope loaded (created by the same
  call: the request was acted on), the reply lost;
- ``cut="after-ended"``: as "after", but only once the unit itself is gone
  again (a command that exited at once, its unit collected);
- ``cut="job"``: the call and its reply (the start job's path) pass, then
  the connection ends before anything else reaches the client: the start
  job's JobRemoved is lost (a daemon-reexec while the job runs).

Later connections are forwarded untouched. ``connections`` counts them.
``cut_all()`` ends every connection open now, as a manager's daemon-reexec
does to its private socket's clients; new ones are forwarded again.
"""

import array
import os
import re
import socket
import threading
import time

from corral_systemd.dbus.connection import wait_until_peer_read
from modes import unit_property

_TRIGGER = b"StartTransientUnit"
_UNIT = re.compile(rb"corral-[0-9a-f]+\.(?:scope|service)")


class CuttingProxy:
    def __init__(self, real: str, directory: str, cut: str | None, slow_begin: bool = False):
        assert cut in (None, "before", "after", "after-ended", "job")
        self.real = real
        self.cut = cut
        self.slow_begin = slow_begin
        self.connections = 0
        self.cut_unit: str | None = None  # the unit whose call was cut
        self._done_cutting = False
        self._lock = threading.Lock()
        os.makedirs(os.path.join(directory, "systemd"), exist_ok=True)
        self.path = os.path.join(directory, "systemd", "private")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._listener.bind(self.path)
        self._listener.listen(16)
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._spawn(self._accept_loop)

    def _spawn(self, fn, *args) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            server.connect(self.real)
            with self._lock:
                self.connections += 1
                self._socks += [client, server]
            muted = threading.Event()  # set: the manager's replies are dropped
            self._spawn(self._client_to_server, client, server, muted)
            self._spawn(self._server_to_client, server, client, muted)

    def _client_to_server(self, client: socket.socket, server: socket.socket, muted: threading.Event) -> None:
        fd_size = socket.CMSG_SPACE(16 * array.array("i").itemsize)
        try:
            while True:
                data, ancillary, _, _ = client.recvmsg(65536, fd_size)
                fds = []
                for level, kind, payload in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds += array.array("i", payload[: len(payload) - len(payload) % 4])
                if not data:
                    break
                cutting = False
                with self._lock:
                    if _TRIGGER in data and not self._done_cutting:
                        self._done_cutting = cutting = self.cut is not None
                        found = _UNIT.search(data)
                        self.cut_unit = found.group().decode() if found else None
                if cutting and self.cut == "before":
                    for fd in fds:
                        os.close(fd)
                    break
                if cutting and self.cut == "job":
                    muted.job = True  # type: ignore[attr-defined]  # see _server_to_client
                elif cutting:
                    muted.set()  # the reply to this call must never reach the client
                server.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else [])
                for fd in fds:
                    os.close(fd)
                if data.endswith(b"BEGIN\r\n"):
                    _wait_until_read(server)  # as a client must
                elif self.slow_begin and b"NEGOTIATE_UNIX_FD" in data:
                    time.sleep(0.5)  # a busy manager: BEGIN, and whatever follows it, is read late
                if cutting and self.cut != "job":  # "after": let the manager act on it, then lose its reply
                    self._wait_taken(self.cut_unit)
                    break
        except OSError:
            pass
        for s in (client, server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _wait_taken(self, unit: str | None) -> None:
        if unit is None:
            return
        tether = unit.rsplit(".", 1)[0] + "-tether.scope"
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if unit_property(tether, "LoadState") == "loaded" and (
                self.cut != "after-ended" or unit_property(unit, "LoadState") != "loaded"
            ):
                return
            time.sleep(0.01)

    def _server_to_client(self, server: socket.socket, client: socket.socket, muted: threading.Event) -> None:
        if self.cut == "job":
            return self._server_to_client_by_message(server, client, muted)
        try:
            while data := server.recv(65536):
                if not muted.is_set():
                    client.sendall(data)
        except OSError:
            pass

    def _server_to_client_by_message(self, server: socket.socket, client: socket.socket, muted) -> None:
        """Forward the handshake's lines, then whole messages; once the
        StartTransientUnit call went out (``muted.job``), end the connection
        right after the first method reply (the call's: the client waits for
        it before its next call), dropping everything after it."""
        pending = b""
        try:
            while data := server.recv(65536):
                pending += data
                while pending:
                    if pending[:1] not in (b"l", b"B"):  # a handshake line (OK, AGREE_UNIX_FD...)
                        end = pending.find(b"\r\n")
                        if end < 0:
                            break
                        line, pending = pending[: end + 2], pending[end + 2 :]
                        client.sendall(line)
                        continue
                    size = _message_size(pending)
                    if size is None or size > len(pending):
                        break
                    message, pending = pending[:size], pending[size:]
                    client.sendall(message)
                    if getattr(muted, "job", False) and message[1] == _METHOD_RETURN:
                        _shut([client, server])
                        return
        except OSError:
            pass

    def cut_all(self) -> None:
        with self._lock:
            _shut(self._socks)

    def close(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone would not
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            _shut(self._socks)
            for s in self._socks:
                s.close()
        for t in self._threads:
            t.join(5)


_METHOD_RETURN = 2


def _message_size(data: bytes) -> int | None:
    """The length of the D-Bus message at the start of ``data`` (None: its
    fixed header has not all arrived). Messages after authentication only."""
    if len(data) < 16:
        return None
    order = "little" if data[:1] == b"l" else "big"
    body = int.from_bytes(data[4:8], order)
    fields = int.from_bytes(data[12:16], order)
    return 16 + fields + (-fields % 8) + body


def _shut(socks) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _wait_until_read(sock: socket.socket) -> None:
    try:
        wait_until_peer_read(sock, 5)
    except TimeoutError:
        pass  # the manager is stuck: the test fails on its own
