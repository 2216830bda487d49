"""``corralctl``: look at and act on registered runs.

    corralctl ps [--json]          live runs: who started what, how many processes, how much memory
    corralctl status RUN           active | expired | finished | unknown  (exit 0 | 10 | 11 | 12)
    corralctl stop RUN             stop a run through its owner (its corral, or its unit), verified
    corralctl gc [--dry-run] [--keep-finished DURATION]
                                   remove finished runs older than DURATION (24h);
                                   stop what crashed corrals left behind
    corralctl audit verify RUN     check a run's event log offline

RUN is a run id, ``corral-<id>``, the unit name or the run's ``--name``. ``status`` does not load
typer: an action gateway may call it before every privileged action.
Errors (a bad or missing argument, an unknown command): one line on stderr,
with the usage, exit 125. ``corralctl`` alone, or a command group alone
(``corralctl audit``), prints its help on stdout and exits 0, as ``--help``.
"""

# The package's interface: what the rest of corral and corralctl's callers use.
from .app import entry, main  # noqa: F401
from .audit import audit_verify  # noqa: F401
from .gc import gc, parse_keep  # noqa: F401
from .processes import run_memory, run_processes  # noqa: F401
from .ps import command_text, ps, ps_rows  # noqa: F401
from .reclaim import reclaim  # noqa: F401
from .status import STATUS_EXIT, CtlError, status  # noqa: F401
from .stop import stop  # noqa: F401
