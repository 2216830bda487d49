"""Scope or service: the two ways a run's command enters its unit, chosen once.

A **scope** is made of a process that already exists: corral forks the
command held at a gate (the CLI forks; a Runner, whose host is
multi-threaded, posix_spawn()s corral-gate to hold it), names it in ``PIDs=``,
and opens the gate once the start job is done. The command is corral's
child: its wait status is the run's.

A **service**'s command is started by the manager: ``ExecStartEx=``, its
stdio passed as descriptors, its environment in a private file, its
credentials through systemd's own mechanism. Its end and its exit status
come only from the manager (``ExecMainCode``/``ExecMainStatus``), and a
failed start job needs explaining (credentials not delivered, systemd
could not execute it, or a command that ran and exited at once).

``SystemdEngine`` asks its strategy at each point where the two differ
and nowhere else.

Over 400 lines because both strategies' whole life is here side by side
(launch, a failed start explained, the exit status), so where a scope and a
service differ reads in one place.
"""

import os
import signal

from ...common.errors import SetupError, UsageError
from ...dbus.connection import BusError
from ...dbus.jobs import pump_signals
from ...dbus.systemd1 import interface_for
from ...kernel.spawn import ExecError, spawn_held
from ..base import fork_run_command, network_fact, refuse_unmaskable
from ..unitcgroup import cgroup_of
from . import properties as P
from .envfile import EnvFile, resolve_for_service, valid_env

#: systemd's exit status for a main process it forked but could not execute (EXIT_EXEC).
EXIT_EXEC = 203
#: How long to wait for the manager's word on a service after its start job.
SETTLE_TIMEOUT = 1.0


class SystemdExecError(ExecError):
    """systemd forked a service's main process but could not execute the
    command (status 203/EXEC): 126, as for a scope's failed exec. systemd
    does not say why over D-Bus, so the errno is nominal (EACCES)."""

    def __init__(self, argv0: str, unit: str):
        import errno

        super().__init__(errno.EACCES, argv0)
        self.unit = unit

    def __str__(self):
        return f"{self.argv0}: systemd could not execute it ({self.unit}: status {EXIT_EXEC}/EXEC)"


class ScopeStrategy:
    """The command is corral's child, held at a gate until its scope exists."""

    #: Its exit status comes from the manager (False: from waiting for our child).
    status_from_manager = False

    def __init__(self, engine):
        self.engine = engine

    @property
    def keep_failed(self) -> bool:
        return False

    def prepare(self, argv, env, cwd) -> None:
        """Before anything starts: nothing to check (exec tells)."""

    def launch(self, argv, *, stdin, stdout, stderr, env, cwd, survey=None) -> tuple[list, list]:
        """(properties, descriptors) for StartTransientUnit: the command forked, held.

        A caller's held process (``kernel.held.HeldProcess``: the corral
        service's runs) is the command's process already: it gets its
        command, environment and stdio when its gate opens (``started``);
        it cannot be sealed (the service declines those runs)."""
        engine = self.engine
        sealed = engine.spec.sealed
        if sealed and engine.held is not None:
            raise SetupError("a sealed run's scope is forked by corral itself, not held for a caller")
        if engine.held is not None:
            engine._child, engine.held = engine.held, None
            engine._child.prepare(argv, env, cwd, engine.spec.umask, (stdin, stdout, stderr))
        elif engine.session is None:
            engine._child = fork_run_command(
                engine.spec,
                argv,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                env=env,
                cwd=cwd,
                gated=True,
                survey=survey,
            )
        elif sealed or engine.spec.pty:
            # The child would have to seal itself (or take a terminal)
            # between fork and exec, and a library host, multi-threaded,
            # must not fork.
            what = ("--network none" if engine.spec.network == "none" else "--handoff deny") if sealed else "--pty"
            raise SetupError(f"{what}: a Runner's scope cannot have it; use unit_type='service' (the default)")
        else:
            from ..libexec import gate_program

            stdio = {"stdin": stdin, "stdout": stdout, "stderr": stderr}
            engine._child = spawn_held(gate_program(), argv, **stdio, env=env, cwd=cwd, umask=engine.spec.umask)
        # By its pidfd where the manager takes one (read once per connection: Manager.apis).
        pidfd = getattr(engine._child, "pidfd", -1)
        by_pidfd = pidfd >= 0 and engine.manager.apis.scope_from_pidfds
        engine.unit_state.note_api("scope_from", "pidfd" if by_pidfd else "pid")
        return P.scope_properties(engine._child.pid, by_pidfd=by_pidfd), [pidfd] if by_pidfd else []

    def start_failed(self, result: str) -> None:
        raise SetupError(f"systemd could not start {self.engine.unit}: job {result}")

    def network_fact(self) -> dict:
        return network_fact(self.engine.spec)

    def request_taken_reply_lost(self, first: str, taken: bool | None, unknown: str) -> None:
        """The start request may have reached the manager: the command is still at its gate, never ran."""
        raise SetupError(f"{first}, and the manager may have created it; the command never ran (held at its gate)")

    may_have_run = ""

    def remove_env_file(self) -> None:
        """A scope's command has the environment corral gave it: no file."""

    def started(self) -> None:
        """Open the gate (ExecError propagates; the scope empties and stops)."""
        engine = self.engine
        engine.seen.add(engine._child.pid)
        try:
            engine._child.release()
        except SetupError:
            # It never ran and is reaped (its seal not in place), or a
            # caller's held process did not take its command: killed.
            engine._child.close()
            engine._child = None
            raise

    def cgroup_hint(self) -> str:
        """The scope's cgroup as the kernel shows it for its held main process."""
        child = self.engine._child
        return cgroup_of(child.pid, self.engine.unit) if child is not None else ""

    def abandon(self) -> None:
        engine = self.engine
        if engine._child is not None:
            engine._child.abandon()
            engine._child = None

    def unit_changed(self, changed: dict) -> None:
        """A service's main-process properties; a scope has none."""

    def main_sessions(self) -> tuple:
        """A scope's main process is corral's (or its caller's) child: the engine knows its session."""
        return ()

    def refresh_status(self) -> None:
        """A scope's status is our child's: nothing to ask."""

    #: An empty scope is stopped by the manager once it notices; corral nudges it.
    nudge_when_empty = True

    def close(self) -> None:
        if self.engine._child is not None:
            self.engine._child.close()


class ServiceStrategy:
    """The manager starts the command; corral learns its end from the manager."""

    status_from_manager = True
    #: ExitType=cgroup: the manager stops a service once its group is empty.
    nudge_when_empty = False
    may_have_run = "; if the first request started the service, ending this run's tether stops it"

    def __init__(self, engine):
        self.engine = engine
        self._service_props: list = []
        self._environment: dict[str, str] = {}
        self._env_file: EnvFile | None = None
        self._main_pid = 0  # ExecMainPID, once the manager says it
        self._main_started = False  # the manager says it started the main process

    @property
    def keep_failed(self) -> bool:
        """A failed start of a service with credentials is explained by its
        ExecStartPre's status, read after the fact; without AddRef only
        CollectMode=inactive keeps a failed unit loaded for that (it is reset
        in the engine's close()). The credentials are known once the run
        guard has seen the engine, before start()."""
        spec = self.engine.spec
        return self.engine.direct and (bool(spec.credentials) or spec.sealed)

    def prepare(self, argv, env, cwd) -> None:
        """Resolve the executable as a scope's exec would (ExecError 127/126
        before anything starts) and settle the environment the unit gets."""
        engine = self.engine
        spec = engine.spec
        _require_utf8(argv, cwd)
        path = resolve_for_service(argv[0], dict(os.environ if env is None else env), cwd)
        # An environment of the user's own (--env-*, the library's env=), not
        # corral's with only CORRAL_RUN_ID added: then the manager adds nothing.
        unset = self._unset_for_explicit_env(env) if spec.env is not None else []
        self._environment = {}
        for key, value in dict(os.environ if env is None else env).items():
            if spec.credentials and key == "CREDENTIALS_DIRECTORY":
                continue  # an inherited one would override systemd's
            if valid_env(key, value):
                self._environment[key] = value
            else:
                engine.warnings.append(f"environment variable {key!r} not passed to the service (systemd rejects it)")
        self._service_props = P.service_properties(argv, path, cwd, unset)

    def _unset_for_explicit_env(self, env) -> list[str]:
        """An explicit environment (--env-clear/--env-drop, library env=) is
        what the service gets: unset what the manager would add from its own
        environment and for every service (MANAGERPID and SYSTEMD_EXEC_PID
        cannot be removed)."""
        names = {"INVOCATION_ID", "HOME", "LOGNAME", "USER", "SHELL", "JOURNAL_STREAM"}
        try:
            names.update(item.split("=", 1)[0] for item in self.engine.manager.manager_property("Environment"))
        except BusError:
            pass
        return sorted(names - set(env))

    def launch(self, argv, *, stdin, stdout, stderr, env, cwd, survey=None) -> tuple[list, list]:
        from ...common.credential_check import CHECK_SCRIPT

        engine = self.engine
        if engine.held is not None:  # the manager starts the command: a caller's held process is not needed
            engine.held.abandon()
            engine.held = None
        props = [
            *self._service_props,
            *P.credential_properties(engine.spec.credentials, CHECK_SCRIPT),
            *P.isolation_properties(engine.manager_kind),
            *self._seal_properties(survey),
            *P.stdio_properties(),
            *P.tty_properties(stdin if engine.spec.pty else None),
            *self._environment_properties(),
        ]
        return props, [stdin, stdout, stderr]

    def _seal_properties(self, survey) -> list:
        """A sealed run (``spec.sealed``): the system manager's namespaces
        (``properties.seal_properties``). A user manager's service cannot be
        sealed: SetupError, before anything starts."""
        engine = self.engine
        spec = engine.spec
        if not spec.sealed:
            return []
        what = "--network none" if spec.network == "none" else "--handoff deny"
        if engine.manager_kind == "user":
            # A user manager gives each of a unit's processes a user namespace
            # of its own, made first, with the mount and network namespaces
            # inside it (execute.c: "If we're unprivileged, set up the user
            # namespace first"): the network namespace the first process makes
            # cannot be joined by the next, which systemd 252 then runs on the
            # host's network with only a warning ("network namespace setup
            # failed, ignoring"; seen in the VM lane as uid 1000). Its mount
            # namespace is then owned by the service's own user namespace,
            # unlike a system manager's (made before it, as corral's child
            # makes it): not tried with the masks here, so not offered.
            raise SetupError(
                f"{what}: a user manager's service cannot be sealed reliably (systemd 252 makes its "
                "namespaces inside a user namespace of each process's own); use --unit-type scope, "
                "or the system manager"
            )
        refuse_unmaskable(spec, survey)
        from ...kernel import netns, seal

        return P.seal_properties(
            survey.masks if survey is not None else [],
            spec.network == "none",
            netns.current(),
            os.readlink("/proc/self/ns/user"),
            seal.CHECK_SCRIPT,
        )

    def _environment_properties(self) -> list:
        """The service's environment, without its values in the unit.

        Environment= would put every value into the unit's properties
        (``systemctl show``: for the system manager, any local user) and
        into its transient unit file. So the variables go to a file of ours
        (``EnvFile``: 0600, in a 0700 directory on a tmpfs) that the unit
        names in EnvironmentFiles=: only its path is in the unit. The
        manager reads it when it execs the unit's commands (ExecStartPre=
        and the command itself), so it is removed once the start job is done
        (Type=exec: after the command's exec), or when the start fails. If
        no private directory is usable, Environment= is used, with a warning.
        """
        if not self._environment:
            return []
        try:
            self._env_file = EnvFile(self.engine.spec.run_id, self._environment)
        except OSError as exc:
            self.engine.warnings.append(
                f"no private directory for the service's environment file ({exc}): "
                "its values are in the unit's Environment= property"
            )
            return P.environment_properties(self._environment, None)
        return P.environment_properties(self._environment, self._env_file.path)

    def remove_env_file(self) -> None:
        if self._env_file is not None:
            self._env_file.remove()
            self._env_file = None

    def start_failed(self, result: str) -> None:
        """The start job failed: why, or a run that did start after all.

        SetupError if systemd did not deliver the credentials, or if the
        command never ran; SystemdExecError (126) if systemd could not execute
        it. Returns when the command did run (systemd 252 can fail a Type=exec
        start job of a command that exits at once): the run is real."""
        self._check_credentials_delivered()
        self._check_sealed()
        if not self._service_ran():
            raise SetupError(f"systemd could not start {self.engine.unit}: job {result}")
        self._check_exec_failed()

    def _service_ran(self) -> bool:
        """systemd 252 can fail a Type=exec start job when the main process
        exits before the manager has processed its exec notification. If the
        main process did start, the run is real: it must be watched, stopped
        and verified, never reported as "not started" (125).

        The manager says so in PropertiesChanged (ExecMainPID,
        ExecMainStartTimestampMonotonic), which may trail JobRemoved a
        little; the unit's final state ends the wait. Once collected (no
        AddRef on a private connection) it cannot be asked any more.
        """
        engine = self.engine
        pump_signals(
            engine.conn,
            engine._handle_signal,
            lambda: self._main_started or engine.unit_state.ended(),
            SETTLE_TIMEOUT,
        )
        if self._main_started or engine.unit_state.gone:
            return self._main_started
        try:
            started = engine.manager.get(engine.unit, interface_for(engine.unit), "ExecMainStartTimestampMonotonic")
        except BusError:
            return False
        return bool(started)

    def _check_exec_failed(self) -> None:
        """After a failed start job whose main process did start: if that
        process ended with EXIT_EXEC (203), systemd forked it but could not
        execute the command: SystemdExecError, 126.

        Only a failed job counts: with Type=exec the start job is "done" once
        the command has been executed, so a command that ran and exited 203
        by itself is not taken for this. ExecMainCode/ExecMainStatus arrive
        in PropertiesChanged, which systemd sends before JobRemoved; asked
        for if still missing.
        """
        engine = self.engine
        pump_signals(
            engine.conn,
            engine._handle_signal,
            lambda: engine._status is not None or engine.unit_state.gone,
            SETTLE_TIMEOUT,
        )
        if engine._status is None and not engine.unit_state.gone:
            self.refresh_status()
        status = engine._status
        if status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_EXEC:
            engine._status = None  # systemd's status, not the command's: it never ran
            raise SystemdExecError(engine.spec.argv[0], engine.unit)

    def _check_credentials_delivered(self) -> None:
        """After a failed start job: SetupError if the credentials are why.

        The check exited CHECK_FAILED (the directory arrived empty), or the
        manager could not load a source (EXIT_CREDENTIALS, in ExecStartPre or,
        if the file vanished in between, in the main process before exec).
        """
        from ...common.credential_check import CHECK_FAILED, EXIT_CREDENTIALS, source_problem

        engine = self.engine
        if not engine.spec.credentials:
            return
        interface = interface_for(engine.unit)
        try:
            pre = engine.manager.get(engine.unit, interface, "ExecStartPre")
            main = (
                engine.manager.get(engine.unit, interface, "ExecMainCode"),
                engine.manager.get(engine.unit, interface, "ExecMainStatus"),
            )
        except BusError:
            return
        check = (pre[0][8], pre[0][9]) if pre else (0, 0)  # (code, status): CLD_EXITED is 1
        if check == (1, CHECK_FAILED):
            raise SetupError(
                f"systemd did not deliver the credentials to {engine.unit} ($CREDENTIALS_DIRECTORY "
                "empty or incomplete in the unit: is the manager's runtime directory a shared mount?); "
                "use --unit-type scope or fix the manager"
            )
        if (1, EXIT_CREDENTIALS) in (check, main):
            why = source_problem(engine.spec.credentials)
            raise SetupError(
                f"systemd could not load the credentials for {engine.unit} (exit status "
                f"{EXIT_CREDENTIALS}/CREDENTIALS{'; ' + why if why else ''})"
            )
        if check[0] and check != (1, 0):
            raise SetupError(
                f"systemd did not deliver the credentials to {engine.unit} (the check could not run: "
                f"code {check[0]}, status {check[1]}); use --unit-type scope or fix the manager"
            )

    def _check_sealed(self) -> None:
        """After a failed start job: SetupError if the seal is why (the unit's
        check found corral's user namespace, a channel still visible, PID 1's
        network namespace within reach, corral's network namespace, or more
        than lo)."""
        from ...kernel import netns, seal

        engine = self.engine
        if not engine.spec.sealed:
            return
        try:
            pre = engine.manager.get(engine.unit, interface_for(engine.unit), "ExecStartPre")
        except BusError:
            return
        what = "--network none" if engine.spec.network == "none" else "--handoff deny"
        for entry in pre:
            if len(entry[1]) > 3 and entry[1][3] == P.SEAL_CHECK and entry[8]:
                code, status = entry[8], entry[9]
                if (code, status) == (1, 0):
                    return
                why = {
                    netns.CHECK_SHARED: "it shares corral's network namespace",
                    netns.CHECK_INTERFACES: "its network namespace holds more than lo",
                    seal.CHECK_USERNS: "it shares corral's user namespace",
                    seal.CHECK_VISIBLE: "a channel it should not reach is visible",
                    seal.CHECK_JOIN: "it could open PID 1's network namespace",
                }.get(status if code == 1 else -1, f"the check ended with code {code}, status {status}")
                raise SetupError(f"{what}: not in place in {engine.unit} ({why}); the command never ran")

    def network_fact(self) -> dict:
        if self.engine.spec.network != "none":
            return {}
        return {"network": "PrivateNetwork"}

    def request_taken_reply_lost(self, first: str, taken: bool | None, unknown: str) -> None:
        """The manager may have taken the start request whose reply was lost:
        that request started the service. Adopt it (see the engine's
        ``UnitState.adopt``), or say that how it ran cannot be known."""
        if taken is None:
            self.engine.unit_state.unknowable(unknown)
        else:
            self.engine.unit_state.adopt(first)

    def started(self) -> None:
        """The manager started the command: nothing to release."""

    def cgroup_hint(self) -> str:
        return ""

    def abandon(self) -> None:
        """A service's start job may still be queued or running (a Runner's
        shared tether would not stop it): cancel and kill it."""
        engine = self.engine
        if engine.manager.lost is not None:
            return
        for action in (
            engine.manager.stop_unit_nowait,
            lambda unit: engine.manager.kill_unit(unit, "all", signal.SIGKILL),
        ):
            try:
                action(engine.unit)
            except BusError:
                pass  # no such unit: nothing to undo

    def unit_changed(self, changed: dict) -> None:
        """The service's main process, from the unit's PropertiesChanged."""
        engine = self.engine
        if changed.get("ExecMainPID"):
            self._main_pid = changed["ExecMainPID"]
        if changed.get("ExecMainPID") or changed.get("ExecMainStartTimestampMonotonic"):
            self._main_started = True
        engine.unit_state.keep_figures(changed)
        self._status_from(changed)

    def main_sessions(self) -> tuple:
        """The main process's session id (the manager calls setsid() for it):
        its number may be reused once the manager has reaped it, so the sweep
        takes only members that carry the run's mark."""
        return (self._main_pid,) if self._main_pid else ()

    def _status_from(self, props: dict) -> None:
        """The main process's wait status from one answer of the manager that
        holds both ExecMainCode and ExecMainStatus (the first such wins)."""
        engine = self.engine
        code = props.get("ExecMainCode", 0)
        if code and "ExecMainStatus" in props and engine._status is None:  # CLD_EXITED=1, CLD_KILLED=2, CLD_DUMPED=3
            status = props["ExecMainStatus"]
            engine._status = (status & 0xFF) << 8 if code == 1 else (status & 0x7F) | (0x80 if code == 3 else 0)

    def refresh_status(self) -> None:
        """Ask the manager for the main process's status (a signal may have been missed).

        One GetAll, never a Get per property: a service stopped from outside
        ends and is collected at once (ExitType=cgroup: the group empties with
        the main process), and a Get that comes after the collection loads a
        new, empty unit of that name (ExecMainStatus 0): ExecMainCode 2
        (killed) from before it and a status 0 from after it read as "exited
        0" (systemd 257's system manager, seen in CI). A collected unit's
        answer has no ExecMainCode: the PropertiesChanged sent before its
        UnitRemoved tells the status."""
        engine = self.engine
        if engine._status is not None:
            return
        try:
            props = engine.manager.get_all(engine.unit, interface_for(engine.unit))
        except BusError:
            return
        self._status_from(props)

    def close(self) -> None:
        self.remove_env_file()  # a service adopted after a lost reply: kept until now


def _require_utf8(argv, cwd) -> None:
    """A service's command line and working directory go to the manager
    over D-Bus, which carries UTF-8 strings only: anything else (os.fsdecode's
    lone surrogates) is refused before anything starts. A scope's command is
    exec'd by corral and takes any bytes."""
    for what, text in [*((f"argument {i}", arg) for i, arg in enumerate(argv)), ("the working directory", cwd or "")]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(
                f"{what} of the command is not valid UTF-8, which a service's command line must be "
                "(it goes to systemd over D-Bus); use --unit-type scope"
            ) from None


def strategy_for(engine):
    return {"scope": ScopeStrategy, "service": ServiceStrategy}[engine.spec.unit_type](engine)
