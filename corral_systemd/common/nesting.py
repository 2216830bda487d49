"""Runs inside runs: corral tells its command which run it is in.

Every command corral starts gets ``CORRAL_RUN_ID=<run id>`` in its
environment (inherited by all it starts). A corral that finds it in its own
environment runs inside that run: a unit or cgroup of its own would take its
command out of the outer run's cgroup, and so out of the outer limits and
the outer stop. So ``--cgroup-mode auto`` then uses the fallback engine (its
processes stay where corral is), ``enforced`` is refused (125) unless
``--cgroup-parent`` names a delegated directory the user chose, and the
record says which run it was nested in (``nested_in``).

The variable is only a hint the command could forge: what it can change is
how an inner corral runs its own command, never what the outer one does.
"""

import os
import re

RUN_ENV = "CORRAL_RUN_ID"
_RUN_ID = re.compile(r"[0-9a-f]{1,64}")


def outer_run(environ=os.environ) -> str | None:
    """The run this process runs inside, by its environment (None: none)."""
    value = environ.get(RUN_ENV)
    return value if value is not None and _RUN_ID.fullmatch(value) else None


def command_env(env: dict | None, run_id: str) -> dict:
    """The command's environment (``env``, or corral's own) with the run's id."""
    out = dict(os.environ if env is None else env)
    out[RUN_ENV] = run_id
    return out
