"""Who a run's owner is and which processes are the run's, as the kernel shows it: the
owner's start time and boot, its sealed token (a memfd only it holds), the run's mark
in its processes' environment."""

import os

from ...common import jsoncodec

try:  # the builtin module loads faster than hashlib (no OpenSSL)
    from _sha256 import sha256
except ImportError:  # pragma: no cover
    from hashlib import sha256
from .files import _canonical
from .paths import valid_run_id

TYPE_CHECKING = False  # typing is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from typing import Any, TypeGuard


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
    from ...kernel.procfs import read_stat

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
# cannot forge is a name the owner process itself holds: the abstract unix
# socket ``@corral-token/<uid>/<name>`` (``corral-run-<id>``), bound before
# the entry is written and held until the run is finished. While the owner
# lives no other process can bind it, and the kernel names the process that
# did to whoever connects (``SO_PEERCRED``). The owner answers each
# connection with its token, JSON {run_id, state, deadline_monotonic,
# boot_id, pid, session}, from its own wait (``serving``): nothing reads its
# /proc files, so corral's processes need not be dumpable (a command of the
# same uid can then neither ptrace them nor open their descriptors).
TOKEN_PREFIX = "corral-run-"
#: The abstract socket names' prefix (``@corral-token/<uid>/<token name>``).
TOKEN_ADDRESS = "corral-token/"
#: How long a reader waits for an owner to answer (one that is stopped, or
#: between two of its waits, answers late or never: its token reads as None).
TOKEN_READ_TIMEOUT = 1.0

#: Tokens this process holds, by their listening socket's descriptor (``serving``).
_HELD: "dict[int, SealedToken]" = {}


def token_address(name: str, uid: int | None = None) -> str:
    return f"\0{TOKEN_ADDRESS}{os.geteuid() if uid is None else uid}/{name}"


def serving() -> dict:
    """The descriptors of the tokens this process holds, each with what answers
    the connections waiting on it: every wait of the owner's polls these."""
    return {fd: token.serve for fd, token in list(_HELD.items())}


def _forget_in_child() -> None:
    """A forked child holds none of its parent's tokens: it closes their sockets
    (the name goes with the owner), and never answers for the owner."""
    for token in list(_HELD.values()):  # each holds its socket (``write``) until ``close`` drops it
        sock, token.sock = token.sock, None
        try:
            sock.close()  # through its object: dropped, its finalizer would close it, with a ResourceWarning
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_in_child)


class SealedToken:
    """A token named ``name`` held by this process: JSON it answers with at its
    address, to the connections its waits accept (``serve``); each ``write``
    replaces what it answers. OSError if the address is taken (another process
    holds a token of that name)."""

    def __init__(self, name: str):
        self.name = name
        self.sock: Any = None  # the listening socket, once written
        self._data = b""

    def write(self, data: dict) -> None:
        import _socket  # not socket (its enums): every run holds a token, few are asked

        self._data = _canonical(data)
        if self.sock is None:
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC | _socket.SOCK_NONBLOCK)
            try:
                sock.bind(token_address(self.name))
                sock.listen(128)
            except BaseException:
                sock.close()
                raise
            self.sock = sock
            _HELD[sock.fileno()] = self

    @property
    def fd(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def serve(self) -> None:
        """Answer every connection waiting (never blocks)."""
        import socket

        while self.sock is not None:
            try:
                fd, _ = self.sock._accept()  # the listening socket is _socket's (``write``): accept4, close-on-exec
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            conn = socket.socket(fileno=fd)
            try:
                conn.settimeout(0.2)
                conn.sendall(self._data)
            except OSError:
                pass
            finally:
                conn.close()

    def close(self) -> None:
        if self.sock is not None:
            _HELD.pop(self.sock.fileno(), None)
            self.sock.close()
            self.sock = None


class OwnerToken(SealedToken):
    """The owner's side: its token, held while the run is not finished."""

    def __init__(self, run_id: str):
        super().__init__(TOKEN_PREFIX + run_id)
        self.run_id = run_id

    def update(self, entry: dict) -> None:
        self.write(
            {
                "run_id": self.run_id,
                "state": entry.get("state"),
                "deadline_monotonic": entry.get("deadline_monotonic"),
                "boot_id": boot_id(),
                "pid": os.getpid(),
                # A session's runs: its holder believes this, never the entry (``state.sessions``).
                "session": entry.get("session"),
            }
        )


def token_holder(name: str) -> int | None:
    """The pid of the process holding token ``name`` (the kernel's word: who is
    bound to its address), or None: no answer needed from it."""
    from ...varlink.wire import connect_bound

    connected = connect_bound(token_address(name), TOKEN_READ_TIMEOUT)
    if connected is None:
        return None
    connected[0].close()
    return connected[1]


def sealed_token(pid: int, name: str) -> dict | None:
    """The JSON token ``name`` held by process ``pid``, or None: nothing holds it,
    another process does, or it did not answer within ``TOKEN_READ_TIMEOUT``.
    Only a token that names ``pid`` itself counts (as ``SealedToken`` writers
    do); the caller still checks ``pid`` is the process it means (start time)."""
    import time

    from ...varlink.wire import connect_bound

    connected = connect_bound(token_address(name), TOKEN_READ_TIMEOUT)
    if connected is None:
        return None
    sock, peer = connected
    try:
        if peer != pid:
            return None
        data = b""
        give_up = time.monotonic() + TOKEN_READ_TIMEOUT
        while len(data) < 1 << 20:
            sock.settimeout(max(0.01, give_up - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        token = jsoncodec.loads(data)
    except (OSError, ValueError):
        return None
    finally:
        sock.close()
    if isinstance(token, dict) and token.get("pid") == pid and token.get("boot_id") in ("", boot_id()):
        return token
    return None


def owner_token(entry: dict) -> dict | None:
    """The live owner's own word on the run (its sealed token), or None.

    None when the owner named by the entry is gone, is another process
    (pid reused), or holds no sealed token for this run: then the entry
    alone says who owns the run, and nothing destructive may rest on that.
    """
    owner = entry.get("owner") if isinstance(entry, dict) else None
    run_id = entry.get("run_id") if isinstance(entry, dict) else None
    if not isinstance(owner, dict) or not isinstance(run_id, str) or not valid_run_id(run_id):
        return None
    pid = owner.get("pid")
    if not _is_pid(pid) or not owner_alive(entry):
        return None
    token = sealed_token(pid, TOKEN_PREFIX + run_id)
    if token is None and token_holder(TOKEN_PREFIX + run_id) == pid:
        # Bound, but not answering (stopped, or between two of its waits): alive
        # and this run's owner, the kernel says; what it would say is the entry's.
        token = {
            "run_id": run_id,
            "pid": pid,
            "state": "active" if entry.get("state") == "finished" else entry.get("state"),
            "deadline_monotonic": entry.get("deadline_monotonic"),
            "session": None,
            "unanswered": True,
        }
    if token is None or token.get("run_id") != run_id:
        return None
    if not owner_alive(entry):
        return None  # read from a process that has since gone (its pid reused)
    return token


def looks_like_corral(pid: int) -> bool:
    """Is ``pid`` running corral's code: a python whose command line runs corral_systemd or a corral script?

    Weak on its own (a process may exec anything with any argv); together
    with the token it keeps a forged entry from naming an arbitrary process.
    A session's background run's corral is a fork of the session's holder, so
    its command line is the holder's: corralctl's (``session start``, ``hook``,
    ``mcp``), or ``python -m corral_systemd.ctl.session_holder`` (a holder unit).
    """
    from ...kernel.procfs import cmdline

    argv = cmdline(pid)
    if not argv:
        return False
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except PermissionError:  # corral is not dumpable: its exe is not another uid-peer's to read
        exe = os.path.basename(argv[0])
    except OSError:
        return False
    if not exe.startswith("python"):
        return False
    for arg in argv[1:4]:
        base = os.path.basename(arg)
        if base in ("corral", "corral-enforced", "corralctl") or "corral_systemd" in arg:
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
