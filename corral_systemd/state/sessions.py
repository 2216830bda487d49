"""Sessions: many runs that end together, held by one holder process.

    <state dir>/sessions/<session id>.json   the session's entry (0600): name, owner,
                                              idle timeout, limits, its engine (systemd:
                                              its slice and holder unit; fallback), its
                                              holder's pid and start time; its end, once ended

The entry is a file the runs' own uid can rewrite, so nothing rests on it:
it is an index of names and, once the session is over, its history.

Which process holds the session is the **kernel's** word: the holder binds
the abstract unix socket ``holder_address(id)`` before any run can join,
and a name bound there cannot be removed, renamed or taken by anyone while
the holder lives (a stopped holder included); ``SO_PEERCRED`` of a
connection to it names the holder's pid. What a reader believes of the
session comes from the **holder's token** read from that pid: a sealed
memfd ``corral-session-<id>`` (``registry.SealedToken``), JSON ``{session,
pid, boot_id, state, members, max_runs, limits, slice, manager, config}``.
``state`` is ``open`` (runs may join) or ``ending``; ``members`` are the runs
the holder admitted, each over a connection from that run's own corral
(``Join``: its pid from ``SO_PEERCRED``, its registry token naming this run
and session), so no entry, rewritten or forged, makes a run join, leave or be
stopped with the session. ``holder_token`` reads it, ``None`` when nothing
holds the address (the session is over, or its holder died).

Failure mode: a same-uid process that binds the address after the holder
died is taken for the holder if it also holds a sealed token of that name;
until then the session's end says its holder is gone (``ctl/sessions.py``).
"""

import os
import time

from ..common import jsoncodec
from ..common.programs import SESSION_ADDRESS_PREFIX as ADDRESS_PREFIX
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


#: The holder's Varlink methods (``ctl/session_holder.py``): start a background run's
#: corral as its child, admit a run, end the session and answer with what is not proven.
INTERFACE = "io.corral.SessionHolder"
SPAWN_METHOD = f"{INTERFACE}.Spawn"
JOIN_METHOD = f"{INTERFACE}.Join"
END_METHOD = f"{INTERFACE}.End"
#: A compiled client's ``--background`` command line, its front forked by the holder (``ctl/session_spawner.py``).
FRONT_METHOD = f"{INTERFACE}.Front"


def release(gate: int) -> None:
    """Let a call's child go on (``ctl.session_spawner._fork_answered``): one byte
    on the gate the holder's answer brought (``Spawn``, ``Front``), written by the
    caller once it has that answer and will not start the run another way."""
    try:
        os.write(gate, b"1")
    except OSError:
        pass  # the child is gone already
    finally:
        os.close(gate)


def holder_address(session_id: str, uid: int | None = None) -> str:
    """The holder's socket: an abstract name (Linux), per user and session. No
    file the runs could rename, remove or bind anew; the kernel refuses the name
    to anyone else while the holder is bound to it."""
    return f"\0{ADDRESS_PREFIX}{os.geteuid() if uid is None else uid}/{session_id}"


def connect_holder(session_id: str, timeout: float = 5.0, unseen: bool = False):
    """(a connection to the session's holder, the holder's pid as the kernel
    recorded it) or None when nothing of this uid is bound to its address.
    ``unseen``: a holder outside this process's pid namespace (this corral is
    nested in a ``pidns`` run) is answered with pid 0."""
    from ..varlink.wire import connect_bound

    if not valid_session_id(session_id):
        return None
    return connect_bound(holder_address(session_id), timeout, unseen=unseen)


def holder_unseen(session_id: str) -> bool:
    """Is the session's holder bound, but outside this process's pid namespace?
    (A corral nested in a ``pidns`` run: it joins only from inside one of the
    session's runs, ``join``.)"""
    connected = connect_holder(session_id, unseen=True)
    if connected is None:
        return False
    connected[0].close()
    return connected[1] == 0


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
            entry = jsoncodec.loads(f.read(1 << 20))
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


def holder_pid(session_id) -> int | None:
    """The pid of the process bound to the session's address (its holder, live,
    stopped or busy), or None: no answer is needed from it."""
    connected = connect_holder(session_id) if isinstance(session_id, str) else None
    if connected is None:
        return None
    connected[0].close()
    return connected[1]


def holder_token(session_id) -> dict | None:
    """The live holder's own word on session ``session_id`` (its sealed token,
    read from the process bound to its address), or None."""
    if not isinstance(session_id, str):
        return None
    connected = connect_holder(session_id)
    if connected is None:
        return None
    sock, pid = connected
    sock.close()  # not held open: the holder serves one connection at a time, and answers its token too
    # The token's address bound by that same pid: the process the kernel named, still alive.
    token = REG.sealed_token(pid, TOKEN_PREFIX + session_id)
    return token if token is not None and token.get("session") == session_id else None


def find(text: str, directory: str) -> dict | None:
    """A session by id or by name (the live one of that name, else the newest).
    By id, a live holder's session is found with its entry removed (what its
    token says of it)."""
    if valid_session_id(text):
        if (entry := read_entry(directory, text)) is not None:
            return entry
        if (token := holder_token(text)) is not None and isinstance(token.get("config"), dict):
            return {**token["config"], "state": token.get("state")}
    named = [e for e in list_entries(directory) if e.get("name") == text]
    live = [e for e in named if holder_pid(e["session"]) is not None]
    pool = live or named
    return max(pool, key=lambda e: e.get("created_at") or 0) if pool else None


class NotJoinable(Exception):
    """Why a run cannot join the session it asks for (its message is the one line said)."""


def joinable(text: str, directory: str) -> str:
    """The id of session ``text`` (an id or a name) if its holder lives and its
    token says open: a check before anything starts. Only the holder admits a
    run (``join``). NotJoinable else."""
    return open_session(text, directory)[0]


def open_session(text: str, directory: str) -> "tuple[str, dict | None]":
    """``joinable``'s id, and the holder's token it read (``holder_token``; None: bound
    but not answering, or outside this pid namespace): one look for both."""
    entry = find(text, directory)
    if entry is None:
        raise NotJoinable(f"no session {text!r}")
    token = holder_token(entry["session"])
    if token is None and (holder_pid(entry["session"]) is not None or holder_unseen(entry["session"])):
        # bound but not answering (stopped, busy), or outside this pid namespace: the holder decides at ``join``
        return entry["session"], None
    if token is None:
        if _holder_elsewhere(entry):
            raise NotJoinable(
                f"session {entry['session']}'s holder is in another network namespace (its address is that "
                "namespace's): a run here cannot join it"
            )
        raise NotJoinable(f"session {entry['session']} has ended")
    if token.get("state") != "open":
        raise NotJoinable(f"session {entry['session']} is ending")
    return entry["session"], token


def looked_again(session_id: str, token: "dict | None") -> "dict | None":
    """``open_session``'s token, or, where its look found the holder busy or stopped
    (None), a second look (``holder_token``): what a run needs of it (its slice, its place)."""
    return token if token is not None else holder_token(session_id)


def _holder_elsewhere(entry: dict) -> bool:
    """Does the process the entry names as holder live in another network namespace?
    (Only to say why a session cannot be joined: nothing else rests on the entry.)"""
    holder = entry.get("holder")
    if not isinstance(holder, dict):
        return False
    pid = holder.get("pid")
    st = REG.proc_stat(pid) if type(pid) is int and pid > 0 else None
    if st is None or st[4] != holder.get("starttime") or st[3] in ("Z", "X"):
        return False
    try:
        return os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    except OSError:
        return False


def join(session_id: str, run_id: str) -> tuple[int | None, dict]:
    """Ask the session's holder to admit run ``run_id`` (this process is its
    corral, registered): (a pidfd of the holder, what its reply says of the
    session: ``owner``, ``limits``, ``slice``, ``manager``). The holder decides
    alone, one call at a time (``--max-runs`` holds however many join at once).
    A holder outside this pid namespace (this corral is nested in a ``pidns``
    run, which hides the holder from every process of the run) admits it only
    as part of the run it is in (``within``: that run's id, whose stop is this
    one's too): no pidfd then. NotJoinable with its one line when it refuses or is gone."""
    from ..varlink.wire import Channel, ProtocolError, VarlinkError

    connected = connect_holder(session_id, unseen=True)
    if connected is None:
        raise NotJoinable(f"session {session_id} has ended")
    sock, pid = connected
    pidfd = None
    if pid:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            if pidfd is not None:
                os.close(pidfd)
            sock.close()
            raise NotJoinable(f"session {session_id} has ended") from None
    try:
        # The reply comes from the live holder, so the pidfd opened before it is the holder's.
        reply, fds = Channel(sock).call(JOIN_METHOD, {"run_id": run_id, **({} if pid else {"within": True})})
        for fd in fds:
            os.close(fd)
        if not pid and not isinstance(reply.get("within"), str):
            raise NotJoinable(f"session {session_id}'s holder did not say which of its runs this one is in")
        return pidfd, reply
    except VarlinkError as exc:
        if pidfd is not None:
            os.close(pidfd)
        why = (exc.parameters or {}).get("why") if isinstance(exc.parameters, dict) else None
        raise NotJoinable(why or f"session {session_id}'s holder refused the run ({exc.name})") from None
    except (OSError, ProtocolError):
        if pidfd is not None:
            os.close(pidfd)
        raise NotJoinable(f"session {session_id} has ended") from None
    finally:
        sock.close()


def live_sessions(directory: str) -> list[dict]:
    """Entries whose holder is alive (bound to the session's address)."""
    return [e for e in list_entries(directory) if holder_pid(e.get("session")) is not None]


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
        from ..kernel.context import own_place

        self.config = public_config(config)
        #: Where it is (namespaces, root): a front compares its own with it (``kernel.context.cannot_carry``).
        self.place = own_place()
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
                "config": self.config,
                "place": self.place,
                "time": time.time(),
            }
        )
