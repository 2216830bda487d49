"""inotify(7): a descriptor that turns readable when a watched file or directory changes.

Waiting on it is a blocked poll(): no timer, nothing spent until the kernel
has an event. ``Inotify`` is non-blocking and close-on-exec; ``watch`` follows
the path to its inode when it is opened (a /proc/PID/fd/N link gives the open
file itself, whatever its name has become since), so a watch is on a file,
not on a name. Used by a session's holder (its sessions directory) and a
background run's log keeper (``core.logkeeper``: the log's IN_MODIFY).

Failure modes: OSError with the kernel's errno: EMFILE (the user's
``fs.inotify.max_user_instances``, or this process's descriptors), ENOSPC
(``fs.inotify.max_user_watches``), ENOENT/ENOTDIR for a path that is gone,
ENOSYS where libc or the kernel has no inotify. The queue can overflow
(IN_Q_OVERFLOW): events are lost, never the fact that something changed.
"""

import os
import struct

from . import libc

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000

#: struct inotify_event: wd, mask, cookie, len; then len bytes of name.
_EVENT = struct.Struct("iIII")


class Inotify:
    """One inotify instance: ``watch`` paths, poll ``fileno()``, ``read()`` what came."""

    def __init__(self):
        self._libc = libc.library()
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise libc.errno_error("inotify_init1")

    def fileno(self) -> int:
        return self.fd

    def watch(self, path: str, mask: int) -> int:
        """Watch ``path`` (its inode, as it is now) for ``mask``; the watch descriptor."""
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            raise libc.errno_error(f"inotify_add_watch {path}")
        return wd

    def read(self) -> list[tuple[int, int, bytes]]:
        """The events queued now, as (wd, mask, name); [] if none (never waits)."""
        events: list[tuple[int, int, bytes]] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return events
            if not data:
                return events
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                events.append((wd, mask, name))
                offset += _EVENT.size + length

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
