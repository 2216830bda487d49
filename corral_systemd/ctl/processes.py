"""A registered run's processes, as the kernel shows them: its cgroup, its sessions, its mark."""

import os
import time

from ..engines.kinds import leftovers_of
from ..state import registry as REG


# -- the run's processes --------------------------------------------------------
def _cgroup_dirs(entry: dict, events: list) -> list[str]:
    cg = entry.get("control_group") or next(
        (e["data"].get("control_group") for e in events if e.get("event") == "started"), None
    )
    if not cg:
        return []
    if leftovers_of(entry) == "cgroup":
        return [cg] if os.path.isdir(cg) else []  # a unit's is named in two hierarchies: below
    from ..kernel import cgroupfs

    mounts = cgroupfs.Mounts()
    dirs = [d for d in (cgroupfs.unified_dir(mounts, cg), cgroupfs.v1_dir(mounts, "name=systemd", cg)) if d]
    return [d for d in dirs if os.path.isdir(d)]


def _sessions(entry: dict, events: list) -> list[tuple[int, int | None]]:
    """(sid, starttime of the session leader) of the command and of every detached process seen."""
    out = []
    for e in events:
        data = e.get("data") or {}
        if e.get("event") == "started" and data.get("sid"):
            out.append((data["sid"], data.get("starttime")))
        elif e.get("event") == "detached" and data.get("sid") == data.get("pid"):
            out.append((data["sid"], data.get("starttime")))
    return out


def session_members(entry: dict, events: list, table) -> list:
    """Processes still in the run's sessions, for a fallback run whose corral is gone.

    A session id stays allocated while any process uses it, so processes
    carrying it belong to that session, unless its number was reused after
    all of them died: then a process with that pid exists and is not the
    leader we recorded (or started after the run registered).
    """
    found = []
    registered_ticks = None
    for sid, leader_start in _sessions(entry, events):
        leader = table.get(sid)
        if leader is not None:
            if leader_start is not None and leader.starttime != leader_start:
                continue  # the number was reused: every process of our session had died
            if registered_ticks is None:
                registered_ticks = _ticks_at(entry.get("registered_at", 0))
            if leader_start is None and leader.starttime < registered_ticks:
                continue  # older than the run: a reused number
        found += [p for p in table.values() if p.sid == sid and p.alive]
    # The log that names these sessions is a file the run's uid can rewrite:
    # only a process carrying the run's mark (its environment, inherited from
    # the command) is proven the run's.
    return [p for p in {p.pid: p for p in found}.values() if REG.carries_mark(p.pid, entry)]


def _ticks_at(wall: float) -> int:
    """A wall-clock time as /proc starttime ticks (clock ticks since boot)."""
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    hz = os.sysconf("SC_CLK_TCK")
    return int((uptime - (time.time() - wall)) * hz) - hz  # one second of slack


def run_processes(entry: dict, events: list, table) -> list:
    """The run's live processes as ProcInfo."""
    from ..kernel import cgroupfs, procfs

    dirs = _cgroup_dirs(entry, events)
    if dirs:
        pids = set()
        for d in dirs:
            pids.update(cgroupfs.procs_below(d))
        return [table[p] for p in sorted(pids) if p in table]
    leftovers = leftovers_of(entry)
    if leftovers not in ("sessions", "namespace"):
        return []
    if REG.owner_alive(entry):
        owner = entry["owner"]["pid"]
        helpers = set(entry.get("helper_pids") or [])
        skip = set()
        members = []
        for p in procfs.descendants(table, owner):
            if p.pid in helpers or p.ppid in skip:
                skip.add(p.pid)
                continue
            if p.alive:
                members.append(p)
        return members
    # A PID namespace died with its init, which dies with corral: nothing is left.
    return session_members(entry, events, table) if leftovers == "sessions" else []


def run_memory(entry: dict, events: list, procs: list) -> int:
    from ..kernel import cgroupfs, procfs

    for d in _cgroup_dirs(entry, events):
        value = cgroupfs.read_int(os.path.join(d, "memory.current"))
        if value is not None:
            return value
    return sum(procfs.resident_bytes(p.pid) for p in procs)
