"""One way to put a run together, for every face of corral.

    guard (registry entry, audit log, credentials)  →  engine  →  register
      →  supervise (start, watch, stop, verify)  →  annotate the outcome

The CLI (``cli._run``), the library's in-process runs (``api._Execution``)
and its fallback child (``fallback_child.py``) all call ``assemble_and_run``; they
differ only in what they pass: which engine and how it is opened, the
signals and cancel descriptor the supervisor watches, where output goes,
and who owns the registry entry. Whatever happens, the guard's clean-up
runs (credentials removed, log closed) before this returns or raises.

Raises what setting up raises (SetupError, UsageError: nothing was started
or what was started is stopped); once the supervisor runs, failures are in
the outcome, never raised.
"""

from .result import RunOutcome

TYPE_CHECKING = False  # collections is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from collections.abc import Callable


def assemble_and_run(
    spec,
    open_engine: "Callable[[], object]",
    *,
    guard: dict | None = None,
    supervisor: dict | None = None,
    opened: "Callable[[object], None] | None" = None,
) -> RunOutcome:
    """Run ``spec`` with the engine ``open_engine()`` gives, inside a RunGuard
    (``guard``: its keyword arguments) and under a Supervisor (``supervisor``:
    its keyword arguments besides spec, engine and observer). ``opened`` is
    told the engine as soon as it exists (the library asks it for pids)."""
    from .runguard import RunGuard
    from .supervisor import Supervisor

    with RunGuard(spec, **(guard or {})) as run_guard:
        engine = open_engine()  # SetupError: nothing started
        if opened is not None:
            opened(engine)
        observer = run_guard.register(engine)  # the entry on disk before the command starts, or SetupError
        outcome = Supervisor(
            spec, engine, observer=observer, ends_with=run_guard.session_ends, **(supervisor or {})
        ).run()
        run_guard.annotate(outcome)
    return outcome
