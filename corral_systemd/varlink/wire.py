"""Varlink messages on a unix stream socket, with file descriptors.

A message is one JSON object followed by a NUL byte. A call is
``{"method": "iface.Method", "parameters": {...}}``; its reply
``{"parameters": {...}}`` or ``{"error": "iface.Error", "parameters": {...}}``.
File descriptors ride with a message's bytes (SCM_RIGHTS); parameters name
them by index.

Bounds (a peer is not trusted to be well-formed): a message is at most
``MAX_MESSAGE`` bytes and carries at most ``MAX_FDS`` descriptors. Anything
else — a longer message, more descriptors, truncated ancillary data, bytes
that are not a JSON object, end of file inside a message — is a
``ProtocolError``; the descriptors received with it are closed first, and
the connection is not usable after it.

Imports only ``os``, ``sys``, ``_socket`` and ``common.jsoncodec`` (not
``json``): the CLI's client side runs this on every ``corral`` start.
"""

import _socket
import os
import sys

from ..common import jsoncodec
from ..kernel.fdpass import received, rights

MAX_MESSAGE = 4 << 20  # a call carries an argv and an environment: generous, still bounded
MAX_FDS = 8
_CMSG_SPACE = _socket.CMSG_SPACE(MAX_FDS * 4)
_UCRED = 12  # struct ucred: pid, uid, gid (int32 each)


class ProtocolError(Exception):
    """The peer broke the protocol (or went away mid-message)."""


class VarlinkError(Exception):
    """A Varlink error reply: ``name`` (``iface.Error``) and its ``parameters``."""

    def __init__(self, name: str, parameters: dict | None = None):
        super().__init__(name)
        self.name = name
        self.parameters = parameters or {}


def encode(message: dict) -> bytes:
    # ASCII: argv and environment may hold undecodable bytes as lone surrogates
    # (os.fsdecode); escaped, they survive the trip and decode to the same surrogates.
    return jsoncodec.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\0"


def peer_credentials(sock) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected, as the kernel recorded it."""
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _UCRED)
    return tuple(int.from_bytes(raw[i : i + 4], sys.byteorder, signed=True) for i in (0, 4, 8))  # type: ignore[return-value]


def connect_bound(address: str, timeout: float, unseen: bool = False):
    """(a connection to the unix socket ``address``, the pid of the process that
    bound it, as the kernel recorded it) or None: nothing is bound there, or a
    process of another uid is. An abstract name (``\\0...``) cannot be taken
    from a live process, so the pid is its holder's. ``unseen``: a process outside
    this one's pid namespace (the kernel says pid 0) is answered with pid 0, not None."""
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
        pid, uid, _gid = peer_credentials(sock)
    except OSError:
        sock.close()
        return None
    if uid != os.geteuid() or pid < 0 or (pid == 0 and not unseen):
        sock.close()
        return None
    return sock, pid


def close_fds(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Channel:
    """One Varlink connection over a connected unix stream socket.

    Not thread-safe: one reader and one writer at a time. Received
    descriptors are the caller's to close (they are O_CLOEXEC).
    """

    def __init__(self, sock):
        self.sock = sock
        self._buffer = bytearray()
        self._fds: list[int] = []

    def send(self, message: dict, fds=()) -> None:
        data = encode(message)
        if fds:
            sent = self.sock.sendmsg([data], rights(fds))
            data = data[sent:]
        if data:
            self.sock.sendall(data)

    def close(self) -> None:
        """Close the connection, and the descriptors of a message not yet whole
        (a call given up midway: its timeout), which no caller would see."""
        close_fds(self._fds)
        self._fds = []
        self.sock.close()

    def buffered(self) -> bool:
        """A whole message is already read: ``receive()`` returns it without
        reading the socket (which may not poll readable for it)."""
        return b"\0" in self._buffer

    def receive(self) -> tuple[dict, list[int]] | None:
        """The next message and the descriptors that came with it; None at
        end of file between messages. ProtocolError for anything malformed."""
        while True:
            end = self._buffer.find(b"\0")
            if end >= 0:
                raw = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                fds, self._fds = self._fds, []
                try:
                    message = jsoncodec.loads(raw.decode(), allow_nan=False)
                except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deep
                    close_fds(fds)
                    raise ProtocolError("a message that is not JSON") from None
                if not isinstance(message, dict):
                    close_fds(fds)
                    raise ProtocolError("a message that is not a JSON object")
                return message, fds
            if len(self._buffer) > MAX_MESSAGE:
                self._fail(f"a message longer than {MAX_MESSAGE} bytes")
            data, ancillary, flags, _ = self.sock.recvmsg(65536, _CMSG_SPACE, _socket.MSG_CMSG_CLOEXEC)
            self._fds += received(ancillary)
            if flags & _socket.MSG_CTRUNC or len(self._fds) > MAX_FDS:
                self._fail(f"more than {MAX_FDS} file descriptors with a message")
            if not data:
                if self._buffer or self._fds:
                    self._fail("end of file inside a message")
                return None
            self._buffer += data

    def _fail(self, why: str):
        close_fds(self._fds)
        self._fds = []
        self._buffer.clear()
        raise ProtocolError(why)

    def call(self, method: str, parameters: dict, fds=()) -> tuple[dict, list[int]]:
        """Send a call and wait for its one reply: (parameters, fds), or
        VarlinkError for an error reply, ProtocolError if none came.

        A service that refuses a connection (PermissionDenied, Busy) says so
        at once and closes: a call sent after that fails with EPIPE, and the
        refusal waiting unread is the answer, not the broken pipe."""
        try:
            self.send({"method": method, "parameters": parameters}, fds)
        except (BrokenPipeError, ConnectionResetError) as exc:
            try:
                got = self.receive()
            except (OSError, ProtocolError):
                got = None
            if got is None or "error" not in got[0]:
                if got is not None:
                    close_fds(got[1])
                raise exc from None
        else:
            got = self.receive()
        if got is None:
            raise ProtocolError("the service closed the connection without a reply")
        reply, reply_fds = got
        if "error" in reply:
            close_fds(reply_fds)
            raise VarlinkError(str(reply["error"]), reply.get("parameters") or {})
        return reply.get("parameters") or {}, reply_fds
