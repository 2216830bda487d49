"""The systemd engine, cut along systemd-run's seams (src/run/run.c).

- ``engine.py``: ``SystemdEngine``, the run's flow: connect, start the
  transient unit, wait for its job, watch it, stop it, prove it empty;
- ``strategy.py``: scope or service, chosen once per run;
- ``properties.py``: the unit's properties, pure functions of the run spec;
- ``engines/unitcgroup.py`` (beside this package, shared with the
  ``--cgroup-parent`` engine): the unit's control group as the kernel shows
  it (members, limits read back, OOM, figures, cgroup.kill);
- ``envfile.py``: a service's executable and environment file;
- ``session.py``: ``SystemdSession``, a library Runner's shared connection and tether.

Finding the manager and waiting for its jobs are D-Bus matters: ``dbus.discovery``
and ``dbus.jobs``.
"""

from .engine import SystemdEngine
from .session import SystemdSession
from .strategy import SystemdExecError

__all__ = ["SystemdEngine", "SystemdExecError", "SystemdSession"]
