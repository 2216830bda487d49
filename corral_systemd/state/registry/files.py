"""The registry's files: entries (replaced atomically) and hash-chained event logs."""

import os
import time

from ...common import jsoncodec

try:  # the builtin module loads faster than hashlib (no OpenSSL)
    from _sha256 import sha256
except ImportError:  # pragma: no cover
    from hashlib import sha256
from .paths import valid_run_id

TYPE_CHECKING = False  # typing is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from typing import Any

VERSION = 1
ZERO_HASH = "0" * 64


# -- files ------------------------------------------------------------
def _canonical(obj) -> bytes:
    return jsoncodec.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


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


def output_path(directory: str, run_id: str) -> str:
    """A --background run's output log (its command's stdout and stderr, corral's lines)."""
    return os.path.join(directory, run_id + ".out")


def report_path(directory: str, run_id: str) -> str:
    """Where a --yield run's corral writes its own lines (warnings, reason, summary)."""
    return os.path.join(directory, run_id + ".report")


def read_entry(directory: str, run_id: str) -> dict | None:
    try:
        with open(entry_path(directory, run_id), "rb") as f:
            entry = jsoncodec.loads(f.read())
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
                    events.append(jsoncodec.loads(line))
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
            from .. import journal

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
                line = jsoncodec.loads(raw)
            except ValueError:
                continue
            seq, head = line.get("seq", seq) + 1, line.get("hash", head)
    return seq, head
