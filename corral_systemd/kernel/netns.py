"""``--network none``: the command in a network namespace of its own that
holds only a loopback interface, up -- and the check that it is so.

``isolate`` runs in the forked child, before the gate and the exec: root
gets a new network namespace; another user a new user namespace first (its
own uid and gid mapped to themselves, nothing else), which owns the new
network namespace and lets the child bring ``lo`` up. Then ``why_not_isolated``
asks the kernel: the namespace is not the one corral runs in, and
``/proc/self/net/dev`` lists ``lo`` and nothing else. Any failure (user
namespaces disabled, a seccomp filter, no ``lo``) is reported to corral,
which then never lets the command run (125): isolation asked for is never
silently absent.

The same check, as a shell script (``CHECK_SCRIPT``), runs inside a
service's unit as ExecStartPre=, where systemd made the namespace
(PrivateNetwork=).
"""

import fcntl
import os
import socket
import struct

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1

#: How the namespace was made, for the record (see ``isolate``).
AS_ROOT = "netns"
AS_USER = "userns+netns"


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


def how() -> str:
    return AS_ROOT if os.geteuid() == 0 else AS_USER


def isolate(host: str) -> None:
    """In the child: a network namespace of its own with ``lo`` up, verified.

    Raises OSError (the kernel refused) or RuntimeError (it is not isolated).
    """
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        _unshare(_CLONE_NEWNET)
    else:
        _unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    _loopback_up()
    if (why := why_not_isolated(host)) is not None:
        raise RuntimeError(why)


def libc_unshare():
    """unshare(2) (``os.unshare`` is Python 3.12's): load it before forking,
    so the child only calls it."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True).unshare


_libc_unshare = None


def prepare() -> None:
    """In the parent, before fork: what ``isolate`` needs, loaded."""
    global _libc_unshare
    if _libc_unshare is None:
        _libc_unshare = libc_unshare()


def _unshare(flags: int) -> None:
    unshare = _libc_unshare or libc_unshare()
    if unshare(flags) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")


def _loopback_up() -> None:
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
