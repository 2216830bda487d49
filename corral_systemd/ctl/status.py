"""The fast path: ``corralctl status`` without typer, for action gateways."""

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
    print(f"{state} ({why})" if state != "unknown" else f"unknown ({run!r}: no such run in {directory})")
    return STATUS_EXIT[state]
