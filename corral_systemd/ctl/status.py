"""The fast path: ``corralctl status`` without typer, for action gateways."""

import os

from ..state import registry as REG

STATUS_EXIT = {"active": 0, "expired": 10, "finished": 11, "unknown": 12}


class CtlError(Exception):
    exit_code = 125


# -- status (fast path) --------------------------------------------------------
def status(run: str, directory: str | None = None) -> int:
    run_id = REG.normalize_run_id(run)
    directory = directory or REG.state_dir()
    entry = REG.read_entry(directory, run_id) if REG.valid_run_id(run_id) else None
    state, why = REG.effective_state(entry)
    if state != "unknown":
        print(f"{state} ({why})")
    elif not os.path.isdir(directory):
        print(f"unknown ({run!r}: {no_registry(directory)})")
    else:
        print(f"unknown ({run!r}: no such run in {directory})")
    return STATUS_EXIT[state]


def no_registry(directory: str) -> str:
    """What corralctl says where there is no registry to read."""
    return (
        f"there is no run registry at {directory}: corral runs here unregistered when it cannot make "
        "one (their records say registry: unavailable), and corralctl knows nothing of them"
    )
