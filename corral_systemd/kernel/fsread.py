"""Reading small kernel files (procfs, cgroupfs) with the fewest syscalls.

``open()`` costs fstat, ioctl (isatty) and lseek besides open/read/close;
each is also a point where a threaded host (a library Runner) hands the GIL
to another thread. These files are small and read whole.
"""

import errno
import os

_CHUNK = 65536

#: What a call fails with when the system (or a limit of ours the command
#: may lower) runs short: descriptors, memory, processes. Never "gone".
SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})


def raise_shortage(exc: OSError) -> None:
    """Re-raise ``exc`` if it is a shortage (``SHORTAGE``). A reader that
    takes a failed read for "the process or group is gone" calls this first:
    a file that could not be opened for want of a descriptor says nothing
    about what it describes, and taking it for absence is a false proof."""
    if exc.errno in SHORTAGE:
        raise exc


def read_bytes(path: str) -> bytes:
    """The whole file. Raises OSError like open() would."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, _CHUNK)
        if len(data) < _CHUNK:
            return data
        chunks = [data]
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to an existing (control) file in one write()."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
