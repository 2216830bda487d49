"""A registered run's processes, as the kernel shows them: its cgroup, its mark."""

import os

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


def marked_members(entry: dict, table) -> list:
    """Processes of a fallback run whose corral is gone: every live process that
    carries the run's mark (its environment, inherited from the command: the entry
    holds only its hash, so a forged entry names no process that carries it),
    wherever it went -- another session, a process group, a new parent. A process
    that cleared its environment is out of reach."""
    return [p for p in table.values() if p.alive and REG.carries_mark(p.pid, entry)]


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
        # The owner's descendants but corral's own helpers (its tether, its
        # credentials watcher) and what they started. A helper that is pid 1 of
        # a PID namespace of its own is the namespace's init: corral's too, but
        # the run is below it (every process of the namespace descends from it).
        owner = entry["owner"]["pid"]
        helpers = set(entry.get("helper_pids") or [])
        skip = set()
        members = []
        for p in procfs.descendants(table, owner):
            if p.pid in helpers:
                if procfs.innermost_pid(p.pid) != 1:
                    skip.add(p.pid)
                continue
            if p.ppid in skip:
                skip.add(p.pid)
                continue
            if p.alive:
                members.append(p)
        return members
    # A PID namespace died with its init, which dies with corral: nothing is left.
    return marked_members(entry, table) if leftovers == "sessions" else []


def run_memory(entry: dict, events: list, procs: list) -> int:
    from ..kernel import cgroupfs, procfs

    for d in _cgroup_dirs(entry, events):
        value = cgroupfs.read_int(os.path.join(d, "memory.current"))
        if value is not None:
            return value
    return sum(procfs.resident_bytes(p.pid) for p in procs)
