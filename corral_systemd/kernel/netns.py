"""``--network none``: a network namespace that holds only a loopback
interface, up -- and the check that it is so.

``kernel.seal`` makes the namespace in the forked child (a sealed run: the
command cannot reach the service managers and buses either, nor join
another network namespace) and brings ``lo`` up (``loopback_up``).
``why_not_isolated`` asks the kernel: the namespace is not the one corral
runs in, and ``/proc/self/net/dev`` lists ``lo`` and nothing else.
``listening`` tells from outside whether a TCP port listens inside a run's
namespace (a background run's --ready-port).

The same check, as a shell script (``CHECK_SCRIPT``), ends ``seal.CHECK_SCRIPT``
inside a service's unit, where systemd made the namespace (PrivateNetwork=).
"""

import fcntl
import os
import socket
import struct
import sys

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def current(pid: int | str = "self") -> str:
    """The network namespace of ``pid`` as the kernel names it ("net:[4026531840]")."""
    return os.readlink(f"/proc/{pid}/ns/net")


def interfaces(pid: int | str = "self") -> list[str]:
    """The interfaces of ``pid``'s network namespace (``/proc/PID/net/dev``)."""
    with open(f"/proc/{pid}/net/dev") as f:
        return [line.split(":", 1)[0].strip() for line in f if ":" in line]


def why_not_isolated(host: str, pid: int | str = "self") -> str | None:
    """Why ``pid``'s network is not an isolated one (None: it is)."""
    try:
        if current(pid) == host:
            return "it shares corral's network namespace"
        found = interfaces(pid)
    except OSError as exc:
        return f"its network namespace cannot be read ({exc.strerror or exc})"
    if found != ["lo"]:
        return f"its network namespace holds {', '.join(found) or 'no interface'}, not only lo"
    return None


def listening(pid: int, starttime: int, port: int) -> bool | None:
    """Does a TCP socket listen on ``port`` (for 127.0.0.1 or ::1: bound to
    either, or to every address) in the network namespace of ``pid``, the
    process started at ``starttime`` (clock ticks, /proc/PID/stat)?

    Read from /proc/PID/net/tcp and tcp6, which list the sockets of that
    process's namespace, not the reader's: no setns, no privilege (a connect
    from here would reach this namespace's port instead). A listening socket
    is what a connect to it finds: the kernel completes the handshake. The
    process is pinned by its /proc directory, opened first and checked by
    its start time; every file is read through that descriptor, so a pid
    reused meanwhile is never read as the process. None: it is not that
    process (gone, its pid reused), or it shares this process's namespace
    (nothing would tell the run's port from the host's); when the namespace
    link cannot be read (a process that is not dumpable), its sockets are
    taken as they are."""
    try:
        proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if _starttime(_read_at(proc, "stat")) != starttime:
            return None
        try:
            theirs, ours = os.stat("ns/net", dir_fd=proc), os.stat("/proc/self/ns/net")
            if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
                return None
        except PermissionError:
            pass
        for name, family in (("net/tcp", socket.AF_INET), ("net/tcp6", socket.AF_INET6)):
            try:
                table = _read_at(proc, name)
            except FileNotFoundError:
                continue  # no IPv6 in this kernel
            if _listens(table, family, port):
                return True
        return False
    except (OSError, ValueError, IndexError):
        return None  # gone while read
    finally:
        os.close(proc)


#: /proc/net/tcp's state of a listening socket; the addresses a connect to 127.0.0.1 or ::1 reaches.
_LISTEN = b"0A"
_REACHED = {"0.0.0.0", "127.0.0.1", "::", "::1", "::ffff:127.0.0.1"}


def _listens(table: bytes, family: int, port: int) -> bool:
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != _LISTEN:
            continue
        address, _, hex_port = fields[1].partition(b":")
        if int(hex_port, 16) == port and _address(address, family) in _REACHED:
            return True
    return False


def _address(text: bytes, family: int) -> str:
    """/proc/net/tcp's address: 32-bit words in hexadecimal, each in this machine's byte order."""
    words = [int(text[i : i + 8], 16) for i in range(0, len(text), 8)]
    raw = b"".join(word.to_bytes(4, sys.byteorder) for word in words)
    return socket.inet_ntop(family, raw)


def _starttime(stat: bytes) -> int:
    # comm may hold spaces and parentheses: the fields after the last ')'; starttime is field 22.
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def _read_at(directory: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=directory)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def loopback_up() -> None:
    """Bring ``lo`` up in this network namespace (the caller holds CAP_NET_ADMIN over it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        # struct ifreq: the name, then ifr_flags in a 24-byte union.
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


#: ``why_not_isolated`` inside a unit, as ExecStartPre=: $1 is corral's own
#: namespace. Exits 0 (isolated), CHECK_SHARED or CHECK_INTERFACES.
CHECK_SHARED = 241
CHECK_INTERFACES = 242
CHECK_SCRIPT = (
    'ns=$(readlink /proc/self/ns/net) || exit 242; [ "$ns" != "$1" ] || exit 241; n=0; '
    "while IFS= read -r line; do case $line in *:*) n=$((n+1)); name=${line%%:*}; "
    'name=$(echo $name); [ "$name" = lo ] || exit 242;; esac; done < /proc/self/net/dev; '
    '[ "$n" = 1 ] || exit 242'
)
