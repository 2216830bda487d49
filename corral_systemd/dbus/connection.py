"""Blocking D-Bus connection: connect, authenticate (EXTERNAL), call, receive.

Failure modes, all raised as ``BusError`` with a one-line reason: no such
socket, connection refused, authentication rejected, timeout, error reply
(``BusError.name`` holds the D-Bus error name).
"""

import select
import socket
import threading
import time
from collections import deque

from ..common import baton
from ..kernel.fdpass import rights
from ._dbus_fast import Message, MessageFlag, MessageType, Unmarshaller

_BUS = "org.freedesktop.DBus"


def wait_fd(fd: int, timeout: float) -> bool:
    """poll() one fd for input (select() fails on fds >= FD_SETSIZE, common in servers).

    A library Runner's run gives its baton up while it waits (``baton.py``)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(baton.poll(poller, max(0.0, timeout) * 1000))


def _wait_writable(fd: int, timeout: float) -> bool:
    """Keeps the baton: called under the send lock, which another run may need."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return bool(poller.poll(max(0.0, timeout) * 1000))


def wait_until_peer_read(sock: socket.socket, timeout: float) -> None:
    """Return once the peer has read everything sent on ``sock`` (SIOCOUTQ is 0).

    systemd's own server (the manager's private socket, systemd 252)
    mishandles a message that arrives in the same read as BEGIN: read
    with the handshake, its file descriptors are lost and the connection
    is dropped (a service's StartTransientUnit: ECONNRESET), and one
    without waits unanswered until the manager wakes up for something
    else (measured: GetUnit sent together with BEGIN, no reply in 2 s).
    Known sd-bus bugs: the trailing SASL buffer's descriptors are not
    attached to the first message (systemd PR #5520, never merged), and a
    server may stay in its auth phase until more input comes (PR #24875).
    A busy manager reads late, so BEGIN and the first call could be
    queued together; this keeps them apart (it costs 30-150 us).
    """
    import fcntl
    import struct
    import termios

    end = time.monotonic() + timeout
    delay = 0.00005
    while True:
        try:
            queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        except OSError:
            return  # cannot tell here (not Linux, a sandbox): go on as before
        if not queued:
            return
        if time.monotonic() >= end:
            raise TimeoutError
        time.sleep(delay)
        delay = min(delay * 2, 0.002)


class BusError(Exception):
    def __init__(self, message: str, name: str | None = None):
        super().__init__(message)
        self.name = name


class BusDisconnected(BusError):
    """The connection ended (EOF, reset, a failed send) after it was up:
    nothing more can be sent or received on it. Unlike a timeout, a call
    in flight then may or may not have reached the other side."""


def _unix_address(address: str) -> str:
    """The socket path (abstract ones start with NUL) of the first unix address."""
    for part in address.split(";"):
        kind, _, params = part.partition(":")
        if kind != "unix":
            continue
        fields = dict(p.split("=", 1) for p in params.split(",") if "=" in p)
        if "path" in fields:
            return _unescape(fields["path"])
        if "abstract" in fields:
            return "\0" + _unescape(fields["abstract"])
    raise BusError(f"unsupported bus address {address!r} (need unix:path= or unix:abstract=)")


def _unescape(value: str) -> str:
    out, i = bytearray(), 0
    while i < len(value):
        if value[i] == "%":
            out.append(int(value[i + 1 : i + 3], 16))
            i += 3
        else:
            out += value[i].encode()
            i += 1
    return out.decode()


class Connection:
    """One connection to a bus (or a peer-to-peer manager socket)."""

    def __init__(self, address: str, *, timeout: float = 5.0, bus: bool = True):
        path = _unix_address(address)
        self.address = address
        self.timeout = timeout
        self._serial = 0
        self.signals: deque[Message] = deque()
        self._replies: dict[int, Message] = {}
        self._send_lock = threading.Lock()
        self.subscribed = False  # Manager.Subscribe done on this connection
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self.sock.settimeout(timeout)
            try:
                self.sock.connect(path)
            except FileNotFoundError:
                raise BusError(f"no bus socket at {path.lstrip(chr(0))}") from None
            except ConnectionRefusedError:
                raise BusError(f"connection refused at {path.lstrip(chr(0))} (bus not running)") from None
            except TimeoutError:
                raise BusError(f"timed out connecting to {path.lstrip(chr(0))}") from None
            except OSError as exc:
                raise BusError(f"cannot connect to {path.lstrip(chr(0))}: {exc.strerror}") from None
            self._authenticate(bus)
            self.sock.setblocking(False)
            # We send descriptors (a service's stdio) but never receive any:
            # without fd support the unmarshaller reads greedily, several
            # messages per recv() instead of two recvmsg() per message.
            self._unmarshaller = Unmarshaller(None, self.sock, False)
            self.unique_name = None
            if bus:
                self.unique_name = self.call(_BUS, "/org/freedesktop/DBus", _BUS, "Hello").body[0]
        except BaseException:
            self.sock.close()
            raise

    # -- handshake -----------------------------------------------------
    def _authenticate(self, bus: bool) -> None:
        try:
            # EXTERNAL with no identity: the server takes ours from the socket
            # (SO_PEERCRED), as sd-bus clients do. A uid we named ourselves is
            # this user namespace's, which the server, in another, refuses.
            # Its empty challenge ("DATA") is answered before it comes.
            self.sock.sendall(b"\0AUTH EXTERNAL\r\nDATA\r\n")
            reply = self._auth_line()
            if reply == b"DATA" or reply.startswith(b"DATA "):
                reply = self._auth_line()
            if not reply.startswith(b"OK "):
                raise BusError(f"bus refused authentication: {reply.decode(errors='replace')}")
            self.sock.sendall(b"NEGOTIATE_UNIX_FD\r\n")
            reply = self._auth_line()
            if not reply.startswith(b"AGREE_UNIX_FD"):
                raise BusError("bus does not pass file descriptors")
            self.sock.sendall(b"BEGIN\r\n")
            if not bus:
                wait_until_peer_read(self.sock, self.timeout)
        except TimeoutError:
            raise BusError("timed out authenticating to the bus") from None
        except OSError as exc:
            raise BusError(f"bus connection failed during authentication: {exc.strerror}") from None

    def _auth_line(self) -> bytes:
        line = b""
        while not line.endswith(b"\r\n"):
            chunk = self.sock.recv(1)  # byte by byte: nothing past the line may be consumed
            if not chunk:
                raise BusError("bus closed the connection during authentication")
            line += chunk
        return line[:-2]

    # -- sending -------------------------------------------------------
    def send(self, msg: Message, on_serial=None) -> int:
        """Send one message; returns its serial. Thread-safe: a shared
        connection (``mux.Multiplexer``) sends from many threads while its
        reader thread receives, so the socket stays non-blocking throughout
        and a full send buffer is waited out with poll(). ``on_serial``
        is called with the serial before any byte is sent."""
        with self._send_lock:
            self._serial += 1
            msg.serial = self._serial
            if on_serial is not None:
                on_serial(msg.serial)
            data = memoryview(bytes(msg._marshall(True)))
            ancillary = rights(msg.unix_fds)
            end = time.monotonic() + self.timeout
            total = len(data)
            try:
                while data:
                    try:
                        sent = self.sock.sendmsg([data], ancillary)
                    except BlockingIOError:
                        left = end - time.monotonic()
                        if left <= 0 or not _wait_writable(self.sock.fileno(), left):
                            raise BusError("timed out sending to the bus") from None
                        continue
                    data, ancillary = data[sent:], []  # the fds went with the first byte
            except OSError as exc:
                raise BusDisconnected(f"bus connection lost while sending: {exc}") from None
            finally:
                if data and len(data) != total:
                    # Half a message is on the stream: nothing after it can be
                    # understood. End the connection so every user sees it lost.
                    try:
                        self.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            return msg.serial

    def call(self, destination, path, interface, member, signature="", body=(), *, fds=(), timeout=None) -> Message:
        """Call a method and wait for its reply. Raises BusError on an error reply."""
        msg = Message(
            destination=destination,
            path=path,
            interface=interface,
            member=member,
            signature=signature,
            body=list(body),
            unix_fds=list(fds),
        )
        serial = self.send(msg)
        reply = self.wait_reply(serial, self.timeout if timeout is None else timeout)
        if reply.message_type == MessageType.ERROR:
            text = reply.body[0] if reply.body else reply.error_name
            raise BusError(f"{member}: {text}", reply.error_name)
        return reply

    def call_no_reply(self, destination, path, interface, member, signature="", body=()) -> None:
        """Send a method call and do not wait: the bus sends no reply (and
        no error) for it. For nudges whose effect arrives as a signal."""
        self.send(
            Message(
                destination=destination,
                path=path,
                interface=interface,
                member=member,
                signature=signature,
                body=list(body),
                flags=MessageFlag.NO_REPLY_EXPECTED,
            )
        )

    def wait_reply(self, serial: int, timeout: float) -> Message:
        end = time.monotonic() + timeout
        while serial not in self._replies:
            left = end - time.monotonic()
            if left <= 0:
                raise BusError(f"no reply from the bus within {timeout:g}s")
            if not wait_fd(self.sock.fileno(), left):
                continue
            self.read_pending()
        return self._replies.pop(serial)

    # -- receiving -----------------------------------------------------
    def read_pending(self) -> None:
        """Read whatever the socket holds; queue signals, file replies.

        The end of the connection is reported (``BusDisconnected``) by the
        first read that gets nothing before it: messages that arrived just
        before the end (a reply the peer sent before a daemon-reexec closed
        it) are delivered first, and the socket, which polls readable at its
        end for ever, makes the next read report it."""
        delivered = False
        while True:
            try:
                msg = self._unmarshaller.unmarshall()
            except EOFError:
                if delivered:
                    return
                raise BusDisconnected("the bus closed the connection") from None
            except OSError as exc:
                if delivered:
                    return
                raise BusDisconnected(f"bus connection lost: {exc}") from None
            if msg is None:
                return
            delivered = True
            if msg.message_type == MessageType.SIGNAL:
                self.signals.append(msg)
            elif msg.message_type in (MessageType.METHOD_RETURN, MessageType.ERROR):
                self._replies[msg.reply_serial] = msg
            # Method calls to us (none expected) are ignored.

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()
