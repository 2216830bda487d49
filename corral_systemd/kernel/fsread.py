"""Reading small kernel files (procfs, cgroupfs) with the fewest syscalls.

``open()`` costs fstat, ioctl (isatty) and lseek besides open/read/close;
each is also a point where a threaded host (a library Runner) hands the GIL
to another thread. These files are small and read whole.
"""

import os

_CHUNK = 65536


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
