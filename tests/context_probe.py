"""The caller's process context, set up and read back, for the parity matrix.

    python3 context_probe.py wrap OUT SETTINGS -- ARGV...
        a caller with a context of its own (what SETTINGS names: rlimits,
        descriptors, namespaces, credentials, scheduling, signals,
        environment, umask, cwd, stdio) runs ARGV (a corral, or the probe
        itself as the bare command); what it set up goes to OUT.wrap
    python3 context_probe.py probe OUT [FILE]
        run under ARGV: what the process got, as JSON, to OUT (the status
        lines as exec gave them, read by ``probe``'s shell first: Python
        changes its own signal dispositions when it starts)

Names are never matched: every value is the kernel's (/proc/self/*, fstat).
"""

import ctypes
import json
import os
import resource
import signal
import socket
import sys

#: Each rlimit (its number: Python's resource module lacks some) and the
#: soft value the wrapper gives it (capped at its hard limit): values no
#: manager or service would have by chance.
RLIMITS = {
    "RLIMIT_CPU": (0, 100_001),
    "RLIMIT_FSIZE": (1, 987_654_321_000),
    "RLIMIT_DATA": (2, 98_765_432_100),
    "RLIMIT_STACK": (3, 7 << 20),
    "RLIMIT_CORE": (4, 12_345 * 4096),
    "RLIMIT_RSS": (5, 123_456_789_000),
    "RLIMIT_NPROC": (6, 54_321),
    "RLIMIT_NOFILE": (7, 777),
    "RLIMIT_MEMLOCK": (8, 3 << 16),
    "RLIMIT_AS": (9, 171_798_691_840),
    "RLIMIT_LOCKS": (10, 4_321),
    "RLIMIT_SIGPENDING": (11, 4_321),
    "RLIMIT_MSGQUEUE": (12, 654_321),
    "RLIMIT_NICE": (13, 0),
    "RLIMIT_RTPRIO": (14, 0),
    "RLIMIT_RTTIME": (15, 999_999),
}
#: The capability sets as exec left them.
CAPABILITIES = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
#: The status lines the probe reports.
STATUS = ("Groups", "NoNewPrivs", "Seccomp", "Seccomp_filters", "SigBlk", "SigIgn", "Cpus_allowed_list", "Umask")
STATUS += CAPABILITIES
NAMESPACES = ("net", "mnt", "pid", "user", "uts", "ipc", "cgroup")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _seccomp_allow_all() -> None:
    """A seccomp filter that allows every call: enough for Seccomp: 2 and Seccomp_filters: 1."""

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    program = (SockFilter * 1)(SockFilter(0x06, 0, 0, 0x7FFF0000))  # BPF_RET|BPF_K, SECCOMP_RET_ALLOW
    fprog = SockFprog(1, program)
    _check(_libc.prctl(22, 2, ctypes.byref(fprog), 0, 0))  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def _identity(fd: int) -> list:
    st = os.fstat(fd)
    return [oct(st.st_mode & 0o170000), st.st_dev, st.st_ino, st.st_rdev]


def wrap(out: str, settings: set, argv: list[str]) -> int:
    """Fork the caller: it sets up its context and execs ``argv``; this
    process holds the other ends of its stdio (a socket's peer, a terminal's
    master) until it has exited, and returns its exit status."""
    root = os.geteuid() == 0
    expect: dict = {"settings": sorted(settings)}
    pty_master = None
    peers = []
    if "stdio" in settings:
        stdin_r, stdin_w = os.pipe()
        os.write(stdin_w, b"stdin\n")
        os.close(stdin_w)
        out_sock, peer = socket.socketpair()
        peers.append(peer)
        pty_master, pty_slave = os.openpty()
        stdio = (stdin_r, out_sock.fileno(), pty_slave)
        expect["stdio"] = [_identity(fd) for fd in stdio]
    if "procsub" in settings:
        sub_r, sub_w = os.pipe()
        argv = [*argv, "/dev/fd/63"]
    pid = os.fork()
    if pid == 0:
        try:
            if "stdio" in settings:
                for target, fd in enumerate(stdio):
                    os.dup2(fd, target)
            if "procsub" in settings:
                os.dup2(sub_r, 63)
            if "fd7" in settings:
                os.dup2(os.open("/etc/hostname", os.O_RDONLY), 7)
            if "rlimits" in settings:
                for which, value in RLIMITS.values():
                    soft, hard = resource.getrlimit(which)
                    want = value if hard == resource.RLIM_INFINITY else min(value, hard)
                    resource.setrlimit(which, (want, hard))
            if "netns" in settings:
                _check(_libc.unshare(0x40000000))  # CLONE_NEWNET
            if "userns" in settings:  # a user namespace, this uid as root in it (as `unshare -r`)
                uid, gid = os.getuid(), os.getgid()
                _check(_libc.unshare(0x10000000))  # CLONE_NEWUSER
                for name, text in (("uid_map", f"0 {uid} 1"), ("setgroups", "deny"), ("gid_map", f"0 {gid} 1")):
                    with open(f"/proc/self/{name}", "w") as f:
                        f.write(text)
            if "pidns" in settings:  # a pid namespace, the host's /proc (as `unshare -fp`)
                _check(_libc.unshare(0x20000000))  # CLONE_NEWPID
                # It is for children: its init (pid 1) waits, the caller is the init's child (pid 2).
                for _ in range(2):
                    inner = os.fork()
                    if inner:
                        os._exit(os.waitstatus_to_exitcode(os.waitpid(inner, 0)[1]) & 0xFF)
            if "mountns" in settings:  # a mount namespace with a mount of its own
                _check(_libc.unshare(0x00020000))  # CLONE_NEWNS
                _check(_libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None))  # MS_REC | MS_PRIVATE
                where = os.environ["CTX_MOUNT_DIR"]
                _check(_libc.mount(b"tmpfs", where.encode(), b"tmpfs", 0, None))
                with open(os.path.join(where, "only-here"), "w") as f:
                    f.write("mounted")
            if "closed" in settings:
                for fd in (0, 1, 2):
                    os.close(fd)
            if "groups" in settings and root:
                os.setgroups([4, 24])
            if "nnp" in settings:
                _check(_libc.prctl(38, 1, 0, 0, 0))  # PR_SET_NO_NEW_PRIVS
            if "seccomp" in settings:
                _seccomp_allow_all()
            if "nice" in settings:
                os.nice(7)
            if "affinity" in settings and os.cpu_count() and os.cpu_count() > 1:
                os.sched_setaffinity(0, {0})
            if "oom" in settings:
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("123")
            if "signals" in settings:
                signal.signal(signal.SIGHUP, signal.SIG_IGN)  # corral resets it (a stop signal)
                signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # stays ignored, as across exec
                signal.signal(signal.SIGWINCH, signal.SIG_IGN)  # corral resets it (it watches it)
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # corral unblocks everything
            if "env" in settings:
                for name in ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE"):
                    os.environ.pop(name, None)  # the C locale: Python would coerce it (PEP 538)
                os.environ["CTX_ODD"] = "two words\nand a line"
            if "umask" in settings:
                os.umask(0o027)
            if "cwd" in settings:
                os.chdir(os.environ["CTX_CWD"])
            with open(out + ".caller", "w") as f:  # what the caller is, as it execs
                json.dump({"ns": _namespaces(), "pid": os.getpid()}, f)
            os.execvp(argv[0], argv)
        except BaseException as exc:  # noqa: BLE001  (its stderr may be anything: say it in a file)
            with open(out + ".error", "w") as f:
                f.write(f"context_probe wrap: {exc!r}\n")
        os._exit(99)
    if "procsub" in settings:
        os.close(sub_r)
        os.write(sub_w, b"procsub\n")  # as bash's <(echo procsub)
        os.close(sub_w)
    if "stdio" in settings:
        for fd in stdio:
            os.close(fd)
    expect["caller_pid"] = pid
    with open(out + ".wrap", "w") as f:
        json.dump(expect, f)
    status = os.waitpid(pid, 0)[1]
    if pty_master is not None:
        os.close(pty_master)
    return os.waitstatus_to_exitcode(status)


def probe(out: str, procsub: str | None) -> None:
    status = {}
    with open(out + ".status") as f:  # this process's, read before Python started (see probe's shell)
        for line in f:
            name, _, value = line.partition(":")
            if name in STATUS:
                status[name] = value.strip()
    with open("/proc/self/limits") as f:
        limits = f.read().splitlines()[1:]
    report = {
        "limits": {line[:26].strip(): line[26:].split()[:2] for line in limits},
        "status": status,
        "ns": _namespaces(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "oom_score_adj": open("/proc/self/oom_score_adj").read().strip(),
        "env": sorted(_environ(out + ".environ")),
        "cwd": os.getcwd(),
        "fd7": _identity(7) if _open(7) else None,
        "procsub": open(procsub).read() if procsub else None,
        "stdio": [_identity(fd) if _open(fd) else None for fd in (0, 1, 2)],
        "stdio_flags": [_flags(fd) for fd in (0, 1, 2)],
        "mount_file": _read(os.path.join(os.environ.get("CTX_MOUNT_DIR", "/nonexistent"), "only-here")),
        "ppid": os.getppid(),
        "pid": os.getpid(),
        "sid": os.getsid(0),
    }
    with open(out, "w") as f:
        json.dump(report, f)


def _environ(path: str) -> list[str]:
    """The environment as exec gave it (probe's shell saved /proc/$$/environ), each entry as repr(NAME)=repr(VALUE)."""
    with open(path, "rb") as f:
        entries = [e for e in f.read().split(b"\0") if e]
    return [f"{name!r}={value!r}" for name, _, value in (e.partition(b"=") for e in entries)]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _namespaces() -> dict:
    return {
        name: os.readlink(f"/proc/self/ns/{name}") for name in NAMESPACES if os.path.exists(f"/proc/self/ns/{name}")
    }


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _flags(fd: int):
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            return next(line.split()[1] for line in f if line.startswith("flags:"))
    except (OSError, StopIteration):
        return None


if __name__ == "__main__":
    if sys.argv[1] == "wrap":
        dash = sys.argv.index("--")
        sys.exit(wrap(sys.argv[2], set(sys.argv[3].split(",")) - {""}, sys.argv[dash + 1 :]))
    probe(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
