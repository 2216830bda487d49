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
def state_dir(env=os.environ) -> str:
    override = env.get("CORRAL_STATE_DIR")
    if override:
        return os.path.abspath(override)
    if os.geteuid() == 0:
        return "/run/corral"
    runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.geteuid()}"
    return os.path.join(runtime, "corral")


def ensure_private_dir(path: str) -> str:
    """Create ``path`` (0700) if needed; refuse one that is not ours and private.

    Only the last component is created: a missing parent (a mistyped
    CORRAL_STATE_DIR) is an OSError, never a tree of new directories.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise OSError(f"{path}: parent directory {os.path.dirname(path.rstrip('/')) or '/'} does not exist "
                      "(only the last component is created)") from None
    st = os.lstat(path)
    import stat

    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise OSError(f"{path} is owned by uid {st.st_uid}, not by us")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def valid_run_id(run_id: str) -> bool:
    return 0 < len(run_id) <= 64 and all(c in "0123456789abcdef" for c in run_id)


def normalize_run_id(text: str) -> str:
    """Accept ``<id>``, ``corral-<id>`` and unit names ``corral-<id>.scope``."""
    text = text.strip()
    if text.startswith("corral-"):
        text = text[len("corral-"):]
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
    st = proc_stat(owner.get("pid", 0)) if owner.get("pid") else None
    return st is not None and st[4] == owner.get("starttime") and st[3] not in ("Z", "X")


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
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def list_entries(directory: str) -> list[dict]:
    out = []
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
            self.seq, self.head = _tail(path)
        self.fd = os.open(path, flags, 0o600)

    def append(self, event: str, data: dict | None = None) -> dict:
        line = {"seq": self.seq, "event": event, "time": time.time(), "monotonic": time.monotonic(),
                "run_id": self.run_id, "data": data or {}, "prev": self.head}
        body = _canonical(line)
        line["hash"] = sha256(body).hexdigest()
        # The canonical form plus the hash as its last member: verifying
        # pops "hash" and canonicalizes again, so the order does not matter.
        os.write(self.fd, body[:-1] + b',"hash":"' + line["hash"].encode() + b'"}\n')
        os.fsync(self.fd)
        self.seq += 1
        self.head = line["hash"]
        return line

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _tail(path: str) -> tuple[int, str]:
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

    def __init__(self, directory: str, entry: dict, log: EventLog):
        self.directory = directory
        self.entry = entry
        self.log = log

    @property
    def run_id(self) -> str:
        return self.entry["run_id"]

    def event(self, name: str, data: dict | None = None) -> dict:
        return self.log.append(name, data)

    def save(self, **changes) -> None:
        self.entry.update(changes)
        self.entry["log"] = {"lines": self.log.seq, "head": self.log.head}
        _write_atomic(entry_path(self.directory, self.run_id), _canonical(self.entry) + b"\n")

    def close(self) -> None:
        self.log.close()


def register(spec, *, mode: str, unit: str | None = None, control_group: str | None = None,
             environment: dict | None = None, credentials: list | None = None,
             credentials_directory: str | None = None, credentials_delivery: str | None = None,
             helper_pids=(), directory: str | None = None, owner_kind: str = "corral") -> Registration:
    """Write the run's entry (state ``active``) and its ``registered`` event.

    Raises OSError when the state directory or the files cannot be written:
    the caller must not start the command then. Once the entry is durable,
    removes a few stale finished runs if it is time to (``maybe_prune``:
    usually one stat(); it never raises).
    """
    directory = ensure_private_dir(directory or state_dir())
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
        "owner": {"pid": os.getpid(), "starttime": own_starttime(), "pgid": os.getpgid(0),
                  "sid": os.getsid(0), "uid": os.geteuid(), "boot_id": boot_id(), "kind": owner_kind},
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
    }
    log = EventLog(log_path(directory, run_id), run_id, create=True)
    try:
        reg = Registration(directory, entry, log)
        reg.event("registered", {k: entry[k] for k in (
            "owner", "mode", "unit", "control_group", "wall", "deadline_at", "command", "cwd", "environment",
            "credentials", "credentials_delivery")})
        reg.save()
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)  # the new names are durable too
        finally:
            os.close(dfd)
    except BaseException:
        log.close()
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
            reg.event("started", {"pid": self.main_pid, "pgid": self.main_pid, "sid": self.main_pid,
                                  "starttime": st[4] if st else None,
                                  "unit": data.get("unit"), "control_group": data.get("control_group")})
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
            reg.save(state="finished", finished_at=line["time"], finished_monotonic=line["monotonic"],
                     exit_code=data.get("exit_code"), outcome=data.get("outcome"),
                     verified=self.verified, remaining_pids=self.remaining)
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
                self.reg.event("detached", {
                    "pid": p.pid, "starttime": p.starttime, "ppid": p.ppid, "pgid": p.pgid, "sid": p.sid,
                    "left": "session" if p.sid != ref else "process group",
                    "argv": redact_argv(cmdline(p.pid))})


# -- retention ---------------------------------------------------------------------------
def finished_time(entry: dict, mtime: float) -> float:
    """When the run finished: the later of its recorded finish time and its
    entry file's mtime, so an entry whose clock or file looks recent is kept."""
    recorded = entry.get("finished_at")
    return max(recorded if isinstance(recorded, (int, float)) else 0.0, mtime)


def prunable(entry, mtime: float, cutoff: float) -> bool:
    """May this entry be removed? Only if it is ``finished`` as written, finished
    before ``cutoff`` and its owner process is gone. Never an active or expired one."""
    return (isinstance(entry, dict) and entry.get("state") == "finished"
            and finished_time(entry, mtime) < cutoff and not owner_alive(entry))


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


def prune_finished(directory: str, keep: float = KEEP_FINISHED, *, dry_run: bool = False,
                   limit: int | None = None, now: float | None = None) -> list[dict]:
    """Remove finished runs (entry and log) that finished more than ``keep`` seconds ago.

    Returns one dict per run removed (or, with ``dry_run``, that would be):
    ``run_id``, ``finished_at``, ``age``, ``outcome``, ``exit_code``, and
    ``error`` when removing failed. Stops after ``limit`` runs. Entries are
    read only when their file is older than the cutoff: a scan of recent
    runs costs one stat() per run.
    """
    now = time.time() if now is None else now
    cutoff = now - keep
    out = []
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
            row = {"run_id": run_id, "finished_at": finished_at, "age": now - finished_at,
                   "outcome": entry.get("outcome"), "exit_code": entry.get("exit_code")}
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
        proof = ("verified" if entry.get("verified")
                 else f"NOT verified, still present: {' '.join(map(str, entry.get('remaining_pids') or [])) or '?'}")
        return f"reclaimed after its corral was gone, exit status unknown; {proof}"
    exit_code = entry.get("exit_code")
    return f"exit {'unknown' if exit_code is None else exit_code}, {entry.get('outcome') or 'unknown outcome'}"


def effective_state(entry: dict | None, *, now_monotonic: float | None = None) -> tuple[str, str]:
    """(state, why) as an authorisation check must see it.

    ``finished`` and ``expired`` as written; ``active`` only while the
    deadline has not passed and the owning corral still runs.
    """
    if entry is None:
        return "unknown", "no such run"
    state = entry.get("state")
    if state == "finished":
        return "finished", _finished_why(entry)
    if state == "expired":
        return "expired", "deadline passed"
    if state != "active":
        return "unknown", f"unreadable state {state!r}"
    deadline = entry.get("deadline_monotonic")
    now = time.monotonic() if now_monotonic is None else now_monotonic
    same_boot = (entry.get("owner") or {}).get("boot_id") in (None, "", boot_id())
    if deadline is not None and (now >= deadline or not same_boot):
        return "expired", "deadline passed"
    if not owner_alive(entry):
        return "expired", "its corral process is gone"
    return "active", "running"
