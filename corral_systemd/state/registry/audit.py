"""The reader side: verifying a run's event log against its entry."""

from ...common import jsoncodec

try:  # the builtin module loads faster than hashlib (no OpenSSL)
    from _sha256 import sha256
except ImportError:  # pragma: no cover
    from hashlib import sha256
from .files import ZERO_HASH, _canonical, log_path, read_entry


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
            line = jsoncodec.loads(raw)
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
        return jsoncodec.loads(raw).get("hash")
    except ValueError:
        return None
