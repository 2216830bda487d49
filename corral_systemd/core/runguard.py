"""What the CLI wraps around a run: registry entry, audit log, credentials.

    with RunGuard(spec, ...) as guard:          # corral's credentials ready (before any engine)
        engine = open_engine(spec)
        observer = guard.register(engine)       # credentials settled (a systemd service: by
                                                # systemd); entry + "registered" on disk, or SetupError
        result = Supervisor(..., observer=observer).run()
        guard.annotate(result)
    # credentials removed, log closed, whatever happened

Kept out of cli.py so the CLI stays thin and the pieces stay testable.
"""

import os

from ..common.errors import SetupError

TYPE_CHECKING = False  # typing is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from ..state.credentials import PrivateCredentials


class RunGuard:
    def __init__(
        self,
        spec,
        *,
        environment: dict | None = None,
        registry: bool = True,
        owner_kind: str = "corral",
        labels: dict | None = None,
        started_fd: int | None = None,
    ):
        self.spec = spec
        #: A background run's front waits on this pipe for the command's start (``register``).
        self.started_fd = started_fd
        #: The registry entry's labels (``RunRequest.guard_options``).
        self.labels = labels or {}
        self.owner_kind = owner_kind
        self.environment = environment
        #: (NAME, PATH) pairs, checked where the request was read (``core.request.credential_pairs``).
        self.credential_pairs = [tuple(pair) for pair in spec.credential_requests]
        self.use_registry = registry
        self.registration = None
        #: The record's ``registry``: "registered", "off" (--no-registry) or
        #: "unavailable" (no private state location could be had; a warning says why).
        self.registry_state = "off" if not registry else "registered"
        self._warnings: list[str] = []
        self.creds: PrivateCredentials | None = None
        #: Who makes $CREDENTIALS_DIRECTORY: "systemd" (a service) or "corral".
        self.delivery: str | None = None

    def __enter__(self):
        if self.credential_pairs:
            if not _may_be_systemd_service(self.spec):
                self._private_credentials()  # before the engine, so fallback counts the watcher as foreign
        return self

    def _private_credentials(self):
        from ..state.credentials import PrivateCredentials
        from ..state.registry import state_dir

        self.creds = PrivateCredentials(self.credential_pairs, self.spec.run_id, state_dir())
        self.creds.create()  # forks the watcher
        env = dict(os.environ if self.spec.env is None else self.spec.env)
        env["CREDENTIALS_DIRECTORY"] = self.creds.path
        self.spec.env = env
        self.delivery = "corral"

    def _credentials_for(self, engine) -> None:
        """A run that may be a systemd service: now that the engine is known, who delivers."""
        if engine.delivers_credentials():
            self.spec.credentials = list(self.credential_pairs)  # LoadCredential=, checked before the command
            self.delivery = "systemd"
            return
        try:  # auto mode fell back: corral's private directory after all
            self._private_credentials()
        except BaseException:
            engine.close()
            raise

    def register(self, engine):
        """Settle the credentials; write the entry before the command starts.

        Returns the observer for the supervisor (or None without a registry
        and no front waiting); SetupError/UsageError (the engine closed) when the
        run cannot start. With ``started_fd``, the observer also tells the
        front through it once the command has started and the registry has it.
        """
        observer = self._registry_observer(engine)
        if self.started_fd is None:
            return observer
        from .background import StartedPipe

        return StartedPipe(observer, self.started_fd, engine.mode, engine.registry_facts().get("unit"))

    def _registry_observer(self, engine):
        if self.credential_pairs and self.delivery is None:
            self._credentials_for(engine)
        if self.creds is not None and self.creds.watcher_pid is not None:
            # corral's child, not the run's: an engine that takes corral's other
            # children for the run's orphans (a subreaper) must leave it alone.
            engine.ignore_child(self.creds.watcher_pid)
        if not self.use_registry:
            return None
        from ..state.registry import MARK_ENV, RegistryObserver, new_mark, register

        mark = new_mark(self.spec.run_id) if engine.marks_processes else None
        session_id, token = self._session_open(engine) if self.spec.session is not None else (None, None)
        in_slice = False
        if session_id is not None:
            self.labels = dict(self.labels, session=session_id)
            in_slice = self._join_session(engine, session_id, token)
        facts = engine.registry_facts()
        try:
            self.registration = register(
                self.spec,
                mode=engine.mode,
                unit=facts.get("unit"),
                control_group=facts.get("control_group"),
                environment=self.environment,
                credentials=[n for n, _ in self.credential_pairs],
                credentials_delivery=self.delivery,
                credentials_directory=self.creds.path if self.creds else None,
                helper_pids=[*engine.helper_pids(), *([self.creds.watcher_pid] if self.creds else [])],
                owner_kind=self.owner_kind,
                mark=mark,
                labels=self.labels,
            )
        except OSError as exc:
            if os.environ.get("CORRAL_STATE_DIR"):  # asked for by name: that one, or nothing runs
                engine.close()
                raise SetupError(f"cannot register the run: {exc}") from None
            # The default location cannot be had safely (an arbitrary uid in a
            # container: no runtime directory, a HOME not its own): run, unregistered.
            self.registry_state = "unavailable"
            self._warnings.append(
                f"the run is not registered ({exc}): corralctl knows nothing of it; "
                "set CORRAL_STATE_DIR to a private directory to register runs"
            )
            return None
        if session_id is not None:
            self._join_holder(engine, session_id, watch=not in_slice)
        if mark is not None or session_id is not None:
            env = dict(os.environ if self.spec.env is None else self.spec.env)
            if mark is not None:
                env[MARK_ENV] = mark
            if session_id is not None:
                from ..state.sessions import SESSION_ENV

                env[SESSION_ENV] = session_id  # nested corrals join it too
            self.spec.env = env
        return RegistryObserver(self.registration)

    def _session_open(self, engine) -> "tuple[str, dict | None]":
        """The id of the session asked for, if it is open, and its holder's token
        (``state.sessions.open_session``); else the engine is closed and SetupError
        says why (125: the command never starts)."""
        from ..state import registry as REG
        from ..state import sessions as S

        try:
            return S.open_session(self.spec.session or "", REG.state_dir())
        except S.NotJoinable as exc:
            engine.close()
            raise SetupError(str(exc)) from None

    def _join_session(self, engine, session_id: str, token: "dict | None") -> bool:
        """Put the run in its session's slice (systemd mode: the session's aggregate
        limits hold it, and ending the session stops the slice); True if it is there.
        A run that cannot be (another engine or manager, its own --slice) is still
        the session's, ended with its holder; its warning says the limits do not hold it."""
        from ..common.limits import BY_FIELD
        from ..common.unit_names import DEFAULT_SLICE
        from ..state import sessions as S

        token = S.looked_again(session_id, token)
        limits = S.session_limits(token)
        in_slice = S.token_slice(token)
        if in_slice is None:
            why = "without a service manager corral has no group over all of a session's runs"
            if engine.command_reaches_corral:
                # The holder is a plain process of the caller's uid, in the command's pid namespace.
                self._warnings.append(
                    f"session {session_id}: this run's command can reach the session's holder (the "
                    f"{engine.guarantee} tier shares its pid namespace): stopped again and again, the holder is "
                    "late to end the session; killed, the session's end cannot be proven (120); a pid "
                    "namespace (--guarantee pidns) hides it"
                )
        elif engine.slice_manager != in_slice[1]:
            why = f"the session is the {in_slice[1]} manager's; this run has " + (
                f"the {engine.slice_manager} manager's unit" if engine.slice_manager else f"no unit ({engine.mode})"
            )
        elif self.spec.slice != DEFAULT_SLICE:
            why = f"it was put in --slice {self.spec.slice}"
        else:
            engine.join_slice(in_slice[0], limits)
            self.labels = dict(self.labels, session_slice=in_slice[0])
            return True
        if limits:
            said = ", ".join(f"{BY_FIELD[k].option} {BY_FIELD[k].show(v)}" for k, v in limits.items())
            self._warnings.append(f"session {session_id}'s limits ({said}) do not hold this run: {why}")
        return False

    #: Pidfds of the joined session's holder and owner, with their warnings: either's end stops the run.
    session_ends: dict[int, str] = {}

    def _join_holder(self, engine, session_id: str, watch: bool) -> None:
        """Be admitted by the session's holder, once registered (it checks this
        process is the run's corral; it alone counts ``--max-runs``). Then watch
        the session's owner (its end ends the session, whatever befalls the
        holder) and, ``watch``, the holder itself (a session whose holder dies,
        SIGKILL included, ends this run with it): pidfds, a blocked wait.
        Refused: the engine closed, SetupError (125)."""
        from ..state import registry as REG
        from ..state import sessions as S

        try:
            pidfd, reply = S.join(session_id, self.spec.run_id)
        except S.NotJoinable as exc:
            engine.close()
            raise SetupError(str(exc)) from None
        if pidfd is None:
            # Nested in one of the session's pidns runs (the holder said which): that
            # run watches the holder and the owner, which this namespace does not show,
            # and its stop -- its init's death -- is this run's too.
            if self.registration is not None:
                self.registration.save(session_within=reply["within"])
            self.session_ends = {}
            return
        ends = {}
        if watch:
            ends[pidfd] = f"its session ended (session {session_id}'s holder exited): stopped"
        else:
            os.close(pidfd)
        owner = reply.get("owner")
        if isinstance(owner, dict) and type(owner.get("pid")) is int:
            try:
                fd = os.pidfd_open(owner["pid"])
            except OSError:
                fd = None
            st = REG.proc_stat(owner["pid"]) if fd is not None else None
            if fd is None or st is None or st[4] != owner.get("starttime") or st[3] in ("Z", "X"):
                for open_fd in [*ends, *([fd] if fd is not None else [])]:
                    os.close(open_fd)
                engine.close()
                raise SetupError(f"session {session_id} is ending: its owner (pid {owner['pid']}) exited")
            ends[fd] = f"its session ended (session {session_id}'s owner, pid {owner['pid']}, exited): stopped"
        self.session_ends = ends

    def annotate(self, result) -> None:
        result.registry = self.registry_state
        result.warnings.extend(self._warnings)
        result.environment = self.environment
        result.credentials = [n for n, _ in self.credential_pairs]
        result.credentials_delivery = self.delivery
        if self.creds is not None:
            result.warnings.extend(w for w in self.creds.warnings if w not in result.warnings)

    def __exit__(self, exc_type, exc, tb):
        for fd in self.session_ends:
            os.close(fd)
        self.session_ends = {}
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


def _may_be_systemd_service(spec) -> bool:
    """Could this run become a systemd service? (auto mode knows only once the engine is open)"""
    return spec.unit_type == "service" and spec.may_be_systemd
