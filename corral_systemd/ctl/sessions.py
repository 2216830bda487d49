"""``corralctl session start | ls | end``: runs that end together, with their agent.

``session start`` decides once where the session lives (``--cgroup-mode``):

- **systemd** (auto, where a manager answers, as a run's engine is chosen): a
  slice ``corral-session_<id>.slice`` with the session's aggregate limits,
  where its runs' units go, and a holder unit ``corral-session_<id>.service``
  (``engines/systemd/session_slice.py``): the session needs no process of
  the caller's;
- **fallback**: a holder process forked away from the caller; ``--mem``,
  ``--pids`` and ``--cpus`` are then not enforced (no group holds all its
  runs), and ``session start`` says so.

The holder (``session_holder.py``) holds the session's sealed token and ends
it when its owner exits, when idle, or when ``session end`` asks (SIGTERM
through a pidfd, after checking the holder's start time and token).
``session end`` then proves each member gone itself (``logs.proven_gone``:
the run's corral says so, or nothing of it is left in the kernel's view) and
the session's slice empty, and exits 0, or 120 naming what is not proven; it
never takes the holder's word, nor the entry's, for that.
"""

import os
import select
import signal
import sys
import time

from ..common import jsoncodec
from ..common.unit_names import new_run_id
from ..state import registry as REG
from ..state import sessions as S
from .session_holder import stop_members, stop_slice
from .status import CtlError

#: How long ``session end`` follows a holder that is stopping the session's runs.
HOLDER_WAIT = 120.0
#: How long ``session start`` waits for a holder unit to hold the session.
HOLDER_START = 30.0


def start(
    name: str | None,
    owner: int | None,
    idle_timeout: float,
    max_runs: int | None,
    as_json: bool,
    directory: str | None = None,
    *,
    limits: dict | None = None,
    cgroup_mode: str = "auto",
) -> int:
    """``corralctl session start``: ``start_session``, then its id printed (``--json``: its entry)."""
    directory = REG.ensure_state_dir(directory)
    session_id = start_session(name, owner, idle_timeout, max_runs, directory, limits=limits, cgroup_mode=cgroup_mode)
    entry = S.read_entry(directory, session_id) or {}
    if as_json:
        print(jsoncodec.dumps(_public(entry), sort_keys=True))
    else:
        print(session_id)
    return 0


def start_session(
    name: str | None,
    owner: int | None,
    idle_timeout: float,
    max_runs: int | None,
    directory: str | None = None,
    *,
    limits: dict | None = None,
    cgroup_mode: str = "auto",
) -> str:
    """Start a session (``limits``: ``common.limits`` fields → values, aggregate
    over its runs); its id, its warnings said on stderr. CtlError (125) for bad
    input, the sessions cap, a name in use, or a mode that cannot be had."""
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
    limits = _check_limits(limits or {})
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
        manager, why = _manager(session_id, cgroup_mode)
        verdicts = None
        if manager is None:  # a fallback session: its id is its holder's commitment (common.verdict)
            from ..common.verdict import Verdicts
            from ..kernel.prctl import set_dumpable

            set_dumpable(False)  # the secrets are in this process's memory until it exits
            verdicts = Verdicts()
            session_id = verdicts.session_id
        config: dict = {
            "session": session_id,
            "name": name,
            "owner": None if owner is None else {"pid": owner, "starttime": owner_start},
            "idle_timeout": idle_timeout,
            "max_runs": max_runs,
            "created_at": time.time(),
            "limits": limits,
        }
        if manager is not None:
            warnings = _start_unit(directory, config, manager)
        else:
            warnings = _start_forked(directory, config, owner_fd, why, verdicts)
    finally:
        os.close(lock)
        if owner_fd is not None:
            os.close(owner_fd)
    for warning in warnings:
        print(f"corralctl: session {session_id}: {warning}", file=sys.stderr)
    return session_id


def _check_limits(limits: dict) -> dict:
    """The session's limits, given as text or numbers (``Limit.coerce``), checked against their bounds."""
    from ..common.limits import BY_FIELD

    checked = {}
    for field, value in limits.items():
        if value is None:
            continue
        limit = BY_FIELD[field]
        try:
            value = limit.coerce(value)
        except ValueError as exc:
            raise CtlError(str(exc)) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= limit.maximum:
            raise CtlError(f"{limit.option} {value}: out of range")
        checked[field] = value
    return checked


def _manager(session_id: str, cgroup_mode: str):
    """(the session's ``SessionSlice`` or None, why not): a manager as a run's
    engine would find one (``engines.open_engine``), unless told otherwise."""
    from ..common.errors import SetupError
    from ..common.nesting import outer_run

    if cgroup_mode == "fallback":
        return None, "--cgroup-mode fallback"
    outer = outer_run()
    if outer is not None:
        if cgroup_mode == "enforced":
            raise CtlError(f"inside corral run {outer}: a session's slice would leave that run's cgroup and its limits")
        return None, f"nested in corral run {outer}"
    from ..engines.systemd.session_slice import SessionSlice

    try:
        return SessionSlice(session_id), None
    except SetupError as exc:
        if cgroup_mode == "enforced":
            raise CtlError(f"--cgroup-mode enforced: {exc}") from None
        return None, str(exc)


def _start_unit(directory: str, config: dict, manager) -> list[str]:
    """systemd: the session's slice (its limits), then its holder as the manager's unit."""
    from ..common.errors import SetupError
    from ..engines.systemd.session_slice import holder_environment

    try:
        enforced, warnings = manager.make_slice(config["limits"])
        config.update(
            limits_enforced=enforced,
            engine="systemd",
            manager=manager.kind,
            slice=manager.slice,
            holder_unit=manager.holder_unit,
        )
        argv = [
            sys.executable,
            "-P",
            "-m",
            "corral_systemd.ctl.session_holder",
            jsoncodec.dumps(config, sort_keys=True),
        ]
        manager.start_holder(argv, holder_environment(directory))
        give_up = time.monotonic() + HOLDER_START
        while S.holder_token(config["session"]) is None:
            if time.monotonic() > give_up or not manager.holder_active():
                manager.abandon()
                raise CtlError(f"the session's holder ({manager.holder_unit}) did not start")
            time.sleep(0.02)
        return warnings
    except SetupError as exc:
        raise CtlError(str(exc)) from None
    finally:
        manager.close()


def _start_forked(directory: str, config: dict, owner_fd: int | None, why: str | None, verdicts) -> list[str]:
    """fallback: the holder forked away from the caller."""
    from ..common.limits import BY_FIELD

    config.update(limits_enforced={k: "none" for k in config["limits"]}, engine="fallback", manager=None, slice=None)
    config["holder_unit"] = None
    warnings = []
    if config["limits"]:
        said = ", ".join(BY_FIELD[k].option for k in config["limits"])
        warnings.append(
            f"{said} not enforced: no service manager ({why}), so no group holds all of its runs; "
            "each run's own limits still hold"
        )
    from ..kernel.detach import fork_detached

    ready_r, ready_w = os.pipe()
    pid = fork_detached(keep=(ready_w, *(() if owner_fd is None else (owner_fd,))))
    if pid == 0:  # the holder's intermediate, from here to os._exit
        code = 1
        try:
            code = _detached_holder(directory, config, owner_fd, ready_w, verdicts)
        finally:
            os._exit(code)
    os.close(ready_w)
    said_ready = os.read(ready_r, 1)
    os.close(ready_r)
    os.waitpid(pid, 0)  # the intermediate: the holder forked itself away
    if said_ready != b"1":
        raise CtlError("the session's holder could not start")
    return warnings


def _detached_holder(directory: str, config: dict, owner_fd: int | None, ready_w: int, verdicts) -> int:
    """The holder's life as a grandchild of ``session start`` (so no shell waits for it)."""
    from .session_holder import Holder

    if os.fork():
        return 0  # the intermediate: ``session start`` reaps it at once
    return Holder(directory, config, owner_fd, verdicts).run(ready_w)


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
    return {**S.public_config(entry), "holder": entry.get("holder"), "state": entry.get("state")}


# -- corralctl session ls / end -------------------------------------------------------------------
def ls(as_json: bool, directory: str | None = None) -> int:
    directory = directory or REG.state_dir()
    rows = []
    for entry in sorted(S.list_entries(directory), key=lambda e: e.get("created_at") or 0):
        token = S.holder_token(entry["session"])
        bound = token is not None or S.holder_pid(entry["session"]) is not None
        if not bound and entry.get("state") == "ended":
            continue
        members = token.get("members", []) if token else []
        live = [m for m in members if REG.effective_state(REG.read_entry(directory, m))[0] != "finished"]
        rows.append(
            {
                "session": entry["session"],
                "name": entry.get("name"),
                # Bound but silent: a holder stopped (or busy); the kernel still names it at its address.
                "state": token.get("state") if token else "not answering" if bound else "holder gone",
                "owner": (entry.get("owner") or {}).get("pid"),
                "runs": len(live),
                "idle_timeout": entry.get("idle_timeout"),
                "age": time.time() - (entry.get("created_at") or time.time()),
            }
        )
    if as_json:
        print(jsoncodec.dumps(rows, sort_keys=True))
        return 0
    print(f"{'SESSION':<25} {'NAME':<16} {'STATE':<13} {'OWNER':>7} {'RUNS':>4} {'AGE':>6}")
    for r in rows:
        owner = "-" if r["owner"] is None else str(r["owner"])
        print(f"{r['session']:<25} {r['name'] or '-':<16} {r['state']:<13} {owner:>7} {r['runs']:>4} {r['age']:>5.0f}s")
    return 0


def end(text: str, directory: str | None = None) -> int:
    directory = directory or REG.state_dir()
    entry = S.find(text, directory)
    if entry is None:
        raise CtlError(f"unknown session {text!r}")
    session_id = entry["session"]
    before = entry.get("state") if S.holder_pid(session_id) is None else None
    members, left = end_session(directory, entry, by="corralctl session end")
    if before == "ended":  # by its holder, earlier: what that end recorded, and what is found now
        left = list(dict.fromkeys([*(entry.get("not_proven") or []), *left]))
        print(f"session {session_id} had already ended ({entry.get('why') or 'no reason recorded'})")
    if left:
        print(f"session {session_id}: NOT proven ended: {'; '.join(left)}", file=sys.stderr)
        return 120
    print(
        f"session {session_id} ended: {len(members)} run{'s' if len(members) != 1 else ''}, every process proven gone"
    )
    return 0


def end_session(directory: str, entry: dict, by: str) -> tuple[list[str], list[str]]:
    """End the session of ``entry``: (its runs, what is not proven gone).

    Its holder is the process the kernel names at its address, never the
    entry's: asked to end (``End``, a stopped one continued), it answers after
    its own proof (``waitpid`` with no child left below it, the slice's cgroup
    empty). A holder that dies or does not answer within ``HOLDER_WAIT`` proves
    nothing: what it held is named not proven (a systemd session's slice is
    still proven from its cgroup). With no holder, a session its holder never
    ended (killed) is not proven: its background runs' orphans were below it.
    Members are the runs the holder admitted, and those whose own live corral
    says they are this session's; each is proven gone by its own proof.

    A fallback session's "proven" is taken only with its holder's verdict
    (``common.verdict``: a secret committed to in the session's id), so a
    rewritten entry or a process bound to its address once its holder is dead
    cannot end it in the holder's name."""
    from ..common.verdict import check, is_committed

    session_id = entry["session"]
    bound = S.holder_pid(session_id) is not None  # a stopped holder too: it is continued and asked
    token = S.holder_token(session_id) if bound else None
    members: list[str] = list(token.get("members", [])) if token else []
    left: list[str] = []
    said: dict | None = None  # the holder's verdict: its End answer, or the entry it wrote at its end
    if bound:
        said = _end_holder(session_id)
        members = list(dict.fromkeys([*members, *said.get("members", [])]))
        if said.get("ended_by_another"):
            again = S.read_entry(directory, session_id) or {}
            said = again if again.get("state") == "ended" else {"not_proven": ["its holder exited unanswered"]}
        left += said.get("not_proven") or []
    elif entry.get("state") == "ended":
        said = entry
    elif is_committed(session_id):  # a fallback session (its id's form says so, not its entry)
        left.append(
            "no holder holds the session (none is bound to its address) and none ended it: "
            "what its holder held (its background runs' orphans) is not proven gone"
        )
    if said is not None and is_committed(session_id):
        verdict = check(session_id, said.get("verdict"))
        if verdict is None and not left:
            members = []  # a "proven" in another's name: nor are the runs it named (only those whose corral says so)
            left.append(
                "the end it was said to have came without its holder's verdict (an entry rewritten, or a "
                "process answering at its address after its holder's death): what its holder held is not proven gone"
            )
        elif not verdict and not left:
            left.append("its holder said what it held is not proven gone")
    for e in REG.list_entries(directory):
        rid = e.get("run_id")
        if isinstance(rid, str) and rid not in members and S.member_of(e, session_id):
            members.append(rid)
    left += stop_members(directory, members)
    if token is None or S.token_slice(token) is not None:  # whatever is still in the slice its id names
        left += stop_slice(session_id)
    left = list(dict.fromkeys(left))
    if not bound and entry.get("state") != "ended":
        entry.update(state="ended", ended_at=time.time(), why=f"ended by {by} (its holder was gone)", not_proven=left)
        try:
            S.write_entry(directory, entry)
        except OSError:
            pass
    return members, left


def orphaned(directory: str) -> list[dict]:
    """Sessions not ended whose holder is gone (SIGKILLed, or its machine's session
    ended) and will not come back (a holder unit the manager is restarting will)."""
    gone = [e for e in S.list_entries(directory) if e.get("state") != "ended" and S.holder_pid(e["session"]) is None]
    return [e for e in gone if not _holder_unit_restarting(e)]


def _holder_unit_restarting(entry: dict) -> bool:
    if entry.get("engine") != "systemd":
        return False
    from ..common.errors import SetupError
    from ..engines.systemd.session_slice import SessionSlice

    try:
        manager = SessionSlice(entry["session"])
    except SetupError:
        return False
    try:
        return manager.holder_active()
    finally:
        manager.close()


def _end_holder(session_id: str) -> dict:
    """Ask the session's holder to end it (``End``) and wait for its answer:
    ``{members, not_proven}``. A stopped holder is continued (again, each second:
    the run may stop it again); one that dies or does not answer within
    ``HOLDER_WAIT`` is SIGKILLed and proves nothing (``not_proven`` says so)."""
    from ..varlink.wire import Channel, ProtocolError

    connected = S.connect_holder(session_id)
    if connected is None:
        return {"not_proven": [f"its holder was gone before it could end the session {session_id}"]}
    sock, pid = connected
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        sock.close()
        return {"not_proven": [f"its holder (pid {pid}) died before it could end the session"]}
    channel = Channel(sock)
    try:
        try:
            channel.send({"method": S.END_METHOD, "parameters": {}})
        except OSError:
            pass
        give_up = time.monotonic() + HOLDER_WAIT
        while time.monotonic() < give_up:
            _signal(pidfd, signal.SIGCONT)  # a holder the run stopped
            if select.select([sock], [], [], 1.0)[0]:
                try:
                    got = channel.receive()
                except (OSError, ProtocolError):
                    got = None
                if got is not None and "error" in got[0]:
                    why = (got[0].get("parameters") or {}).get("why") or got[0]["error"]
                    return {"not_proven": [f"its holder refused to end it: {why}"]}
                if got is not None:
                    return dict(got[0].get("parameters") or {})
                # Closed unanswered: ending already (asked by another), it answers none
                # that came later; its exit, then its entry, are all there is to go by.
                if select.select([pidfd], [], [], 5.0)[0]:
                    return {"ended_by_another": True}
                break
        _signal(pidfd, signal.SIGKILL)
        return {
            "not_proven": [f"its holder (pid {pid}) did not finish ending the session: what it held is not proven gone"]
        }
    finally:
        sock.close()
        os.close(pidfd)


def _signal(pidfd: int, sig: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except OSError:
        pass
