"""The cgroup tier found without being named: the delegated cgroup v2 subtree corral runs in.

Where a container gives its processes a cgroup v2 subtree of their own
(Podman with ``--security-opt unmask=/sys/fs/cgroup --cgroups=split``, a
``--privileged`` container, Kubernetes' WritableCgroups, systemd-nspawn,
LXC), corral's auto mode runs each command in a child group of it, as
``--cgroup-parent`` does with a directory named (``cgroupv2.CgroupEngine``:
the same engine, the same proof). ``find_subtree`` says whether there is one:

- ``/sys/fs/cgroup`` is a cgroup2 mount (pure v2; a hybrid layout's
  ``/sys/fs/cgroup/unified`` is not looked at, so a hybrid host behaves as
  before);
- corral's own group (``0::X`` in /proc/self/cgroup) is a directory corral
  may write (the group and its ``cgroup.procs``) and has ``cgroup.kill``;
- it is not a systemd unit's group that was not delegated (a ``.scope``,
  ``.service`` or ``.slice`` without the manager's ``delegate`` mark):
  the manager owns those.

The no-internal-processes rule: the kernel enables a controller for the
children of a group (``cgroup.subtree_control``) only while the group itself
holds no process. So when corral is alone in its group (a container's PID
1, say) and a limit needs a controller, it moves itself into a leaf of its
own (``corral-supervisor-<pid>``) and enables what the limits need (each
write idempotent: concurrent corrals may do it too). When other processes
share its group (a container's shell), corral does not move them: the
controllers stay off, and the limits are watched or not enforced, said on
stderr and in the record (``limits_enforced``), exactly as for a
``--cgroup-parent`` that does not delegate them. cgroup.kill, the
``populated`` flag and ``cpu.stat`` need no controller.

A leaf cannot be removed by the process in it: corral's own stays (empty
once corral has exited) and the next corral removes it — an rmdir, which
the kernel refuses while a process is in it, so another live corral's is
never taken. Nothing in the subtree that the command could write steers
this: the command may write its own group, but the proof is the kernel's
``populated 0`` and a successful rmdir of the run's group (``CgroupEngine``).
"""

import errno
import os

from ..common.errors import SetupError
from ..common.plainclass import field, plainclass
from ..common.unit_names import PREFIX
from ..kernel import cgroupfs
from ..kernel.fsread import read_bytes, write_bytes

#: Where a pure cgroup v2 layout mounts the hierarchy.
ROOT = "/sys/fs/cgroup"
#: corral's own leaf, when it leaves its group to enable controllers.
LEAF_PREFIX = f"{PREFIX}supervisor-"
#: A systemd unit's group, owned by its manager unless delegated.
_UNIT_SUFFIXES = (".scope", ".service", ".slice")


@plainclass
class Subtree:
    """The delegated group corral runs in: ``path`` (its directory), where
    each run gets a child group."""

    path: str
    #: What the limits cannot get here, for ``engine.warnings``.
    warnings: list[str] = field(default_factory=list)


def find_subtree() -> Subtree:
    """The delegated cgroup v2 subtree corral runs in, or SetupError saying
    in a few words why there is none (auto's ladder keeps it)."""
    mounts = cgroupfs.Mounts()
    if mounts.unified != ROOT:
        where = f"cgroup2 is at {mounts.unified}" if mounts.unified else "no cgroup2 mount"
        raise SetupError(f"{ROOT} is not a cgroup2 mount ({where})")
    own = cgroupfs.proc_cgroup(os.getpid(), "0")
    if own is None or not own.startswith("/"):
        raise SetupError("no cgroup v2 entry in /proc/self/cgroup")
    path = os.path.normpath(ROOT + own)
    if os.path.basename(path).startswith(LEAF_PREFIX):
        path = os.path.dirname(path)  # corral's own leaf, left by an earlier start of this process
    if not os.path.isdir(path):
        raise SetupError(f"corral's cgroup {own} is not under {ROOT}")
    if not (os.access(path, os.W_OK) and os.access(os.path.join(path, "cgroup.procs"), os.W_OK)):
        raise SetupError(f"corral's cgroup {own} is not delegated to it (cannot write)")
    if not os.path.exists(os.path.join(path, "cgroup.kill")):
        raise SetupError(f"{path} has no cgroup.kill (Linux 5.14 or later)")
    if os.path.basename(path).endswith(_UNIT_SUFFIXES) and not _delegated_by_manager(path):
        raise SetupError(f"corral's cgroup {own} is a systemd unit's, not delegated")
    return Subtree(path)


def _delegated_by_manager(path: str) -> bool:
    """Did systemd mark ``path`` delegated (``Delegate=yes``: its xattr)?"""
    for name in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(path, name) == b"1":
                return True
        except OSError:
            continue
    return False


def prepare(subtree: Subtree, controllers_needed: set[str]) -> None:
    """Make ``controllers_needed`` available to the children of ``subtree``
    where the kernel allows; what cannot be had is left to the limits'
    ``write_limits`` (watched or not enforced) with a warning here saying why."""
    remove_stale_leaves(subtree.path)
    wanted = controllers_needed & cgroupfs.controllers(subtree.path)
    enabled = cgroupfs.controllers(subtree.path, "cgroup.subtree_control")
    if not wanted - enabled:
        return
    others = [pid for pid in _procs(subtree.path) if pid != os.getpid()]
    if others:
        subtree.warnings.append(
            f"{subtree.path} holds other processes ({' '.join(map(str, others[:5]))}"
            f"{' ...' if len(others) > 5 else ''}): the kernel enables no controller for its children "
            f"then (no internal processes), so {', '.join(sorted(wanted - enabled))} cannot hold the run"
        )
        return
    _move_into_leaf(subtree.path)
    for name in sorted(wanted - enabled):
        try:
            write_bytes(os.path.join(subtree.path, "cgroup.subtree_control"), f"+{name}".encode())
        except OSError as exc:  # EBUSY: a process came in meanwhile
            subtree.warnings.append(f"cannot enable the {name} controller in {subtree.path}: {exc.strerror}")


def _move_into_leaf(path: str) -> None:
    """corral's process into ``path/corral-supervisor-<pid>`` (made if need be)."""
    leaf = os.path.join(path, f"{LEAF_PREFIX}{os.getpid()}")
    for _ in range(3):  # another corral's stale-leaf removal may take it between mkdir and the move
        try:
            os.mkdir(leaf)
        except FileExistsError:
            pass
        except OSError as exc:
            raise SetupError(f"cannot create {leaf}: {exc.strerror}") from None
        try:
            write_bytes(os.path.join(leaf, "cgroup.procs"), b"0")
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                raise SetupError(f"cannot move corral into {leaf}: {exc.strerror}") from None
    raise SetupError(f"cannot move corral into {leaf}: removed each time")


def remove_stale_leaves(path: str) -> None:
    """Remove the empty leaves corrals left (a leaf with a process in it,
    another live corral's, is refused by the kernel: EBUSY)."""
    try:
        names = os.listdir(path)
    except OSError:
        return
    for name in names:
        if name.startswith(LEAF_PREFIX) and name != f"{LEAF_PREFIX}{os.getpid()}":
            try:
                os.rmdir(os.path.join(path, name))
            except OSError:
                pass


def _procs(path: str) -> list[int]:
    try:
        return [int(x) for x in read_bytes(os.path.join(path, "cgroup.procs")).split()]
    except OSError:
        return []
