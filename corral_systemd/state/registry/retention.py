"""Retention: which finished runs may go, and removing them."""

import os
import time

from .files import entry_path, log_path, output_path, read_entry, report_path
from .identity import owner_alive
from .paths import valid_run_id

TYPE_CHECKING = False  # typing is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from typing import TypeGuard

#: A finished run's entry and log are kept at least this long (seconds) after it finished.
KEEP_FINISHED = 24 * 3600.0
#: Registration looks for stale finished runs at most this often (by PRUNE_STAMP's mtime) ...
PRUNE_INTERVAL = 3600.0
#: ... and removes at most this many of them each time ...
PRUNE_BATCH = 64
#: ... spending at most this many seconds reading and removing them (entries a
#: day old may be cold on a slow disk) ...
PRUNE_BUDGET = 0.01
#: ... and, when that left more, looks again this long after (not at the next
#: registration: each look stats every entry, tens of ms with tens of thousands).
PRUNE_AGAIN = 60.0
PRUNE_STAMP = ".pruned"


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
    """Remove a run's output log and report (a background run's), its event
    log, then its entry.

    In this order, an interruption leaves a finished entry, which the next
    pruning removes with what is left of the rest; never a file without its entry.
    """
    for path in (
        output_path(directory, run_id),
        report_path(directory, run_id),
        log_path(directory, run_id),
        entry_path(directory, run_id),
    ):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _old_entries(directory: str, cutoff: float):
    """(run id, mtime) of each entry whose file is older than ``cutoff``: one
    stat() per entry, none read (a scan of recent runs costs that alone)."""
    try:
        scan = os.scandir(directory)
    except OSError:
        return
    with scan:
        for item in scan:
            if not item.name.endswith(".json"):
                continue
            try:
                mtime = item.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            run_id = item.name[:-5]
            if mtime < cutoff and valid_run_id(run_id):
                yield run_id, mtime


def _remove_if_prunable(directory: str, run_id: str, mtime: float, cutoff: float, now: float, dry_run: bool):
    """The run's row if it may go (removed unless ``dry_run``; ``error`` if that failed), else None."""
    entry = read_entry(directory, run_id)
    if not prunable(entry, mtime, cutoff):
        return None
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
    return row


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
    for run_id, mtime in _old_entries(directory, cutoff):
        if limit is not None and len(out) >= limit:
            break
        row = _remove_if_prunable(directory, run_id, mtime, cutoff, now, dry_run)
        if row is not None:
            out.append(row)
    return out


def maybe_prune(directory: str, *, now: float | None = None) -> int:
    """Registration's share of retention: cheap, bounded, never an error.

    Costs one stat() while ``PRUNE_STAMP`` is younger than ``PRUNE_INTERVAL``.
    Otherwise it renews the stamp first (concurrent registrations then skip)
    and removes at most ``PRUNE_BATCH`` runs finished more than
    ``KEEP_FINISHED`` ago (those it could not remove do not count), reading
    and removing for at most ``PRUNE_BUDGET`` seconds (the scan's stats do
    not count: every look gets past the recent entries); if it stopped at
    either, more may be left, so it dates the stamp for the next look
    ``PRUNE_AGAIN`` from now. A look stats every entry (the runs of the last
    ``KEEP_FINISHED``), which is what a registration pays for it: a backlog
    of old runs (a day of heavy use) costs one look a minute, never one per run.
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
        cutoff, removed, spent = now - KEEP_FINISHED, 0, 0.0
        for run_id, mtime in _old_entries(directory, cutoff):
            if removed >= PRUNE_BATCH or spent >= PRUNE_BUDGET:  # more may be left
                again = now - PRUNE_INTERVAL + PRUNE_AGAIN
                os.utime(stamp, (again, again), follow_symlinks=False)
                break
            began = time.monotonic()
            row = _remove_if_prunable(directory, run_id, mtime, cutoff, now, dry_run=False)
            spent += time.monotonic() - began
            removed += row is not None and "error" not in row
        return removed
    except Exception:  # noqa: BLE001 -- the run is registered; pruning must never stop it
        return 0
