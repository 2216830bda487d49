"""Descriptors passed over a unix socket (SCM_RIGHTS): packed and unpacked in one place.

The kernel's ancillary data holds C ints. They are packed here with
``int.to_bytes`` rather than ``array``, which imports ``collections.abc``
(about 1.4 ms of every start that passes a descriptor, issue 38).
"""

import _socket
import sys

#: sizeof(int) on every Linux ABI.
_INT = 4


def rights(fds) -> list[tuple[int, int, bytes]]:
    """``sendmsg``'s ancillary data that sends ``fds``; [] for none."""
    if not fds:
        return []
    packed = b"".join(fd.to_bytes(_INT, sys.byteorder, signed=True) for fd in fds)
    return [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, packed)]


def received(ancillary) -> list[int]:
    """The descriptors in ``recvmsg``'s ancillary data, in order (any other
    kind of data ignored; a truncated last int dropped)."""
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(data) - len(data) % _INT
            fds += [int.from_bytes(data[i : i + _INT], sys.byteorder, signed=True) for i in range(0, usable, _INT)]
    return fds
