"""systemd engine: every run is a transient unit, stopped and proven empty.

The flow, as in systemd-run (run.c):

1. connect to the manager: its private socket where we may (as systemctl
   does), else its bus (user: session bus; system: system bus);
2. on a bus, AddMatch + Subscribe, so no JobRemoved / PropertiesChanged is
   missed (a private connection receives every signal unasked);
3. fork the *tether* (a tiny child of corral that dies with corral) and,
   for a scope, fork the command held at a gate before exec;
4. StartTransientUnit: the run unit (limits, BindsTo+After the tether's
   scope) plus the tether scope as an auxiliary unit, in one call;
5. wait for the start job's JobRemoved; only then open the gate, so
   nothing the command runs can start outside the unit;
6. watch: the main process (scope: our child, via pidfd; service:
   PropertiesChanged on the unit), OOM counters;
7. stop: KillUnit(all, SIGTERM+SIGCONT), SIGKILL after grace through
   cgroup.kill where the unified hierarchy offers it, else KillUnit;
8. verify: the kernel reports the unit's cgroup empty and the unit is
   inactive or gone; read results; UnrefUnit; end the tether.

If corral is SIGKILLed, the tether exits (``tether.py``), its scope
empties and stops, and BindsTo= makes the manager stop the run within
TimeoutStopSec (= grace). RuntimeMaxSec is a further backstop.

A library ``Runner`` passes a ``SystemdSession``: one manager connection
(multiplexed between its concurrent runs) and one tether, so a run costs
one StartTransientUnit and no extra process. The CLI makes both per run
(the tether scope then rides in the same StartTransientUnit call as an
auxiliary unit).
"""

import errno
import os
import re
import signal
import time

from ..dbus.connection import BusDisconnected, BusError, Connection, wait_fd
from ..dbus.systemd1 import MANAGER, NO_SUCH_UNIT, PROPS, UNIT, Manager, interface_for, prop, unit_path
from ..errors import SetupError
from ..kernel import cgroupfs
from ..kernel.fsread import read_bytes
from ..kernel.pidfd import RunTracker, signal_cgroup_members
from ..kernel.spawn import ExecError, fork_command, resolve_in_cwd, spawn_gated_by_shell
from ..redact import redact_argv
from .base import CgroupMemoryLimit, Engine, usage_facts
from .tether import Tether

START_TIMEOUT = 10.0
_USEC = 1_000_000
#: Once the unit runs, a call that gets no answer within this is a lost manager.
RUNTIME_CALL_TIMEOUT = 1.0
#: systemd's exit status for a main process it forked but could not execute (EXIT_EXEC).
EXIT_EXEC = 203
#: How often the unit's cgroup figures are read while the run lives (see _arm_watches).
SAMPLE_INTERVAL = 0.1
#: A CLI run whose manager connection ended mid-run (daemon-reexec closes every
#: private connection) connects again for this long before it calls the manager
#: lost; one attempt every RECONNECT_EVERY, each bounded by RECONNECT_TIMEOUT so
#: the watch loop (deadline, limits) is never held longer than that.
RECONNECT_WINDOW = 60.0
RECONNECT_EVERY = 0.5
RECONNECT_TIMEOUT = 0.5


class SystemdExecError(ExecError):
    """systemd forked a service's main process but could not execute the
    command (status 203/EXEC): 126, as for a scope's failed exec. systemd
    does not say why over D-Bus, so the errno is nominal (EACCES)."""

    def __init__(self, argv0: str, unit: str):
        super().__init__(errno.EACCES, argv0)
        self.unit = unit

    def __str__(self):
        return f"{self.argv0}: systemd could not execute it ({self.unit}: status {EXIT_EXEC}/EXEC)"


def _private_socket(kind: str) -> str | None:
    """The manager's own socket (peer-to-peer, no bus daemon in between), as
    systemctl uses it: $XDG_RUNTIME_DIR/systemd/private for the user
    manager, /run/systemd/private (root only) for the system manager."""
    if os.environ.get("CORRAL_SYSTEMD_TRANSPORT") == "bus":
        return None
    if kind == "user":
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        path = os.path.join(runtime, "systemd", "private") if runtime else None
    else:
        path = "/run/systemd/private" if os.geteuid() == 0 else None
    try:
        # Ours only: root with an inherited XDG_RUNTIME_DIR (su, sudo -E) must
        # not land in another user's manager, whose private socket root may use.
        return path if path and os.stat(path).st_uid == os.geteuid() else None
    except OSError:
        return None


def _bus_address(manager: str) -> tuple[str, str | None]:
    """(manager kind, bus address or None if only the private socket is
    there) or SetupError saying what is missing."""
    from . import session_bus_candidates

    if manager in ("auto", "user"):
        address = session_bus_candidates()
        if address is not None or _private_socket("user"):
            return "user", address
        if manager == "user":
            raise SetupError(
                "no user manager bus: DBUS_SESSION_BUS_ADDRESS is unset and $XDG_RUNTIME_DIR/bus does not exist"
            )
    if os.geteuid() != 0 and manager == "auto":
        raise SetupError("no user manager bus (DBUS_SESSION_BUS_ADDRESS unset, no $XDG_RUNTIME_DIR/bus)")
    if not os.path.isdir("/run/systemd/system"):
        raise SetupError("no system manager: this machine was not booted with systemd (/run/systemd/system missing)")
    return "system", os.environ.get("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/run/dbus/system_bus_socket")


def connect_manager(manager: str, timeout: float = 10.0) -> tuple[str, Connection]:
    """(manager kind, connection): the manager's private socket where we
    may use it, else its bus. SetupError if neither answers.

    The private socket saves the bus daemon's hop on every message and the
    Hello/AddMatch/Subscribe calls (the manager sends every signal to every
    private connection); the price is that AddRef/UnrefUnit need a bus name
    and are not available there (see ``SystemdEngine.direct``).
    """
    kind, address = _bus_address(manager)
    private = _private_socket(kind)
    if private is not None:
        try:
            return kind, Connection(f"unix:path={private}", timeout=timeout, bus=False)
        except BusError:
            pass  # not ours to use (e.g. another user's): try the bus
    if address is None:
        raise SetupError(f"{kind} manager unreachable: its private socket did not answer and there is no bus")
    try:
        return kind, Connection(address, timeout=timeout)
    except BusError as exc:
        raise SetupError(f"{kind} manager unreachable: {exc}") from None


class SystemdEngine(CgroupMemoryLimit, Engine):
    mode = "systemd"
    #: How SIGKILL is delivered: "cgroup.kill" where writable, else "KillUnit".
    kill_method = os.environ.get("CORRAL_KILL_METHOD", "cgroup.kill")

    def __init__(self, spec, session: "SystemdSession | None" = None):
        super().__init__()
        self.spec = spec
        self._session = session
        self.unit = f"corral-{spec.run_id}.{spec.unit_type}"
        self._unit_path = unit_path(self.unit)
        self._unit_match = (
            "type='signal',sender='org.freedesktop.systemd1',"
            f"path='{self._unit_path}',interface='{PROPS}',member='PropertiesChanged'"
        )
        if session is None:
            self._open_own_connection()
            self.tether_unit = f"corral-{spec.run_id}-tether.scope"
        else:
            self.manager_kind, self.conn = session.manager_kind, session.channel(self.unit, self._unit_path)
            self.manager = Manager(self.conn)
            self.tether_unit = session.tether_unit
        #: A peer-to-peer connection to the manager: no bus name, so no
        #: AddRef/UnrefUnit; the unit may be collected as soon as it ends,
        #: and what we need of it arrives in PropertiesChanged before UnitRemoved.
        self.direct = self.conn.unique_name is None
        self._child = None  # scope: the command, our child
        self._tether = None  # our own tether (no session)
        self._status: int | None = None
        self._main_started = False  # a service's main process was started (PropertiesChanged)
        self._conn_dead = False  # the manager connection ended
        self._conn_lost_at: float | None = None  # when (monotonic); see _reconnect
        self._next_reconnect = 0.0
        self._adopted: str | None = None  # see _adopt_service
        self._start_reply_lost: str | None = None
        self._cgroup: str | None = None
        self._mounts: cgroupfs.Mounts | None = None
        self._oom_eventfd = None
        self._oom_seen = False
        self._oom_signals_after_removal = 0  # see _oom_event
        self._stopping = False  # corral has signalled the run
        #: The unit's cgroup v2 memory.events and cgroup.events, kept open (see _arm_watches).
        self._watches: dict[str, cgroupfs.KeyedWatch] = {}
        #: Resource figures read from the unit's cgroup, and those the manager reported.
        self._usage = cgroupfs.Usage()
        self._manager_figures: dict[str, int] = {}
        self._exit_sampled = False
        self._next_sample = 0.0
        self._unit_gone = False
        self._active_state: str | None = None  # from PropertiesChanged
        self._inactive_checks = 0
        self._started = False
        self._stopped_count = 0
        self._signalled: set[int] = set()
        self._last: list[int] = []
        self._environment: dict[str, str] = {}  # a service's, passed in _env_file
        self._env_file: _EnvFile | None = None
        #: Processes that leave the unit's cgroup (see RunTracker); a scope's
        #: main process is held unreaped until close(), so its session id stays the run's.
        self.tracker = RunTracker()
        self._hold_main = True
        self.facts = {
            "manager": self.manager_kind,
            "unit": self.unit,
            "unit_type": spec.unit_type,
            "transport": "private" if self.direct else "bus",
        }

    def _open_own_connection(self, timeout: float = START_TIMEOUT) -> None:
        """A connection of this run's own (the CLI), subscribed to the unit's signals."""
        self.manager_kind, self.conn = connect_manager(self.spec.manager, timeout)
        self.manager = Manager(self.conn)
        try:
            _subscribe(self.conn, self.manager)
            self.manager.add_match(self._unit_match)
        except BusError as exc:
            self.conn.close()
            raise SetupError(f"{self.manager_kind} manager not usable: {_why(exc)}") from None

    # -- start ---------------------------------------------------------
    def start(self, argv, *, stdin, stdout, stderr, env, cwd):
        spec = self.spec
        if spec.unit_type == "service":
            # ExecError (127/126, as a scope's exec gives) before anything starts.
            service_props = self._service_properties(argv, env, cwd)
        aux = []
        if self._session is None:
            self._tether = Tether()
            aux = [(self.tether_unit, _tether_properties(self._tether.pid, spec.slice, self.unit))]
        props = self._common_properties(argv)
        fds = []
        if spec.unit_type == "scope":
            # The CLI forks (one small thread, exact exec errors); a library
            # Runner's host is multi-threaded and must not fork: a shell holds the gate.
            start_gated = fork_command if self._session is None else spawn_gated_by_shell
            self._child = start_gated(
                argv,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                env=env,
                cwd=cwd,
                **({"gated": True} if self._session is None else {}),
            )
            props.append(prop("PIDs", "au", [self._child.pid]))
        else:
            props += service_props
            props += self._credential_properties(props)
            props += [
                prop("StandardInputFileDescriptor", "h", 0),
                prop("StandardOutputFileDescriptor", "h", 1),
                prop("StandardErrorFileDescriptor", "h", 2),
            ]
            fds = [stdin, stdout, stderr]
        try:
            if spec.unit_type == "service":
                props += self._environment_properties()
            job = self._start_transient_unit(props, aux, fds)
            result = self._wait_job(job) if job is not None else "done"
            if job is not None:
                # The start job is over: the manager has exec'd the command
                # (or given up), and read the environment file for good.
                self._remove_env_file()
            if result != "done":
                self._check_credentials_delivered()  # SetupError if systemd did not deliver them
                if not self._service_ran():
                    raise SetupError(f"systemd could not start {self.unit}: job {result}")
                self._check_exec_failed()  # ExecError (126) if systemd could not execute the command
        except BusError as exc:
            self._abandon()
            raise SetupError(f"StartTransientUnit failed: {_why(exc)}") from None
        except BaseException:
            self._abandon()
            raise
        finally:
            if not self._adopted:  # else the manager may not have read it yet: close() removes it
                self._remove_env_file()
        # From here on the unit exists and (for a service) the command runs:
        # no failure may be reported as "not started" (125) any more.
        self._started = True
        self.conn.timeout = RUNTIME_CALL_TIMEOUT
        self._locate_cgroup()
        if self._child is not None:
            self.seen.add(self._child.pid)
            self._child.release()  # ExecError propagates; the scope empties and stops
        # Signals that arrived while we waited for replies are queued, and the
        # socket will not poll readable for them: handle them now (a fast
        # service's exit status may be among them).
        self.poll_events()

    def _start_transient_unit(self, props, aux, fds) -> str | None:
        """StartTransientUnit; once more on a fresh connection if ours ended under the call.

        A connection of the CLI's own can end mid-call (seen once in CI:
        ECONNRESET from the private socket, the manager busy with 8 runs).
        The command never starts twice: whether the first request reached
        the manager is read from this run's tether scope, created by the
        same call and kept while our tether process lives (the unit itself
        may already be collected if its command exited at once). Not taken:
        the call is made again. Taken: a scope's command is still held at
        its gate, never ran, and the start fails (125); a service was
        started by that request, and None is returned (``_adopt_service``).
        A Runner's shared connection is not retried: the session counts as
        lost, and the Runner reconnects for later runs.
        """
        try:
            return self.manager.start_transient_unit(self.unit, props, aux, fds=fds)
        except BusDisconnected as exc:
            if self._session is not None:
                raise
            first = f"the manager connection ended while starting {self.unit} ({exc})"
        direct = self.direct
        self.conn.close()
        try:
            self._open_own_connection()
        except SetupError as exc:
            may_run = (
                ""
                if self._child is not None
                else "; if the first request started the service, ending this run's tether stops it"
            )
            raise SetupError(f"{first}, and a new one failed: {exc}{may_run}") from None
        try:
            taken = self.manager.unit_loaded(self.tether_unit)
        except BusError as exc:
            taken = None
            unknown = f"{first}; whether the manager had taken it could not be asked ({_why(exc)})"
        if taken is False:
            if (self.conn.unique_name is None) != direct:
                # The unit's properties were chosen for the first transport (AddRef only on the bus).
                raise SetupError(
                    f"{first}; the manager had not taken it, and it is not asked again: a new "
                    "connection would use another transport"
                )
            job = self.manager.start_transient_unit(self.unit, props, aux, fds=fds)
            self.warnings.append(f"{first}; the manager had not taken the request: asked again on a new connection")
            return job
        if self._child is not None:
            raise SetupError(f"{first}, and the manager may have created it; the command never ran (held at its gate)")
        if taken is None:
            self._adopted = self._start_reply_lost = f"{unknown}: how the service ran cannot be known"
        else:
            self._adopt_service(first)
        return None

    def _adopt_service(self, why: str) -> None:
        """The manager took our StartTransientUnit, its reply was lost: the
        service was started by that request. Watch it as any run: its end
        arrives on the new connection (subscribed before we looked), its
        status read as usual if it has already ended but is still loaded.
        If it was collected, or cannot be asked about, how it ended cannot
        be known: ``lost_track`` says so, and the run is stopped and proven
        empty from its cgroup (exit 120)."""
        why = f"{why}, after the manager had started it"
        self._adopted = why
        try:
            loaded = self.manager.unit_loaded(self.unit)
            if loaded:
                self._active_state = self.manager.get(self.unit, UNIT, "ActiveState")
        except BusError as exc:
            self._start_reply_lost = (
                f"{why}; the manager could not be asked about it ({_why(exc)}), so how it ran cannot be known"
            )
            return
        if not loaded:
            self._unit_gone = True
            self._start_reply_lost = f"{why}; it ended unseen and was collected, so its exit status cannot be known"
        else:
            self.warnings.append(f"{why}; watching that start")

    def _service_ran(self) -> bool:
        """A failed start job does not always mean the command never ran.

        systemd 252 can fail a Type=exec start job when the main process
        exits before the manager has processed its exec notification (a
        command that starts a daemon and exits at once). If the main process
        did start, the run is real: it must be watched, stopped and verified,
        never reported as "not started" (125).
        """
        if self.spec.unit_type != "service":
            return False
        # The manager says so in PropertiesChanged (ExecMainPID,
        # ExecMainStartTimestampMonotonic), which may trail JobRemoved a
        # little; the unit's final state ends the wait. Once collected (no
        # AddRef on a private connection) it cannot be asked any more.
        _pump_signals(
            self.conn,
            self._handle_signal,
            lambda: self._main_started or self._unit_gone or self._active_state in ("failed", "inactive"),
            RUNTIME_CALL_TIMEOUT,
        )
        if self._main_started or self._unit_gone:
            return self._main_started
        try:
            started = self.manager.get(self.unit, interface_for(self.unit), "ExecMainStartTimestampMonotonic")
        except BusError:
            return False
        return bool(started)

    def _check_exec_failed(self) -> None:
        """After a failed start job whose main process did start: if that
        process ended with EXIT_EXEC (203), systemd forked it but could not
        execute the command (a change since corral resolved it, or something
        only the manager meets): SystemdExecError, 126.

        Only a failed job counts: with Type=exec the start job is "done" once
        the command has been executed, so a command that ran and exited 203
        by itself is not taken for this (barring systemd 252's race in
        ``_service_ran``, where the job of a command that exits at once may
        fail too). ExecMainCode/ExecMainStatus arrive in PropertiesChanged,
        which systemd sends before JobRemoved; asked for if still missing.
        """
        _pump_signals(
            self.conn, self._handle_signal, lambda: self._status is not None or self._unit_gone, RUNTIME_CALL_TIMEOUT
        )
        if self._status is None and not self._unit_gone:
            self._refresh_service_status()
        status = self._status
        if status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_EXEC:
            self._status = None  # systemd's status, not the command's: it never ran
            raise SystemdExecError(self.spec.argv[0], self.unit)

    # -- --credential for a service (see credentials.py) ---------------
    def _credential_properties(self, props) -> list:
        """LoadCredential= for each credential (the manager reads the file:
        only the path goes over the bus) and an ExecStartPre= that checks,
        inside the unit and before the command, that each one arrived."""
        from ..credentials import CHECK_SCRIPT

        pairs = self.spec.credentials
        if not pairs:
            return []
        for i, (name, value) in enumerate(props):
            if name == "Environment":  # an inherited CREDENTIALS_DIRECTORY= would override systemd's
                props[i] = prop(name, "as", [a for a in value.value if not a.startswith("CREDENTIALS_DIRECTORY=")])
        return [
            prop("LoadCredential", "a(ss)", [(n, path) for n, path in pairs]),
            prop(
                "ExecStartPre",
                "a(sasb)",
                [("/bin/sh", ["/bin/sh", "-c", CHECK_SCRIPT, "corral-credentials", *(n for n, _ in pairs)], False)],
            ),
        ]

    def _check_credentials_delivered(self) -> None:
        """After a failed start job: SetupError if the credentials are why.

        The check exited CHECK_FAILED (the directory arrived empty), or the
        manager could not load a source (EXIT_CREDENTIALS, in ExecStartPre or,
        if the file vanished in between, in the main process before exec).
        """
        from ..credentials import CHECK_FAILED, EXIT_CREDENTIALS, source_problem

        if self.spec.unit_type != "service" or not self.spec.credentials:
            return
        try:
            pre = self.manager.get(self.unit, interface_for(self.unit), "ExecStartPre")
            main = (
                self.manager.get(self.unit, interface_for(self.unit), "ExecMainCode"),
                self.manager.get(self.unit, interface_for(self.unit), "ExecMainStatus"),
            )
        except BusError:
            return
        check = (pre[0][8], pre[0][9]) if pre else (0, 0)  # (code, status): CLD_EXITED is 1
        if check == (1, CHECK_FAILED):
            raise SetupError(
                f"systemd did not deliver the credentials to {self.unit} ($CREDENTIALS_DIRECTORY "
                "empty or incomplete in the unit: is the manager's runtime directory a shared mount?); "
                "use --unit-type scope or fix the manager"
            )
        if (1, EXIT_CREDENTIALS) in (check, main):
            why = source_problem(self.spec.credentials)
            raise SetupError(
                f"systemd could not load the credentials for {self.unit} (exit status "
                f"{EXIT_CREDENTIALS}/CREDENTIALS{'; ' + why if why else ''})"
            )
        if check[0] and check != (1, 0):
            raise SetupError(
                f"systemd did not deliver the credentials to {self.unit} (the check could not run: "
                f"code {check[0]}, status {check[1]}); use --unit-type scope or fix the manager"
            )

    @property
    def _keep_failed(self) -> bool:
        """A failed start of a service with credentials is explained by its
        ExecStartPre's status, read after the fact; without AddRef only
        CollectMode=inactive keeps a failed unit loaded for that (it is
        reset in close()). The credentials are known once the run guard
        has seen the engine, before start()."""
        return self.direct and self.spec.unit_type == "service" and bool(self.spec.credentials)

    def _common_properties(self, argv):
        spec = self.spec
        props = [
            # Redacted as the registry and the record redact it: the unit's
            # properties are visible to everyone who may ask its manager.
            prop("Description", "s", "corral: " + " ".join(redact_argv(argv))[:200]),
            prop("Slice", "s", spec.slice),
            prop("CollectMode", "s", "inactive" if self._keep_failed else "inactive-or-failed"),
            prop("SendSIGKILL", "b", True),
            prop("TimeoutStopUSec", "t", int(spec.grace * _USEC)),
            prop("BindsTo", "as", [self.tether_unit]),
            prop("After", "as", [self.tether_unit]),
            prop("TasksAccounting", "b", True),
            prop("MemoryAccounting", "b", True),
        ]
        if not self.direct:
            # Keep the unit (and its result) until UnrefUnit, even if it is
            # collected-eligible before we read it. Not on a direct connection.
            props.append(prop("AddRef", "b", True))
        if spec.wall is not None:
            backstop = spec.wall + spec.grace + spec.verify_timeout
            props.append(prop("RuntimeMaxUSec", "t", int(backstop * _USEC)))
        if spec.mem is not None:
            props += [prop("MemoryMax", "t", spec.mem), prop("MemorySwapMax", "t", 0)]
        if spec.pids is not None:
            props.append(prop("TasksMax", "t", spec.pids))
        return props

    def _service_properties(self, argv, env, cwd):
        path = _resolve_for_service(argv[0], dict(os.environ if env is None else env), cwd)
        unset = self._unset_for_explicit_env(env) if env is not None else []
        env = dict(os.environ if env is None else env)
        self._environment = {}
        for key, value in env.items():
            if self.spec.credentials and key == "CREDENTIALS_DIRECTORY":
                continue  # an inherited one would override systemd's
            if _valid_env(key, value):
                self._environment[key] = value
            else:
                self.warnings.append(f"environment variable {key!r} not passed to the service (systemd rejects it)")
        return [
            prop("Type", "s", "exec"),
            # ExecStartEx with no-env-expand (the ":" prefix): the arguments
            # reach the command as given; plain ExecStart would have systemd
            # expand "$VAR", "${VAR}" and "$$" in them.
            prop("ExecStartEx", "a(sasas)", [(path, list(argv), ["no-env-expand"])]),
            *([prop("UnsetEnvironment", "as", unset)] if unset else []),
            prop("WorkingDirectory", "s", os.path.abspath(cwd or os.getcwd())),
            prop("RemainAfterExit", "b", False),
        ]

    def _environment_properties(self) -> list:
        """The service's environment, without its values in the unit.

        Environment= would put every value into the unit's properties
        (``systemctl show``: for the system manager, any local user) and
        into its transient unit file. So the variables go to a file of
        ours (``_EnvFile``: 0600, in a 0700 directory on a tmpfs) that
        the unit names in EnvironmentFiles=: only its path is in the
        unit. The manager reads it when it execs the unit's commands
        (ExecStartPre= and the command itself), so it is removed once the
        start job is done (Type=exec: after the command's exec), or when
        the start fails; see start(). If no private directory is usable,
        Environment= is used as before, with a warning.
        """
        if not self._environment:
            return []
        try:
            self._env_file = _EnvFile(self.spec.run_id, self._environment)
        except OSError as exc:
            self.warnings.append(
                f"no private directory for the service's environment file ({exc}): "
                "its values are in the unit's Environment= property"
            )
            return [prop("Environment", "as", [f"{k}={v}" for k, v in self._environment.items()])]
        return [prop("EnvironmentFiles", "a(sb)", [(self._env_file.path, False)])]

    def _remove_env_file(self) -> None:
        if self._env_file is not None:
            self._env_file.remove()
            self._env_file = None

    def _unset_for_explicit_env(self, env) -> list[str]:
        """An explicit environment (--env-clear/--env-drop, library env=) is
        what the service gets: unset what the manager would add from its own
        environment and for every service (MANAGERPID and SYSTEMD_EXEC_PID
        cannot be removed)."""
        names = {"INVOCATION_ID", "HOME", "LOGNAME", "USER", "SHELL", "JOURNAL_STREAM"}
        try:
            names.update(item.split("=", 1)[0] for item in self.manager.manager_property("Environment"))
        except BusError:
            pass
        return sorted(names - set(env))

    def _wait_job(self, job: str) -> str:
        return _wait_job(self.conn, job, self._handle_signal, what=self.unit)

    def _locate_cgroup(self):
        """Find the unit's cgroup, then check limits and arm the OOM watch.

        Without a round trip where the kernel can tell: a scope's is its
        held main process's; a service's is its slice's (known from the
        tether's scope in the same slice) plus its name, which is how
        systemd names it. Else the manager's ControlGroup property.
        """
        self._mounts = cgroupfs.Mounts() if self._session is None else cgroupfs.Mounts.current()
        cg = self._cgroup_from_proc()
        derived = "" if cg else self._cgroup_beside_tether()
        if derived and (self._cgroup_dir_exists(derived) or self._ended_per_signals()):
            cg = derived
        elif not cg:
            # A derived path must be seen to exist while the unit runs, or a
            # wrong guess would read as an empty group: ask the manager.
            try:
                cg = self.manager.get(self.unit, interface_for(self.unit), "ControlGroup")
                # "" (or, below, no such unit): the unit has no cgroup any more,
                # it ran and ended, so the derived path's absence is the truth.
                cg = cg or derived
            except BusError as exc:
                if exc.name == NO_SUCH_UNIT:
                    cg = derived  # already ran and was collected (a service exiting at once)
                else:
                    self.warnings.append(f"could not read the unit's cgroup from the manager ({_why(exc)})")
                    cg = ""
        if cg and not self._is_unit_cgroup(cg):
            self.warnings.append(f"ignoring control group {cg!r}: not the unit's")
            cg = ""
        if cg:
            self._cgroup = cg
            self.facts["control_group"] = cg
            # The listing _pids() reads: the unified hierarchy where there is one.
            if self.tracker is not None:
                self.tracker.hierarchy = "0" if self._mounts.unified is not None else "name=systemd"
                self.tracker.cgroup = cg
                self._track(self._pids())
        self._check_limits_enforced()
        self._arm_oom_eventfd()
        self._arm_watches()

    def _cgroup_dir_exists(self, cg: str) -> bool:
        mounts = self._mounts
        if mounts is None:
            return False
        for d in (cgroupfs.unified_dir(mounts, cg), cgroupfs.v1_dir(mounts, "name=systemd", cg)):
            if d is not None and os.path.isdir(d):
                return True
        return False

    def _ended_per_signals(self) -> bool:
        """The manager has told us the unit ended (a service that exited at once)."""
        self.poll_events()
        return self._unit_gone or self._active_state in ("inactive", "failed")

    def _cgroup_beside_tether(self) -> str:
        """The service's cgroup, from the tether scope's when both share a slice."""
        if self._session is not None:
            slice_cgroup = self._session.slice_cgroup if self._session.slice == self.spec.slice else None
        else:
            tether = self._tether
            path = tether and _cgroup_of(tether.pid, self.tether_unit)
            slice_cgroup = path.rsplit("/", 1)[0] if path else None
        return f"{slice_cgroup}/{self.unit}" if slice_cgroup else ""

    def _cgroup_from_proc(self) -> str:
        """A scope's cgroup as the kernel shows it for its (held) main process."""
        return _cgroup_of(self._child.pid, self.unit) if self._child is not None else ""

    def _is_unit_cgroup(self, path: str) -> bool:
        return path.endswith("/" + self.unit)

    def _abandon(self):
        """Undo a start that failed after StartTransientUnit may have been
        accepted: a service's start job may still be queued or running (a
        Runner's shared tether would not stop it), so cancel and kill it."""
        if self._child is not None:
            self._child.abandon()
            self._child = None
        elif self.spec.unit_type == "service" and self.manager.lost is None:
            for action in (
                self.manager.stop_unit_nowait,
                lambda unit: self.manager.kill_unit(unit, "all", signal.SIGKILL),
            ):
                try:
                    action(self.unit)
                except BusError:
                    pass  # no such unit: nothing to undo
        self._end_tether()

    # -- the unit's directories -----------------------------------------
    def _dir(self, hierarchy: str) -> str | None:
        if self._cgroup is None or self._mounts is None:
            return None
        if hierarchy == "unified":
            d = cgroupfs.unified_dir(self._mounts, self._cgroup)
        else:
            d = cgroupfs.v1_dir(self._mounts, hierarchy, self._cgroup)
        return d

    def _check_limits_enforced(self):
        spec = self.spec
        unified = self._dir("unified")
        v2_ctrls = cgroupfs.controllers(unified) if unified else set()

        def kernel_has(controller: str, v2_file: str, v1_file: str, value: int) -> bool:
            """The limit reads back as set, in cgroup v2 or in the v1 hierarchy."""
            v1 = self._dir(controller)
            return (controller in v2_ctrls and cgroupfs.read_int(os.path.join(unified, v2_file)) == value) or (
                v1 is not None and cgroupfs.read_int(os.path.join(v1, v1_file)) == value
            )

        if spec.mem is not None:
            kernel = kernel_has("memory", "memory.max", "memory.limit_in_bytes", spec.mem)
            self.limits_enforced["mem"] = "kernel" if kernel else "watch"
            if not kernel:
                self.warnings.append("--mem: no memory controller for the unit; memory is watched by corral instead")
        if spec.pids is not None:
            kernel = kernel_has("pids", "pids.max", "pids.max", spec.pids)
            self.limits_enforced["pids"] = "kernel" if kernel else "none"
            if not kernel:
                self.warnings.append("--pids: no pids controller for the unit; the limit is not enforced")

    def _arm_oom_eventfd(self):
        # cgroup v1: an eventfd registered on memory.oom_control fires on OOM
        # even if the cgroup is removed right after, so a fast collection
        # cannot hide an OOM kill from us (see _oom_event for its removal signal).
        mem_v1 = self._dir("memory")
        if self.spec.mem is None or mem_v1 is None or not os.path.isdir(mem_v1):
            return
        try:
            efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            ofd = os.open(os.path.join(mem_v1, "memory.oom_control"), os.O_RDONLY | os.O_CLOEXEC)
            try:
                with open(os.path.join(mem_v1, "cgroup.event_control"), "w") as f:
                    f.write(f"{efd} {ofd}")
            finally:
                os.close(ofd)
            self._oom_eventfd = efd
        except OSError:
            pass

    def _arm_watches(self):
        """Keep the unit's cgroup v2 ``memory.events`` and ``cgroup.events``
        open and watched (``cgroupfs.KeyedWatch``, polled through ``priority_fds``).

        The manager removes the unit's cgroup as soon as the unit ends,
        often before corral learns that the main process exited (a service's
        end comes from the manager, after its clean-up; systemd 252 gives a
        scope no ``oom-kill`` result): what is not read by then is lost. So
        the OOM counters are re-read on every change of memory.events (the
        usage too, on an OOM event), and the usage is sampled when the group
        empties (cgroup.events), at the main process's exit, before TERM and
        KILL, and once verification finds the group empty. The manager is
        told of the group's emptying as early as corral (and of a service's
        exit before corral), so when the last process exits on its own the
        group is often gone before either read: the figures are also read
        every SAMPLE_INTERVAL while the run lives, and what it used in its
        last interval may then be missing.
        """
        unified = self._dir("unified")
        if unified is None:
            return
        for name in ("memory.events", "cgroup.events"):
            try:
                self._watches[name] = cgroupfs.KeyedWatch(os.path.join(unified, name))
            except OSError:
                pass  # no memory controller for the unit, or the group is already gone

    def _read_watches(self) -> None:
        """Re-read the watched files (re-arming them); sample the usage on an
        OOM event or when the group has emptied."""
        memory = self._watches.get("memory.events")
        if memory is not None and memory.alive:
            before = (memory.values.get("oom", 0), memory.values.get("oom_kill", 0))
            if memory.read() and (memory.values.get("oom", 0), memory.values.get("oom_kill", 0)) != before:
                self._sample_cgroup()
        events = self._watches.get("cgroup.events")
        if events is not None and events.alive:
            was = events.values.get("populated")
            if events.read() and events.values.get("populated") == 0 and was != 0:
                self._sample_cgroup()

    def _sample_cgroup(self) -> None:
        """Read the kernel's resource figures from the unit's cgroup while it exists."""
        if self._cgroup is not None and self._mounts is not None:
            self._usage.sample(self._dir("unified"), self._dir("memory"), self._dir("pids"))

    def watch_interval(self):
        interval = super().watch_interval()
        if self._cgroup is not None:  # also for the periodic usage sample
            interval = min(interval or SAMPLE_INTERVAL, SAMPLE_INTERVAL)
        return interval

    def check_limits(self):
        if time.monotonic() >= self._next_sample:
            self._next_sample = time.monotonic() + SAMPLE_INTERVAL
            self._sample_cgroup()
            self._track(self._pids())
        return super().check_limits()

    # -- watching ------------------------------------------------------
    def priority_fds(self):
        return [w.fileno() for w in self._watches.values() if w.alive]

    def wait_fds(self):
        # A dead connection polls readable (EOF) forever: stop watching it.
        fds = [*([] if self._conn_dead else [self.conn.fileno()]), *super().wait_fds()]
        if self._oom_eventfd is not None:
            fds.append(self._oom_eventfd)
        return fds

    def poll_events(self):
        self._read_watches()  # first: the OOM counters before the exit that may follow from them
        try:
            self.conn.read_pending()
        except BusError as exc:
            # Manager gone (or re-executing): _reconnect tries again; if it
            # never comes back, verification tells what we can prove.
            self._conn_dead = True
            if self._conn_lost_at is None:
                self._conn_lost_at = time.monotonic()
            if self.manager.lost is None:
                self.manager.lost = str(exc)
        while self.conn.signals:
            self._handle_signal(self.conn.signals.popleft())
        if (
            self._child is None
            and self._status is None
            and self._active_state in ("inactive", "failed", "deactivating")
        ):
            self._refresh_service_status()  # it ended, yet no ExecMain* change reached us: ask
        self._reap_child()
        self._oom_event()
        if self._status is not None and not self._exit_sampled:
            # The main process exited: read what its cgroup says now,
            # before anything is stopped and before the manager removes it.
            self._exit_sampled = True
            self._read_watches()
            self._sample_cgroup()

    def _reconnect(self) -> bool:
        """The CLI's own connection ended while the run lives: connect again,
        subscribe, and read the unit's state back (a re-executed manager
        deserialises its units, so the run is still there). True once
        connected. A Runner's shared connection is the session's to restore."""
        if not self._conn_dead or self._session is not None or time.monotonic() < self._next_reconnect:
            return not self._conn_dead
        self._next_reconnect = time.monotonic() + RECONNECT_EVERY
        lost = self.manager.lost
        try:
            self.conn.close()
        except Exception:
            pass
        try:
            self._open_own_connection(RECONNECT_TIMEOUT)
            loaded = self.manager.unit_loaded(self.unit)
            state = self.manager.get(self.unit, UNIT, "ActiveState") if loaded else None
        except (BusError, SetupError, OSError) as exc:
            self.manager.lost = lost or str(exc)
            return False
        if not loaded and self._pids():
            # Unknown to the manager, yet its processes still run in its
            # group: not collected (a collected unit's group is empty and
            # gone). Ask again on the next attempt, within the window.
            self.conn.close()
            return False
        self.conn.timeout = RUNTIME_CALL_TIMEOUT
        self._conn_dead, self._conn_lost_at = False, None
        self.facts["reconnected"] = self.facts.get("reconnected", 0) + 1
        # The new manager's word wins: one going down for daemon-reexec frees
        # its units and says UnitRemoved for each, this one too (VM lane).
        self._unit_gone = not loaded  # not loaded: it ended and was collected while we were away
        if loaded:
            self._active_state = state
            if self._child is None:
                self._refresh_service_status()
        return True

    def lost_track(self):
        if self._start_reply_lost is not None and self._status is None:
            return self._start_reply_lost
        if self._adopted and self._status is None and (self._unit_gone or self._active_state in ("inactive", "failed")):
            # Its start job may have failed before the command ran (we never saw the job).
            return f"{self._adopted}; it ended without an exit status of its command"
        # A service's end and exit status come only from the manager: with
        # the connection gone, watching on would wait forever.
        if self._conn_dead and self._started and self._status is None and not self._reconnect():
            # (_unit_gone is no reason to stop waiting: see _reconnect)
            if self._session is None and time.monotonic() - (self._conn_lost_at or 0) < RECONNECT_WINDOW:
                return None  # a re-executing manager comes back: keep watching (the deadline still holds)
        if self.facts.get("reconnected") and self._unit_gone and self._child is None and self._status is None:
            return (
                f"the systemd manager connection was lost and {self.unit} was collected "
                "before corral reconnected: the service's exit status cannot be known"
            )
        if self._conn_dead and self._started and self._child is None and self._status is None:
            return f"systemd manager lost ({self.manager.lost}): the service's exit status cannot be known; stopped it"
        return None

    def _handle_signal(self, msg):
        """Track the unit from its PropertiesChanged signals, so that the
        common path needs no Get round trips: ActiveState (Unit), Result and,
        for a service, ExecMainCode/ExecMainStatus all emit changes."""
        if msg.member == "UnitRemoved" and msg.body[0] == self.unit:
            self._unit_gone = True  # collected: inactive, and no more calls about it
            return
        if msg.member != "PropertiesChanged" or msg.path != self._unit_path:
            return
        interface, changed = msg.body[0], {k: v.value for k, v in msg.body[1].items()}
        if interface == UNIT:
            if "ActiveState" in changed:
                self._active_state = changed["ActiveState"]
            if changed.get("InvocationID") and "invocation_id" not in self.facts:
                self.facts["invocation_id"] = bytes(changed["InvocationID"]).hex()
            return
        if "Result" in changed:
            self.facts["unit_result"] = changed["Result"]
        if self._child is None:
            if changed.get("ExecMainPID") or changed.get("ExecMainStartTimestampMonotonic"):
                self._main_started = True
            self._sample_manager(changed)
            self._service_status_from(changed)

    def _service_status_from(self, props: dict) -> None:
        code = props.get("ExecMainCode", 0)
        if code and self._status is None:  # CLD_EXITED=1, CLD_KILLED=2, CLD_DUMPED=3
            status = props.get("ExecMainStatus", 0)
            self._status = (status & 0xFF) << 8 if code == 1 else (status & 0x7F) | (0x80 if code == 3 else 0)

    def _refresh_service_status(self):
        """Ask the manager (when a signal may have been missed)."""
        if self._status is not None:
            return
        try:
            code = self.manager.get(self.unit, interface_for(self.unit), "ExecMainCode")
            status = self.manager.get(self.unit, interface_for(self.unit), "ExecMainStatus") if code else 0
        except BusError:
            return
        self._service_status_from({"ExecMainCode": code, "ExecMainStatus": status})

    def _oom_event(self) -> bool:
        """cgroup v1: has the OOM eventfd fired for an OOM?

        The kernel also signals it once when the group is removed (to tell
        listeners the registration is gone; from a work item, so possibly
        later). A signal read while the group is still there is an OOM.
        Once the group is gone: a second signal means one of them was an
        OOM; a single one is an OOM only if the main process was SIGKILLed
        (the OOM killer's signal: corral has not stopped anything while it
        watches), not a removal after a normal end."""
        if self._oom_eventfd is not None:
            try:
                count = os.eventfd_read(self._oom_eventfd)
            except BlockingIOError:
                count = 0
            if count:
                mem_v1 = self._dir("memory")
                if mem_v1 is not None and os.path.isdir(mem_v1):
                    self._oom_seen = True
                    self._sample_cgroup()  # while the group is still there
                else:
                    self._oom_signals_after_removal += count
        if not self._oom_seen and self._oom_signals_after_removal:
            killed = (
                self._status is not None
                and os.WIFSIGNALED(self._status)
                and os.WTERMSIG(self._status) == signal.SIGKILL
                and not self._stopping
            )
            self._oom_seen = self._oom_signals_after_removal > 1 or killed
        return self._oom_seen

    def oom_killed(self):
        if self.spec.mem is None:
            return False
        if self._oom_event():
            return True
        # cgroup v2: the counters as last read; read again if the group is still there.
        self._read_watches()
        memory = self._watches.get("memory.events")
        if memory is not None and memory.values.get("oom_kill", 0) > 0:
            return True
        if (
            memory is not None
            and (memory.values.get("oom", 0) > 0 or memory.values.get("max", 0) > 0)
            and self._sigkilled_unprompted()
        ):
            # The group hit its limit and the main process died of SIGKILL that
            # corral did not send: the kernel's kill, whose oom_kill count was
            # not read before the manager removed the group (the VM lane, under
            # emulation, read {max: 1, oom: 0, oom_kill: 0} last).
            return True
        mem_v1 = self._dir("memory")
        if mem_v1:
            try:
                if cgroupfs.read_keyed(os.path.join(mem_v1, "memory.oom_control")).get("oom_kill", 0) > 0:
                    return True
            except OSError:
                pass
        return self.facts.get("unit_result") == "oom-kill"

    def _sigkilled_unprompted(self) -> bool:
        status = self._status
        return (
            status is not None
            and not self._stopping
            and os.WIFSIGNALED(status)
            and os.WTERMSIG(status) == signal.SIGKILL
        )

    def _sample_manager(self, props):
        """Keep the manager's figures (see ``usage_facts``: the larger reading
        wins); systemd 252 has no MemoryPeak and reports unset values as 2**64-1."""
        figures = self._manager_figures
        for prop_name, name in (
            ("CPUUsageNSec", "cpu_usage_nsec"),
            ("TasksCurrent", "tasks_peak"),
            ("IOReadBytes", "io_read_bytes"),
            ("IOWriteBytes", "io_write_bytes"),
        ):
            value = props.get(prop_name)
            if value is not None and value < 2**63:
                figures[name] = max(figures.get(name, 0), value)

    # -- stopping ------------------------------------------------------
    def _pids(self) -> list[int]:
        for hierarchy in ("unified", "name=systemd"):
            d = self._dir(hierarchy)
            if d and os.path.isdir(d):
                return cgroupfs.procs_below(d)
        return []

    def live_pids(self):
        return self._pids()

    def signal_all(self, *sigs):
        self._stopping = True
        self._sample_cgroup()
        self._sample_unit()
        pids = self._pids()
        self.seen.update(pids)
        self._track(pids)
        self._signalled.update(pids)
        self._stopped_count = max(self._stopped_count, len(pids))
        for sig in sigs:
            self._kill_unit(sig)
        return len(pids)

    def _kill_unit(self, sig):
        try:
            self.manager.kill_unit(self.unit, "all", sig)
        except BusError:
            pass  # unit or manager gone: verification decides whether it mattered

    def kill_all(self):
        self._stopping = True
        pids = self._pids()
        self.seen.update(pids)
        self._track(pids)
        if self.tracker is not None:
            self.tracker.kill_escaped()
        self._stopped_count = max(self._stopped_count, len(pids))
        self._kill_v1_only()
        unified = self._dir("unified")
        if unified and not os.path.isdir(unified):
            return  # the group is gone: nothing left to kill
        self._sample_cgroup()
        if self.kill_method == "cgroup.kill" and unified and cgroupfs.kill(unified):
            return
        self._kill_unit(signal.SIGKILL)

    def _kill_v1_only(self) -> None:
        """Hybrid layout: a process that left the unit's cgroup in the unified
        hierarchy only is still listed in name=systemd, where cgroup.kill does
        not reach: SIGKILL it through a pidfd checked against that listing."""
        systemd_v1 = self._dir("name=systemd")
        if self._dir("unified") is None or not systemd_v1 or not os.path.isdir(systemd_v1):
            return
        if pids := cgroupfs.procs_below(systemd_v1):
            signal_cgroup_members(pids, (signal.SIGKILL,), systemd_v1)

    def signal_new(self, *sigs):
        directory = self._dir("unified") or self._dir("name=systemd")
        fresh = [pid for pid in self._last if pid not in self._signalled]
        if not fresh or directory is None:
            return 0
        done = signal_cgroup_members(fresh, sigs, directory)
        self._signalled.update(fresh)
        return len(done)

    def verify_empty(self):
        self.reap()
        left = []
        unified = self._dir("unified")
        if unified and cgroupfs.populated(unified):
            left = cgroupfs.procs_below(unified) or [-1]
        systemd_v1 = self._dir("name=systemd")
        if systemd_v1 and os.path.isdir(systemd_v1):
            v1 = cgroupfs.procs_below(systemd_v1)
            if v1 and unified and not left and self.tracker is not None and self.tracker.cgroup is not None:
                # Out of the unit in the unified hierarchy, still in it in name=systemd: left it.
                self.tracker.escaped.update(p for p in v1 if self.tracker.in_group(p) is False)
            left = sorted(set(left) | set(v1))
        if self._cgroup is None and self._started:
            # No cgroup to ask the kernel about: only a live manager's word
            # that the unit is gone will do.
            if not self._unit_inactive() or self.manager.lost is not None:
                return [-1]
            return []
        if left:
            return [p for p in left if p != -1] or left
        # The kernel says empty: the figures are final, and the manager may
        # remove the group any moment now. The unit must also be inactive or gone.
        self._sample_cgroup()
        if not self._unit_inactive():
            self.poll_events()
            if not self._unit_inactive():
                return [-1]
        # Whatever of the run still lives is outside the group: find and kill it.
        if self.tracker is not None and (escaped := self.tracker.sweep(self._pinned_sessions())):
            self._stopped_count = max(self._stopped_count, len(self.tracker.escaped))
            return escaped
        return []

    def _unit_inactive(self) -> bool:
        """The unit is inactive, failed or gone (a vanished manager has no units)."""
        if self._unit_gone:
            return True
        if self._active_state in ("inactive", "failed"):
            return True
        self._inactive_checks += 1
        if (
            self._inactive_checks == 2
            and self.spec.unit_type == "scope"
            and self._cgroup
            and self._started
            and self.manager.lost is None
        ):
            # An empty scope is stopped by the manager once it notices the
            # empty cgroup; nudge it rather than wait for that. The reply
            # does not matter (PropertiesChanged tells), so none is awaited.
            try:
                self.manager.stop_unit_nowait(self.unit)
            except BusError:
                pass
        if self._inactive_checks <= 4:
            return False  # PropertiesChanged will say "inactive"; see poll_events
        try:
            state = self.manager.get(self.unit, UNIT, "ActiveState")
        except BusError as exc:
            if exc.name in (NO_SUCH_UNIT, "org.freedesktop.DBus.Error.UnknownObject"):
                self._unit_gone = True
                return True
            if self.manager.lost is not None:
                # No manager, no unit: the kernel's word on the cgroup decides.
                self._unit_gone = True
                self.warnings.append(
                    f"systemd manager lost during the run ({self.manager.lost}); emptiness proven from the cgroup alone"
                )
                return True
            return False
        self._active_state = state
        return state in ("inactive", "failed")

    def _sample_unit(self):
        try:
            props = self.manager.get_all(self.unit, interface_for(self.unit))
        except BusError:
            return
        self._sample_manager(props)
        if props.get("Result"):
            self.facts["unit_result"] = props["Result"]

    # -- cleanup -------------------------------------------------------
    def _end_tether(self):
        if self._tether is not None:
            self._tether.close()
            self._tether = None

    def close(self):
        if self.conn is None:
            return
        if self._started and not self._unit_gone and self.manager.lost is None:
            if self.facts.get("unit_result") is None:  # not yet told by PropertiesChanged
                try:
                    self.facts["unit_result"] = self.manager.get(self.unit, interface_for(self.unit), "Result")
                except BusError:
                    pass
            if not self.direct:
                try:
                    self.manager.unref_unit(self.unit)
                except BusError:
                    pass
        if self._keep_failed and not self._unit_gone and self.manager.lost is None:
            try:
                self.manager.reset_failed_unit(self.unit)
            except BusError:
                pass  # not failed (already collected) or gone
        self._end_tether()
        self._remove_env_file()  # a service adopted after a lost reply: kept until now
        if self.tracker is not None:
            self.tracker.close()
        self._release_main()
        if self._child is not None and self._child.pidfd >= 0:
            os.close(self._child.pidfd)
            self._child.pidfd = -1
        if self._oom_eventfd is not None:
            os.close(self._oom_eventfd)
            self._oom_eventfd = None
        for watch in self._watches.values():
            watch.close()
        self.conn.close()  # a session's channel: just stop routing to it
        self.conn = None

    def describe(self):
        info = dict(self.facts)
        info.update(usage_facts(self._usage.figures, self._manager_figures))
        if self.tracker is not None:
            info.update(self.tracker.facts())
        memory = self._watches.get("memory.events")
        if memory is not None:
            info["memory_events"] = {key: memory.values.get(key, 0) for key in ("max", "oom", "oom_kill")}
        return info

    @property
    def processes_stopped(self) -> int:
        return self._stopped_count


def _why(exc: BusError) -> str:
    names = {
        "org.freedesktop.DBus.Error.ServiceUnknown": "manager not running on this bus",
        "org.freedesktop.DBus.Error.NameHasNoOwner": "manager not running on this bus",
        "org.freedesktop.DBus.Error.AccessDenied": "permission denied",
        "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired": "permission denied (needs authorization)",
    }
    return names.get(exc.name or "", str(exc))


#: What systemd accepts in Environment= (env_assignment_is_valid): a name
#: of [A-Za-z0-9_] not starting with a digit, a value with no control
#: characters other than tab and newline.
_ENV_NAME = re.compile(r"(?![0-9])[A-Za-z0-9_]+")
_ENV_VALUE = re.compile(r"[^\x00-\x08\x0b-\x1f\x7f]*")


def _valid_env(key: str, value: str) -> bool:
    if _ENV_NAME.fullmatch(key) is None or _ENV_VALUE.fullmatch(value) is None:
        return False
    try:
        value.encode("utf-8")  # systemd wants valid UTF-8; undecodable bytes arrive as surrogates
    except UnicodeEncodeError:
        return False
    return True


def _resolve_for_service(name: str, env: dict, cwd: str | None) -> str:
    """The service's executable, found as a scope's exec finds it (after
    chdir to the command's cwd, with its PATH), or ExecError: 127 for not
    found (also a missing cwd, as chdir gives), 126 for not executable, a
    directory, permission denied."""
    # Relative PATH entries (and empty ones: the cwd) are relative to the command's cwd.
    return resolve_in_cwd(name, env.get("PATH", os.defpath), cwd)


def _env_file_value(value: str) -> str:
    """``value`` as systemd's environment-file parser reads it back exactly:
    double-quoted, with backslash before each of ``"`` ``\\`` `` ` `` ``$``
    (the characters it unescapes there); newlines and tabs stand as they are."""
    for char in ("\\", '"', "`", "$"):
        value = value.replace(char, "\\" + char)
    return f'"{value}"'


def _env_file_dirs() -> list[str]:
    """Where a service's environment file may go: a directory of ours on a
    tmpfs that the manager can read. The user's runtime directory (a user
    manager runs as the user; root's system manager reads anything), /run
    for root, else /dev/shm."""
    uid = os.geteuid()
    out = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        out.append(os.path.join(runtime, "corral-env"))
    if uid == 0:
        out.append("/run/corral-env")
    out.append(f"/dev/shm/corral-env-{uid}")
    return out


class _EnvFile:
    """A service's environment as a 0600 file in a private directory (0700,
    ours, not a symlink; made if missing), named by the run id and 16 random
    bytes, written O_EXCL. OSError if no such directory can be had."""

    def __init__(self, run_id: str, environment: dict):
        import stat

        data = "".join(f"{key}={_env_file_value(value)}\n" for key, value in environment.items())
        encoded = data.encode("utf-8")
        errors = []
        for directory in _env_file_dirs():
            try:
                try:
                    os.mkdir(directory, 0o700)
                except FileExistsError:
                    pass
                st = os.lstat(directory)
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
                    raise OSError(f"{directory} is not a private directory of ours")
                path = os.path.join(directory, f"{run_id}.{os.urandom(16).hex()}.env")
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                errors.append(str(exc))
                continue
            try:
                view = memoryview(encoded)
                while view:
                    view = view[os.write(fd, view) :]
            except BaseException:
                os.unlink(path)
                raise
            finally:
                os.close(fd)
            self.path = path
            return
        raise OSError("; ".join(errors))

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _cgroup_of(pid: int, unit: str) -> str:
    """``pid``'s cgroup path as the kernel shows it, if it is ``unit``'s.

    Only a path that ends in the unit's own name is accepted: a stale or
    foreign path (e.g. a v1 hierarchy systemd does not manage, which reads
    "/") must never become the group corral kills.
    """
    try:
        lines = [line.split(":", 2) for line in read_bytes(f"/proc/{pid}/cgroup").decode().splitlines()]
    except OSError:
        return ""
    # The unified line first (the tree systemd tracks processes in), then name=systemd.
    for hierarchy, controllers, path in sorted(lines, key=lambda line: line[0] != "0"):
        if (hierarchy == "0" or "name=systemd" in controllers.split(",")) and path.endswith("/" + unit):
            return path
    return ""


def _subscribe(conn: Connection, manager: Manager, *, all_units: bool = False) -> None:
    """Make sure the manager's signals reach ``conn``, once per connection
    (before any start). A private connection gets them all unasked. On a
    bus: match JobRemoved (and, for a shared connection, every unit's
    PropertiesChanged and UnitRemoved) and Subscribe."""
    if conn.subscribed:
        return
    if conn.unique_name is not None:
        manager.add_match(f"type='signal',sender='org.freedesktop.systemd1',interface='{MANAGER}',member='JobRemoved'")
        if all_units:
            manager.add_match(
                f"type='signal',sender='org.freedesktop.systemd1',interface='{MANAGER}',member='UnitRemoved'"
            )
            manager.add_match(
                "type='signal',sender='org.freedesktop.systemd1',interface='"
                + PROPS
                + "',member='PropertiesChanged',path_namespace='/org/freedesktop/systemd1/unit'"
            )
        manager.subscribe()
    conn.subscribed = True


def _pump_signals(conn, handle, done, timeout: float) -> bool:
    """Feed ``conn``'s signals to ``handle`` until ``done()`` or ``timeout``; return ``done()``."""
    end = time.monotonic() + timeout
    while True:
        while conn.signals and not done():
            handle(conn.signals.popleft())
        if done():
            return True
        left = end - time.monotonic()
        if left <= 0 or not wait_fd(conn.fileno(), left):
            return done()
        conn.read_pending()


def _wait_job(conn, job: str, other=lambda msg: None, *, what: str) -> str:
    """Wait for JobRemoved of ``job``; pass other signals to ``other``."""
    result = []

    def handle(msg):
        if msg.member == "JobRemoved" and msg.body[1] == job:
            result.append(msg.body[3])
        else:
            other(msg)

    if not _pump_signals(conn, handle, lambda: bool(result), START_TIMEOUT):
        raise SetupError(f"systemd did not start {what} within {START_TIMEOUT:g}s")
    return result[0]


def _tether_properties(pid: int, slice_: str, for_what: str) -> list:
    return [
        prop("Description", "s", f"corral tether for {for_what}"),
        prop("PIDs", "au", [pid]),
        prop("Slice", "s", slice_),
        prop("CollectMode", "s", "inactive-or-failed"),
    ]


class SystemdSession:
    """What a library Runner shares between its systemd runs.

    One manager connection (the private socket where possible), shared by
    all runs through a ``Multiplexer`` (a reader thread routes replies and
    each unit's signals to its run), and one tether (with its scope) for all
    runs, so a run costs one StartTransientUnit and no extra process or
    connection. Thread-safe. Failure modes: SetupError from the constructor
    when no manager answers or the tether cannot be started; once the
    connection ends, every run's calls fail and its manager counts as lost.
    """

    def __init__(self, manager: str = "auto", slice_: str = "corral.slice"):
        from ..baton import Baton
        from ..dbus.mux import Multiplexer

        self.slice = slice_
        self.manager_kind, conn = connect_manager(manager, START_TIMEOUT)
        try:
            _subscribe(conn, Manager(conn), all_units=True)
        except BusError as exc:
            conn.close()
            raise SetupError(f"{self.manager_kind} manager not usable: {_why(exc)}") from None
        self._mux = Multiplexer(conn)
        #: Its runs take turns running Python (see ``baton.py``).
        self.baton = Baton()
        self._tether: Tether | None = None
        self.tether_unit = f"corral-runner-{os.getpid()}-{os.urandom(4).hex()}-tether.scope"
        #: The slice's cgroup, as the kernel shows it for the tether's scope.
        self.slice_cgroup: str | None = None
        try:
            self._start_tether()
        except BaseException:
            self._mux.close()
            raise

    @property
    def lost(self) -> bool:
        """The connection ended (manager gone or re-executed): make a new session."""
        return self._mux.lost is not None

    def channel(self, unit: str, path: str):
        """A connection-like view for one unit's run (see ``mux.Channel``)."""
        return self._mux.channel(unit, path)

    def _start_tether(self) -> None:
        chan = self.channel(self.tether_unit, unit_path(self.tether_unit))
        manager = Manager(chan)
        self._tether = Tether()
        try:
            job = manager.start_transient_unit(
                self.tether_unit, _tether_properties(self._tether.pid, self.slice, f"runner {os.getpid()}")
            )
            result = _wait_job(chan, job, what=self.tether_unit)
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
        path = _cgroup_of(self._tether.pid, self.tether_unit)
        self.slice_cgroup = path.rsplit("/", 1)[0] if path else None

    def close(self) -> None:
        """End the tether (units bound to it stop) and the connection."""
        tether, self._tether = self._tether, None
        if tether is not None:
            tether.close()
        self._mux.close()
