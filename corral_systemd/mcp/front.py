"""An exec run's front in the server's own process: ``corral --yield`` without a corral process start.

    the exec's arguments (``Session.exec_arguments``: corral --yield ... --session S --json RECORD)
        │  core.request.parse_command_line: the RunRequest a corral front would read
        ├─ core.background.launch (a worker thread), as a ``ServedCaller`` with this
        │  server's own context: the run's corral is the session's holder's child,
        │  its output its log, its stdin kept (a pipe, or its terminal)
        └─ the server waits for its end up to the yield on the kept corral (the
           holder's word once it has reaped it: ``SessionRun.ended``, in the event
           loop) and reads its log by cursor

The run is the one ``corral --yield`` starts (same arguments, same holder, same
record file, same log); only the front, a Python process start per exec, is
gone: the server already holds corral's modules. ``launch`` installs no signal
handler for a served caller, so the server's own stay as they are.

Failure modes (what ``launch`` says, as the front's exit said it):
``Refused`` (one line: bad input or a guarantee not to be had, exit 125,
nothing ran); ``Unstarted`` (one line: the run could not start or be ready,
no record); ``FrontNeeded`` (the session's holder cannot start the run's
corral with this server's context: the caller runs a corral front instead,
which can start it itself).
"""

import asyncio
import os

from ..common.plainclass import plainclass


class Refused(Exception):
    """corral's exit 125 before anything ran: its one line."""


class Unstarted(Exception):
    """The run could not start, or be made ready, and left no record: one line."""


class FrontNeeded(Exception):
    """The session's holder cannot start this run's corral with this server's context."""


@plainclass
class Launched:
    """The run's id and log; ``corral``: its corral as ``launch`` keeps it watched (the
    holder's word on its end, given once it has reaped it: its record is written by
    then), the caller's to close; None when it ended before it was seen started (its
    end is its record file)."""

    run_id: str
    log: str
    corral: object | None = None


async def launch(session, cmd: str, *, yield_s: float, pty: bool, record: str, cwd: str | None, options: dict):
    """Start ``cmd`` as ``Session.exec`` would (stdin kept, or on a terminal with
    ``pty``), its record going to ``record``; ``Launched`` once it has started."""
    from ..common.errors import UsageError
    from ..common.programs import PROGRAMS
    from ..core.request import parse_command_line

    try:
        args = session.exec_arguments(cmd, yield_s, "keep", pty, record, options)
        request = parse_command_line(args, default_mode=PROGRAMS["corral"], cwd=cwd)
    except UsageError as exc:
        raise Refused(" ".join(str(exc).split())) from None
    return await asyncio.to_thread(_launch, request, cwd)


def _launch(request, cwd: str | None) -> Launched:
    """``core.background.launch`` for this server (blocks: a worker thread's)."""
    from .. import cli
    from ..common.errors import SetupError, UsageError
    from ..core import background
    from ..kernel.context import ProcessContext

    context = ProcessContext.here(dict(os.environ))
    if cwd is not None:
        context.cwd = os.path.abspath(cwd)
    caller = background.ServedCaller(context, connection=None)  # the holder watches this server itself
    run_id, bg = request.spec.run_id, request.background
    try:
        started = background.launch(request, cli.run, caller=caller, keep_corral=True)
    except background.EndedEarly as exc:
        if not os.path.exists(request.json_path):
            _no_record(bg.log, run_id, exc.exit_code)
        return Launched(run_id, bg.log)
    except background.NotReady as exc:
        if not os.path.exists(request.json_path):
            raise Unstarted(" ".join(str(exc).split())) from None
        return Launched(run_id, bg.log)
    except UsageError as exc:
        raise Refused(" ".join(str(exc).split())) from None
    except SetupError as exc:
        raise FrontNeeded(str(exc)) from None
    except OSError as exc:
        raise Unstarted(f"--yield: {exc}") from None
    return Launched(started.run_id, started.log, started.corral)


def _no_record(log: str, run_id: str, code: int) -> None:
    """A run's corral that ended early without a record: its own lines say why (Refused at 125)."""
    said = take_report(log, run_id).decode(errors="replace").strip()
    if code == 125:
        raise Refused(said.splitlines()[-1] if said else "bad input")
    raise Unstarted(f"the run could not start (exit {code}): {' '.join(said.split())}")


def take_report(log: str, run_id: str) -> bytes:
    """The run's corral's own lines (``state.registry.report_path``), read once and removed,
    as ``corral --yield`` takes them for a run that ended within the yield."""
    from ..core.handback import _take_report

    return _take_report(log, run_id)
