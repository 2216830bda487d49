"""Namespace plumbing shared by a sealed run (``kernel.seal``) and the PID
namespace tier (``engines.pidns``): a child cloned straight into new
namespaces, a user namespace that maps its own uid and gid to themselves, a
mount made through libc, a fresh /proc.

``clone_into`` is ``os.fork`` with namespace flags: the child is this
process's own child (waitable, with a pidfd from ``clone3``), and the pid
namespace among ``flags`` is the child's own (it is its pid 1), not only its
children's as ``unshare`` would make it. Python's fork bookkeeping runs on
both sides (``PyOS_BeforeFork`` / ``AfterFork_*``), and the syscall is made
holding the GIL (``PyDLL``), so the child starts in the state ``os.fork``
leaves it in; like ``os.fork``, only from a process whose other threads hold
no lock the child will need.

Failure modes: ``clone_into`` raises OSError with the kernel's errno: EPERM
(no privilege, unprivileged user namespaces forbidden by sysctl, AppArmor or
a seccomp filter), ENOSPC (a namespace count limit, ``user.max_user_namespaces``),
EINVAL (a kernel without the namespace).
"""

import _signal  # not signal: the same numbers without enum's start-up cost
import os

from . import libc

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
_CLONE_PIDFD = 0x1000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND = 4096
MS_REC = 16384
MS_SLAVE = 1 << 19
MNT_DETACH = 2
PR_SET_DUMPABLE = 4
#: The initial user namespace's inode number (a constant of the kernel's: ``USER_NS_INIT_INO``).
_INITIAL_USER_NS = 0xEFFFFFFD

_SYS_CLONE3 = 435  # the same number on every architecture
_SYS_CLONE = {"x86_64": 56, "aarch64": 220, "ppc64le": 120, "s390x": 120, "riscv64": 220}


def preloaded():
    """libc's unshare, mount, umount2 and prctl, errno kept (``os.unshare``
    is Python 3.12's), looked up now: load them before a fork, call them in the child."""
    lib = libc.library()
    for name in ("unshare", "mount", "umount2", "prctl", "syscall"):
        getattr(lib, name)
    return lib


def mount(lib, source, target, fstype, flags: int, data: str | None = None) -> None:
    """mount(2) through ``lib`` (``preloaded()``); OSError naming ``target`` if refused."""
    args = [None if s is None else os.fsencode(s) for s in (source, target, fstype, data)]
    if lib.mount(args[0], args[1], args[2], flags, args[3]) != 0:
        raise libc.errno_error(f"mount {target}")


def map_self(uid: int, gid: int) -> None:
    """This process's user namespace (new, unmapped) maps only ``uid`` and
    ``gid`` to themselves, ``setgroups`` denied. The process must be
    dumpable (its /proc/self files are its own only then)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def mount_own_proc(lib) -> None:
    """In a mount namespace of this process's own whose pid namespace it
    leads: nothing mounted here propagates out (every mount a slave), and a
    /proc for its pid namespace.

    Every /proc the mount namespace was copied with is detached (with
    whatever is mounted below it), so that unmounting the new one shows an
    empty directory. In the initial user namespace (root) first: nothing is
    locked there, and the kernel asks for no other /proc to be visible before
    it mounts one. In any other the kernel mounts a /proc only while one is
    fully visible: the new one is made first, attached nowhere (``fsmount``),
    then the copies are detached, then it is attached at /proc. A copy made
    into a user namespace below its parent's is locked (no process may
    unmount it): it stays below the new one, which a command without
    CAP_SYS_ADMIN over this mount namespace cannot unmount either (where the
    new mount API is refused, the new one goes over every copy the same way).

    OSError if refused (a container's /proc with masked paths is not "fully
    visible": a user namespace may not mount another), if a /proc of the
    host's is left where none may be, or if /proc does not show this process
    as pid 1."""
    mount(lib, None, "/", None, MS_REC | MS_SLAVE)
    initial = os.stat("/proc/self/ns/user").st_ino == _INITIAL_USER_NS
    if initial:
        _detach_procs(lib)
        mount(lib, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        if _proc_mounts() != [b"/proc"]:
            raise OSError(0, "a /proc of the host's could not be detached")
    else:
        try:
            fresh = _detached_proc(lib)
        except OSError:  # no fsmount (seccomp, an old kernel): over the copies
            mount(lib, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        else:
            try:
                _detach_procs(lib)
                if lib.syscall(_c(_SYS_MOVE_MOUNT), _c(fresh), b"", _c(_AT_FDCWD), b"/proc", _c(4)) != 0:
                    raise libc.errno_error("move_mount /proc")  # 4: MOVE_MOUNT_F_EMPTY_PATH
            finally:
                os.close(fresh)
    if os.readlink("/proc/self") != str(os.getpid()):
        raise OSError(0, "the new /proc does not number this namespace's processes")


#: fsopen(2) and its kin: one number on every architecture (Linux 5.2).
_SYS_MOVE_MOUNT, _SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT = 429, 430, 431, 432
_AT_FDCWD = -100


def _c(value: int) -> libc.c_long:
    return libc.c_long(value)


def _detached_proc(lib) -> int:
    """A descriptor of a new proc mount of this pid namespace, attached nowhere:
    the kernel checks a /proc is fully visible when it is made (``fsmount``)."""
    fs = lib.syscall(_c(_SYS_FSOPEN), b"proc", _c(1))  # FSOPEN_CLOEXEC
    if fs < 0:
        raise libc.errno_error("fsopen proc")
    try:
        if lib.syscall(_c(_SYS_FSCONFIG), _c(fs), _c(6), None, None, _c(0)) != 0:  # FSCONFIG_CMD_CREATE
            raise libc.errno_error("fsconfig proc")
        # FSMOUNT_CLOEXEC; MOUNT_ATTR_NOSUID | NODEV | NOEXEC
        fresh = lib.syscall(_c(_SYS_FSMOUNT), _c(fs), _c(1), _c(0x2 | 0x4 | 0x8))
        if fresh < 0:
            raise libc.errno_error("fsmount proc")
        return fresh
    finally:
        os.close(fs)


def _detach_procs(lib) -> None:
    """Detach every /proc of this mount namespace's (a locked one refuses: it stays listed)."""
    for point in reversed(_proc_mounts()):  # a stacked or nested one before the one below it
        lib.umount2(point, MNT_DETACH)


def _proc_mounts() -> list[bytes]:
    """Where a proc file system is mounted in this process's mount namespace,
    in mount order (its /proc/self/mountinfo)."""
    with open("/proc/self/mountinfo", "rb") as f:
        lines = f.read().splitlines()
    points = []
    for line in lines:
        fields, _, fs = line.partition(b" - ")
        if fs.split(b" ", 1)[0] == b"proc":
            points.append(_unescaped(fields.split()[4]))
    return points


def _unescaped(field: bytes) -> bytes:
    """A mountinfo field with its octal escapes (``\\040`` for a space; a
    backslash is ``\\134``) made bytes again. By hand: ``re`` costs every
    run's start more than this."""
    head, *escaped = field.split(b"\\")
    out = [head]
    for part in escaped:
        code = part[:3]
        if len(code) == 3 and all(0x30 <= digit <= 0x37 for digit in code):
            out.append(bytes([int(code, 8) & 0xFF]) + part[3:])
        else:
            out.append(b"\\" + part)
    return b"".join(out)


#: struct clone_args (Linux 5.3): eleven 64-bit fields, of which these are set.
#: An array, not a Structure: a Structure's fields make Python 3.14's _ctypes
#: import the ctypes module (its layout code), at every run's start.
_CLONE_ARGS_FIELDS = 11
_FLAGS, _PIDFD, _EXIT_SIGNAL = 0, 1, 4


def clone_into(flags: int) -> tuple[int, int]:
    """Fork into new namespaces (``CLONE_NEW*`` ``flags``): (pid, pidfd) in
    the parent, (0, -1) in the child. See the module's docstring."""
    pidfd = libc.c_int(-1)
    args = (libc.c_uint64 * _CLONE_ARGS_FIELDS)()
    args[_FLAGS], args[_PIDFD], args[_EXIT_SIGNAL] = flags | _CLONE_PIDFD, libc.addressof(pidfd), _signal.SIGCHLD
    api = libc.pythonapi()  # the GIL stays held across each call
    api.syscall.restype = libc.c_long
    # Every symbol looked up before the clone: a lookup takes the loader's lock,
    # which a raw clone (unlike fork) does not make usable again in the child.
    syscall, before = api.syscall, api.PyOS_BeforeFork
    child, parent = api.PyOS_AfterFork_Child, api.PyOS_AfterFork_Parent
    before()
    pid = syscall(_SYS_CLONE3, libc.byref(args), libc.sizeof(args))
    err = libc.get_errno() if pid < 0 else 0
    if pid < 0 and err == 38 and (number := _SYS_CLONE.get(os.uname().machine)) is not None:
        # ENOSYS: clone3 filtered (Docker's seccomp profile does), the old clone is allowed.
        pid = syscall(number, libc.c_ulong(flags | _signal.SIGCHLD), None, None, None, None)
        err = libc.get_errno() if pid < 0 else 0
        pidfd.value = -2
    if pid == 0:
        child()
        return 0, -1
    parent()
    if pid < 0:
        raise OSError(err, os.strerror(err))
    return pid, pidfd.value if pidfd.value >= 0 else os.pidfd_open(pid)


def set_dumpable(lib, dumpable: bool = True) -> None:
    """Dumpable: this process's /proc/self files are its own to write (a
    parent that was not dumpable passed that on). Not dumpable: its /proc/PID
    files are root's, and another process may open its descriptors
    (/proc/PID/fd), read its memory or ptrace it only with CAP_SYS_PTRACE over
    the user namespace of its address space (where it last exec'd; a clone
    that did not exec: its parent's), which root of the initial one keeps; an
    ``execve`` of a program the process may read makes it dumpable again."""
    lib.prctl(PR_SET_DUMPABLE, int(dumpable), 0, 0, 0)
