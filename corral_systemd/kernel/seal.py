"""A sealed run: the command where no hand-off channel outside the run can be
reached (``--handoff deny``; ``--network none`` too), and where it cannot
undo that -- and the check that it is so.

``apply`` runs in the forked child, before the gate and the exec:

1. a mount namespace, and with ``--network none`` a network namespace
   whose ``lo`` it brings up. Root makes them as root; another user in a
   user namespace of its own first (its uid and gid mapped to themselves),
   which owns them;
2. every mount a slave: nothing mounted below propagates back out;
3. every channel's path hidden (``handoff.Mask``): ``/dev/null`` bound over
   a socket, an empty read-only tmpfs on a spool or manager directory, an
   empty tmpfs of the command's own (0700) on a terminal multiplexer's
   socket directory (a server the command starts itself works there);
4. a user namespace for the command, its uid and gid mapped to themselves
   and ``setgroups`` denied, as systemd's ``PrivateUsers=`` maps a root
   service. The namespaces of 1 belong to the user namespace above the
   command's: it holds no capability over them, so it cannot unmount or
   cover what hides the channels, nor configure the network; it cannot
   join another network namespace (``setns`` needs ``CAP_SYS_ADMIN`` over
   it, root included), and the kernel's ptrace check refuses it another
   process's ``/proc/PID/root``, ``/proc/PID/ns/*`` and ``/proc/PID/fd``
   outside its user namespace (corral's own, ``$PPID``, included).

Root's command keeps root's power over root's own files and loses it over
everything else (other users' files, processes, devices, the machine).

Then ``why_not_sealed`` asks the kernel: the user and mount namespaces are
not corral's, each masked path shows no socket and each masked directory
is empty, a mask cannot be unmounted, corral's network namespace cannot be
opened, and with ``--network none`` only ``lo`` is there (``netns``). Any
failure is reported to corral, which never lets the command run (125).

The same check for a service's unit, as a shell script (``CHECK_SCRIPT``):
systemd's ``PrivateUsers=``, ``BindReadOnlyPaths=``,
``TemporaryFileSystem=`` and ``PrivateNetwork=`` do 1 to 4 there.
"""

import os
import stat

from . import libc, netns
from . import namespaces as ns
from .handoff import Mask
from .namespaces import map_self, mount, preloaded, set_dumpable

#: The record's ``network`` for --network none made this way.
HOW = "userns+netns"


class Seal:
    """What the child needs to seal itself, found in corral before the fork."""

    def __init__(self, masks: list[Mask], network: bool):
        self.masks = list(masks)
        self.network = network
        #: The option that asked for it, for the one line that says it failed.
        self.what = "--network none" if network else "--handoff deny"
        self.host_net = netns.current()
        self.host_user = os.readlink("/proc/self/ns/user")
        self.host_mnt = os.readlink("/proc/self/ns/mnt")
        self.uid, self.gid = os.geteuid(), os.getegid()
        self._libc = preloaded()

    # -- in the child ----------------------------------------------------
    def apply(self) -> None:
        """Seal this process (see the module's docstring). Raises OSError
        (the kernel refused) or RuntimeError (it is not sealed)."""
        net = ns.CLONE_NEWNET if self.network else 0
        # Our own /proc/self files (uid_map, ...) are ours to write only while
        # we are dumpable; a parent that is not (the Python client) passed that on.
        set_dumpable(self._libc)
        if self.uid == 0:
            self._unshare(ns.CLONE_NEWNS | net)
        else:
            self._unshare(ns.CLONE_NEWUSER | ns.CLONE_NEWNS | net)
            self._map_self()
        if self.network:
            netns.loopback_up()
        self._mount(None, "/", None, ns.MS_REC | ns.MS_SLAVE)
        for mask in self.masks:
            if mask.how == "socket":
                self._mount("/dev/null", mask.path, None, ns.MS_BIND)
            elif mask.how == "spool":
                flags = ns.MS_RDONLY | ns.MS_NOSUID | ns.MS_NODEV | ns.MS_NOEXEC
                self._mount("tmpfs", mask.path, "tmpfs", flags, "mode=0555,size=4k")
            else:
                options = f"mode=0700,uid={self.uid},gid={self.gid}"
                self._mount("tmpfs", mask.path, "tmpfs", ns.MS_NOSUID | ns.MS_NODEV, options)
        self._unshare(ns.CLONE_NEWUSER)
        self._map_self()
        if (why := self.why_not_sealed()) is not None:
            raise RuntimeError(why)

    def why_not_sealed(self) -> str | None:
        """Why this process is not sealed (None: it is); see the module's docstring."""
        try:
            if os.readlink("/proc/self/ns/user") == self.host_user:
                return "it shares corral's user namespace"
            if os.readlink("/proc/self/ns/mnt") == self.host_mnt:
                return "it shares corral's mount namespace"
        except OSError as exc:
            return f"its namespaces cannot be read ({exc.strerror or exc})"
        for mask in self.masks:
            if (why := _visible(mask)) is not None:
                return why
        if self.masks and self._libc.umount2(os.fsencode(self.masks[0].path), ns.MNT_DETACH) == 0:
            return f"it could unmount what hides {self.masks[0].path}"
        try:
            os.close(os.open(f"/proc/{os.getppid()}/ns/net", os.O_RDONLY | os.O_CLOEXEC))
            return "it could open corral's network namespace (nsenter --net=/proc/$PPID/ns/net)"
        except OSError:
            pass
        if self.network:
            return netns.why_not_isolated(self.host_net)
        return None

    def _unshare(self, flags: int) -> None:
        if self._libc.unshare(flags) != 0:
            raise libc.errno_error("unshare")

    def _mount(self, source, target, fstype, flags: int, data: str | None = None) -> None:
        mount(self._libc, source, target, fstype, flags, data)

    def _map_self(self) -> None:
        """This user namespace maps only our own uid and gid (setgroups denied)."""
        map_self(self.uid, self.gid)


def _visible(mask: Mask) -> str | None:
    """Why ``mask``'s path still shows what it should hide (None: hidden)."""
    try:
        if mask.how == "socket":
            if stat.S_ISSOCK(os.lstat(mask.path).st_mode):
                return f"{mask.path} is still a socket"
        elif os.listdir(mask.path):
            return f"{mask.path} is not empty"
    except FileNotFoundError:
        return None
    except OSError as exc:
        if mask.how != "socket":
            return None  # unreadable: nothing in it can be reached either
        return f"{mask.path} cannot be checked ({exc.strerror or exc})"
    return None


#: ``why_not_sealed`` inside a unit, as ExecStartPre=: $1 is corral's network
#: namespace ("" without --network none), $2 corral's user namespace, then each
#: mask as HOW:PATH. Exits 0 (sealed), or one of these:
CHECK_USERNS = 244
CHECK_VISIBLE = 245
CHECK_JOIN = 246
CHECK_SCRIPT = (
    'u=$(readlink /proc/self/ns/user) || exit 244; [ "$u" != "$2" ] || exit 244; '
    "! readlink /proc/1/ns/net >/dev/null 2>&1 || exit 246; "
    'net=$1; shift 2; for m in "$@"; do p=${m#*:}; case $m in '
    'socket:*) [ ! -S "$p" ] || exit 245;; '
    '*) [ ! -d "$p" ] || [ -z "$(ls -A "$p" 2>/dev/null)" ] || exit 245;; esac; done; '
    '[ -z "$net" ] && exit 0; set -- "$net"; ' + netns.CHECK_SCRIPT
)
