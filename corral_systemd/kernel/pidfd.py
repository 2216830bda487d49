"""Signalling processes that are not our children, without pid-reuse races.

A pid from a /proc scan may be recycled by the time we signal it. We open a
pidfd first (which pins that exact process), then re-read its stat: if the
start time still matches the scan and the caller's membership test still
holds, the pidfd is known to name the process we meant, and only then is
the signal sent through it.
"""

import _signal  # not signal: the same numbers without enum's start-up cost
import os
from _thread import LockType, allocate_lock  # not threading: the CLI's start-up need not load it

from .fsread import SHORTAGE, raise_shortage
from .procfs import ProcInfo, read_stat

TYPE_CHECKING = False  # collections is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from collections.abc import Callable


def signal_process(info: ProcInfo, sig: int, belongs: "Callable[[ProcInfo], bool]") -> bool:
    """Send ``sig`` to the process ``info`` describes, if it is still that process.

    Returns True when the signal was delivered, False when the process is
    gone or no longer belongs. PermissionError propagates: a process we may
    not signal is one we cannot prove stopped.
    """
    try:
        fd = os.pidfd_open(info.pid)
    except ProcessLookupError:
        return False
    try:
        current = read_stat(info.pid)
        if current is None or current.starttime != info.starttime or not belongs(current):
            return False
        _signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


class FoundProcesses:
    """A stop target (``common.stopping.StopTarget``) over the processes
    ``find()`` names (pid -> ProcInfo; found again at each round), each
    signalled through a pidfd only while ``belongs(found, current)`` holds
    for what the pidfd pins (``signal_process``). A process corral may not
    signal stays in ``remaining()``: its stop is not proven."""

    def __init__(
        self,
        find: "Callable[[], dict[int, ProcInfo]]",
        belongs: "Callable[[ProcInfo, ProcInfo], bool]",
    ):
        self._find, self._belongs = find, belongs
        self._last: dict[int, ProcInfo] = {}
        self._signalled: set[int] = set()

    def remaining(self) -> list[int]:
        self._last = self._find()
        return list(self._last)

    def _send(self, infos: list[ProcInfo], sigs) -> int:
        sent = 0
        for info in infos:
            self._signalled.add(info.pid)

            def belongs(current: ProcInfo, found: ProcInfo = info) -> bool:
                return self._belongs(found, current)

            for sig in sigs:
                try:
                    sent += signal_process(info, sig, belongs)
                except PermissionError:
                    pass  # left in remaining(): unproven
        return sent

    def signal_all(self, *sigs: int) -> int:
        self.remaining()
        return self._send(list(self._last.values()), sigs)

    def signal_new(self, *sigs: int) -> int:
        return self._send([p for pid, p in self._last.items() if pid not in self._signalled], sigs)

    def kill_all(self) -> None:
        self.remaining()
        self._send(list(self._last.values()), (_signal.SIGKILL,))

    def verify_empty(self) -> list[int]:
        return self.remaining()

    def unproven(self) -> str | None:
        return None


def kill_and_reap(pid: int, pidfd: int) -> None:
    """SIGKILL our child ``pid`` through its pidfd, reap it, close the pidfd."""
    try:
        _signal.pidfd_send_signal(pidfd, _signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
    os.close(pidfd)


def signal_cgroup_members(pids, sigs, directory: str) -> list[int]:
    """Signal each pid that is (still) in the cgroup at ``directory``.

    The pidfd is opened first; if the pid is then listed in the group's
    cgroup.procs, the pidfd names a process of the group, not a recycled
    pid. Returns the pids signalled.
    """
    from .cgroupfs import procs_below

    done = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            if pid not in procs_below(directory):
                continue
            for sig in sigs:
                _signal.pidfd_send_signal(fd, sig)
            done.append(pid)
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)
    return done


def _carries_run_id(pid: int, run_id: str) -> bool:
    """``pid``'s environment holds ``CORRAL_RUN_ID=<run_id>`` (the run's mark on every process it started)."""
    from ..common.nesting import RUN_ENV

    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{RUN_ENV}={run_id}".encode() in f.read().split(b"\0")
    except OSError as exc:
        raise_shortage(exc)
        return False


def exited(fd: int) -> bool:
    """A pidfd polls readable once its process has exited (every thread; a zombie counts)."""
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def pid_of(fd: int) -> int | None:
    """The pid a pidfd names, as the kernel says it (its fdinfo's ``Pid``) in this
    process's pid namespace; None once the process has been reaped, where it is
    not visible from here (another pid namespace's), or if that cannot be read."""
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
                    return pid if pid > 0 else None
    except (OSError, ValueError, IndexError):
        pass
    return None


def _limit() -> int:
    """How many pidfds all trackers of this process may hold together: at
    most 4096, and at most half the soft descriptor limit."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return min(4096, max(0, soft // 2 - 32)) if soft != resource.RLIM_INFINITY else 4096


class RunTracker:
    """The run's processes as pidfds, to find those that leave its cgroup.

    A process with write access to cgroupfs (root; a user inside their own
    delegated subtree) can move itself out of the run's cgroup, which then
    reads empty while it lives. The engines show the tracker every listing
    of the group they read (``observe``; while the run lives, at each of
    ``engines.base.CgroupLimits``'s readings): each new pid gets a pidfd,
    kept only if the pid is still listed after the pidfd was opened (so the
    pidfd names the process corral saw,
    never a reused pid). A tracked process that is no longer listed is dead
    (its pidfd polls readable: closed) or alive elsewhere: escaped.

    At verification, with the group empty, ``sweep`` finds every process of
    the run still alive outside it: each tracked process alive, every
    process in one of the run's sessions (the sessions of those, and
    ``pinned`` session ids whose number cannot have been reused: the main
    process's, while it is held unreaped, which ``still_pinned()`` confirms
    after the scan), every process in a ``marked`` session (a session id
    whose number may have been reused since, the main process being reaped:
    a service's, whose manager reaps it) that carries the run's mark in its
    environment (``CORRAL_RUN_ID=<run id>``, which a stranger in a reused
    session does not), and every descendant of one found (by parent pid,
    while the parent lives), from one scan of /proc. Each is SIGKILLed
    through its pidfd, so a reused pid is never hit.

    Bounded: all trackers of a process hold at most ``_limit()`` pidfds
    together; past it new processes are not tracked and ``limit_hit`` says
    so. A process that leaves the group and forks (in a session of its own)
    before corral first saw it is beyond its reach.
    """

    _lock: LockType | None = None
    _open = 0
    _max: int | None = None

    def __init__(self, hierarchy: str = "0"):
        if RunTracker._lock is None:
            RunTracker._lock = allocate_lock()
        #: The group's path as /proc/PID/cgroup shows it (set once known), and
        #: which line of that file to read: "0" (cgroup v2) or "name=systemd".
        self.cgroup: str | None = None
        self.hierarchy = hierarchy
        self._fds: dict[int, int] = {}
        #: pids of the run seen alive outside its group (tracked by pidfd).
        self.escaped: set[int] = set()
        #: Where an escaped process was when corral saw it outside the group
        #: (its /proc/PID/cgroup path), for the record; pid -> path.
        self.moved_to: dict[int, str] = {}
        #: Escaped pids corral could not signal (PermissionError).
        self.unkillable: set[int] = set()
        self.limit_hit = False
        self.peak = 0

    # -- the budget ----------------------------------------------------
    def _reserve(self) -> bool:
        assert RunTracker._lock is not None
        with RunTracker._lock:
            if RunTracker._max is None:
                RunTracker._max = _limit()
            if RunTracker._open >= RunTracker._max:
                return False
            RunTracker._open += 1
            return True

    def _unreserve(self, n: int = 1) -> None:
        assert RunTracker._lock is not None
        with RunTracker._lock:
            RunTracker._open -= n

    def _drop(self, pid: int) -> None:
        os.close(self._fds.pop(pid))
        self._unreserve()

    # -- watching ------------------------------------------------------
    def in_group(self, pid: int) -> bool | None:
        """Is ``pid`` in the group (or below it)? None if it cannot be read."""
        from .cgroupfs import proc_cgroup

        path = proc_cgroup(pid, self.hierarchy)
        if path is None or self.cgroup is None:
            return None
        return path == self.cgroup or path.startswith(self.cgroup.rstrip("/") + "/")

    def mark_escaped(self, pid: int) -> None:
        """``pid`` (tracked, alive) is outside the group: an escaper; where it went."""
        from .cgroupfs import proc_cgroup

        self.escaped.add(pid)
        if pid not in self.moved_to and (path := proc_cgroup(pid, self.hierarchy)) is not None:
            self.moved_to[pid] = path

    def pidfd_of(self, pid: int) -> int | None:
        """The pidfd this tracker holds for ``pid`` (closed by the tracker), or None."""
        return self._fds.get(pid)

    def new_escapers(self, known) -> list[int]:
        """Escaped pids not in ``known``, still alive (the engine asks its manager about them)."""
        return [p for p in sorted(self.escaped) if p not in known and p in self._fds and not exited(self._fds[p])]

    def observe(self, listed, relist) -> None:
        """``listed``: the group's pids as just read; ``relist()`` reads them again."""
        if self.cgroup is None:
            return
        listed_set = set(listed)
        for pid in [p for p in self._fds if p not in listed_set and p not in self.escaped]:
            if exited(self._fds[pid]):
                self._drop(pid)
            elif self.in_group(pid) is False and not exited(self._fds[pid]):
                self.mark_escaped(pid)
        opened = {}
        for pid in listed:
            if pid in self._fds or pid in opened:
                continue
            if not self._reserve():
                self.limit_hit = True
                break
            try:
                opened[pid] = os.pidfd_open(pid)
            except OSError as exc:
                self._unreserve()
                if exc.errno in SHORTAGE:  # untracked for want of a descriptor: never taken for gone
                    for fd in opened.values():
                        os.close(fd)
                    self._unreserve(len(opened))
                    raise
        if not opened:
            return
        still = set(relist())
        for pid, fd in opened.items():
            if pid in still:
                self._fds[pid] = fd
            else:  # gone (or moved) before it could be confirmed: not ours to keep
                os.close(fd)
                self._unreserve()
        self.peak = max(self.peak, len(self._fds))

    def sweep(
        self,
        pinned: tuple = (),
        still_pinned=lambda: True,
        marked: tuple = (),
        run_id: str = "",
        orphans_of: int | None = None,
        not_orphans: frozenset = frozenset(),
        orphans_marked: bool = False,
        before_kill=None,
    ) -> list[int]:
        """With the group empty: find, track and SIGKILL the run's processes
        still alive outside it; return those still alive.

        ``orphans_of``: a child subreaper above the command (corral, or the
        client that forked it): a process of the run whose parent died is
        its child now, wherever it moved itself, in whatever session; every
        live child of it but ``not_orphans`` (the main process, corral's own
        helpers) is the run's -- with ``orphans_marked``, only those that
        carry the run's mark: the subreaper is a caller that may have other
        children of its own (a client of the corral service). ``before_kill()``:
        called once they are found, before any is signalled (while each lives
        where it went)."""
        live = [pid for pid, fd in self._fds.items() if not exited(fd)]
        if orphans_of is not None:
            live += self._adopt_orphans(orphans_of, not_orphans, run_id if orphans_marked else None)
        for pid in live:
            self.mark_escaped(pid)
        sids = set()
        for pid in live:
            info = read_stat(pid)
            if info is not None and not exited(self._fds[pid]):
                sids.add(info.sid)
        own = os.getsid(0)
        sids.discard(own)
        pinned_sids = set(pinned) - {own} - sids
        marked_sids = set(marked) - {own} - sids - pinned_sids if run_id else set()
        if sids or live or pinned_sids or marked_sids:
            self._find_members(sids, set(live), pinned_sids, still_pinned, marked_sids, run_id)
        if before_kill is not None:
            before_kill()
        left = []
        for pid in sorted(self.escaped):
            fd = self._fds.get(pid)
            if fd is None or exited(fd):
                continue
            try:
                _signal.pidfd_send_signal(fd, _signal.SIGKILL)
            except ProcessLookupError:
                continue
            except PermissionError:
                self.unkillable.add(pid)
            left.append(pid)
        return left

    def _adopt_orphans(self, parent: int, not_orphans: frozenset, marked_by: str | None) -> list[int]:
        """Track every live child of ``parent`` but ``not_orphans`` (with
        ``marked_by``, a run id: only those carrying its mark), each confirmed
        after its pidfd is open (still that child); return them."""
        from .procfs import scan

        adopted = []
        for info in scan().values():
            if info.ppid != parent or not info.alive or info.pid in not_orphans or info.pid in self._fds:
                continue
            if marked_by is not None and not _carries_run_id(info.pid, marked_by):
                continue
            if not self._reserve():
                self.limit_hit = True
                break
            try:
                fd = os.pidfd_open(info.pid)
            except OSError as exc:
                self._unreserve()
                raise_shortage(exc)  # untracked for want of a descriptor: never taken for gone
                continue
            now = read_stat(info.pid)
            if now is not None and now.ppid == parent and now.starttime == info.starttime:
                self._fds[info.pid] = fd
                adopted.append(info.pid)
            else:
                os.close(fd)
                self._unreserve()
        return adopted

    def _find_members(
        self,
        sids: set,
        parents: set,
        pinned: set = frozenset(),  # type: ignore[assignment]
        still_pinned=lambda: True,
        marked: set = frozenset(),  # type: ignore[assignment]
        run_id: str = "",
    ) -> None:
        """Track every process (from one /proc scan) in one of ``sids`` (or
        of ``pinned``, if ``still_pinned()`` holds once the scan's pidfds are
        open; or of ``marked``, carrying the run's mark) or below a live
        tracked process, confirmed after its pidfd is open."""
        from .procfs import scan

        table = scan()
        children: dict[int, list] = {}
        for info in table.values():
            children.setdefault(info.ppid, []).append(info)
        me = os.getpid()
        found = {info.pid: info for info in table.values() if info.sid in sids and info.alive}
        by_pin = {pid: info for pid, info in table.items() if info.sid in pinned and info.alive}
        # Still pinned after the scan: then it was during it (reaping is for
        # good), so every process the scan saw in that session was the run's.
        if by_pin and still_pinned():
            found.update(by_pin)
            sids = sids | pinned
        by_mark = {
            pid: info
            for pid, info in table.items()
            if info.sid in marked and info.alive and pid not in found and _carries_run_id(pid, run_id)
        }
        found.update(by_mark)
        sids = sids | {info.sid for info in by_mark.values()}
        stack = list(parents | set(found))
        while stack:
            for child in children.get(stack.pop(), ()):
                if child.pid not in found and child.alive:
                    found[child.pid] = child
                    stack.append(child.pid)
        for pid, info in found.items():
            if pid == me or pid in self._fds:
                continue
            if not self._reserve():
                self.limit_hit = True
                return
            try:
                fd = os.pidfd_open(pid)
            except OSError as exc:
                self._unreserve()
                raise_shortage(exc)  # untracked for want of a descriptor: never taken for gone
                continue
            now = read_stat(pid)
            if (
                now is not None
                and now.starttime == info.starttime
                and (now.sid in sids or (now.ppid in self._fds and not exited(self._fds[now.ppid])))
            ):
                self._fds[pid] = fd
                self.escaped.add(pid)
            else:
                os.close(fd)
                self._unreserve()

    def kill_escaped(self) -> None:
        """SIGKILL every escaped process still alive (through its pidfd).

        Their sessions and children are found first, while they live: once
        an escaper is dead its session id may be reused and its children
        are reparented, so ``sweep`` could no longer tell them from
        strangers (a moved process's children then outlived the run)."""
        live = {pid for pid in self.escaped if pid in self._fds and not exited(self._fds[pid])}
        if live:
            sids = {info.sid for pid in live if (info := read_stat(pid)) is not None}
            sids.discard(os.getsid(0))
            self._find_members(sids, live)
        for pid in self.escaped:
            fd = self._fds.get(pid)
            if fd is not None and not exited(fd):
                try:
                    _signal.pidfd_send_signal(fd, _signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def facts(self) -> dict:
        """For the record: only when something happened."""
        out: dict[str, object] = {}
        if self.escaped:
            out["escaped_pids"] = sorted(self.escaped)
        if self.moved_to:
            out["moved_to"] = sorted(set(self.moved_to.values()))
        if self.limit_hit:
            out["limit_hit"] = True
            out["limit"] = RunTracker._max
        return {"escape_tracking": out} if out else {}

    def unproven(self) -> str | None:
        if not self.escaped:
            return None
        pids = " ".join(map(str, sorted(self.escaped)))
        killed = (
            "killed through their pidfds"
            if not self.unkillable
            else f"could not kill {' '.join(map(str, sorted(self.unkillable)))}"
        )
        return (
            f"processes of the run left its control group while alive (pids {pids}; {killed}): "
            "what they started elsewhere cannot be proven gone"
        )

    def close(self) -> None:
        n = len(self._fds)
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if n:
            self._unreserve(n)
