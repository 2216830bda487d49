"""The run registry: every run written down before it starts, and an audit log.

Layout of the state directory (0700; every file 0600)::

    <dir>/<run id>.json    the run's entry, replaced atomically on each state change
    <dir>/<run id>.log     its events, JSON lines, append-only, hash-chained
    <dir>/credentials/     corral's private credential directories (only if <dir> is a tmpfs;
                           a systemd service's are the manager's, see credentials.py)
    <dir>/.pruned          its mtime: when registration last looked for stale entries

The directory is ``$CORRAL_STATE_DIR`` if set, else ``/run/corral`` for
root and ``$XDG_RUNTIME_DIR/corral`` for other users.

Entry states: ``active`` (registered, running), ``expired`` (its deadline
passed; written *before* the first signal is sent), ``finished`` (corral
has proven the run stopped, or could not and said so). A reader (``corralctl
status``) also treats an active entry whose deadline has passed, or whose
corral process is gone, as expired: a run is never more authorised than
its clock and its owner allow.

Every log line is ``{"seq", "event", "time", "monotonic", "run_id", "data",
"prev", "hash"}``: ``prev`` is the previous line's ``hash`` (64 zeros for
the first), ``hash`` the SHA-256 of the line's canonical JSON without
``hash``. The entry anchors the chain (``log.lines``, ``log.head``) each
time it is rewritten, so a truncated tail is caught too. Lines are written
with one ``write()`` each and fsynced before the call returns.

Retention: a finished entry and its log stay at least ``KEEP_FINISHED``
(24 h) after the run finished; then ``corralctl gc`` removes them
(``--keep-finished``), and so does registration of a new run, at most
``PRUNE_BATCH`` of them and only when ``.pruned`` is older than
``PRUNE_INTERVAL`` (see ``maybe_prune``). Active and expired entries, and
entries whose owner still runs, are never removed.

The run's own uid can rewrite all of these files (see README "Security:
what corral trusts"), so a reader never acts on them alone: while the
owner lives, its sealed token (``OwnerToken``, a memfd only it holds)
gives the run's state and deadline (``effective_state``, ``owner_verified``);
a fallback run's processes carry ``CORRAL_RUN_MARK`` (``carries_mark``);
each event line is also sent to the journal where journald runs
(``journal.py``).

Never recorded: environment values, credential contents. Arguments that
look like secrets (``Authorization:`` headers, ``--password=...``,
``TOKEN=...``, URL passwords) are redacted, best effort, in the command
line and in detached processes' argv.

This module is on corral's hot path: it imports only os, json, time, a
SHA-256 implementation and ``redact`` (the redaction the run record shares).
"""

import json
import os
import time
from typing import Any, TypeGuard

try:  # the builtin module loads faster than hashlib (no OpenSSL)
    from _sha256 import sha256
except ImportError:  # pragma: no cover
    from hashlib import sha256

from .redact import REDACTED, redact_argv  # noqa: F401  (shared with the run record; registry.redact_argv stays)

VERSION = 1
ZERO_HASH = "0" * 64
STATES = ("active", "expired", "finished")
#: How often the observer looks for processes leaving the command's session or group.
DETACH_WATCH_INTERVAL = 0.2
#: A finished run's entry and log are kept at least this long (seconds) after it finished.
KEEP_FINISHED = 24 * 3600.0
#: Registration looks for stale finished runs at most this often (by PRUNE_STAMP's mtime) ...
PRUNE_INTERVAL = 3600.0
#: ... and removes at most this many of them each time.
PRUNE_BATCH = 8
PRUNE_STAMP = ".pruned"


# -- where ------------------------------------------------------------
#: The private fallback for a user without a runtime directory (cron, ``su -c``), below $HOME.
STATE_FALLBACK = os.path.join(".local", "state", "corral")


def state_dir(env=os.environ) -> str:
    """Where the registry lives (see the module docstring and ``man corralctl``).

    A user without ``$XDG_RUNTIME_DIR`` (cron, ``su -c``) gets
    ``/run/user/UID/corral`` if that runtime directory exists and is theirs
    and private, else ``$XDG_STATE_HOME/corral`` (``~/.local/state/corral``):
    a path no other user can create first, found again by corralctl from
    the same environment. ``/tmp/corral-UID`` would be squattable.
    """
    override = env.get("CORRAL_STATE_DIR")
    if override:
        return os.path.abspath(override)
    uid = os.geteuid()
    if uid == 0:
        return "/run/corral"
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "corral")
    runtime = f"/run/user/{uid}"
    if _private_dir_of(runtime, uid):
        return os.path.join(runtime, "corral")
    state_home = env.get("XDG_STATE_HOME")
    if state_home and os.path.isabs(state_home):
        return os.path.join(state_home, "corral")
    return os.path.join(_home(env), STATE_FALLBACK)


def _home(env) -> str:
    home = env.get("HOME")
    if not home or not os.path.isabs(home):
        try:
            import pwd

            home = pwd.getpwuid(os.geteuid()).pw_dir
        except (KeyError, ImportError):
            home = "/"
    return home


def _private_dir_of(path: str, uid: int) -> bool:
    """``path`` is a real directory (not a symlink) owned by ``uid``, writable by no one else."""
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022


def unsafe_dir_reason(path: str, st=None) -> str | None:
    """Why an existing ``path`` must not be used as a private directory, or None.

    Refused: a symlink or non-directory, another owner, group- or other-writable
    (someone else may have put files in it).
    """
    import stat

    if st is None:
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.geteuid():
        return f"{path} is owned by uid {st.st_uid}, not by us (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"{path} is writable by others (mode {st.st_mode & 0o7777:04o})"
    return None


def ensure_private_dir(path: str, *, parents_below: str | None = None) -> str:
    """Create ``path`` (0700) if needed; refuse one that is not ours and private.

    Only the last component is created: a missing parent (a mistyped
    CORRAL_STATE_DIR) is an OSError, never a tree of new directories;
    except below ``parents_below`` (a directory of ours: $HOME for the
    fallback state directory), where missing parents are made 0700.
    Refused (OSError, one line): a symlink, another owner, group/other-writable.
    A directory of ours that is merely readable by others is made 0700.
    """
    if parents_below and path.startswith(parents_below.rstrip("/") + "/"):
        reason = unsafe_dir_reason(parents_below)
        if reason:
            raise OSError(reason)
        parent = os.path.dirname(path.rstrip("/"))
        if not os.path.isdir(parent):
            os.makedirs(parent, 0o700, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise OSError(
            f"{path}: parent directory {os.path.dirname(path.rstrip('/')) or '/'} does not exist "
            "(only the last component is created)"
        ) from None
    reason = unsafe_dir_reason(path)
    if reason:
        raise OSError(f"refusing the private directory {reason}")
    if os.lstat(path).st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def ensure_state_dir(path: str | None = None, env=os.environ) -> str:
    """The state directory, made if needed (see ``state_dir``): OSError (one line) if unusable."""
    path = path or state_dir(env)
    home = None
    if not env.get("CORRAL_STATE_DIR") and os.geteuid() != 0 and not env.get("XDG_RUNTIME_DIR"):
        home = _home(env)
    return ensure_private_dir(path, parents_below=home)


def valid_run_id(run_id: str) -> bool:
    return 0 < len(run_id) <= 64 and all(c in "0123456789abcdef" for c in run_id)


def normalize_run_id(text: str) -> str:
    """Accept ``<id>``, ``corral-<id>`` and unit names ``corral-<id>.scope``."""
    text = text.strip()
    if text.startswith("corral-"):
        text = text[len("corral-") :]
    for suffix in (".scope", ".service"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
    return text


# -- process identity ---------------------------------------------------
def boot_id() -> str:
    global _boot_id
    if _boot_id is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                _boot_id = f.read().strip()
        except OSError:
            return ""
    return _boot_id


_boot_id: str | None = None
_own_starttime: tuple[int, int | None] | None = None  # (pid, start time) of this process


def own_starttime() -> int | None:
    """This process's start time (cached per pid, so a forked child reads its own)."""
    global _own_starttime
    pid = os.getpid()
    if _own_starttime is None or _own_starttime[0] != pid:
        me = proc_stat(pid)
        _own_starttime = (pid, me[4] if me else None)
    return _own_starttime[1]


def proc_stat(pid: int):
    """(ppid, pgid, sid, state, starttime) of ``pid``, or None."""
    from .kernel.procfs import read_stat

    info = read_stat(pid)
    return None if info is None else (info.ppid, info.pgid, info.sid, info.state, info.starttime)


def owner_alive(entry: dict) -> bool:
    """Is the corral process that owns this entry still running (same boot, same start time)?"""
    owner = entry.get("owner") or {}
    if owner.get("boot_id") and owner.get("boot_id") != boot_id():
        return False
    pid = owner.get("pid")
    st = proc_stat(pid) if _is_pid(pid) else None
    return st is not None and st[4] == owner.get("starttime") and st[3] not in ("Z", "X")


def _is_pid(value) -> "TypeGuard[int]":
    return type(value) is int and 0 < value < 1 << 22


# -- what only the owner can hold: its token -------------------------------------------------
# The entry and the log are files the run's own uid can rewrite. What it
# cannot forge is a sealed memfd held open by the owner process itself:
# ``corral-run-<id>``, JSON {run_id, state, deadline_monotonic, boot_id, pid},
# F_SEAL_WRITE|SHRINK|GROW|SEAL, replaced (dup2 onto the same fd) on each
# state change and closed when the run is finished. Another process cannot
# put a descriptor into the owner, nor change a sealed file's contents.
TOKEN_PREFIX = "corral-run-"


def _seals() -> int:
    import fcntl

    return fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class OwnerToken:
    """The owner's side: a sealed memfd describing the run, held while the run is not finished."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.fd = -1

    def update(self, entry: dict) -> None:
        import fcntl

        data = _canonical(
            {
                "run_id": self.run_id,
                "state": entry.get("state"),
                "deadline_monotonic": entry.get("deadline_monotonic"),
                "boot_id": boot_id(),
                "pid": os.getpid(),
            }
        )
        fd = os.memfd_create(TOKEN_PREFIX + self.run_id, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, data)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _seals())
            if self.fd < 0:
                self.fd, fd = fd, -1
            else:
                os.dup2(fd, self.fd, inheritable=False)  # atomic: a reader sees the old or the new one
        finally:
            if fd >= 0:
                os.close(fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def owner_token(entry: dict) -> dict | None:
    """The live owner's own word on the run (its sealed token), or None.

    None when the owner named by the entry is gone, is another process
    (pid reused), or holds no sealed token for this run: then the entry
    alone says who owns the run, and nothing destructive may rest on that.
    """
    import fcntl

    owner = entry.get("owner") if isinstance(entry, dict) else None
    run_id = entry.get("run_id") if isinstance(entry, dict) else None
    if not isinstance(owner, dict) or not isinstance(run_id, str) or not valid_run_id(run_id):
        return None
    pid = owner.get("pid")
    if not _is_pid(pid) or not owner_alive(entry):
        return None
    want = f"/memfd:{TOKEN_PREFIX}{run_id} (deleted)"
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for name in names:
        path = f"/proc/{pid}/fd/{name}"
        try:
            if os.readlink(path) != want:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _seals() != _seals():
                continue  # not sealed: anyone holding it could have written it
            token = json.loads(os.pread(fd, 65536, 0))
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
        if not isinstance(token, dict) or token.get("run_id") != run_id or token.get("pid") != pid:
            continue
        if token.get("boot_id") not in ("", boot_id()) or not owner_alive(entry):
            return None  # read from a process that has since gone (its pid reused)
        return token
    return None


def looks_like_corral(pid: int) -> bool:
    """Is ``pid`` running corral's code: a python whose command line runs corral_systemd or a corral script?

    Weak on its own (a process may exec anything with any argv); together
    with the token it keeps a forged entry from naming an arbitrary process.
    """
    from .kernel.procfs import cmdline

    argv = cmdline(pid)
    if not argv:
        return False
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False
    if not exe.startswith("python"):
        return False
    for arg in argv[1:4]:
        base = os.path.basename(arg)
        if base in ("corral", "corral-enforced") or "corral_systemd" in arg:
            return True
    return False


def owner_verified(entry: dict) -> tuple[bool, str]:
    """(True, "") when the entry's owner is proven to be this run's live owner, else (False, why).

    Proof: same boot, pid and start time; the process holds this run's
    sealed token; and, for an owner of kind ``corral``, it runs corral.
    """
    owner = entry.get("owner") or {}
    pid = owner.get("pid")
    if not owner_alive(entry):
        return False, "its owner is gone"
    if owner_token(entry) is None:
        return False, f"process {pid} holds no token for this run: not its owner"
    if owner.get("kind", "corral") == "corral" and not (_is_pid(pid) and looks_like_corral(pid)):
        return False, f"process {pid} is not a corral"
    return True, ""


# -- membership: a mark in the command's environment ----------------------------------------------
#: A fallback run's command gets ``CORRAL_RUN_MARK=<run id>.<nonce>``; the entry holds its SHA-256.
#: Every process the command starts inherits it: once corral is gone, it is what
#: proves a process a member of the run (a forged entry names no process that carries it).
MARK_ENV = "CORRAL_RUN_MARK"


def new_mark(run_id: str) -> str:
    return f"{run_id}.{os.urandom(16).hex()}"


def mark_hash(mark: str) -> str:
    return sha256(mark.encode()).hexdigest()


def process_mark(pid: int) -> str | None:
    """The run mark in ``pid``'s environment (a live thread's, if its main thread has exited), or None."""
    paths = [f"/proc/{pid}/environ"]
    try:
        paths += [f"/proc/{pid}/task/{t}/environ" for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        pass
    key = MARK_ENV.encode() + b"="
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        for item in data.split(b"\0"):
            if item.startswith(key):
                return item[len(key) :].decode(errors="replace")
        if data:
            return None
    return None


def carries_mark(pid: int, entry: dict) -> bool:
    """Is ``pid`` proven a member of this run by the mark it inherited?"""
    want = entry.get("mark_sha256")
    mark = process_mark(pid)
    return (
        isinstance(want, str)
        and mark is not None
        and mark.startswith(f"{entry.get('run_id')}.")
        and mark_hash(mark) == want
    )


# -- files ------------------------------------------------------------
def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def entry_path(directory: str, run_id: str) -> str:
    return os.path.join(directory, run_id + ".json")


def log_path(directory: str, run_id: str) -> str:
    return os.path.join(directory, run_id + ".log")


def read_entry(directory: str, run_id: str) -> dict | None:
    try:
        with open(entry_path(directory, run_id), "rb") as f:
            entry = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("run_id") != run_id:
        return None  # not an entry, or one copied from another run
    return entry


def list_entries(directory: str) -> list[dict]:
    out: list[dict] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        if name.endswith(".json") and valid_run_id(name[:-5]):
            entry = read_entry(directory, name[:-5])
            if entry is not None:
                out.append(entry)
    return out


def read_events(directory: str, run_id: str) -> list[dict]:
    """The run's events, parsed (lines that do not parse are skipped; audit tells)."""
    events = []
    try:
        with open(log_path(directory, run_id), "rb") as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return events


class EventLog:
    """One run's append-only, hash-chained, fsynced event log."""

    def __init__(self, path: str, run_id: str, *, create: bool):
        self.path = path
        self.run_id = run_id
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        if create:
            flags |= os.O_CREAT | os.O_EXCL
            self.seq, self.head = 0, ZERO_HASH
        else:
            self.seq, self.head = log_tail(path)
        self.fd = os.open(path, flags, 0o600)

    def append(self, event: str, data: dict | None = None) -> dict:
        line: dict[str, Any] = {
            "seq": self.seq,
            "event": event,
            "time": time.time(),
            "monotonic": time.monotonic(),
            "run_id": self.run_id,
            "data": data or {},
            "prev": self.head,
        }
        body = _canonical(line)
        line["hash"] = sha256(body).hexdigest()
        # The canonical form plus the hash as its last member: verifying
        # pops "hash" and canonicalizes again, so the order does not matter.
        raw = body[:-1] + b',"hash":"' + line["hash"].encode() + b'"}'
        os.write(self.fd, raw + b"\n")
        os.fsync(self.fd)
        # The copy the run's uid cannot rewrite, where journald runs (journal.py).
        try:
            from . import journal

            journal.send_event(line, raw)
        except Exception:  # noqa: BLE001 -- best effort: the journal never fails a run
            pass
        self.seq += 1
        self.head = line["hash"]
        return line

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def log_tail(path: str) -> tuple[int, str]:
    """(next seq, last hash) of an existing log."""
    seq, head = 0, ZERO_HASH
    with open(path, "rb") as f:
        for raw in f:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            seq, head = line.get("seq", seq) + 1, line.get("hash", head)
    return seq, head


# -- the writer side ----------------------------------------------------------
class Registration:
    """A registered run: its entry and its log, written by the owning corral."""

    def __init__(self, directory: str, entry: dict, log: EventLog, token: "OwnerToken | None" = None):
        self.directory = directory
        self.entry = entry
        self.log = log
        #: The owner's sealed token (register() makes one; corralctl's reclaim writes without).
        self.token = token

    @property
    def run_id(self) -> str:
        return self.entry["run_id"]

    def event(self, name: str, data: dict | None = None) -> dict:
        return self.log.append(name, data)

    def save(self, **changes) -> None:
        self.entry.update(changes)
        self.entry["log"] = {"lines": self.log.seq, "head": self.log.head}
        _write_atomic(entry_path(self.directory, self.run_id), _canonical(self.entry) + b"\n")
        if self.token is not None:
            self.token.update(self.entry)

    def close(self) -> None:
        self.log.close()
        if self.token is not None:
            self.token.close()


def register(
    spec,
    *,
    mode: str,
    unit: str | None = None,
    control_group: str | None = None,
    environment: dict | None = None,
    credentials: list | None = None,
    credentials_directory: str | None = None,
    credentials_delivery: str | None = None,
    helper_pids=(),
    directory: str | None = None,
    owner_kind: str = "corral",
    mark: str | None = None,
) -> Registration:
    """Write the run's entry (state ``active``) and its ``registered`` event.

    Raises OSError when the state directory or the files cannot be written:
    the caller must not start the command then. Once the entry is durable,
    removes a few stale finished runs if it is time to (``maybe_prune``:
    usually one stat(); it never raises).
    """
    directory = ensure_private_dir(directory) if directory else ensure_state_dir()
    run_id = spec.run_id
    if not valid_run_id(run_id):
        raise OSError(f"run id {run_id!r} is not a registry id")
    now, mono = time.time(), time.monotonic()
    entry = {
        "version": VERSION,
        "run_id": run_id,
        "state": "active",
        # kind "corral": the owner is a corral process (SIGTERM makes it stop
        # the run, verified); "library": an application using the Python API,
        # which must never be signalled — its runs are stopped through the unit.
        "owner": {
            "pid": os.getpid(),
            "starttime": own_starttime(),
            "pgid": os.getpgid(0),
            "sid": os.getsid(0),
            "uid": os.geteuid(),
            "boot_id": boot_id(),
            "kind": owner_kind,
        },
        "mode": mode,
        "unit": unit,
        "control_group": control_group,
        "registered_at": now,
        "registered_monotonic": mono,
        "wall": spec.wall,
        "grace": spec.grace,
        "verify_timeout": spec.verify_timeout,
        "deadline_at": None if spec.wall is None else now + spec.wall,
        "deadline_monotonic": None if spec.wall is None else mono + spec.wall,
        "command": redact_argv(spec.argv),
        "cwd": os.path.abspath(spec.cwd or os.getcwd()),
        "environment": environment,
        "credentials": list(credentials or []),
        # "systemd" (a service's LoadCredential=; the manager owns and removes
        # the directory) or "corral" (credentials_directory is corral's own)
        "credentials_delivery": credentials_delivery,
        "credentials_directory": credentials_directory,
        "helper_pids": list(helper_pids),
        # SHA-256 of the CORRAL_RUN_MARK the command got (fallback runs): see carries_mark()
        "mark_sha256": mark_hash(mark) if mark else None,
    }
    log = EventLog(log_path(directory, run_id), run_id, create=True)
    token = OwnerToken(run_id)
    try:
        reg = Registration(directory, entry, log, token)
        reg.event(
            "registered",
            {
                k: entry[k]
                for k in (
                    "owner",
                    "mode",
                    "unit",
                    "control_group",
                    "wall",
                    "deadline_at",
                    "command",
                    "cwd",
                    "environment",
                    "credentials",
                    "credentials_delivery",
                )
            },
        )
        reg.save()
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)  # the new names are durable too
        finally:
            os.close(dfd)
    except BaseException:
        log.close()
        token.close()
        raise
    maybe_prune(directory, now=now)
    return reg


def _status_data(status: int | None) -> dict:
    if status is None:
        return {}
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"exit_status": os.waitstatus_to_exitcode(status)}


class RegistryObserver:
    """Writes a run's steps to the registry, each durably before the supervisor acts.

    A ``RunObserver`` (``supervisor.py``) by duck typing, so importing this
    module does not import the supervisor.
    """

    watch_interval = DETACH_WATCH_INTERVAL

    def __init__(self, registration: Registration):
        self.reg = registration
        self.main_pid: int | None = None
        self._seen_detached: set[tuple[int, int]] = set()

    def event(self, name: str, data: dict) -> None:
        reg = self.reg
        if name == "started":
            self.main_pid = data.get("pid")
            st = proc_stat(self.main_pid) if self.main_pid else None
            reg.event(
                "started",
                {
                    "pid": self.main_pid,
                    "pgid": self.main_pid,
                    "sid": self.main_pid,
                    "starttime": st[4] if st else None,
                    "unit": data.get("unit"),
                    "control_group": data.get("control_group"),
                },
            )
            if data.get("control_group") and not reg.entry.get("control_group"):
                reg.save(control_group=data["control_group"], main_pid=self.main_pid)
            else:
                reg.entry["main_pid"] = self.main_pid  # saved with the next state change
        elif name == "deadline_expired":
            line = reg.event("deadline_expired", {})
            reg.save(state="expired", expired_at=line["time"], expired_monotonic=line["monotonic"])
        elif name == "command_exited":
            reg.event("command_exited", _status_data(data.get("status")))
        elif name == "finished":
            line = reg.event("finished", dict(data))
            reg.save(
                state="finished",
                finished_at=line["time"],
                finished_monotonic=line["monotonic"],
                exit_code=data.get("exit_code"),
                outcome=data.get("outcome"),
                verified=self.verified,
                remaining_pids=self.remaining,
            )
            reg.close()
        else:
            if name == "verified":
                self.verified, self.remaining = True, []
            elif name == "unverified":
                self.verified, self.remaining = False, list(data.get("remaining", []))
            reg.event(name, dict(data))

    verified: bool | None = None
    remaining: list = []

    def tick(self, processes: list) -> None:
        ref = self.main_pid
        live = [p for p in processes if p.alive]
        if ref is None and live:  # a service: its main process is the oldest, a session leader
            ref = min(live, key=lambda p: p.starttime).sid
        if ref is None:
            return
        from .kernel.procfs import cmdline

        for p in live:
            if (p.sid != ref or p.pgid != ref) and (p.pid, p.starttime) not in self._seen_detached:
                self._seen_detached.add((p.pid, p.starttime))
                self.reg.event(
                    "detached",
                    {
                        "pid": p.pid,
                        "starttime": p.starttime,
                        "ppid": p.ppid,
                        "pgid": p.pgid,
                        "sid": p.sid,
                        "left": "session" if p.sid != ref else "process group",
                        "argv": redact_argv(cmdline(p.pid)),
                    },
                )


# -- retention ---------------------------------------------------------------------------
def finished_time(entry: dict, mtime: float) -> float:
    """When the run finished: the later of its recorded finish time and its
    entry file's mtime, so an entry whose clock or file looks recent is kept."""
    recorded = entry.get("finished_at")
    return max(recorded if isinstance(recorded, (int, float)) else 0.0, mtime)


def prunable(entry, mtime: float, cutoff: float) -> "TypeGuard[dict]":
    """May this entry be removed? Only if it is ``finished`` as written, finished
    before ``cutoff`` and its owner process is gone. Never an active or expired one."""
    return (
        isinstance(entry, dict)
        and entry.get("state") == "finished"
        and finished_time(entry, mtime) < cutoff
        and not owner_alive(entry)
    )


def remove_run(directory: str, run_id: str) -> None:
    """Remove a run's event log, then its entry.

    In this order, an interruption leaves a finished entry without a log,
    which the next pruning removes; never a log without its entry.
    """
    for path in (log_path(directory, run_id), entry_path(directory, run_id)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def prune_finished(
    directory: str,
    keep: float = KEEP_FINISHED,
    *,
    dry_run: bool = False,
    limit: int | None = None,
    now: float | None = None,
) -> list[dict]:
    """Remove finished runs (entry and log) that finished more than ``keep`` seconds ago.

    Returns one dict per run removed (or, with ``dry_run``, that would be):
    ``run_id``, ``finished_at``, ``age``, ``outcome``, ``exit_code``, and
    ``error`` when removing failed. Stops after ``limit`` runs. Entries are
    read only when their file is older than the cutoff: a scan of recent
    runs costs one stat() per run.
    """
    now = time.time() if now is None else now
    cutoff = now - keep
    out: list[dict] = []
    try:
        scan = os.scandir(directory)
    except OSError:
        return out
    with scan:
        for item in scan:
            if limit is not None and len(out) >= limit:
                break
            if not item.name.endswith(".json"):
                continue
            try:
                mtime = item.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            run_id = item.name[:-5]
            if mtime >= cutoff or not valid_run_id(run_id):  # the cheap test first
                continue
            entry = read_entry(directory, run_id)
            if not prunable(entry, mtime, cutoff):
                continue
            finished_at = finished_time(entry, mtime)
            row = {
                "run_id": run_id,
                "finished_at": finished_at,
                "age": now - finished_at,
                "outcome": entry.get("outcome"),
                "exit_code": entry.get("exit_code"),
            }
            if not dry_run:
                try:
                    remove_run(directory, run_id)
                except OSError as exc:
                    row["error"] = str(exc)
            out.append(row)
    return out


def maybe_prune(directory: str, *, now: float | None = None) -> int:
    """Registration's share of retention: cheap, bounded, never an error.

    Costs one stat() while ``PRUNE_STAMP`` is younger than ``PRUNE_INTERVAL``.
    Otherwise it renews the stamp first (concurrent registrations then skip)
    and removes at most ``PRUNE_BATCH`` runs finished more than
    ``KEEP_FINISHED`` ago; if it removed that many, more may be left, so it
    makes the stamp stale again for the next registration to go on.
    Returns how many runs it removed.
    """
    now = time.time() if now is None else now
    stamp = os.path.join(directory, PRUNE_STAMP)
    try:
        try:
            if 0 <= now - os.stat(stamp).st_mtime < PRUNE_INTERVAL:
                return 0  # a stamp from the future (clock set back) counts as stale
        except FileNotFoundError:
            pass
        fd = os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.utime(fd, (now, now))
        finally:
            os.close(fd)
        removed = prune_finished(directory, KEEP_FINISHED, limit=PRUNE_BATCH, now=now)
        if len(removed) >= PRUNE_BATCH:
            os.utime(stamp, (0, 0))
        return len(removed)
    except Exception:  # noqa: BLE001 -- the run is registered; pruning must never stop it
        return 0


# -- the reader side: audit -----------------------------------------------------
def verify_log(directory: str, run_id: str) -> tuple[bool, str, int | None]:
    """(ok, message, first bad line number (1-based) or None)."""
    try:
        with open(log_path(directory, run_id), "rb") as f:
            raw_lines = f.read().split(b"\n")
    except FileNotFoundError:
        return False, "no event log", None
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    else:
        return False, "last line is incomplete (no newline)", len(raw_lines)
    prev = ZERO_HASH
    for number, raw in enumerate(raw_lines, 1):
        try:
            line = json.loads(raw)
            claimed = line.pop("hash")
        except (ValueError, KeyError, AttributeError, TypeError):
            return False, "not a log line (unparsable or no hash)", number
        if sha256(_canonical(line)).hexdigest() != claimed:
            return False, "content does not match its hash (line changed)", number
        if line.get("prev") != prev:
            return False, "does not follow the previous line (line removed, inserted or reordered)", number
        if line.get("seq") != number - 1:
            return False, f"sequence number {line.get('seq')} where {number - 1} was expected", number
        if line.get("run_id") != run_id:
            return False, f"belongs to run {line.get('run_id')!r}", number
        prev = claimed
    entry = read_entry(directory, run_id)
    count = len(raw_lines)
    if entry is not None and entry.get("log"):
        anchored, head = entry["log"].get("lines", 0), entry["log"].get("head")
        if count < anchored:
            return False, f"log truncated: the entry anchors {anchored} lines, {count} found", count + 1
        if anchored and _hash_of_line(raw_lines[anchored - 1]) != head:
            return False, "does not match the hash the entry recorded for it", anchored
        if entry.get("state") == "finished" and count > anchored:
            return False, "lines after the run finished that the entry does not anchor", anchored + 1
    elif entry is None:
        return True, f"{count} lines, chain intact (no entry to anchor the tail)", None
    return True, f"{count} lines, chain intact", None


def _hash_of_line(raw: bytes) -> str | None:
    try:
        return json.loads(raw).get("hash")
    except ValueError:
        return None


# -- the reader side: state -------------------------------------------------------
def _finished_why(entry: dict) -> str:
    """How a finished run ended, in words: its exit, or how it was reclaimed."""
    if entry.get("outcome") == "reclaimed":
        # Its corral died; corralctl stopped what was left. No exit status is known.
        proof = (
            "verified"
            if entry.get("verified")
            else f"NOT verified, still present: {' '.join(map(str, entry.get('remaining_pids') or [])) or '?'}"
        )
        return f"reclaimed after its corral was gone, exit status unknown; {proof}"
    exit_code = entry.get("exit_code")
    return f"exit {'unknown' if exit_code is None else exit_code}, {entry.get('outcome') or 'unknown outcome'}"


def effective_state(entry: dict | None, *, now_monotonic: float | None = None) -> tuple[str, str]:
    """(state, why) as an authorisation check must see it.

    The entry is a file the run's own uid can rewrite, so while its owner
    lives the owner's sealed token (``owner_token``) decides: an entry that
    claims ``finished``, or a later deadline, while its corral still runs
    the run is overruled, and the why says so. Without a token: ``finished``
    and ``expired`` as written; ``active`` only while the deadline has not
    passed and the owner still runs and holds the token (so an entry naming
    some other live process as its owner is ``expired``).
    """
    if not isinstance(entry, dict):
        return "unknown", "no such run"
    now = time.monotonic() if now_monotonic is None else now_monotonic
    written = entry.get("state")
    token = owner_token(entry) if written in STATES else None
    if token is not None:
        pid = (entry.get("owner") or {}).get("pid")
        said = token.get("state")
        if said == "finished":
            return "finished", _finished_why(entry) if written == "finished" else "finished (its owner says so)"
        deadline = token.get("deadline_monotonic")
        if said == "expired" or (isinstance(deadline, (int, float)) and now >= deadline):
            state, why = "expired", "deadline passed"
        else:
            state, why = "active", "running"
        if written == "finished":
            why += f"; entry claims finished but its owner (pid {pid}) is alive and running the run"
        elif written != said:
            why += f"; entry claims {written} but its owner (pid {pid}) says {said}"
        elif entry.get("deadline_monotonic") != deadline:
            why += f"; entry's deadline differs from its owner's (pid {pid})"
        return state, why
    if written == "finished":
        return "finished", _finished_why(entry)
    if written == "expired":
        return "expired", "deadline passed"
    if written != "active":
        return "unknown", f"unreadable state {written!r}"
    deadline = entry.get("deadline_monotonic")
    same_boot = (entry.get("owner") or {}).get("boot_id") in (None, "", boot_id())
    if isinstance(deadline, (int, float)) and (now >= deadline or not same_boot):
        return "expired", "deadline passed"
    if not owner_alive(entry):
        return "expired", "its corral process is gone"
    return "expired", (
        f"its owner (pid {(entry.get('owner') or {}).get('pid')}) holds no token for this run: "
        "the entry alone does not make it active"
    )
