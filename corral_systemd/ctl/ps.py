"""``corralctl ps``: live runs, who started what, how many processes, how much memory."""

import json
import os
import sys
import time

from ..state import registry as REG
from .processes import run_memory, run_processes


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


def ps_rows(directory: str, include_finished: bool = False, session: str | None = None) -> list[dict]:
    """Live runs (and finished ones if asked); with ``session``, only that session's:
    proven by the run's own corral's token while it lives, else as its entry says."""
    from ..kernel import procfs
    from ..state import sessions as S

    table = procfs.scan()
    now, mono = time.time(), time.monotonic()
    rows = []
    for entry in REG.list_entries(directory):
        state, why = REG.effective_state(entry, now_monotonic=mono)
        if state == "finished" and not include_finished:  # as its owner says, while it holds its token
            continue
        if session is not None and not (
            S.member_of(entry, session) or (REG.owner_token(entry) is None and entry.get("session") == session)
        ):
            continue
        events = REG.read_events(directory, entry["run_id"])
        procs = run_processes(entry, events, table)
        deadline = entry.get("deadline_monotonic")
        rows.append(
            {
                "run_id": entry["run_id"],
                "name": entry.get("name"),
                "session": entry.get("session"),
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


def ps(as_json: bool, directory: str | None = None, session: str | None = None) -> int:
    directory = directory or REG.state_dir()
    if not os.path.isdir(directory):
        from .status import no_registry

        print(f"corralctl: {no_registry(directory)}", file=sys.stderr)
    if session is not None:
        from ..state import sessions as S
        from .status import CtlError

        found = S.find(session, directory)
        if found is None:
            raise CtlError(f"unknown session {session!r}")
        session = found["session"]
    rows = ps_rows(directory, session=session)
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
                cell(r["unit"] or "-"),
                _age(r["age"]),
                _deadline_cell(r),
                str(r["processes"]),
                _size(r["memory"]),
                cell(r["cwd"] or "-"),
                command_text(r["command"] or []),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    for line in lines:
        print("  ".join(col.ljust(w) for col, w in zip(line, widths, strict=False)) + "  " + line[-1])
    return 0


def _deadline_cell(row: dict) -> str:
    """Time left to the deadline, or what it says instead: ``passed`` once
    the deadline is behind, ``-`` for none (never a countdown past it)."""
    left = row["time_to_deadline"]
    if left is None:
        return "-"
    if left <= 0 or row["state"] == "expired":
        return "passed" if left <= 0 else "expired"
    return _age(left)


#: Characters that would break or forge a table row: C0/C1 controls, DEL, line/paragraph separators.
def _unsafe(ch: str) -> bool:
    code = ord(ch)
    return code < 0x20 or 0x7F <= code < 0xA0 or ch in "\u2028\u2029"


def cell(text) -> str:
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
    return cell(" ".join(_quote(str(a)) for a in argv))
