"""``corralctl audit verify``: a run's event log checked offline, and against the journal."""

import os
import sys

from ..state import registry as REG
from ..state.registry.audit import verify_log
from .status import STATUS_EXIT


def audit_verify(run: str, directory: str | None = None) -> int:
    """0 intact, 1 bad (or the log is missing while the entry is there), 12 no such run."""
    directory = directory or REG.state_dir()
    run_id = REG.normalize_run_id(run)
    if not REG.valid_run_id(run_id) or not any(
        os.path.lexists(path) for path in (REG.entry_path(directory, run_id), REG.log_path(directory, run_id))
    ):
        print(f"corralctl: unknown run {run!r}", file=sys.stderr)
        return STATUS_EXIT["unknown"]
    ok, message, line = verify_log(directory, run_id)
    path = REG.log_path(directory, run_id)
    if not ok:
        where = f":{line}" if line else ""
        print(f"{path}{where}: BAD: {message}")
        return 1
    # The chain shows the file is consistent, not who wrote it: the run's uid
    # can rewrite it, chain and anchor included. The journal's copy it cannot.
    from ..state import journal

    if not journal.available():
        print(
            f"{path}: OK: {message}; no journal to compare with: the chain cannot tell a rewrite "
            "by the run's own uid (see man corralctl)"
        )
        return 0
    records = journal.read_records(run_id)
    if records is None:
        print(f"{path}: OK: {message}; the journal could not be read (journalctl failed)")
        return 0
    copy, sender = journal.trusted_lines(records, run_id, os.geteuid())
    if not copy:
        print(f"{path}: OK: {message}; the journal has no copy of this run")
        return 0
    try:
        with open(path, "rb") as f:
            file_lines = f.read().split(b"\n")[:-1]
    except OSError as exc:
        print(f"{path}: BAD: {exc.strerror}")
        return 1
    diffs = journal.compare(file_lines, copy)
    if not diffs:
        print(f"{path}: OK: {message}; matches the journal ({len(copy)} events sent by {sender})")
        return 0
    for number, what in diffs:
        print(f"{path}:{number}: BAD: {what}")
    return 1
