"""What a library Runner shares between its systemd runs."""

import os

from ...common.errors import SetupError
from ...common.unit_names import runner_tether_unit
from ...dbus.connection import BusError
from ...dbus.discovery import connect_manager
from ...dbus.discovery import describe_error as _why
from ...dbus.jobs import START_TIMEOUT, subscribe, wait_job
from ...dbus.systemd1 import Manager, unit_path
from ..tether import Tether
from ..unitcgroup import cgroup_of
from .properties import tether_properties


class SystemdSession:
    """One manager connection (the private socket where possible), shared by
    all runs through a ``Multiplexer`` (a reader thread routes replies and
    each unit's signals to its run), and one tether (with its scope) for all
    runs, so a run costs one StartTransientUnit and no extra process or
    connection. Thread-safe. Failure modes: SetupError from the constructor
    when no manager answers or the tether cannot be started; once the
    connection ends, every run's calls fail and its manager counts as lost.
    """

    def __init__(self, manager: str = "auto", slice_: str = "corral.slice"):
        from ...common.baton import Baton
        from ...dbus.mux import Multiplexer

        self.slice = slice_
        self.manager_kind, conn = connect_manager(manager, START_TIMEOUT)
        try:
            calls = Manager(conn)
            subscribe(conn, calls, all_units=True)
            #: What the manager offers beyond 252, read once for every run of the session.
            self.apis = calls.apis
        except BusError as exc:
            conn.close()
            raise SetupError(f"{self.manager_kind} manager not usable: {_why(exc)}") from None
        self._mux = Multiplexer(conn)
        #: Its runs take turns running Python (see ``baton.py``).
        self.baton = Baton()
        self._tether: Tether | None = None
        self.tether_unit = runner_tether_unit()
        #: The slice's cgroup, as the kernel shows it for the tether's scope.
        self.slice_cgroup: str | None = None
        try:
            self._start_tether()
        except BaseException:
            self._mux.close()
            raise

    @property
    def lost(self) -> bool:
        """The connection ended (manager gone or re-executed): make a new
        session. Also true as soon as the manager closed its end, before the
        reader thread has seen it (``Multiplexer.peer_closed``)."""
        return self._mux.lost is not None or self._mux.peer_closed()

    def channel(self, unit: str, path: str):
        """A connection-like view for one unit's run (see ``mux.Channel``)."""
        return self._mux.channel(unit, path)

    def _start_tether(self) -> None:
        chan = self.channel(self.tether_unit, unit_path(self.tether_unit))
        manager = Manager(chan)
        self._tether = Tether()
        try:
            job = manager.start_transient_unit(
                self.tether_unit, tether_properties(self._tether.pid, self.slice, f"runner {os.getpid()}")
            )
            result = wait_job(chan, job, what=self.tether_unit)
            if result != "done":
                raise SetupError(f"systemd could not start {self.tether_unit}: job {result}")
        except BusError as exc:
            self._tether.close()
            raise SetupError(f"cannot start the runner's tether: {_why(exc)}") from None
        except BaseException:
            self._tether.close()
            raise
        finally:
            chan.close()
        path = cgroup_of(self._tether.pid, self.tether_unit)
        self.slice_cgroup = path.rsplit("/", 1)[0] if path else None

    def close(self) -> None:
        """End the tether (units bound to it stop) and the connection."""
        tether, self._tether = self._tether, None
        if tether is not None:
            tether.close()
        self._mux.close()
