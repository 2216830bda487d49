"""``corralctl stop``: a run stopped through its owner (its corral, or its unit), verified."""

import sys
import time

from ..state import registry as REG
from .ps import cell
from .reclaim import _Bus, _leftovers, _seconds, _signal_owner, reclaim, stop_unit
from .status import STATUS_EXIT


def stop(run: str, timeout: float | None = None, directory: str | None = None) -> int:
    """Stop a run: through its owner when the owner is proven (``registry.owner_verified``),
    else by reclaiming what is proven the run's (``reclaim``). Nothing the entry alone
    says is signalled or stopped."""
    directory = directory or REG.state_dir()
    run_id = REG.normalize_run_id(run)
    entry = REG.read_entry(directory, run_id) if REG.valid_run_id(run_id) else None
    if entry is None:
        from .logs import find_run
        from .status import CtlError

        try:
            entry = find_run(run, directory)  # a --name
        except CtlError as exc:
            print(f"corralctl: {exc}", file=sys.stderr)
            return STATUS_EXIT["unknown"]
        run_id = entry["run_id"]
    bus = None
    token = REG.owner_token(entry)
    if entry.get("state") == "finished" and (token is None or token.get("state") == "finished"):
        bus = _Bus()
        left, unit = _leftovers(directory, entry, bus)
        if left is None:
            print(f"{run_id}: already finished (exit {entry.get('exit_code')}, {entry.get('outcome')})")
            return 0
        print(f"{run_id}: entry claims finished but {left}: stopping it")
        entry = dict(entry, state="expired", unit=unit or entry.get("unit"))
    elif entry.get("state") == "finished":
        print(
            f"{run_id}: entry claims finished but its owner (pid {entry['owner']['pid']}) is alive and "
            "running the run: stopping it"
        )
    wait = (
        timeout
        if timeout is not None
        else (_seconds(entry.get("grace"), 2.0) + _seconds(entry.get("verify_timeout"), 2.0) + 10)
    )
    verified, why = REG.owner_verified(entry)
    if verified and entry["owner"].get("kind") == "library":
        return _stop_library_run(directory, entry, wait)
    if verified:
        if _signal_owner(entry):  # corral runs its verified stop
            code = _await_finished(
                directory,
                entry,
                wait,
                f"stopped by its corral (pid {entry['owner']['pid']})",
                "its corral",
                give_up=lambda e: not REG.owner_alive(e),
            )
            if code is not None:
                return code  # else: died without finishing; reclaim below
    elif REG.owner_alive(entry):
        print(f"{run_id}: not signalling the owner the entry names: {why}", file=sys.stderr)
    fresh = REG.read_entry(directory, run_id)
    if (
        fresh is not None
        and REG.effective_state(fresh)[0] == "finished"
        and not _leftovers(directory, fresh, bus if bus is not None else (_Bus() if fresh.get("unit") else None))[0]
    ):
        print(f"{run_id}: already finished (exit {fresh.get('exit_code')}, {fresh.get('outcome')})")
        return 0
    if bus is None and entry.get("unit"):
        bus = _Bus()
    report = reclaim(directory, entry, bus=bus, dry_run=False, by="corralctl stop")
    _print_report(report, dry_run=False)
    return 0 if report["verified"] else 1


def _stop_library_run(directory: str, entry: dict, wait: float) -> int:
    """A run owned by an application (Python API): never signal the
    application; stop the unit, and let its in-process supervisor verify."""
    run_id = entry["run_id"]
    if not entry.get("unit"):
        print(
            f"corralctl: {run_id}: owned by process {entry['owner']['pid']} through the Python API, "
            "without a unit: stop it from that application",
            file=sys.stderr,
        )
        return 1
    bus = _Bus()
    if bus.manager is None:
        print(f"corralctl: {run_id}: {bus.why}", file=sys.stderr)
        return 1
    if (why := bus.not_corrals(entry["unit"], run_id)) is not None:
        print(f"corralctl: {run_id}: {cell(entry['unit'])} left alone: {why}", file=sys.stderr)
        return 1
    stop_unit(
        bus,
        entry["unit"],
        grace=_seconds(entry.get("grace"), 2.0),
        verify=min(wait, _seconds(entry.get("verify_timeout"), 2.0) + 1.0),
    )
    code = _await_finished(
        directory, entry, wait, f"unit {entry['unit']} stopped; its supervisor reports", "its supervisor"
    )
    return 1 if code is None else code


def _await_finished(
    directory: str, entry: dict, wait: float, done: str, who: str, give_up=lambda entry: False
) -> int | None:
    """Wait for the run's supervisor to record "finished"; report and return the exit code.

    None when ``give_up(entry)`` says waiting is pointless (the owner died).
    """
    run_id = entry["run_id"]
    end = time.monotonic() + wait
    while time.monotonic() < end:
        entry = REG.read_entry(directory, run_id) or entry
        if REG.effective_state(entry)[0] == "finished":  # the owner's token, while it holds one
            if entry.get("state") != "finished":
                # The owner writes its entry, then its token: a token read after
                # the entry may already say finished. Read the entry again.
                time.sleep(0.02)
                continue
            ok = bool(entry.get("verified"))
            print(
                f"{run_id}: {done}: exit {entry.get('exit_code')}, "
                + ("verified" if ok else f"NOT verified, still present: {entry.get('remaining_pids')}")
            )
            return 0 if ok else 1
        if give_up(entry):
            # The owner may have written "finished" and exited since the read above.
            last = REG.read_entry(directory, run_id)
            if last is None or last.get("state") != "finished":
                return None
            continue
        time.sleep(0.02)
    print(f"corralctl: {run_id}: {who} did not finish within {wait:g}s", file=sys.stderr)
    return 1


def _print_report(report: dict, dry_run: bool) -> None:
    what = "; ".join(report["actions"]) or "nothing left to stop"
    verdict = (
        "would do"
        if dry_run
        else ("verified" if report["verified"] else f"NOT verified, still present: {report['remaining']}")
    )
    print(
        f"{report['run_id']} ({report['mode']}{' ' + report['unit'] if report.get('unit') else ''}): {what}: {verdict}"
    )
    for note in report.get("notes", []):
        if not report["verified"] or dry_run:
            print(f"  note: {note}")
