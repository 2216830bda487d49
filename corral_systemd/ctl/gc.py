"""``corralctl gc``: finished runs removed after their retention, and what crashed corrals left, reclaimed."""

import json
import os

from ..common.unit_names import is_tether
from ..state import registry as REG
from .ps import _age
from .reclaim import _Bus, reclaim, stop_unit
from .status import CtlError
from .stop import _print_report


def parse_keep(text: str) -> float:
    """``--keep-finished``: a DURATION (``0s`` allowed); bad input is a CtlError (exit 125)."""
    from ..common.units import parse_duration

    try:
        return parse_duration(text, what="--keep-finished")
    except ValueError as exc:
        raise CtlError(str(exc)) from None


def _print_pruned(rows: list[dict], dry_run: bool) -> None:
    for row in rows:
        done = "would remove" if dry_run else ("NOT removed: " + row["error"] if "error" in row else "removed")
        print(
            f"{row['run_id']}: finished {_age(row['age'])} ago (exit {row['exit_code']}, {row['outcome']}): "
            f"entry and event log {done}"
        )


def gc(
    dry_run: bool, as_json: bool = False, directory: str | None = None, keep_finished: float = REG.KEEP_FINISHED
) -> int:
    """Reclaim what dead owners left, then remove finished runs older than ``keep_finished`` seconds.

    Exit 0 when everything was stopped (verified) and removed, else 1.
    Never removes an active or expired entry, nor one whose owner runs.
    """
    directory = directory or REG.state_dir()
    # Finished runs past retention, first: a run this gc reclaims is not among them.
    pruned = REG.prune_finished(directory, keep_finished, dry_run=dry_run)
    # Sessions whose holder is gone: nothing else would end them (their runs
    # go on). Ended here as ``session end`` ends them, before the runs below.
    from .sessions import end_session, orphaned

    sessions = []
    for session in orphaned(directory):
        row = {"session": session["session"], "name": session.get("name"), "runs": [], "not_proven": []}
        if not dry_run:
            row["runs"], row["not_proven"] = end_session(directory, session, by="corralctl gc")
        sessions.append(row)
    entries = REG.list_entries(directory)
    bus = _Bus()
    reports, ok = [], True
    live_ids = set()
    for entry in entries:
        if entry.get("state") == "finished":
            continue
        if REG.owner_alive(entry):
            live_ids.add(entry["run_id"])
            continue
        report = reclaim(directory, entry, bus=bus, dry_run=dry_run, by="corralctl gc")
        reports.append(report)
        ok = ok and report["verified"]
    # Units no live corral owns: the registry knows some owners; for runs
    # registered elsewhere (another state directory) the tether tells: it
    # lives exactly as long as its corral.
    notes = []
    if bus.manager is not None:
        units = dict(bus.list_units())
        for unit, state in sorted(units.items()):
            if is_tether(unit) or state in ("inactive", "failed"):
                continue
            run_id = REG.normalize_run_id(unit)
            if run_id in live_ids or bus.not_corrals(unit) is not None or bus.tether_alive(unit):
                continue  # a live corral's, or not corral's at all (by its marks, not its name)
            if any(r["unit"] == unit for r in reports):
                continue
            report = {
                "run_id": run_id,
                "mode": "systemd",
                "unit": unit,
                "actions": [],
                "verified": True,
                "remaining": [],
                "notes": ["no live owner (no registry entry, no tether)"],
            }
            if dry_run:
                report["actions"].append(f"SIGTERM {unit}")
            elif not stop_unit(bus, unit, actions=report["actions"]).verified:
                report["verified"] = False
                report["notes"].append(f"{unit} still {bus.active_state(unit)}")
            reports.append(report)
            ok = ok and report["verified"]
    else:
        notes.append(f"units not checked: {bus.why}")
    # Credential directories without a live run (a watcher killed by hand):
    # only in corral's own bases, and never one a live run holds locked,
    # registered here or not (--no-registry, another state directory).
    from ..state.credentials import candidate_bases, removable, remove_tree

    for base in candidate_bases(directory):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            if name in live_ids:
                continue
            path = os.path.join(base, name)
            if removable(path, None, directory) is not None:
                continue
            reports.append(
                {
                    "run_id": name,
                    "mode": "-",
                    "unit": None,
                    "actions": [f"remove {path}"],
                    "verified": True,
                    "remaining": [],
                    "notes": [],
                }
            )
            if not dry_run:
                remove_tree(path)
    ok = ok and not any("error" in row for row in pruned) and not any(row["not_proven"] for row in sessions)
    if as_json:
        print(
            json.dumps(
                {
                    "dry_run": dry_run,
                    "reclaimed": reports,
                    "pruned": pruned,
                    "sessions": sessions,
                    "keep_finished": keep_finished,
                    "notes": notes,
                },
                indent=2,
            )
        )
    else:
        for row in sessions:
            what = (
                "would end it"
                if dry_run
                else f"ended: {len(row['runs'])} runs, "
                + (f"NOT proven: {' '.join(row['not_proven'])}" if row["not_proven"] else "every process proven gone")
            )
            print(f"session {row['session']}: its holder is gone: {what}")
        for report in reports:
            _print_report(report, dry_run)
        _print_pruned(pruned, dry_run)
        for note in notes:
            print(f"note: {note}")
        if not reports and not pruned and not sessions:
            print("nothing to clean up")
    return 0 if ok else 1
