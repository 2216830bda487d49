"""Reading the process table from /proc.

A scan is a snapshot: processes appear and vanish while it runs, so every
reader tolerates a pid disappearing between listing and reading. Identity
of a process is (pid, start time): the start time (clock ticks since boot,
field 22 of /proc/PID/stat) tells a recycled pid from the original.

Liveness is the thread group's, not the leader's: a process whose main
thread has exited (``pthread_exit()`` in ``main``) while other threads run
shows ``Z`` in /proc/PID/stat, yet it is alive and holds memory. Its
``ProcInfo.state`` is the state of a live thread (``leader_exited`` set);
``Z``/``X`` means every task of the group is dead.
"""

import os

from .fsread import raise_shortage, read_bytes

#: States of a task that has exited (zombie, dead).
DEAD_STATES = ("Z", "X")


class ProcInfo:
    __slots__ = ("pid", "ppid", "pgid", "sid", "state", "starttime", "leader_exited")

    def __init__(
        self, pid: int, ppid: int, pgid: int, sid: int, state: str, starttime: int, leader_exited: bool = False
    ):
        self.pid = pid
        self.ppid = ppid
        self.pgid = pgid
        self.sid = sid
        #: The thread group's state: ``Z``/``X`` only when no task of it is alive.
        self.state = state
        self.starttime = starttime
        #: The main thread has exited but other threads run (state is theirs).
        self.leader_exited = leader_exited

    @property
    def alive(self) -> bool:
        return self.state not in DEAD_STATES

    def __repr__(self) -> str:
        return f"ProcInfo(pid={self.pid}, ppid={self.ppid}, state={self.state})"


def _stat_fields(data: bytes) -> list[bytes]:
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    return data[data.rindex(b")") + 2 :].split()


def read_stat(pid: int) -> ProcInfo | None:
    """The process's stat line, or None if it is gone (or unreadable).

    A zombie leader whose other threads still run is reported with a live
    thread's state and ``leader_exited`` set: the process is alive.
    """
    try:
        data = read_bytes(f"/proc/{pid}/stat")
    except OSError as exc:
        raise_shortage(exc)
        return None
    fields = _stat_fields(data)
    state = fields[0].decode()
    live_thread = None
    if state in DEAD_STATES:
        live_thread = live_task(pid)
        if live_thread is not None:
            state = live_thread[1]
    return ProcInfo(
        pid, int(fields[1]), int(fields[2]), int(fields[3]), state, int(fields[19]), live_thread is not None
    )


def live_task(pid: int) -> tuple[int, str] | None:
    """(tid, state) of a task of ``pid``'s thread group that has not exited, or None.

    The group is alive while any of its tasks is not ``Z``/``X``, whatever
    its leader's state.
    """
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError as exc:
        raise_shortage(exc)
        return None
    for name in tids:
        try:
            state = _stat_fields(read_bytes(f"/proc/{pid}/task/{name}/stat"))[0].decode()
        except OSError as exc:
            raise_shortage(exc)
            continue
        except (ValueError, IndexError):
            continue
        if state not in DEAD_STATES:
            return int(name), state
    return None


def scan() -> dict[int, ProcInfo]:
    """Every process visible in /proc, keyed by pid (threads excluded).

    A shortage (no descriptor left: ``fsread.SHORTAGE``) raises, never
    leaves a live process out."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = read_stat(int(name))
            if info is not None:
                table[info.pid] = info
    return table


def children(pid: int) -> list[int] | None:
    """``pid``'s children as the kernel lists them (its main thread's:
    /proc/PID/task/PID/children); None if that cannot be read."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return None


def innermost_pid(pid: int) -> int | None:
    """``pid``'s number in its own pid namespace (the last of /proc/PID/status's NSpid)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def subtree(root: int) -> list[ProcInfo] | None:
    """Every process below ``root`` as the kernel links them (root excluded):
    each task's children (/proc/PID/task/TID/children: a child a thread
    forked is that thread's), walked down, each read once. It reads the
    run's tree only, never all of /proc: its cost grows with the run, not
    with the machine. None when ``root``'s children cannot be read (gone, or
    a kernel without CONFIG_PROC_CHILDREN): then the caller scans.

    A snapshot as a scan is: a process that forks or is re-parented while
    the walk runs may be missed, as a scan may miss it. A pid listed, then
    recycled before its stat is read, is left out: its parent is not one
    the walk passed. A shortage of descriptors raises (``fsread.SHORTAGE``).
    """
    first = _task_children(root)
    if first is None:
        return None
    found: list[ProcInfo] = []
    passed = {root}
    stack = first
    while stack:
        pid = stack.pop()
        if pid in passed:
            continue
        info = read_stat(pid)
        if info is None or info.ppid not in passed:
            continue
        passed.add(pid)
        found.append(info)
        stack.extend(_task_children(pid) or ())
    return found


def _task_children(pid: int) -> list[int] | None:
    """The children of every task of ``pid``; None if its task list cannot be read."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError as exc:
        raise_shortage(exc)
        return None
    pids: list[int] = []
    for tid in tids:
        try:
            pids.extend(map(int, read_bytes(f"/proc/{pid}/task/{tid}/children").split()))
        except FileNotFoundError:
            if tid == str(pid) and os.path.isdir(f"/proc/{pid}/task/{tid}"):
                return None  # no children files on this kernel
        except OSError as exc:
            raise_shortage(exc)
    return pids


def descendants(table: dict[int, ProcInfo], root: int) -> list[ProcInfo]:
    """All processes below ``root`` in ``table`` (root itself excluded)."""
    children: dict[int, list[ProcInfo]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info)
    found = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child.pid)
    return found


def _resident_pages(path: str) -> int:
    try:
        return int(read_bytes(path).split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def resident_bytes(pid: int) -> int:
    """Resident set size of one process (0 if it is gone).

    A zombie leader's own statm reads 0 while its threads still use the
    group's memory: then a live thread's statm (the same address space)
    is read.
    """
    pages = _resident_pages(f"/proc/{pid}/statm")
    if pages == 0 and (live := live_task(pid)) is not None:
        pages = _resident_pages(f"/proc/{pid}/task/{live[0]}/statm")
    return pages * PAGE_SIZE


#: Clock ticks per second, the unit of /proc/PID/stat's CPU times.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> tuple[int, int] | None:
    """(user, system) CPU time of a process and of the children it has
    reaped (utime+cutime, stime+cstime), in clock ticks; None if it is gone.
    A zombie keeps its figures until it is reaped."""
    try:
        fields = _stat_fields(read_bytes(f"/proc/{pid}/stat"))
        # After comm: state is field 3, so utime (14) .. cstime (17) are 11..14.
        return int(fields[11]) + int(fields[13]), int(fields[12]) + int(fields[14])
    except (OSError, ValueError, IndexError):
        return None


def cmdline(pid: int) -> list[str]:
    """argv of a process, for reports ([] if gone or a kernel thread)."""
    try:
        return [a.decode(errors="replace") for a in read_bytes(f"/proc/{pid}/cmdline").split(b"\0")[:-1]]
    except OSError:
        return []


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def proc_is_ours() -> bool:
    """Does /proc number processes as this process's pid namespace does?
    (/proc/self names this process by the numbers of the namespace /proc was
    mounted for: after ``unshare -fp`` without a /proc of its own, the parent's.)"""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False
