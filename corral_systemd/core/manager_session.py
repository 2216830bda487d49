"""The manager session that runs share: one connection and one tether for many runs.

A run of its own (the CLI) connects to its manager and forks a tether per
run. A process that runs many (the library's ``Runner``, the corral service)
keeps one ``SystemdSession`` (engines/systemd/session.py) here instead: made
on the first run that may be a systemd one, shared by every run after it,
and replaced once lost (a manager's daemon-reexec closes every private
connection; a run in flight then finishes on what it had, see
``Execution``'s ``renew_session``). Closing ends the tether: units still
running then are stopped by the manager (BindsTo=).

Guarantees: one session at a time, made under a lock (runs on many threads);
``get`` raises SetupError when an enforced run cannot have one, or the
keeper is closed; in auto mode a manager that cannot be had is remembered
(``NO_SYSTEMD``: those runs take the fallback, as a run of its own would).
"""

import threading

from ..common.errors import SetupError
from .execution import NO_SYSTEMD, Execution
from .spec import RunSpec

#: ``get_if_ready``: getting the session would block (it is being made or replaced).
NOT_READY = object()


class SharedSession:
    def __init__(self):
        self._lock = threading.Lock()
        self._session = None
        self._closed = False

    def get(self, spec: RunSpec):
        """The session for ``spec``'s run: None when it cannot be a systemd
        run, NO_SYSTEMD when auto mode found no manager."""
        if not spec.may_be_systemd:
            return None
        with self._lock:
            if self._closed:
                raise SetupError("runner is closed")
            if self._session not in (None, NO_SYSTEMD) and self._session.lost:
                stale, self._session = self._session, None
                stale.close()
            if self._session is None:
                from ..engines.systemd import SystemdSession

                try:
                    self._session = SystemdSession(spec.manager, spec.slice)
                except SetupError:
                    if spec.cgroup_mode == "enforced":
                        raise
                    self._session = NO_SYSTEMD
            return self._session

    def get_if_ready(self, spec: RunSpec):
        """``get`` when it would not block (an event loop's thread asks), else NOT_READY."""
        if not spec.may_be_systemd:
            return None
        if not self._lock.acquire(blocking=False):  # a session is being made: that blocks
            return NOT_READY
        try:
            if self._session not in (None, NO_SYSTEMD) and self._session.lost:
                return NOT_READY  # reconnecting blocks
            if self._session is not None and not self._closed:
                return self._session
        finally:
            self._lock.release()
        return NOT_READY

    def execution(self, spec: RunSpec, stdout, stderr, *, session=NOT_READY, **options) -> Execution:
        """A run of ``spec`` on the shared session (``session``: one already
        got); ``options`` as ``Execution`` takes them. SetupError if an
        enforced run cannot have a session."""
        if session is NOT_READY:
            session = self.get(spec)
        return Execution(spec, session, stdout, stderr, renew_session=self.get, **options)

    def close(self) -> None:
        """No more runs; the session's tether ends (idempotent)."""
        with self._lock:
            self._closed = True
            session, self._session = self._session, None
        if session is not None and session is not NO_SYSTEMD:
            session.close()
