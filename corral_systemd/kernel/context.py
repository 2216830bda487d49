"""A process context carried to another process's child: what ``exec`` would inherit.

A session's background run is started by the session's holder (its child, so
the run is the holder's descendant), not by the corral the caller ran; what
the caller's own fork would have given the run must then be carried over:

- carried (``ProcessContext``, set in the holder's child by ``apply``): the
  environment, working directory (a descriptor, so a renamed or unreachable
  path still works), umask, every rlimit, nice, CPU affinity,
  ``oom_score_adj``, which signals are ignored (an ignored signal stays
  ignored across exec; the others start at their default), and the
  inheritable and ambient capability sets, lowered to the caller's
  (``kernel.capabilities``: what exec passes on; systemd 257's user manager
  gives its services an inheritable CAP_WAKE_ALARM a login shell lacks);
- not carried, so compared (``cannot_carry``): what a child of the holder
  cannot be given without privilege or at all: the uid, gids and groups,
  the bounding, permitted and effective capabilities, an inheritable or
  ambient capability the holder lacks (never raised), no-new-privs and a
  seccomp filter, the namespaces and the root directory, an rlimit above
  the holder's hard limit, a nice value or an ``oom_score_adj`` below the
  holder's. Where any differs, the caller's own fork is the only faithful
  way: the front then starts the run itself.

Descriptors 3 and up, the terminal and the session are a background run's
own by design (none of the caller's, its own session).
"""

import os
import resource

from ..common.plainclass import field, plainclass

#: Linux's rlimits, by name and number (Python's resource module lacks RLIMIT_LOCKS).
RLIMITS = {
    "RLIMIT_CPU": 0,
    "RLIMIT_FSIZE": 1,
    "RLIMIT_DATA": 2,
    "RLIMIT_STACK": 3,
    "RLIMIT_CORE": 4,
    "RLIMIT_RSS": 5,
    "RLIMIT_NPROC": 6,
    "RLIMIT_NOFILE": 7,
    "RLIMIT_MEMLOCK": 8,
    "RLIMIT_AS": 9,
    "RLIMIT_LOCKS": 10,
    "RLIMIT_SIGPENDING": 11,
    "RLIMIT_MSGQUEUE": 12,
    "RLIMIT_NICE": 13,
    "RLIMIT_RTPRIO": 14,
    "RLIMIT_RTTIME": 15,
}
#: What /proc/PID/status lines must read the same in the caller and the holder.
_SAME_STATUS = ("Uid", "Gid", "Groups", "NoNewPrivs", "Seccomp", "CapPrm", "CapEff", "CapBnd")
#: The capability sets the holder's child lowers to the caller's: the caller's must be within the holder's.
_LOWERED_STATUS = ("CapInh", "CapAmb")
_NAMESPACES = ("mnt", "net", "pid", "user", "ipc", "uts", "cgroup", "time")


@plainclass
class ProcessContext:
    env: dict[str, str]
    cwd: str
    umask: int
    rlimits: dict[str, list[int]]
    nice: int
    affinity: list[int] | None
    oom_score_adj: int | None
    ignored: list[int] = field(default_factory=list)
    #: The inheritable and ambient capability sets (None: a peer that did not say; the holder's own are kept).
    cap_inheritable: int | None = None
    cap_ambient: int | None = None

    @classmethod
    def here(cls, env: dict[str, str]) -> "ProcessContext":
        """This process's context, with ``env`` as its environment."""
        return cls._of(os.getpid(), env, os.getcwd())

    @classmethod
    def of_process(cls, pid: int) -> "ProcessContext":
        """Process ``pid``'s context as the kernel shows it: the environment its exec
        gave it (/proc/PID/environ, read as Python reads its own: the first of a
        name), its working directory's path, and the rest as ``here``. For a caller
        that cannot change them meanwhile (a compiled client waiting for its answer);
        of this uid and dumpable, else OSError."""
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
        env: dict[str, str] = {}
        for entry in raw.split(b"\0"):
            name, sep, value = entry.partition(b"=")
            if sep and name:
                env.setdefault(os.fsdecode(name), os.fsdecode(value))
        return cls._of(pid, env, os.readlink(f"/proc/{pid}/cwd"))

    @classmethod
    def _of(cls, pid: int, env: dict[str, str], cwd: str) -> "ProcessContext":
        from .capabilities import status_sets

        status = _status(pid)
        if status is None:
            raise OSError(f"process {pid}: its status cannot be read")
        inheritable, ambient = status_sets(status)
        return cls(
            env=dict(env),
            cwd=cwd,
            umask=int(status["Umask"], 8),
            rlimits={name: list(resource.prlimit(pid, number)) for name, number in RLIMITS.items()},
            nice=os.getpriority(os.PRIO_PROCESS, pid),
            affinity=sorted(os.sched_getaffinity(pid)) if hasattr(os, "sched_getaffinity") else None,
            oom_score_adj=_read_int(f"/proc/{pid}/oom_score_adj"),
            ignored=_ignored(status),
            cap_inheritable=inheritable,
            cap_ambient=ambient,
        )

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict) -> "ProcessContext":
        """The context a peer sent; ValueError if it is not one."""
        try:
            ctx = cls(**data)
        except TypeError as exc:
            raise ValueError(f"not a process context: {exc}") from None
        env = ctx.env
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("env: not a mapping of strings")
        if not isinstance(ctx.cwd, str) or type(ctx.umask) is not int or type(ctx.nice) is not int:
            raise ValueError("cwd, umask, nice: of the wrong type")
        if not isinstance(ctx.rlimits, dict) or not all(k in RLIMITS for k in ctx.rlimits):
            raise ValueError("rlimits: unknown names")
        if not all(v is None or (type(v) is int and 0 <= v < 1 << 64) for v in (ctx.cap_inheritable, ctx.cap_ambient)):
            raise ValueError("cap_inheritable, cap_ambient: not capability sets")
        return ctx

    def apply(self, cwd_fd: int) -> None:
        """In a freshly forked child (a session's run's corral): become this context
        (OSError if the kernel refuses a part of it; ``cannot_carry`` said beforehand
        it would not). The child is not dumpable, before and after: only for the
        moment of writing its own ``oom_score_adj`` is it (a process that is not owns
        none of its /proc files)."""
        import signal

        from .signals import CHILD_DEFAULTS

        os.fchdir(cwd_fd)
        os.umask(self.umask)
        for name, (soft, hard) in self.rlimits.items():
            resource.setrlimit(RLIMITS[name], (soft, hard))
        os.setpriority(os.PRIO_PROCESS, 0, self.nice)
        if self.affinity is not None:
            os.sched_setaffinity(0, self.affinity)
        if self.oom_score_adj is not None and self.oom_score_adj != _read_int("/proc/self/oom_score_adj"):
            from .prctl import set_dumpable

            set_dumpable(True)
            try:
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write(str(self.oom_score_adj))
            finally:
                set_dumpable(False)
        for signum in range(1, signal.NSIG):
            if signum in (signal.SIGKILL, signal.SIGSTOP) or signum in CHILD_DEFAULTS:
                continue
            try:
                signal.signal(signum, signal.SIG_IGN if signum in self.ignored else signal.SIG_DFL)
            except (OSError, ValueError):
                pass  # a number with no signal behind it
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        if self.cap_inheritable is not None and self.cap_ambient is not None:
            from .capabilities import lower_to, status_sets

            # Last: nothing above needs them, and exec passes these two sets on.
            lower_to(self.cap_inheritable, self.cap_ambient, status_sets(_status(os.getpid()) or {})[1])

    def enter(self, cwd_fd: int) -> None:
        """A fork of a session's holder becomes this context for good: ``apply``,
        ``cwd_fd`` closed, ``os.environ`` exactly this environment (what exec
        would have given), and not dumpable (its holder's memory is in it)."""
        from .prctl import set_dumpable

        set_dumpable(False)
        self.apply(cwd_fd)
        os.close(cwd_fd)
        os.environ.clear()
        os.environ.update(self.env)


def own_place() -> dict:
    """This process's namespaces and root directory, as ``cannot_carry`` compares
    them: what a process that is not dumpable states of itself (another process
    of its uid cannot read its /proc/PID/ns or root)."""
    root = os.stat("/proc/self/root")
    return {"ns": {ns: _link(f"/proc/self/ns/{ns}") for ns in _NAMESPACES}, "root": [root.st_dev, root.st_ino]}


def cannot_carry(pid: int, ctx: ProcessContext, place: dict | None = None, caller: int | None = None) -> str | None:
    """Why a child of process ``pid`` cannot be given ``ctx`` and be what the
    caller's own child would be (None: it can). The caller: this process, or
    process ``caller`` (a compiled client, whose context ``ctx`` is:
    ``ProcessContext.of_process``). Reads ``pid``'s /proc; its namespaces and
    root as ``place`` states them (``own_place``, from ``pid`` itself) where given."""
    me = "self" if caller is None else str(caller)
    mine, theirs = _status(os.getpid() if caller is None else caller) or {}, _status(pid)
    if theirs is None:
        return f"process {pid} cannot be read"
    for key in _SAME_STATUS:
        if mine.get(key) != theirs.get(key):
            return f"its {key} differs ({mine.get(key)} here, {theirs.get(key)} there)"
    lowered = (ctx.cap_inheritable, ctx.cap_ambient)
    for key, wanted in zip(_LOWERED_STATUS, lowered, strict=True):
        if None in lowered:  # not carried: the holder's own would be the child's
            if mine.get(key) != theirs.get(key):
                return f"its {key} differs ({mine.get(key)} here, {theirs.get(key)} there)"
        elif wanted is not None and wanted & ~int(theirs.get(key, "0"), 16):
            return f"its {key} lacks capabilities of this process ({wanted:016x} here, {theirs.get(key)} there)"
    stated = place.get("ns") if isinstance(place, dict) and isinstance(place.get("ns"), dict) else None
    for ns in _NAMESPACES:
        here = _link(f"/proc/{me}/ns/{ns}")
        there = stated.get(ns) if stated is not None else _link(f"/proc/{pid}/ns/{ns}")
        if here != there:
            return f"another {ns} namespace"
    if stated is not None:
        a = os.stat(f"/proc/{me}/root")
        if [a.st_dev, a.st_ino] != place.get("root"):  # type: ignore[union-attr]
            return "another root directory"
    else:
        try:
            a, b = os.stat(f"/proc/{me}/root"), os.stat(f"/proc/{pid}/root")
        except OSError as exc:
            return f"its root directory cannot be compared ({exc.strerror})"
        if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
            return "another root directory"
    limits = _hard_limits(pid)
    for name, (_soft, hard) in ctx.rlimits.items():
        there_hard = limits.get(name)
        if there_hard is None or _above(hard, there_hard):
            return f"{name} {hard} above what it may set ({there_hard})"
    their_nice = _nice(pid)
    if their_nice is None or ctx.nice < their_nice:
        return f"nice {ctx.nice} below its {their_nice}"
    their_adj = _read_int(f"/proc/{pid}/oom_score_adj")
    if ctx.oom_score_adj is not None and (their_adj is None or ctx.oom_score_adj < their_adj):
        return f"oom_score_adj {ctx.oom_score_adj} below its {their_adj}"
    return None


def _above(value: int, limit: int) -> bool:
    infinity = resource.RLIM_INFINITY
    return limit != infinity and (value == infinity or value > limit)


def _status(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return None


def _ignored(status: dict[str, str]) -> list[int]:
    mask = int(status.get("SigIgn", "0"), 16)
    return [n for n in range(1, 65) if mask & (1 << (n - 1))]


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _nice(pid: int) -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, pid)
    except OSError:
        return None


def _hard_limits(pid: int) -> dict[str, int]:
    """``pid``'s hard rlimits (/proc/PID/limits), by ``RLIMITS`` name."""
    import re

    names = {
        "Max cpu time": "RLIMIT_CPU",
        "Max file size": "RLIMIT_FSIZE",
        "Max data size": "RLIMIT_DATA",
        "Max stack size": "RLIMIT_STACK",
        "Max core file size": "RLIMIT_CORE",
        "Max resident set": "RLIMIT_RSS",
        "Max processes": "RLIMIT_NPROC",
        "Max open files": "RLIMIT_NOFILE",
        "Max locked memory": "RLIMIT_MEMLOCK",
        "Max address space": "RLIMIT_AS",
        "Max file locks": "RLIMIT_LOCKS",
        "Max pending signals": "RLIMIT_SIGPENDING",
        "Max msgqueue size": "RLIMIT_MSGQUEUE",
        "Max nice priority": "RLIMIT_NICE",
        "Max realtime priority": "RLIMIT_RTPRIO",
        "Max realtime timeout": "RLIMIT_RTTIME",
    }
    limits: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/limits") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return limits
    for line in lines:
        m = re.match(r"(.+?)\s{2,}(\S+)\s+(\S+)", line)
        if m and m.group(1) in names:
            hard = m.group(3)
            limits[names[m.group(1)]] = resource.RLIM_INFINITY if hard == "unlimited" else int(hard)
    return limits
