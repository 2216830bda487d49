"""``corralctl``: look at and act on registered runs.

    corralctl ps [--json]          live runs: who started what, how many processes, how much memory
    corralctl status RUN           active | expired | finished | unknown  (exit 0 | 10 | 11 | 12)
    corralctl stop RUN             stop a run through its owner (its corral, or its unit), verified
    corralctl gc [--dry-run] [--keep-finished DURATION]
                                   remove finished runs older than DURATION (24h);
                                   stop what crashed corrals left behind
    corralctl audit verify RUN     check a run's event log offline

RUN is a run id, ``corral-<id>`` or the unit name. ``status`` does not load
typer: an action gateway may call it before every privileged action.
Errors (a bad or missing argument, an unknown command): one line on stderr,
with the usage, exit 125. ``corralctl`` alone, or a command group alone
(``corralctl audit``), prints its help on stdout and exits 0, as ``--help``.
"""

import json
import os
import signal
import sys
import time

from . import registry as REG

STATUS_EXIT = {"active": 0, "expired": 10, "finished": 11, "unknown": 12}


class CtlError(Exception):
    exit_code = 125


# -- status (fast path) --------------------------------------------------------
def status(run: str, directory: str | None = None) -> int:
    run_id = REG.normalize_run_id(run)
    directory = directory or REG.state_dir()
    entry = REG.read_entry(directory, run_id) if REG.valid_run_id(run_id) else None
    state, why = REG.effective_state(entry)
    print(f"{state} ({why})" if state != "unknown" else f"unknown ({run!r}: no such run in {directory})")
    return STATUS_EXIT[state]


# -- the run's processes --------------------------------------------------------
def _cgroup_dirs(entry: dict, events: list) -> list[str]:
    cg = entry.get("control_group") or next(
        (e["data"].get("control_group") for e in events if e.get("event") == "started"), None
    )
    if not cg:
        return []
    if entry.get("mode") == "cgroup":
        return [cg] if os.path.isdir(cg) else []
    from .kernel import cgroupfs

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


def _session_members(entry: dict, events: list, table) -> list:
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
    from .kernel import cgroupfs, procfs

    dirs = _cgroup_dirs(entry, events)
    if dirs:
        pids = set()
        for d in dirs:
            pids.update(cgroupfs.procs_below(d))
        return [table[p] for p in sorted(pids) if p in table]
    if entry.get("mode") == "fallback" and REG.owner_alive(entry):
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
    if entry.get("mode") == "fallback":
        return _session_members(entry, events, table)
    return []


def run_memory(entry: dict, events: list, procs: list) -> int:
    from .kernel import cgroupfs, procfs

    for d in _cgroup_dirs(entry, events):
        value = cgroupfs.read_int(os.path.join(d, "memory.current"))
        if value is not None:
            return value
    return sum(procfs.resident_bytes(p.pid) for p in procs)


# -- ps ----------------------------------------------------------------------------
def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    neg = seconds < 0
    seconds = abs(seconds)
    if seconds < 60:
        text = f"{seconds:.0f}s"
    elif seconds < 3600:
        text = f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    else:
        text = f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"
    return "-" + text if neg else text


def _size(n: float) -> str:
    for unit in ("B", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def ps_rows(directory: str, include_finished: bool = False) -> list[dict]:
    from .kernel import procfs

    table = procfs.scan()
    now, mono = time.time(), time.monotonic()
    rows = []
    for entry in REG.list_entries(directory):
        state, why = REG.effective_state(entry, now_monotonic=mono)
        if state == "finished" and not include_finished:  # as its owner says, while it holds its token
            continue
        events = REG.read_events(directory, entry["run_id"])
        procs = run_processes(entry, events, table)
        deadline = entry.get("deadline_monotonic")
        rows.append(
            {
                "run_id": entry["run_id"],
                "state": state,
                "why": why,
                "owner_alive": REG.owner_alive(entry),
                "owner_pid": (entry.get("owner") or {}).get("pid"),
                "mode": entry.get("mode"),
                "unit": entry.get("unit"),
                "age": now - entry.get("registered_at", now),
                "time_to_deadline": None if deadline is None else deadline - mono,
                "processes": len(procs),
                "pids": [p.pid for p in procs],
                "memory": run_memory(entry, events, procs),
                "cwd": entry.get("cwd"),
                "command": entry.get("command"),
            }
        )
    rows.sort(key=lambda r: -r["age"])
    return rows


def ps(as_json: bool, directory: str | None = None) -> int:
    rows = ps_rows(directory or REG.state_dir())
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("RUN", "STATE", "MODE", "UNIT", "AGE", "DEADLINE", "PROCS", "MEM", "CWD", "COMMAND")
    lines = [header]
    for r in rows:
        lines.append(
            (
                r["run_id"],
                r["state"],
                r["mode"] or "-",
                _cell(r["unit"] or "-"),
                _age(r["age"]),
                _age(r["time_to_deadline"]),
                str(r["processes"]),
                _size(r["memory"]),
                _cell(r["cwd"] or "-"),
                command_text(r["command"] or []),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    for line in lines:
        print("  ".join(col.ljust(w) for col, w in zip(line, widths, strict=False)) + "  " + line[-1])
    return 0


#: Characters that would break or forge a table row: C0/C1 controls, DEL, line/paragraph separators.
def _unsafe(ch: str) -> bool:
    code = ord(ch)
    return code < 0x20 or 0x7F <= code < 0xA0 or ch in "\u2028\u2029"


def _cell(text) -> str:
    """``text`` on one table line: control characters (newline, tab, escape...)
    shown as backslash escapes (``\\n``, ``\\t``, ``\\x1b``), so no value can
    break or forge a row. ``ps --json`` has the exact text."""
    names = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
    return "".join(
        names.get(ch, f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}") if _unsafe(ch) else ch
        for ch in str(text)
    )


_SHELL_SPECIAL = set("'\"\\$`;&|<>()*?[]#~!{}")


def _quote(arg: str) -> str:
    """One argument as a shell would need it (quoted only when it must be)."""
    import shlex

    if arg and not any(c.isspace() or c in _SHELL_SPECIAL or _unsafe(c) for c in arg):
        return arg
    return shlex.quote(arg)


def command_text(argv: list) -> str:
    """argv as one table cell: shell-quoted where needed, control characters escaped."""
    return _cell(" ".join(_quote(str(a)) for a in argv))


# -- reclaiming what a dead corral left -------------------------------------------------
class _Bus:
    """The systemd manager, when one is reachable (for units)."""

    def __init__(self):
        self.manager = None
        self.why = None
        try:
            from . import dbus
            from .dbus.discovery import connect_manager
            from .dbus.systemd1 import Manager
            from .errors import SetupError

            dbus.light_import = True
            try:
                _kind, conn = connect_manager("auto", timeout=5.0)
                self.manager = Manager(conn)
            except SetupError as exc:
                self.why = str(exc)
        except Exception as exc:  # no bus: units are not checked, and we say so
            self.why = f"systemd manager unreachable: {exc}"

    def list_units(self) -> list[tuple[str, str]]:
        return self.manager.list_units(["corral-*"])

    def active_state(self, unit: str) -> str:
        from .dbus.connection import BusError
        from .dbus.systemd1 import UNIT

        try:
            return self.manager.get(unit, UNIT, "ActiveState")
        except BusError as exc:
            if exc.name in ("org.freedesktop.systemd1.NoSuchUnit", "org.freedesktop.DBus.Error.UnknownObject"):
                return "gone"
            raise

    def not_corrals(self, unit: str, run_id: str | None = None) -> str | None:
        """Why ``unit`` is not a run unit corral started (for ``run_id``, if given), or None.

        By corral's own marks, never by name alone: named ``corral-<id>.scope``
        or ``.service`` (a run id: hex), bound (BindsTo=) to that run's tether
        scope ``corral-<id>-tether.scope`` or to a library Runner's
        ``corral-runner-<pid>-<hex>-tether.scope``, and described ``corral: ...``.
        A unit that is gone is not corral's to stop either.
        """
        import re

        from .dbus.connection import BusError
        from .dbus.systemd1 import UNIT

        m = re.fullmatch(r"corral-([0-9a-f]{1,64})\.(scope|service)", unit or "")
        if m is None:
            return "not named like a corral run unit (corral-<run id>.scope/.service)"
        if run_id is not None and m.group(1) != run_id:
            return f"not this run's unit (corral-{run_id}.*)"
        try:
            bound = list(self.manager.get(unit, UNIT, "BindsTo"))
            description = self.manager.get(unit, UNIT, "Description")
        except BusError as exc:
            return f"cannot read its properties ({exc.name})"
        tethers = [
            b
            for b in bound
            if b == f"corral-{m.group(1)}-tether.scope"
            or re.fullmatch(r"corral-runner-[0-9]+-[0-9a-f]{8}-tether\.scope", b)
        ]
        if not tethers:
            return "not bound to a corral tether (BindsTo=)"
        if not str(description).startswith("corral: "):
            return "its description is not corral's"
        return None

    def tether_alive(self, unit: str) -> bool:
        """Does a live corral own ``unit``? Its tether (the unit it BindsTo=) lives exactly as long as corral."""
        from .dbus.connection import BusError
        from .dbus.systemd1 import UNIT

        try:
            bound = self.manager.get(unit, UNIT, "BindsTo")
        except BusError:
            return False
        return any(self.active_state(b) in ("active", "activating", "reloading") for b in bound)

    def stop_verified(self, unit: str, timeout: float) -> bool:
        from .dbus.connection import BusError

        state = self.active_state(unit)
        if state in ("inactive", "failed", "gone"):
            return True
        try:
            self.manager.stop_unit(unit)
        except BusError as exc:
            if exc.name != "org.freedesktop.systemd1.NoSuchUnit":
                raise
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.active_state(unit) in ("inactive", "failed", "gone"):
                return True
            time.sleep(0.02)
        return False


def _not_corrals_cgroup(cg, run_id: str) -> str | None:
    """Why ``cg`` is not the cgroup corral made for this run (``--cgroup-parent``), or None."""
    from .kernel import cgroupfs

    if not isinstance(cg, str) or not os.path.isabs(cg) or os.path.normpath(cg) != cg:
        return "not a normalised absolute path"
    if os.path.basename(cg) != f"corral-{run_id}":
        return f"not named corral-{run_id}"
    unified = cgroupfs.Mounts().unified
    if unified is None or not cg.startswith(unified.rstrip("/") + "/"):
        return "not inside the cgroup v2 hierarchy"
    if os.path.realpath(cg) != cg:
        return "reached through a symlink"
    if not os.path.isfile(os.path.join(cg, "cgroup.procs")):
        return "not a control group"
    return None


def _signal_checked(info, sig, entry: dict) -> bool:
    """Signal the process ``info`` names, through a pidfd, if it still is that process in that session."""
    from .kernel.pidfd import signal_process

    return signal_process(info, sig, lambda current: current.sid == info.sid and REG.carries_mark(info.pid, entry))


def reclaim(directory: str, entry: dict, *, bus: "_Bus | None", dry_run: bool, by: str) -> dict:
    """Stop (TERM, grace, KILL, verify) what a run whose corral is gone left behind."""
    from .kernel import cgroupfs, procfs

    events = REG.read_events(directory, entry["run_id"])
    grace = _seconds(entry.get("grace"), 2.0)
    verify = _seconds(entry.get("verify_timeout"), 2.0) + 1.0
    report = {
        "run_id": entry["run_id"],
        "mode": entry.get("mode"),
        "unit": entry.get("unit"),
        "actions": [],
        "verified": True,
        "remaining": [],
        "notes": [],
    }
    actions = report["actions"]
    # The unit: the manager stops it (TERM, TimeoutStopSec=grace, KILL) and waits for its cgroup.
    # Only a unit proven corral's for this run (name, tether, description): the entry may be forged.
    if entry.get("unit"):
        if bus is None or bus.manager is None:
            report["verified"] = False
            report["notes"].append(bus.why if bus else "no systemd manager")
        elif bus.active_state(entry["unit"]) in ("inactive", "failed", "gone"):
            pass  # nothing left to stop (asking is harmless, whatever unit the entry names)
        elif (why := bus.not_corrals(entry["unit"], entry["run_id"])) is not None:
            report["verified"] = False
            report["notes"].append(f"{_cell(entry['unit'])} left alone: {why}")
        else:
            state = bus.active_state(entry["unit"])
            if state not in ("inactive", "failed", "gone"):
                actions.append(f"StopUnit {entry['unit']}")
                if not dry_run and not bus.stop_verified(entry["unit"], grace + verify + 5):
                    report["verified"] = False
                    report["notes"].append(f"{entry['unit']} still {bus.active_state(entry['unit'])}")
    elif entry.get("mode") == "cgroup" and entry.get("control_group"):
        cg = entry["control_group"]
        why = _not_corrals_cgroup(cg, entry["run_id"])
        if why is not None:
            report["verified"] = False
            report["notes"].append(f"control group {_cell(cg)} left alone: {why}")
        elif os.path.isdir(cg):
            actions.append(f"cgroup.kill {cg}")
            if not dry_run:
                cgroupfs.kill(cg)
                end = time.monotonic() + verify
                while cgroupfs.populated(cg) and time.monotonic() < end:
                    time.sleep(0.01)
                try:
                    os.rmdir(cg)
                except FileNotFoundError:
                    pass
                except OSError:
                    report["verified"] = False
                    report["remaining"] = cgroupfs.procs_below(cg) or [-1]
    elif entry.get("mode") == "fallback":
        members = _session_members(entry, events, procfs.scan())
        if members:
            actions.append("SIGTERM " + " ".join(str(p.pid) for p in members))
        if members and not dry_run:
            for p in members:
                _signal_checked(p, signal.SIGTERM, entry)
                _signal_checked(p, signal.SIGCONT, entry)
            end = time.monotonic() + grace
            while time.monotonic() < end and _session_members(entry, events, procfs.scan()):
                time.sleep(0.02)
            end = time.monotonic() + verify
            while True:
                left = _session_members(entry, events, procfs.scan())
                if not left or time.monotonic() >= end:
                    break
                if "SIGKILL" not in " ".join(actions):
                    actions.append("SIGKILL " + " ".join(str(p.pid) for p in left))
                for p in left:
                    _signal_checked(p, signal.SIGKILL, entry)
                time.sleep(0.01)
            if left:
                report["verified"] = False
                report["remaining"] = [p.pid for p in left]
        report["notes"].append(
            "fallback: only processes still in the command's session, or in the session of a "
            "detached process the log recorded, can be found once corral is gone"
        )
    creds = entry.get("credentials_directory")
    if creds and isinstance(creds, str) and os.path.lexists(creds):
        from .credentials import removable, remove_tree

        why = removable(creds, entry["run_id"], directory)
        if why is not None:
            report["notes"].append(f"{_cell(creds)} left alone: {why}")
        else:
            actions.append(f"remove {creds}")
            if not dry_run:
                remove_tree(creds)
    if not dry_run:
        _record_reclaim(directory, entry, report, by)
    return report


def _record_reclaim(directory: str, entry: dict, report: dict, by: str) -> None:
    import fcntl

    path = REG.log_path(directory, entry["run_id"])
    log = REG.EventLog(path, entry["run_id"], create=False)
    try:
        fcntl.flock(log.fd, fcntl.LOCK_EX)
        log.seq, log.head = REG.log_tail(path)
        reg = REG.Registration(directory, dict(entry), log)
        reg.event(
            "reclaimed",
            {"by": by, "actions": report["actions"], "verified": report["verified"], "remaining": report["remaining"]},
        )
        reg.save(
            state="finished",
            outcome="reclaimed",
            verified=report["verified"],
            remaining_pids=report["remaining"],
            finished_at=time.time(),
            finished_monotonic=time.monotonic(),
        )
    finally:
        log.close()


def _seconds(value, default: float, cap: float = 600.0) -> float:
    """A duration read from an entry (a file the run's uid can write): a number in [0, cap], else ``default``."""
    return min(float(value), cap) if isinstance(value, (int, float)) and value >= 0 else default


def _leftovers(directory: str, entry: dict, bus: "_Bus | None") -> tuple[str | None, str | None]:
    """(what is still running, the unit it is in) for a run whose entry claims it finished.

    Asked of the kernel and the manager, not the entry: a unit of corral's
    for this run id still active, a corral cgroup still populated, or a
    process carrying the run's mark in a session its log names.
    """
    from .kernel import cgroupfs, procfs

    run_id = entry["run_id"]
    if bus is not None and bus.manager is not None:
        for unit in (f"corral-{run_id}.scope", f"corral-{run_id}.service"):
            state = bus.active_state(unit)
            if state not in ("inactive", "failed", "gone") and bus.not_corrals(unit, run_id) is None:
                return f"its unit {unit} is {state}", unit
    cg = entry.get("control_group")
    if (
        entry.get("mode") == "cgroup"
        and isinstance(cg, str)
        and _not_corrals_cgroup(cg, run_id) is None
        and cgroupfs.populated(cg)
    ):
        return f"its control group {cg} still has processes", None
    members = _session_members(entry, REG.read_events(directory, run_id), procfs.scan())
    if members:
        return f"processes of the run are alive: {' '.join(str(p.pid) for p in members)}", None
    return None, None


def _signal_owner(entry: dict) -> bool:
    """SIGTERM the run's owner (a corral: it runs its verified stop), through a pidfd, re-verified after opening it."""
    pid = entry["owner"]["pid"]
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return False
    try:
        # The pidfd pins the process: if it is still the verified owner now, it is the one we signal.
        if not REG.owner_verified(entry)[0]:
            return False
        signal.pidfd_send_signal(fd, signal.SIGTERM)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


def stop(run: str, timeout: float | None = None, directory: str | None = None) -> int:
    """Stop a run: through its owner when the owner is proven (``registry.owner_verified``),
    else by reclaiming what is proven the run's (``reclaim``). Nothing the entry alone
    says is signalled or stopped."""
    directory = directory or REG.state_dir()
    run_id = REG.normalize_run_id(run)
    entry = REG.read_entry(directory, run_id) if REG.valid_run_id(run_id) else None
    if entry is None:
        print(f"corralctl: unknown run {run!r}", file=sys.stderr)
        return STATUS_EXIT["unknown"]
    bus = None
    token = REG.owner_token(entry)
    if entry.get("state") == "finished" and (token is None or token.get("state") == "finished"):
        bus = _Bus()
        left, unit = _leftovers(directory, entry, bus)
        if left is None:
            print(f"{run_id}: already finished (exit {entry.get('exit_code')}, {entry.get('outcome')})")
            return 0
        print(f"{run_id}: entry claims finished but {left}: stopping it")
        entry = dict(entry, state="expired", unit=unit or entry.get("unit"))
    elif entry.get("state") == "finished":
        print(
            f"{run_id}: entry claims finished but its owner (pid {entry['owner']['pid']}) is alive and "
            "running the run: stopping it"
        )
    wait = (
        timeout
        if timeout is not None
        else (_seconds(entry.get("grace"), 2.0) + _seconds(entry.get("verify_timeout"), 2.0) + 10)
    )
    verified, why = REG.owner_verified(entry)
    if verified and entry["owner"].get("kind") == "library":
        return _stop_library_run(directory, entry, wait)
    if verified:
        if _signal_owner(entry):  # corral runs its verified stop
            code = _await_finished(
                directory,
                entry,
                wait,
                f"stopped by its corral (pid {entry['owner']['pid']})",
                "its corral",
                give_up=lambda e: not REG.owner_alive(e),
            )
            if code is not None:
                return code  # else: died without finishing; reclaim below
    elif REG.owner_alive(entry):
        print(f"{run_id}: not signalling the owner the entry names: {why}", file=sys.stderr)
    fresh = REG.read_entry(directory, run_id)
    if (
        fresh is not None
        and REG.effective_state(fresh)[0] == "finished"
        and not _leftovers(directory, fresh, bus if bus is not None else (_Bus() if fresh.get("unit") else None))[0]
    ):
        print(f"{run_id}: already finished (exit {fresh.get('exit_code')}, {fresh.get('outcome')})")
        return 0
    if bus is None and entry.get("unit"):
        bus = _Bus()
    report = reclaim(directory, entry, bus=bus, dry_run=False, by="corralctl stop")
    _print_report(report, dry_run=False)
    return 0 if report["verified"] else 1


def _stop_library_run(directory: str, entry: dict, wait: float) -> int:
    """A run owned by an application (Python API): never signal the
    application; stop the unit, and let its in-process supervisor verify."""
    run_id = entry["run_id"]
    if not entry.get("unit"):
        print(
            f"corralctl: {run_id}: owned by process {entry['owner']['pid']} through the Python API, "
            "without a unit: stop it from that application",
            file=sys.stderr,
        )
        return 1
    bus = _Bus()
    if bus.manager is None:
        print(f"corralctl: {run_id}: {bus.why}", file=sys.stderr)
        return 1
    if (why := bus.not_corrals(entry["unit"], run_id)) is not None:
        print(f"corralctl: {run_id}: {_cell(entry['unit'])} left alone: {why}", file=sys.stderr)
        return 1
    bus.stop_verified(entry["unit"], wait)
    code = _await_finished(
        directory, entry, wait, f"unit {entry['unit']} stopped; its supervisor reports", "its supervisor"
    )
    return 1 if code is None else code


def _await_finished(
    directory: str, entry: dict, wait: float, done: str, who: str, give_up=lambda entry: False
) -> int | None:
    """Wait for the run's supervisor to record "finished"; report and return the exit code.

    None when ``give_up(entry)`` says waiting is pointless (the owner died).
    """
    run_id = entry["run_id"]
    end = time.monotonic() + wait
    while time.monotonic() < end:
        entry = REG.read_entry(directory, run_id) or entry
        if REG.effective_state(entry)[0] == "finished":  # the owner's token, while it holds one
            ok = bool(entry.get("verified"))
            print(
                f"{run_id}: {done}: exit {entry.get('exit_code')}, "
                + ("verified" if ok else f"NOT verified, still present: {entry.get('remaining_pids')}")
            )
            return 0 if ok else 1
        if give_up(entry):
            return None
        time.sleep(0.02)
    print(f"corralctl: {run_id}: {who} did not finish within {wait:g}s", file=sys.stderr)
    return 1


def _print_report(report: dict, dry_run: bool) -> None:
    what = "; ".join(report["actions"]) or "nothing left to stop"
    verdict = (
        "would do"
        if dry_run
        else ("verified" if report["verified"] else f"NOT verified, still present: {report['remaining']}")
    )
    print(
        f"{report['run_id']} ({report['mode']}{' ' + report['unit'] if report.get('unit') else ''}): {what}: {verdict}"
    )
    for note in report.get("notes", []):
        if not report["verified"] or dry_run:
            print(f"  note: {note}")


def parse_keep(text: str) -> float:
    """``--keep-finished``: a DURATION (``0s`` allowed); bad input is a CtlError (exit 125)."""
    from .units import parse_duration

    try:
        return parse_duration(text, what="--keep-finished")
    except ValueError as exc:
        raise CtlError(str(exc)) from None


def _print_pruned(rows: list[dict], dry_run: bool) -> None:
    for row in rows:
        done = "would remove" if dry_run else ("NOT removed: " + row["error"] if "error" in row else "removed")
        print(
            f"{row['run_id']}: finished {_age(row['age'])} ago (exit {row['exit_code']}, {row['outcome']}): "
            f"entry and event log {done}"
        )


def gc(
    dry_run: bool, as_json: bool = False, directory: str | None = None, keep_finished: float = REG.KEEP_FINISHED
) -> int:
    """Reclaim what dead owners left, then remove finished runs older than ``keep_finished`` seconds.

    Exit 0 when everything was stopped (verified) and removed, else 1.
    Never removes an active or expired entry, nor one whose owner runs.
    """
    directory = directory or REG.state_dir()
    # Finished runs past retention, first: a run this gc reclaims is not among them.
    pruned = REG.prune_finished(directory, keep_finished, dry_run=dry_run)
    entries = REG.list_entries(directory)
    bus = _Bus()
    reports, ok = [], True
    live_ids = set()
    for entry in entries:
        if entry.get("state") == "finished":
            continue
        if REG.owner_alive(entry):
            live_ids.add(entry["run_id"])
            continue
        report = reclaim(directory, entry, bus=bus, dry_run=dry_run, by="corralctl gc")
        reports.append(report)
        ok = ok and report["verified"]
    # Units no live corral owns: the registry knows some owners; for runs
    # registered elsewhere (another state directory) the tether tells: it
    # lives exactly as long as its corral.
    notes = []
    if bus.manager is not None:
        units = dict(bus.list_units())
        for unit, state in sorted(units.items()):
            if unit.endswith("-tether.scope") or state in ("inactive", "failed"):
                continue
            run_id = REG.normalize_run_id(unit)
            if run_id in live_ids or bus.not_corrals(unit) is not None or bus.tether_alive(unit):
                continue  # a live corral's, or not corral's at all (by its marks, not its name)
            if any(r["unit"] == unit for r in reports):
                continue
            report = {
                "run_id": run_id,
                "mode": "systemd",
                "unit": unit,
                "actions": [f"StopUnit {unit}"],
                "verified": True,
                "remaining": [],
                "notes": ["no live owner (no registry entry, no tether)"],
            }
            if not dry_run and not bus.stop_verified(unit, 15):
                report["verified"] = False
                report["notes"].append(f"{unit} still {bus.active_state(unit)}")
            reports.append(report)
            ok = ok and report["verified"]
    else:
        notes.append(f"units not checked: {bus.why}")
    # Credential directories without a live run (a watcher killed by hand):
    # only in corral's own bases, and never one a live run holds locked,
    # registered here or not (--no-registry, another state directory).
    from .credentials import candidate_bases, removable, remove_tree

    for base in candidate_bases(directory):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            if name in live_ids:
                continue
            path = os.path.join(base, name)
            if removable(path, None, directory) is not None:
                continue
            reports.append(
                {
                    "run_id": name,
                    "mode": "-",
                    "unit": None,
                    "actions": [f"remove {path}"],
                    "verified": True,
                    "remaining": [],
                    "notes": [],
                }
            )
            if not dry_run:
                remove_tree(path)
    ok = ok and not any("error" in row for row in pruned)
    if as_json:
        print(
            json.dumps(
                {
                    "dry_run": dry_run,
                    "reclaimed": reports,
                    "pruned": pruned,
                    "keep_finished": keep_finished,
                    "notes": notes,
                },
                indent=2,
            )
        )
    else:
        for report in reports:
            _print_report(report, dry_run)
        _print_pruned(pruned, dry_run)
        for note in notes:
            print(f"note: {note}")
        if not reports and not pruned:
            print("nothing to clean up")
    return 0 if ok else 1


def audit_verify(run: str, directory: str | None = None) -> int:
    """0 intact, 1 bad (or the log is missing while the entry is there), 12 no such run."""
    directory = directory or REG.state_dir()
    run_id = REG.normalize_run_id(run)
    if not REG.valid_run_id(run_id) or not any(
        os.path.lexists(path) for path in (REG.entry_path(directory, run_id), REG.log_path(directory, run_id))
    ):
        print(f"corralctl: unknown run {run!r}", file=sys.stderr)
        return STATUS_EXIT["unknown"]
    ok, message, line = REG.verify_log(directory, run_id)
    path = REG.log_path(directory, run_id)
    if not ok:
        where = f":{line}" if line else ""
        print(f"{path}{where}: BAD: {message}")
        return 1
    # The chain shows the file is consistent, not who wrote it: the run's uid
    # can rewrite it, chain and anchor included. The journal's copy it cannot.
    from . import journal

    if not journal.available():
        print(
            f"{path}: OK: {message}; no journal to compare with: the chain cannot tell a rewrite "
            "by the run's own uid (see man corralctl)"
        )
        return 0
    records = journal.read_records(run_id)
    if records is None:
        print(f"{path}: OK: {message}; the journal could not be read (journalctl failed)")
        return 0
    copy, sender = journal.trusted_lines(records, run_id, os.geteuid())
    if not copy:
        print(f"{path}: OK: {message}; the journal has no copy of this run")
        return 0
    try:
        with open(path, "rb") as f:
            file_lines = f.read().split(b"\n")[:-1]
    except OSError as exc:
        print(f"{path}: BAD: {exc.strerror}")
        return 1
    diffs = journal.compare(file_lines, copy)
    if not diffs:
        print(f"{path}: OK: {message}; matches the journal ({len(copy)} events sent by {sender})")
        return 0
    for number, what in diffs:
        print(f"{path}:{number}: BAD: {what}")
    return 1


# -- command line ---------------------------------------------------------------------
def _app():

    import typer

    app = typer.Typer(
        add_completion=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        no_args_is_help=True,
        context_settings={"help_option_names": ["--help", "-h"]},
        help="Look at and act on corral runs (the run registry: $CORRAL_STATE_DIR, else /run/corral "
        "for root, $XDG_RUNTIME_DIR/corral for other users).",
    )
    audit = typer.Typer(help="The runs' audit logs.", no_args_is_help=True)
    app.add_typer(audit, name="audit")

    @app.command("ps")
    def _ps(as_json: bool = typer.Option(False, "--json", help="JSON instead of a table.")):
        """Live runs: id, mode, unit, age, time to deadline, processes, memory, cwd, command."""
        raise typer.Exit(ps(as_json))

    @app.command("status")
    def _status(run: str = typer.Argument(..., metavar="RUN")):
        """active (0), expired (10), finished (11) or unknown (12)."""
        raise typer.Exit(status(run))

    @app.command("stop")
    def _stop(
        run: str = typer.Argument(..., metavar="RUN"),
        timeout: float | None = typer.Option(
            None,
            "--timeout",
            metavar="SECONDS",
            help="Seconds to wait for the owner to finish the run. Default: the run's grace + verify timeout + 10 s.",
        ),
    ):
        """Stop a run through its owner (its corral, or its unit when corral is gone), verified."""
        raise typer.Exit(stop(run, timeout))

    @app.command("gc")
    def _gc(
        dry_run: bool = typer.Option(False, "--dry-run", help="Report only; stop and remove nothing."),
        keep_finished: str = typer.Option(
            f"{REG.KEEP_FINISHED / 3600:g}h",
            "--keep-finished",
            metavar="DURATION",
            help="Remove finished runs (entry and event log) that finished longer ago than this.",
        ),
        as_json: bool = typer.Option(False, "--json", help="JSON report."),
    ):
        """Reclaim what crashed corrals left; prune old finished runs.

        Removes finished runs (entry and event log) that finished longer ago
        than --keep-finished; stops runs whose corral is gone, corral-* units no
        live corral owns, and removes stray credential directories. Active and
        expired runs, and runs whose owner still runs, are never removed.
        """
        raise typer.Exit(gc(dry_run, as_json, keep_finished=parse_keep(keep_finished)))

    @audit.command("verify")
    def _verify(run: str = typer.Argument(..., metavar="RUN")):
        """Check a run's hash-chained event log; point at the first bad line."""
        raise typer.Exit(audit_verify(run))

    return app


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) == 2 and args[0] == "status" and not args[1].startswith("-"):
            return status(args[1])  # fast path: no typer
        import click
        import typer

        command = typer.main.get_command(_app())
        no_args = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2
        try:
            rv = command.main(args=args, prog_name="corralctl", standalone_mode=False)
            return rv if isinstance(rv, int) else 0
        except click.exceptions.Exit as exc:
            return exc.exit_code
        except no_args as exc:  # `corralctl`, `corralctl audit`: the help, as --help gives it
            print(exc.ctx.get_help())
            return 0
        except click.UsageError as exc:
            usage = exc.ctx.get_usage().replace("\n", " ").strip() if exc.ctx is not None else ""
            print(f"corralctl: {exc.format_message()}" + (f" ({usage})" if usage else ""), file=sys.stderr)
            return 125
        except click.ClickException as exc:
            print(f"corralctl: {exc.format_message()}", file=sys.stderr)
            return 125
        except click.Abort:
            print("corralctl: aborted", file=sys.stderr)
            return 130
    except CtlError as exc:
        print(f"corralctl: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"corralctl: {exc}", file=sys.stderr)
        return 125


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
