"""The fast path: ``corralctl status`` without typer, for action gateways."""

import os

from ..state import registry as REG

STATUS_EXIT = {"active": 0, "expired": 10, "finished": 11, "unknown": 12}


class CtlError(Exception):
    exit_code = 125


class UnknownRun(CtlError):
    """No run has that id or name (``logs.find_run``)."""


# -- status (fast path) --------------------------------------------------------
def status(run: str, directory: str | None = None) -> int:
    """The state of the run ``run`` names: its id in any form, or its
    ``--name`` (``logs.find_run``, as logs, wait and stop take it)."""
    from .logs import find_run

    directory = directory or REG.state_dir()
    try:
        entry, ambiguous = find_run(run, directory), None
    except UnknownRun:
        entry, ambiguous = None, None
    except CtlError as exc:  # a name two live runs share: which one is not said
        entry, ambiguous = None, str(exc)
    state, why = REG.effective_state(entry)
    if state != "unknown":
        print(f"{state} ({why})")
    elif ambiguous:
        print(f"unknown ({ambiguous})")
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
