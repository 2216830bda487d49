"""Sessions: many runs that end together, held by one holder process.

    <state dir>/sessions/<session id>.json   the session's entry (0600): name, owner,
                                              idle timeout, limits, its engine (systemd:
                                              its slice and holder unit; fallback), its
                                              holder's pid and start time; its end, once ended

The entry is a file the runs' own uid can rewrite, so nothing rests on it
alone. What a reader believes comes from the **holder's token**: a sealed
memfd ``corral-session-<id>`` that only the live holder process holds
(``registry.SealedToken``), JSON ``{session, pid, boot_id, state, members,
max_runs, limits, slice, manager}``. ``state`` is ``open`` (runs may join) or ``ending``; ``members``
are the run ids the holder saw join, each proven by that run's own corral's
token naming this session (``registry.owner_token``'s ``session``), so a
forged entry can neither add a run of another session to this one nor make
a closed session look open. ``holder_token`` reads it, ``None`` when the
holder is gone (the session is over, or its holder died: ``corralctl session
end`` then works from the registry's own proofs).
"""

import json
import os
import time

from . import registry as REG

#: Sessions per user at once (``CORRAL_MAX_SESSIONS`` overrides).
MAX_SESSIONS = 32
#: A session ends after this long with no run started and none in the foreground.
IDLE_TIMEOUT = 30 * 60.0
TOKEN_PREFIX = "corral-session-"
#: The variable corral gives every command of a session (and reads to join one).
SESSION_ENV = "CORRAL_SESSION"


def max_sessions(env=os.environ) -> int:
    text = env.get("CORRAL_MAX_SESSIONS")
    if text is None or text == "":
        return MAX_SESSIONS
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"CORRAL_MAX_SESSIONS={text!r}: a whole number, 1 or more")
    return int(text)


def sessions_dir(directory: str) -> str:
    return os.path.join(directory, "sessions")


#: The holder's one Varlink method: start a background run's corral as its child (``ctl/session_spawner.py``).
SPAWN_METHOD = "io.corral.SessionHolder.Spawn"


def socket_address(dirfd: int, session_id: str) -> str:
    """The holder's socket, named through an open descriptor of the sessions
    directory (``/proc/self/fd/N/<id>.sock``): a unix socket's path is at most
    108 bytes, a state directory's is not."""
    return f"/proc/self/fd/{dirfd}/{session_id}.sock"


def entry_path(directory: str, session_id: str) -> str:
    return os.path.join(sessions_dir(directory), f"{session_id}.json")


def valid_session_id(text) -> bool:
    return REG.valid_run_id(text)


def read_entry(directory: str, session_id: str) -> dict | None:
    if not valid_session_id(session_id):
        return None
    try:
        fd = os.open(entry_path(directory, session_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            entry = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and entry.get("session") == session_id else None


def write_entry(directory: str, entry: dict) -> None:
    from .registry.files import _canonical, _write_atomic

    REG.ensure_private_dir(sessions_dir(directory))
    _write_atomic(entry_path(directory, entry["session"]), _canonical(entry) + b"\n")


def list_entries(directory: str) -> list[dict]:
    try:
        names = os.listdir(sessions_dir(directory))
    except OSError:
        return []
    entries = []
    for name in names:
        if name.endswith(".json") and (entry := read_entry(directory, name[:-5])) is not None:
            entries.append(entry)
    return entries


def holder_token(entry: dict | None) -> dict | None:
    """The live holder's own word on the session (its sealed token), or None."""
    if not isinstance(entry, dict):
        return None
    holder = entry.get("holder")
    session_id = entry.get("session")
    if not isinstance(holder, dict) or not isinstance(session_id, str) or not valid_session_id(session_id):
        return None
    pid, starttime = holder.get("pid"), holder.get("starttime")
    if type(pid) is not int or not 0 < pid < 1 << 22 or not _alive(pid, starttime):
        return None
    token = REG.sealed_token(pid, TOKEN_PREFIX + session_id)
    if token is None or token.get("session") != session_id or not _alive(pid, starttime):
        return None  # no token of this session, or read from a process since gone
    return token


def _alive(pid: int, starttime) -> bool:
    st = REG.proc_stat(pid)
    return st is not None and st[4] == starttime and st[3] not in ("Z", "X")


def find(text: str, directory: str) -> dict | None:
    """A session by id or by name (the live one of that name, else the newest)."""
    if valid_session_id(text) and (entry := read_entry(directory, text)) is not None:
        return entry
    named = [e for e in list_entries(directory) if e.get("name") == text]
    live = [e for e in named if holder_token(e) is not None]
    pool = live or named
    return max(pool, key=lambda e: e.get("created_at") or 0) if pool else None


class NotJoinable(Exception):
    """Why a run cannot join the session it asks for (its message is the one line said)."""


def joinable(text: str, directory: str, joining: str | None = None) -> str:
    """The id of session ``text`` (an id or a name) if a run may join it now: its
    holder alive and holding its token, which says open; once the run is registered
    (``joining``: its id), also room under the token's ``max_runs``. NotJoinable else."""
    entry = find(text, directory)
    token = holder_token(entry)
    if entry is None:
        raise NotJoinable(f"no session {text!r}")
    if token is None:
        raise NotJoinable(f"session {entry['session']} has ended")
    if token.get("state") != "open":
        raise NotJoinable(f"session {entry['session']} is ending")
    if joining is not None and isinstance(max_runs := token.get("max_runs"), int):
        running = [
            m
            for m in token.get("members", [])
            if m != joining and REG.effective_state(REG.read_entry(directory, m))[0] != "finished"
        ]
        if len(running) >= max_runs:
            raise NotJoinable(f"session {entry['session']} has {len(running)} runs, its --max-runs")
    return entry["session"]


def live_sessions(directory: str) -> list[dict]:
    """Entries whose holder is alive and holds its token."""
    return [e for e in list_entries(directory) if holder_token(e) is not None]


#: The session limits (``common.limits`` fields): aggregate over every run of the session.
SESSION_LIMITS = ("mem", "pids", "cpus")


def session_limits(token: dict | None) -> dict:
    """The aggregate limits the holder's token states ({} if none, or no token)."""
    limits = (token or {}).get("limits")
    if not isinstance(limits, dict):
        return {}
    return {k: v for k, v in limits.items() if k in SESSION_LIMITS and type(v) in (int, float) and v > 0}


def member_of(entry: dict, session_id: str) -> bool:
    """Is the run of registry entry ``entry`` proven a member of ``session_id``
    (its live corral's token says so)?"""
    token = REG.owner_token(entry)
    return token is not None and token.get("session") == session_id


#: What ``session start`` decides and the holder keeps (its argv, as a unit): the entry's first fields.
CONFIG_KEYS = (
    "session",
    "name",
    "owner",
    "idle_timeout",
    "max_runs",
    "created_at",
    "limits",
    "limits_enforced",
    "engine",
    "manager",
    "slice",
    "holder_unit",
)


def public_config(config: dict) -> dict:
    return {key: config.get(key) for key in CONFIG_KEYS}


def token_slice(token: dict | None) -> tuple[str, str] | None:
    """(the session's slice, its manager: "user" or "system") as its holder's token
    says, in systemd mode: the slice its id names; None for a fallback session."""
    from ..common.unit_names import session_slice

    if not token or not isinstance(session_id := token.get("session"), str):
        return None
    if token.get("slice") != session_slice(session_id) or token.get("manager") not in ("user", "system"):
        return None
    return token["slice"], token["manager"]


class HolderToken(REG.SealedToken):
    """The holder's side of ``holder_token``."""

    def __init__(self, config: dict):
        super().__init__(TOKEN_PREFIX + config["session"])
        self.session_id = config["session"]
        self.max_runs = config.get("max_runs")
        self.limits = dict(config.get("limits") or {})
        self.slice = config.get("slice")
        self.manager = config.get("manager")
        self.state = "open"
        self.members: list[str] = []

    def update(self, *, state: str | None = None, members: list[str] | None = None) -> None:
        if state is not None:
            self.state = state
        if members is not None:
            self.members = list(members)
        self.write(
            {
                "session": self.session_id,
                "pid": os.getpid(),
                "boot_id": REG.boot_id(),
                "state": self.state,
                "members": self.members,
                "max_runs": self.max_runs,
                "limits": self.limits,
                "slice": self.slice,
                "manager": self.manager,
                "time": time.time(),
            }
        )
