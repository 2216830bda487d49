"""Who a run's owner is and which processes are the run's, as the kernel shows it: the
owner's start time and boot, its sealed token (a memfd only it holds), the run's mark
in its processes' environment."""

import json
import os
from typing import TypeGuard

try:  # the builtin module loads faster than hashlib (no OpenSSL)
    from _sha256 import sha256
except ImportError:  # pragma: no cover
    from hashlib import sha256
from .files import _canonical
from .paths import valid_run_id


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
# cannot forge is a sealed memfd held open by the owner process itself:
# ``corral-run-<id>``, JSON {run_id, state, deadline_monotonic, boot_id, pid},
# F_SEAL_WRITE|SHRINK|GROW|SEAL, replaced (dup2 onto the same fd) on each
# state change and closed when the run is finished. Another process cannot
# put a descriptor into the owner, nor change a sealed file's contents.
TOKEN_PREFIX = "corral-run-"


def _seals() -> int:
    import fcntl

    return fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class SealedToken:
    """A sealed memfd named ``name`` holding JSON, held by this process; each
    ``update`` replaces it atomically (``dup2`` onto the same descriptor)."""

    def __init__(self, name: str):
        self.name = name
        self.fd = -1

    def write(self, data: dict) -> None:
        import fcntl

        fd = os.memfd_create(self.name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, _canonical(data))
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


class OwnerToken(SealedToken):
    """The owner's side: a sealed memfd describing the run, held while the run is not finished."""

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


def sealed_token(pid: int, name: str) -> dict | None:
    """The JSON object in a sealed memfd ``name`` that process ``pid`` holds, or None.

    Only a descriptor sealed against writing counts (anyone holding an
    unsealed one could have written it), and only a token that names ``pid``
    itself (as ``SealedToken`` writers do): the caller still checks that
    ``pid`` is the process it means (start time) after reading."""
    import fcntl

    want = f"/memfd:{name} (deleted)"
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd_name in names:
        path = f"/proc/{pid}/fd/{fd_name}"
        try:
            if os.readlink(path) != want:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _seals() != _seals():
                continue
            token = json.loads(os.pread(fd, 1 << 20, 0))
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
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
    if token is None or token.get("run_id") != run_id:
        return None
    if not owner_alive(entry):
        return None  # read from a process that has since gone (its pid reused)
    return token


def looks_like_corral(pid: int) -> bool:
    """Is ``pid`` running corral's code: a python whose command line runs corral_systemd or a corral script?

    Weak on its own (a process may exec anything with any argv); together
    with the token it keeps a forged entry from naming an arbitrary process.
    """
    from ...kernel.procfs import cmdline

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
