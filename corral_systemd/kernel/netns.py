"""``--network none``: a network namespace that holds only a loopback
interface, up -- and the check that it is so.

``kernel.seal`` makes the namespace in the forked child (a sealed run: the
command cannot reach the service managers and buses either, nor join
another network namespace) and brings ``lo`` up (``loopback_up``).
``why_not_isolated`` asks the kernel: the namespace is not the one corral
runs in, and ``/proc/self/net/dev`` lists ``lo`` and nothing else.

The same check, as a shell script (``CHECK_SCRIPT``), ends ``seal.CHECK_SCRIPT``
inside a service's unit, where systemd made the namespace (PrivateNetwork=).
"""

import fcntl
import os
import socket
import struct

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
