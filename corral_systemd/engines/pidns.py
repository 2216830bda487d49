"""The PID namespace tier: the run in a pid namespace whose init is corral's child.

Guarantees:
- no process of the run can leave the namespace, however it detaches
  (setsid, double fork, a setuid program): every one is a descendant of the
  namespace's init (``pidns_init``), its pid 1, which reaps every orphan;
- when the init dies the kernel SIGKILLs every process of the namespace,
  atomically (no fork outruns it), and reaps them all before the init's own
  exit is reported; the init dies with corral (``PR_SET_PDEATHSIG``), so a
  SIGKILLed corral leaves nothing of the run behind, at once;
- the stop: TERM and CONT to each process of the namespace (found in
  corral's /proc as the init's descendants, by the kernel's children
  lists from the init down, never a scan of every process: ``procfs.subtree``;
  each signalled through a pidfd re-checked against that reading:
  ``proctree``), the grace period, then
  SIGKILL to the init (the whole namespace);
- the proof: corral reaped the init. That covers every process that was
  ever in the namespace, the ones corral never saw included;
- the main process's exit status is the kernel's where it keeps one for a
  process corral did not reap (``PIDFD_INFO_EXIT``, Linux 6.15), and a
  line of the init's is never taken before the kernel shows the main
  process reaped: a command running as root may reach the init's status
  channel (``_ended``);
- the start never rests on a line the command could have written: the
  init's status channel is a socket (no process reopens it through
  /proc/1/fd/N, where a pipe is reopened), the init names the command's
  process (``fork PID``) while it is held before its exec, when nothing
  but corral's code runs in the namespace, and lets it exec only on
  corral's word, corral holding a pidfd for it by then; after that a
  line (``run``, ``exec ERRNO``, ``setup WHY``) may be forged (root takes
  descriptors with pidfd_getfd(2)): ``run`` says nothing corral does not
  check, a failure is believed only once the init has ended without a
  ``run`` (it writes one or the other, then a failure exits). Every wait
  on the init ends when it ends (its pidfd), and no later than the wall
  limit: then the init is SIGKILLed (the namespace with it), and the run
  is reported not started (125): the command's exec never completed.

The init is the compiled one (``INIT_PROGRAM``, exec'd by the clone once the
namespaces are set up: a run is one Python process) where the package was
built with a C compiler, else a clone of corral (``pidns_init``); both speak
the same protocol, and the record's ``engine.pid_namespace.init_program``
says which served.

Limits as in the fallback (``proctree``): --mem and --cpu-time watched,
--pids and --cpus not enforced.

What differs from the other tiers, for the command (said in the record's
``engine.pid_namespace``): its pids are the namespace's (it is not pid 1:
the init is; ``$$`` is small) and it sees only the run's processes in
/proc; not root, it runs in a user namespace of its own (its uid and gid
mapped to themselves): a set-user-ID program does not gain its owner's
rights there, and groups it has but that are not mapped read as
``nobody``'s (65534).

The namespace (``PidNamespace``) serves the cgroup tier as well, where a
run group holds the run's processes (``cgroupv2``). ``PidNamespace(spec)``
raises SetupError (one line: why) when no pid
namespace can be had: not root and unprivileged user namespaces forbidden
(sysctl, AppArmor, a seccomp filter: EPERM), a namespace limit (ENOSPC),
or no /proc of its own can be mounted in it (a container's masked /proc);
and in a process with other threads (a library's host: the library runs a
manager-less run in a child process of its own, ``core.fallback_child``).
"""

import _signal  # not signal: the same numbers without enum's start-up cost
import _socket  # not socket: its enums cost every run's start
import errno
import os
import select
import time

from ..common.errors import SetupError
from ..kernel import procfs
from .base import network_fact, refuse_unmaskable
from .libexec import compiled_helper, libexec_path
from .proctree import ProcessTreeEngine

TYPE_CHECKING = False  # typing is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from typing import NoReturn


class PidNamespace:
    """A pid namespace whose init is corral's child, and the command's main
    process in it: the module's guarantees, for whichever engine holds the
    run's processes (``PidnsEngine``: the namespace is the run; the cgroup
    tier's ``CgroupEngine``: a run group holds them, the namespace hides
    corral and every process outside the run from the command).

    ``PidNamespace(spec)`` clones the init and waits for its ``ready``, or
    raises SetupError saying why no namespace can be had. ``start`` forks the
    command through it; ``main_status`` reads its end; ``kill`` SIGKILLs the
    init (the kernel kills the whole namespace); ``reap_init`` is the proof.
    Engines never print: what is worth saying goes to ``warnings`` (the
    engine's list)."""

    def __init__(self, spec, warnings: list[str]):
        from ..kernel import namespaces as ns

        if len(os.listdir("/proc/self/task")) > 1:
            # The init is a clone of this process: other threads' locks would be
            # held for good in it, and its PR_SET_PDEATHSIG would follow this thread.
            raise SetupError("this process runs other threads (a library's host): the init is only cloned from one")
        self.spec = spec
        self.warnings = warnings
        uid, gid = os.geteuid(), os.getegid()
        # Root makes the namespaces as itself; root without the capability over
        # its pid namespace (uid 0 of a user namespace) and any other user in a
        # user namespace of their own first, which owns them.
        self.userns = uid != 0
        lib = ns.preloaded()
        # Loaded here, before the clone: the init starts with its code (and json)
        # in memory instead of loading it while corral waits for its ``ready``.
        from . import pidns_init

        helper = _init_program(spec)
        status_r, status_w = _status_channel()
        mine, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        me = os.pidfd_open(os.getpid())
        try:
            try:
                pid, pidfd = ns.clone_into(ns.CLONE_NEWPID | ns.CLONE_NEWNS | (ns.CLONE_NEWUSER if self.userns else 0))
            except PermissionError:
                if self.userns:
                    raise
                self.userns = True
                pid, pidfd = ns.clone_into(ns.CLONE_NEWPID | ns.CLONE_NEWNS | ns.CLONE_NEWUSER)
        except OSError as exc:
            for fd in (status_r, status_w, me):
                os.close(fd)
            mine.close()
            theirs.close()
            raise SetupError(_refused(exc, self.userns)) from None
        if pid == 0:  # pragma: no cover  (the init; tested through the runs it serves)
            mine.close()
            os.close(status_r)
            pidns_init.run(
                spec,
                status=status_w,
                control=theirs.detach(),
                corral_pidfd=me,
                uid=uid,
                gid=gid,
                userns=self.userns,
                lib=lib,
                helper=helper,
            )
        os.close(status_w)
        os.close(me)
        theirs.close()
        #: The init: its pid (corral's child) and pidfd.
        self.init, self._init_fd = pid, pidfd
        self.program = helper or "python"
        #: The init has been reaped: every process of the namespace had ended first.
        self.reaped = False
        self._killed = False
        self._status_r = status_r
        self._control = mine
        self._buffer = b""
        self._eof = False
        #: The command's main process, as corral's /proc numbers it and as the namespace does.
        self.main: int | None = None
        self.main_inside: int | None = None
        self._main_fd = -1
        self._link = _ns_link(pid)
        said = self._next_line()  # nothing but the init runs in the namespace yet
        if said != "ready":
            self.reap_init(block=True)
            why = said[len("setup ") :] if said and said.startswith("setup ") else "its init ended before it was ready"
            self._close_channels()
            raise SetupError(why)

    # -- the init's channel ---------------------------------------------
    def _next_line(self, block: bool = True, deadline: float | None = None) -> str | None:
        """The init's next line (None: none yet, or it is gone: ``_eof``).
        ``block``: wait for one as long as the init lives (its pidfd: no end
        of file is needed, which a copy of the channel's other end elsewhere
        would withhold) and, with ``deadline`` (monotonic), no longer: then
        None, ``_eof`` not set."""
        while b"\n" not in self._buffer:
            if self._eof:
                return None
            wait = 0.0 if not block else None if deadline is None else max(0.0, deadline - time.monotonic())
            watch = [self._status_r] + ([self._init_fd] if block and self._init_fd >= 0 else [])
            ready = select.select(watch, [], [], wait)[0]
            if not ready:
                return None
            if self._status_r not in ready:
                self._eof = True  # the init has ended, and all it wrote is read
                return None
            chunk = os.read(self._status_r, 4096)
            if not chunk:
                self._eof = True
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace")

    def _close_channels(self) -> None:
        if self._status_r >= 0:
            os.close(self._status_r)
            self._status_r = -1
        self._control.close()

    # -- start ---------------------------------------------------------
    def start(self, argv, *, stdin, stdout, stderr, env, cwd, survey=None, admit=None) -> None:
        """Fork the command in the namespace; return once it has exec'd
        (``main`` names it). ``admit(pid)``: called while it is held before
        its exec, corral holding a pidfd for it (the cgroup tier moves it
        into the run's group there, so nothing it starts is outside); its
        SetupError ends the namespace, the command never ran."""
        from ..kernel.fdpass import rights
        from ..kernel.spawn import ExecError
        from .pidns_init import StartMessage, start_message

        refuse_unmaskable(self.spec, survey)
        masks = [(m.path, m.how) for m in survey.masks] if survey is not None and self.spec.sealed else []
        # No environment given: corral's, which the init (a clone of corral, or its exec) has as well.
        message = StartMessage(
            list(argv), dict(os.environ if env is None else env), cwd, self.spec.umask, bool(self.spec.pty), masks
        )
        deadline = None if self.spec.wall is None else time.monotonic() + self.spec.wall
        try:
            self._control.sendmsg([b"s"], rights((stdin, stdout, stderr)))
            self._control.sendall(start_message(message))
        except OSError:
            pass  # the init is gone: its last line (or none) says why
        # Until the init's word to open the gate nothing but corral's code runs in the
        # namespace: its first line is its own.
        said = self._next_line(deadline=deadline)
        word = said[len("fork ") :] if said is not None and said.startswith("fork ") else ""
        if not word.isdigit():
            if said is not None and said.startswith("setup "):
                self._give_up(said[len("setup ") :])
            self._give_up(self._silence(said, deadline))
        self.main_inside = int(word)
        self.main = self._host_pid(self.main_inside)
        if self.main is None:
            self._give_up(f"its init's command process ({self.main_inside}) is not its child")
        try:
            # Before it may exec (or be reaped): the kernel keeps its end for a pidfd opened first.
            self._main_fd = os.pidfd_open(self.main)
        except ProcessLookupError:
            self._give_up("its init ended first")  # killed from outside, and the namespace with it
        if admit is not None:
            try:
                admit(self.main)
            except SetupError as exc:
                self._give_up(str(exc))
        try:
            self._control.send(b"k")  # the gate opens
        except OSError:
            pass
        # From here on a line may be the command's: see the module's docstring.
        failed = None
        while (said := self._next_line(deadline=deadline)) is not None:
            if said == "run":
                # A command that ended at once: its "exit STATUS" may have come in the same
                # read as "run", and waits in the buffer, where no poll of the channel wakes.
                return
            if failed is None and said.startswith(("exec ", "setup ")):
                failed = said  # the init's only if it ends now, without a `run`
        why = self._silence(None, deadline)
        self.kill()
        self.reap_init(block=True)
        if failed is not None and self._eof and self._failed_before_exec(failed):
            if failed.startswith("exec ") and failed[5:].isdigit():
                raise ExecError(int(failed[5:]), argv[0])
            why = failed[len("setup ") :]
        raise SetupError(f"pid namespace: {why}; the command never ran")

    def _silence(self, said: str | None, deadline: float | None) -> str:
        """Why the init's answer is not to be had (``said``: what came instead)."""
        if said is not None:
            return f"its init's answer was not its own ({said[:60]!r})"
        if not self._eof and deadline is not None and time.monotonic() >= deadline:
            return "its init did not answer within the wall limit"
        return "its init ended first"

    def _give_up(self, why: str) -> "NoReturn":
        """The command never ran (the gate stays shut): the init SIGKILLed and
        reaped, the namespace with it; SetupError ``why``."""
        self.kill()
        self.reap_init(block=True)
        raise SetupError(f"pid namespace: {why}; the command never ran")

    def _failed_before_exec(self, said: str) -> bool:
        """The kernel does not contradict the init's ``exec``/``setup`` line:
        the main process exited as the child of a failed exec (127) or setup
        (125) does. Where the kernel keeps no status (before 6.15), the line
        counts: the init ended without a ``run``."""
        status = _exit_status(self._main_fd) if self._main_fd >= 0 else None
        if status is None:
            return True
        return os.WIFEXITED(status) and os.WEXITSTATUS(status) == (127 if said.startswith("exec ") else 125)

    def _host_pid(self, ns_pid: int) -> int | None:
        """The main process's pid as corral's /proc numbers it: the init's child
        whose innermost pid (``NSpid``) is ``ns_pid``."""
        children = procfs.children(self.init)
        if children is None:
            children = [p.pid for p in procfs.scan().values() if p.ppid == self.init]
        for pid in children:
            if procfs.innermost_pid(pid) == ns_pid:
                return pid
        return None

    # -- the main process's end -----------------------------------------
    def wait_fd(self) -> int | None:
        """Readable when the init has something to say (or has ended)."""
        return self._status_r if not self._eof and self._status_r >= 0 else None

    def main_status(self) -> int | None:
        """The main process's wait status once it has ended (read from the
        init's lines, checked against the kernel: ``_ended``), else None;
        SIGKILL's when the init ended first (the kernel killed the namespace)."""
        status = None
        while status is None and self._status_r >= 0 and (said := self._next_line(block=False)) is not None:
            status = self._ended(said)
        if status is None and self._eof and self.main is not None:
            status = int(_signal.SIGKILL)
            if not self._killed:
                self.warnings.append("the pid namespace's init ended before the command did (killed from outside?)")
        return status

    def _ended(self, said: str) -> int | None:
        """The main process's wait status, on a line from the init's channel
        (None: the line is not the init's ``exit STATUS``).

        The init says it once it has reaped the main process, but a command
        running as root can write a line as well formed into the channel
        (taken with pidfd_getfd(2)). So no line counts while the kernel still has the main
        process (running, or not reaped), and the kernel's status is taken
        over the line's where it keeps one: then any line, a garbled one too,
        only says when to ask. Before Linux 6.15 the line's number is taken:
        one written in the instant between the init's reaping and its own
        line would be believed."""
        if self._main_fd >= 0:
            try:
                _signal.pidfd_send_signal(self._main_fd, 0)
                return None
            except ProcessLookupError:
                pass  # reaped
            except PermissionError:
                return None
            if (status := _exit_status(self._main_fd)) is not None:
                return status
        word = said[len("exit ") :] if said.startswith("exit ") else ""
        return int(word) if word.isdigit() else None

    # -- the end of the namespace -----------------------------------------
    def kill(self) -> None:
        """SIGKILL the init: the kernel kills every process of the namespace at once."""
        if self.reaped or self._killed:
            return
        try:
            _signal.pidfd_send_signal(self._init_fd, _signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._killed = True

    def kill_without_descriptors(self) -> bool:
        """``kill`` by pid (the init is corral's unreaped child: the pid is still its own)."""
        if self.reaped:
            return False
        os.kill(self.init, _signal.SIGKILL)
        self._killed = True
        return True

    def reap_init(self, block: bool = False) -> bool:
        """Reap the init if it has exited (``block``: wait for it); True once
        reaped: the kernel reports an init's exit only after every other
        process of its namespace has exited and been reaped."""
        if not self.reaped:
            try:
                pid, _ = os.waitpid(self.init, 0 if block else os.WNOHANG)
            except ChildProcessError:
                pid = self.init
            if pid:
                self.reaped = True
                os.close(self._init_fd)
                self._init_fd = -1
        return self.reaped

    def close(self) -> None:
        if not self.reaped:
            self.kill()
            self.reap_init(block=True)
        self._close_channels()
        if self._main_fd >= 0:
            os.close(self._main_fd)
            self._main_fd = -1

    def facts(self) -> dict:
        """The record's ``engine.pid_namespace``."""
        return {
            "namespace": self._link,
            "init_pid": self.init,
            "init_program": self.program,
            "main_pid_inside": self.main_inside,
            "user_namespace": "own, uid and gid mapped to themselves" if self.userns else "corral's",
            "proof": "the namespace's init reaped by corral: the kernel ends and reaps every process of the "
            "namespace first, those corral never saw included",
        }


class PidnsEngine(ProcessTreeEngine):
    mode = "pidns"
    guarantee = "pidns"
    #: Nothing of the run outlives corral (``kinds``: "namespace"): no mark needed.
    marks_processes = False
    command_reaches_corral = False
    _tier_words = "the pid namespace tier"

    def __init__(self, spec):
        super().__init__(spec)
        self._ns = PidNamespace(spec, self.warnings)
        self._helpers: set[int] = set()

    def start(self, argv, *, stdin, stdout, stderr, env, cwd, survey=None):
        self._ns.start(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd, survey=survey)
        if self._ns.main is not None:  # always, once start returned
            self.seen.add(self._ns.main)
        self.reap()

    @property
    def main_pid(self) -> int | None:
        return self._ns.main

    # -- events --------------------------------------------------------
    def wait_fds(self) -> list[int]:
        fd = self._ns.wait_fd() if self._status is None else None
        return [] if fd is None else [fd]

    def ignore_child(self, pid):
        self._helpers.add(pid)

    def reap(self) -> None:
        # A container's pid 1: orphans outside the run (a `podman exec`'s) are corral's children now.
        self._reap_adopted(*self._helpers)  # the init: helper_pids
        if self._status is None:
            self._status = self._ns.main_status()

    # -- membership ----------------------------------------------------
    def _members(self) -> list[procfs.ProcInfo]:
        if self._ns.reaped:
            return []
        # The init's tree only (every process of the namespace is below it);
        # all of /proc only where the kernel lists no children.
        tree = procfs.subtree(self._ns.init)
        if tree is None:
            tree = procfs.descendants(procfs.scan(), self._ns.init)
        members = [p for p in tree if p.alive]
        self.seen.update(p.pid for p in members)
        return members

    def _reaper_child(self, current) -> bool:
        return current.ppid == self._ns.init and not self._ns.reaped

    def _reaper_cpu_ticks(self) -> tuple[int, int]:
        if self._ns.reaped:
            return (0, 0)  # its figures are corral's reaped children's now
        return procfs.cpu_ticks(self._ns.init) or (0, 0)

    # -- stopping ------------------------------------------------------
    def signal_all(self, *sigs):
        members = self._members()
        return self._signal(members, sigs, {p.pid for p in members})

    def kill_all(self):
        """SIGKILL the init: the kernel kills every process of the namespace at once."""
        self._signalled.update((p.pid, p.starttime) for p in self._last_infos if p.alive)
        self._ns.kill()

    def kill_without_descriptors(self) -> bool:
        return self._ns.kill_without_descriptors()

    def verify_empty(self):
        """[] once corral has reaped the init (``PidNamespace.reap_init``).
        Until then the init is SIGKILLed (the stop is over)."""
        left = self.remaining()
        self._ns.kill()
        if self._ns.reap_init():
            self.reap()  # the init's last lines (the main process's status)
            return []
        return left or [self._ns.init]

    def helper_pids(self) -> list[int]:
        return [self._ns.init]

    def close(self):
        self._ns.close()

    def describe(self):
        return {**self.tree_facts(), **network_fact(self.spec), "pid_namespace": self._ns.facts()}


#: Where the compiled init sits (``libexec``): built from packaging/pidns-init/init.c.
INIT_PROGRAM = libexec_path("corral-pidns-init")


def _init_program(spec) -> str | None:
    """The compiled init's path, or None for the Python init: where it was
    not built (no C compiler), for a sealed run (the seal is Python's:
    ``kernel.seal``), or with ``CORRAL_PIDNS_INIT=python`` (the tests run
    both; ``=c`` insists on the compiled one: SetupError where it is not)."""
    program = compiled_helper(INIT_PROGRAM, "CORRAL_PIDNS_INIT", "compiled init")
    return None if spec.sealed else program


def _status_channel() -> tuple[int, int]:
    """The init's status channel, (corral's end, the init's), close-on-exec:
    a socket pair, one way. Not a pipe: a command running as root reopens a
    pipe of its init's through /proc/1/fd/N, never a socket."""
    mine, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    mine.shutdown(_socket.SHUT_WR)
    theirs.shutdown(_socket.SHUT_RD)
    return mine.detach(), theirs.detach()


def _refused(exc: OSError, userns: bool) -> str:
    """Why the kernel refused the namespaces, in one clause."""
    if exc.errno == errno.EPERM:
        who = "not root" if os.geteuid() != 0 else "root without CAP_SYS_ADMIN over its pid namespace"
        return (
            f"{who}, and user namespaces are forbidden here "
            "(kernel.unprivileged_userns_clone, AppArmor or a seccomp filter: EPERM)"
        )
    if exc.errno == errno.ENOSPC:
        return "a namespace limit is reached (user.max_user_namespaces, user.max_pid_namespaces: ENOSPC)"
    if exc.errno in (errno.EINVAL, errno.ENOSYS):
        return f"this kernel cannot make one ({exc.strerror})"
    return exc.strerror or str(exc)


#: PIDFD_GET_INFO (Linux 6.13), ``_IOWR(0xFF, 11, ...)`` for the first, 64-byte
#: ``struct pidfd_info``; its PIDFD_INFO_EXIT (6.15) and where ``exit_code`` is.
_PIDFD_GET_INFO = (3 << 30) | (64 << 16) | (0xFF << 8) | 11
_PIDFD_INFO_EXIT = 8
_EXIT_CODE_AT = 60


def _exit_status(pidfd: int) -> int | None:
    """The wait status the kernel kept for a reaped process with ``pidfd``
    open since before (whoever reaped it), or None: a kernel that keeps none
    (before 6.15), or the process is not reaped."""
    import fcntl
    import struct

    info = bytearray(64)
    struct.pack_into("=Q", info, 0, _PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, info)
    except OSError:
        return None  # ENOTTY before 6.13; ESRCH for a reaped process before 6.15
    if not struct.unpack_from("=Q", info, 0)[0] & _PIDFD_INFO_EXIT:
        return None
    return struct.unpack_from("=i", info, _EXIT_CODE_AT)[0]


def _ns_link(pid: int) -> str | None:
    """``pid``'s pid namespace, as the kernel names it."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
