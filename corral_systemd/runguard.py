"""What the CLI wraps around a run: registry entry, audit log, credentials.

    with RunGuard(spec, ...) as guard:          # credentials ready (before any engine)
        engine = open_engine(spec)
        observer = guard.register(engine)       # entry + "registered" on disk, or SetupError
        result = Supervisor(..., observer=observer).run()
        guard.annotate(result)
    # credentials removed, log closed, whatever happened

Kept out of cli.py so the CLI stays thin and the pieces stay testable.
"""

import os

from .errors import SetupError


class RunGuard:
    def __init__(self, spec, *, environment: dict | None = None, credentials=(), registry: bool = True,
                 owner_kind: str = "corral"):
        self.spec = spec
        self.owner_kind = owner_kind
        self.environment = environment
        self.credential_pairs = list(credentials)
        self.use_registry = registry
        self.registration = None
        self.creds = None
        self._state_dir = None

    def __enter__(self):
        if self.credential_pairs:
            from .credentials import PrivateCredentials
            from .registry import state_dir

            self.creds = PrivateCredentials(self.credential_pairs, self.spec.run_id, state_dir())
            self.creds.create()  # forks the watcher: before the engine, so fallback counts it as foreign
            env = dict(os.environ if self.spec.env is None else self.spec.env)
            env["CREDENTIALS_DIRECTORY"] = self.creds.path
            self.spec.env = env
        return self

    def register(self, engine):
        """Write the entry before the command starts; the observer for the supervisor (or None)."""
        if not self.use_registry:
            return None
        from .registry import RegistryObserver, register

        facts = engine.describe() if engine.mode != "systemd" else {}
        try:
            self.registration = register(
                self.spec, mode=engine.mode, unit=getattr(engine, "unit", None),
                control_group=facts.get("control_group"), environment=self.environment,
                credentials=self.creds.names if self.creds else [],
                credentials_directory=self.creds.path if self.creds else None,
                helper_pids=[self.creds.watcher_pid] if self.creds else [], owner_kind=self.owner_kind)
        except OSError as exc:
            engine.close()
            raise SetupError(f"cannot register the run: {exc}") from None
        return RegistryObserver(self.registration)

    def annotate(self, result) -> None:
        result.environment = self.environment
        result.credentials = list(self.creds.names) if self.creds else []

    def __exit__(self, exc_type, exc, tb):
        try:
            if self.creds is not None:
                self.creds.close()
        finally:
            reg = self.registration
            if reg is not None and reg.log.fd >= 0:
                # The supervisor never reached "finished" (a bug, an exception):
                # the run is no longer authorised; say so durably.
                try:
                    reg.event("aborted", {"error": repr(exc) if exc is not None else None})
                    reg.save(state="expired")
                except OSError:
                    pass
                reg.close()
        return False
