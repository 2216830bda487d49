"""Reading the process table from /proc.

A scan is a snapshot: processes appear and vanish while it runs, so every
reader tolerates a pid disappearing between listing and reading. Identity
of a process is (pid, start time): the start time (clock ticks since boot,
field 22 of /proc/PID/stat) tells a recycled pid from the original.
"""

import os

from .fsread import read_bytes


class ProcInfo:
    __slots__ = ("pid", "ppid", "pgid", "sid", "state", "starttime")

    def __init__(self, pid: int, ppid: int, pgid: int, sid: int, state: str, starttime: int):
        self.pid = pid
        self.ppid = ppid
        self.pgid = pgid
        self.sid = sid
        self.state = state
        self.starttime = starttime

    def __repr__(self) -> str:
        return f"ProcInfo(pid={self.pid}, ppid={self.ppid}, state={self.state})"


def read_stat(pid: int) -> ProcInfo | None:
    """The process's stat line, or None if it is gone (or unreadable)."""
    try:
        data = read_bytes(f"/proc/{pid}/stat")
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    return ProcInfo(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0].decode(), int(fields[19]))


def scan() -> dict[int, ProcInfo]:
    """Every process visible in /proc, keyed by pid (threads excluded)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = read_stat(int(name))
            if info is not None:
                table[info.pid] = info
    return table


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


def resident_bytes(pid: int) -> int:
    """Resident set size of one process (0 if it is gone)."""
    try:
        return int(read_bytes(f"/proc/{pid}/statm").split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0


def cmdline(pid: int) -> list[str]:
    """argv of a process, for reports ([] if gone or a kernel thread)."""
    try:
        return [a.decode(errors="replace") for a in read_bytes(f"/proc/{pid}/cmdline").split(b"\0")[:-1]]
    except OSError:
        return []


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
