"""``corralctl session start | ls | end``: runs that end together, with their agent.

A session is held by a **holder**: a detached process ``session start`` forks
(its own session, /dev/null for stdio, none of the caller's descriptors),
which holds the session's sealed token (``state.sessions``), learns each
run that joins (from that run's own corral's token, never from its entry),
and ends the session when

- its owner exits (``--owner PID``: watched through a pidfd opened by
  ``session start`` and inherited, so a reused pid number is never taken
  for the owner),
- it has been idle for ``--idle-timeout`` (no run started, none running in
  the foreground; background runs do not keep a session alive), or
- ``corralctl session end`` asks (SIGTERM through a pidfd, after checking the
  holder's start time and token).

Ending: the token says ``ending`` first (no run joins from then: a joining
corral checks it after registering), every member is stopped with its own
stop sequence (``corralctl stop``'s rules: only what is proven the run's is
signalled), in parallel. ``session end`` then proves each member gone itself
(``logs.finished``: the run's corral says so, or nothing of it is left in
the kernel's view) and exits 0, or 120 naming what is not proven; it never
takes the holder's word, nor the entry's, for that.
"""

import json
import os
import select
import signal
import sys
import time

from ..common.unit_names import new_run_id
from ..state import registry as REG
from ..state import sessions as S
from .status import CtlError

#: How often the holder looks at the registry (new members, foreground runs).
SCAN = 0.2
#: How long ``session end`` follows a holder that is stopping the session's runs.
HOLDER_WAIT = 120.0


def start(
    name: str | None,
    owner: int | None,
    idle_timeout: float,
    max_runs: int | None,
    as_json: bool,
    directory: str | None = None,
) -> int:
    directory = REG.ensure_state_dir(directory)
    REG.ensure_private_dir(S.sessions_dir(directory))
    if name is not None:
        from ..common.errors import UsageError
        from ..core.request import check_name

        try:
            check_name(name, "--name")
        except UsageError as exc:
            raise CtlError(str(exc)) from None
    if max_runs is not None and max_runs < 1:
        raise CtlError("--max-runs must be 1 or more")
    try:
        cap = S.max_sessions()
    except ValueError as exc:
        raise CtlError(str(exc)) from None
    owner_fd, owner_start = _open_owner(owner) if owner is not None else (None, None)
    lock = _lock(directory)
    try:
        live = S.live_sessions(directory)
        if len(live) >= cap:
            raise CtlError(
                f"{len(live)} sessions are open, the most this user may have (CORRAL_MAX_SESSIONS={cap}): end one first"
            )
        if name is not None and any(e.get("name") == name for e in live):
            raise CtlError(f"--name {name!r}: a session of that name is open")
        session_id = new_run_id()
        ready_r, ready_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the holder, from here to os._exit
            code = 1
            try:
                os.close(ready_r)
                code = _hold(directory, session_id, name, owner, owner_start, owner_fd, idle_timeout, max_runs, ready_w)
            finally:
                os._exit(code)
        os.close(ready_w)
        said = os.read(ready_r, 1)
        os.close(ready_r)
    finally:
        os.close(lock)
        if owner_fd is not None:
            os.close(owner_fd)
    if said != b"1":
        raise CtlError("the session's holder could not start")
    os.waitpid(pid, 0)  # the intermediate: the holder forked itself away (see _hold)
    entry = S.read_entry(directory, session_id) or {}
    if as_json:
        print(json.dumps(_public(entry), sort_keys=True))
    else:
        print(session_id)
    return 0


def _open_owner(pid: int) -> tuple[int, int]:
    if pid <= 0:
        raise CtlError(f"--owner {pid}: not a process id")
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise CtlError(f"--owner {pid}: no such process") from None
    except OSError as exc:
        raise CtlError(f"--owner {pid}: {exc.strerror}") from None
    st = REG.proc_stat(pid)
    if st is None or st[3] in ("Z", "X"):
        os.close(fd)
        raise CtlError(f"--owner {pid}: no such process")
    return fd, st[4]


def _lock(directory: str) -> int:
    """One ``session start`` at a time per user, so the cap holds under a race."""
    import fcntl

    fd = os.open(
        os.path.join(S.sessions_dir(directory), ".lock"),
        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _public(entry: dict) -> dict:
    keys = ("session", "name", "owner", "idle_timeout", "max_runs", "created_at", "holder", "state")
    return {k: entry.get(k) for k in keys}


# -- the holder -----------------------------------------------------------------------------------
def _hold(directory, session_id, name, owner, owner_start, owner_fd, idle_timeout, max_runs, ready_w) -> int:
    """The holder's life (a grandchild of ``session start``, so no shell waits for it)."""
    os.setsid()
    if os.fork():
        return 0  # the intermediate: ``session start`` reaps it at once
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = {ready_w} | ({owner_fd} if owner_fd is not None else set())
    for fd in range(3, 1024):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    stop_r, stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(stop_w)
    asked: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: asked.append(signum))
    token = S.HolderToken(session_id, max_runs)
    token.update()
    entry = {
        "session": session_id,
        "name": name,
        "owner": None if owner is None else {"pid": owner, "starttime": owner_start},
        "idle_timeout": idle_timeout,
        "max_runs": max_runs,
        "created_at": time.time(),
        "holder": {"pid": os.getpid(), "starttime": REG.own_starttime(), "boot_id": REG.boot_id()},
        "state": "open",
    }
    S.write_entry(directory, entry)
    os.write(ready_w, b"1")
    os.close(ready_w)
    members: list[str] = []
    seen: dict[str, int] = {}
    last_activity = time.monotonic()
    why = None
    while why is None:
        fds = [stop_r] + ([owner_fd] if owner_fd is not None else [])
        ready, _, _ = select.select(fds, [], [], SCAN)
        if owner_fd is not None and owner_fd in ready:
            why = f"its owner (pid {owner}) exited"
            break
        if asked:
            why = "ended by corralctl session end"
            break
        if S.read_entry(directory, session_id) != entry:  # removed or rewritten: the holder's is the entry
            try:
                S.write_entry(directory, entry)
            except OSError:
                pass  # the state directory itself is gone: the token still holds the session
        joined, foreground = _scan(directory, session_id, members, seen)
        if joined:
            members.extend(joined)
            token.update(members=members)
        if joined or foreground:
            last_activity = time.monotonic()
        elif time.monotonic() - last_activity >= idle_timeout:
            why = f"idle for {idle_timeout:g}s"
    token.update(state="ending")
    joined, _ = _scan(directory, session_id, members, seen)  # whoever joined before "ending" was read
    members.extend(joined)
    token.update(members=members)
    left = stop_members(directory, members)
    entry.update(state="ended", ended_at=time.time(), why=why, members=members, not_proven=left)
    S.write_entry(directory, entry)
    token.close()
    return 0


def _scan(directory: str, session_id: str, members: list[str], seen: dict) -> tuple[list[str], bool]:
    """(runs newly proven to have joined, whether a member runs in the foreground now).

    Reads only entries changed since the last look."""
    joined: list[str] = []
    foreground = False
    try:
        names = os.scandir(directory)
    except OSError:
        return joined, foreground
    with names:
        for item in names:
            if not item.name.endswith(".json"):
                continue
            run_id = item.name[:-5]
            if not REG.valid_run_id(run_id):
                continue
            try:
                mtime = item.stat(follow_symlinks=False).st_mtime_ns
            except OSError:
                continue
            is_member = run_id in members or run_id in joined
            if not is_member and seen.get(run_id) == mtime:
                continue
            seen[run_id] = mtime
            entry = REG.read_entry(directory, run_id)
            if entry is None or entry.get("run_id") != run_id:
                continue
            if not is_member and entry.get("session") == session_id:
                if S.member_of(entry, session_id):
                    joined.append(run_id)
                    is_member = True
                else:
                    # A run that came and went between two looks: it kept the
                    # session busy (all an entry alone may do here).
                    foreground = True
            if is_member and not entry.get("background") and REG.effective_state(entry)[0] == "active":
                foreground = True
    return joined, foreground


def stop_members(directory: str, run_ids: list[str]) -> list[str]:
    """Stop each run (in parallel, each with its own stop sequence); the ids not proven gone."""
    from concurrent.futures import ThreadPoolExecutor

    from .logs import proven_gone
    from .stop import stop

    def one(run_id: str) -> str | None:
        entry = REG.read_entry(directory, run_id)
        if entry is None:
            return None if not _marked_alive(run_id) else run_id
        if not proven_gone(directory, entry):
            stop(run_id, directory=directory)
        again = REG.read_entry(directory, run_id) or entry
        return None if proven_gone(directory, again) else run_id

    if not run_ids:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(run_ids))) as pool:
        return [r for r in pool.map(one, run_ids) if r is not None]


def _marked_alive(run_id: str) -> bool:
    """A run whose entry is gone (removed by its uid): is any process of it left
    (``CORRAL_RUN_ID`` in its environment, inherited by all it started)?"""
    from ..engines.fallback_tether import MarkedProcesses

    return bool(MarkedProcesses(run_id).remaining())


# -- corralctl session ls / end -------------------------------------------------------------------
def ls(as_json: bool, directory: str | None = None) -> int:
    directory = directory or REG.state_dir()
    rows = []
    for entry in sorted(S.list_entries(directory), key=lambda e: e.get("created_at") or 0):
        token = S.holder_token(entry)
        if token is None and entry.get("state") == "ended":
            continue
        members = token.get("members", []) if token else []
        live = [m for m in members if REG.effective_state(REG.read_entry(directory, m))[0] != "finished"]
        rows.append(
            {
                "session": entry["session"],
                "name": entry.get("name"),
                "state": token.get("state") if token else "holder gone",
                "owner": (entry.get("owner") or {}).get("pid"),
                "runs": len(live),
                "idle_timeout": entry.get("idle_timeout"),
                "age": time.time() - (entry.get("created_at") or time.time()),
            }
        )
    if as_json:
        print(json.dumps(rows, sort_keys=True))
        return 0
    print(f"{'SESSION':<13} {'NAME':<16} {'STATE':<12} {'OWNER':>7} {'RUNS':>4} {'AGE':>6}")
    for r in rows:
        owner = "-" if r["owner"] is None else str(r["owner"])
        print(f"{r['session']:<13} {r['name'] or '-':<16} {r['state']:<12} {owner:>7} {r['runs']:>4} {r['age']:>5.0f}s")
    return 0


def end(text: str, directory: str | None = None) -> int:
    directory = directory or REG.state_dir()
    entry = S.find(text, directory)
    if entry is None:
        raise CtlError(f"unknown session {text!r}")
    members, left = end_session(directory, entry, by="corralctl session end")
    session_id = entry["session"]
    if left:
        print(f"session {session_id}: NOT proven ended: {' '.join(left)} may still run", file=sys.stderr)
        return 120
    print(
        f"session {session_id} ended: {len(members)} run{'s' if len(members) != 1 else ''}, every process proven gone"
    )
    return 0


def end_session(directory: str, entry: dict, by: str) -> tuple[list[str], list[str]]:
    """End the session of ``entry``: (its runs, those not proven gone). Through its
    holder while it lives; the runs are then proven gone here, whatever it said."""
    session_id = entry["session"]
    token = S.holder_token(entry)
    members: list[str] = list(token.get("members", [])) if token else []
    if token is not None:
        members = _end_holder(entry, members)
    # Runs whose own live corral says they are of this session (a holder that died
    # never learnt them), and, with no holder to ask, those whose entries say so:
    # each is stopped only through what proves it the run's (``stop``).
    for e in REG.list_entries(directory):
        rid = e.get("run_id")
        if isinstance(rid, str) and rid not in members and e.get("session") == session_id:
            if S.member_of(e, session_id) or token is None:
                members.append(rid)
    left = stop_members(directory, members)
    if token is None and entry.get("state") != "ended":
        entry.update(state="ended", ended_at=time.time(), why=f"ended by {by} (its holder was gone)", not_proven=left)
        S.write_entry(directory, entry)
    return members, left


def orphaned(directory: str) -> list[dict]:
    """Sessions not ended whose holder is gone (SIGKILLed, or its machine's session ended)."""
    return [e for e in S.list_entries(directory) if e.get("state") != "ended" and S.holder_token(e) is None]


def _end_holder(entry: dict, members: list[str]) -> list[str]:
    """Ask the holder to end the session; follow its token's members until it exits."""
    holder = entry["holder"]
    try:
        fd = os.pidfd_open(holder["pid"])
    except OSError:
        return members
    try:
        if S.holder_token(entry) is None:  # the pid now names another process
            return members
        signal.pidfd_send_signal(fd, signal.SIGTERM)
        give_up = time.monotonic() + HOLDER_WAIT
        while time.monotonic() < give_up:
            token = S.holder_token(entry)
            if token is not None:
                members = list(dict.fromkeys([*members, *token.get("members", [])]))
            if select.select([fd], [], [], 0.05)[0]:
                return members
        return members  # still going: what it has not stopped, session end stops itself
    finally:
        os.close(fd)
