"""Runs inside runs: corral tells its command which run it is in.

Every command corral starts gets ``CORRAL_RUN_ID=<run id>`` in its
environment (inherited by all it starts). A corral that finds it in its own
environment runs inside that run: a unit or cgroup of its own would take its
command out of the outer run's cgroup, and so out of the outer limits and
the outer stop. So ``--cgroup-mode auto`` then uses the fallback engine (its
processes stay where corral is), ``enforced`` is refused (125) unless
``--cgroup-parent`` names a delegated directory the user chose, and the
record says which run it was nested in (``nested_in``).

The variable is only a hint: a shell that outlived its run may still export
it, and the command could forge it. So it is believed only when the kernel
agrees: /proc/self/cgroup places this process in that run's unit
(``corral-<id>.scope``/``.service``) or ``--cgroup-parent`` group
(``corral-<id>``). Inside a fallback run (no cgroup of its own) nothing
shows it: an inner corral there is not nested, and needs not be (the outer
fallback finds its processes by descent, wherever the inner one puts them).
What the variable can change is how an inner corral runs its own command,
never what the outer one does.
"""

import os

from .unit_names import group_name, is_run_id, run_units

RUN_ENV = "CORRAL_RUN_ID"


def outer_run(environ=os.environ, cgroups: str | None = None) -> str | None:
    """The run this process runs inside: its environment says which, and its
    cgroups (``cgroups``: /proc/self/cgroup's text, read if None) confirm it; else None."""
    value = environ.get(RUN_ENV)
    if value is None or not is_run_id(value):
        return None
    if cgroups is None:
        try:
            with open("/proc/self/cgroup") as f:
                cgroups = f.read()
        except OSError:
            return None
    names = {*run_units(value), group_name(value)}
    for line in cgroups.splitlines():
        if names.intersection(line.split(":", 2)[-1].split("/")):
            return value
    return None


def command_env(env: dict | None, run_id: str) -> dict:
    """The command's environment (``env``, or corral's own) with the run's id."""
    out = dict(os.environ if env is None else env)
    out[RUN_ENV] = run_id
    return out
