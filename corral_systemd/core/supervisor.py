"""The run loop, the same for every engine.

    start -> watch (main exit | deadline | limit | output cap | signal)
          -> stop (TERM+CONT, grace, KILL) -> verify -> result

Guarantees:
- The run ends when the command's main process exits, not when its output
  pipes close: a descendant holding stdout cannot make corral hang.
- Whatever ended the watch, the stop sequence runs: leftovers get SIGTERM
  (and SIGCONT, so stopped processes act on it), then SIGKILL after
  ``grace``, then corral keeps killing, reaping and re-checking until the
  engine proves the run empty or ``verify_timeout`` passes. In the latter
  case the result lists the remaining pids and the exit code is 120.
- Every signal that would end corral (SIGINT, SIGTERM, SIGHUP, SIGQUIT,
  SIGUSR1/2, SIGALRM, ... : ``kernel.signals``) ends the run instead: stop,
  verify, exit 128+N. A second one during the grace period skips to SIGKILL.

The loop is synchronous (select.poll) so the fallback path never imports
asyncio; engines that talk to systemd hand their bus socket to the loop
through ``wait_fds()`` (polled for input) and open cgroup notification
files through ``priority_fds()`` (polled for POLLPRI only).

The run loop, its poll round (output, signals, cancellation, the engine's
descriptors) and the observer protocol belong together (each step's timing
is in the record); the stop sequence itself is ``stopping.py``, the signal
pipe the loop polls ``signalwatch.py``.
"""

import _signal  # not signal: the same numbers without enum's start-up cost
import os
import select
import sys
import time

from ..common import baton
from ..common.cleanup import ExitStack
from ..common.errors import SetupError, UsageError
from ..common.limits import ENDS_RUN, MAX_OUTPUT
from ..common.nesting import command_env, outer_run
from ..common.stopping import stop_and_verify
from ..kernel import handoff
from ..kernel.rlimits import OwnLimits, lowered_limit
from ..kernel.spawn import ExecError
from . import result as R
from .signalwatch import STOP_SIGNALS, SignalWatch

#: Where the sealed tokens this process holds are kept (``identity.serving``): no
#: token exists unless the registry was loaded, which a --no-registry run never does.
_TOKENS_MODULE = __name__.rsplit(".", 2)[0] + ".state.registry.identity"

TYPE_CHECKING = False  # output.py and pty.py load only for a run that uses them (start-up)
if TYPE_CHECKING:
    from .output import OutputPump
    from .pty import Pty

#: Longest single poll() wait (an hour; poll's own limit is INT_MAX ms).
_MAX_POLL_MS = 3600 * 1000
# After the run is proven empty, its pipes are read until EOF for at most
# this long (a descriptor passed to an outside process could keep a pipe
# open forever). Only the reading is bounded: every byte read (up to the
# cap) is then delivered, however slow the reader (``OutputPump.flush``).
_DRAIN_LIMIT = 0.5


#: Step names as events: what an observer is told, in this order of time.
_EVENT_NAMES = {"spawned": "started", "deadline": "deadline_expired"}
#: Said once in the record when corral was continued (SIGCONT) while it supervised the run: it
#: was stopped -- by the command (a process of its uid), or a job control stop -- and any deadline
#: that fell in the stop was kept only when it went on (or by its tether's backstop).
STOPPED_WARNING = (
    "corral itself was stopped (SIGSTOP) during the run and continued: a deadline passed meanwhile was kept late"
)


class RunObserver:
    """What the supervisor tells an observer (the registry, a test).

    ``event(name, data)`` is called synchronously at each step, *before*
    the supervisor acts on it: ``deadline_expired`` returns before the first
    signal is sent, so an observer that writes it durably has it on disk
    first. Names: started, deadline_expired, limit_exceeded,
    signal_received, command_exited, term_sent, kill_sent, verified,
    unverified, finished. Nothing is told between steps: a waiting run
    reads nothing for its observer.

    An observer that raises (a state directory removed by the command, a
    full filesystem) is never allowed to skip the stop and the proof: the
    supervisor stops telling it, goes on with the run, and reports the
    failure in the result's ``warnings`` (``registry: ...``) and
    ``observer_error``, so an audit that cannot be written is not silently
    lost.
    """

    def event(self, name: str, data: dict) -> None:
        pass


class Supervisor:
    """Runs one RunSpec on one engine and returns a RunOutcome.

    ``signals``: a SignalWatch (CLI, main thread) or None. ``cancel_fd``: a
    descriptor whose readability asks the run to stop (library use).
    ``observer``: a RunObserver, told of every step. ``stdout``/``stderr``:
    where the command's output goes — a file descriptor (passed to the
    command as is, unless --max-output needs counting) or a callable that
    receives each chunk. ``stdin_fd``: what ``spec.stdin == "inherit"`` gives.
    """

    def __init__(
        self,
        spec,
        engine,
        *,
        signals: SignalWatch | None = None,
        cancel_fd: int | None = None,
        stdout=1,
        stderr=2,
        stdin_fd: int = 0,
        observer: RunObserver | None = None,
        ends_with: dict[int, str] | None = None,
        watches: dict | None = None,
    ):
        self.spec = spec
        self.engine = engine
        self.signals = signals
        self.cancel_fd = cancel_fd
        #: Pidfds whose process's exit ends the run (stopped as by SIGTERM), each with
        #: the warning that says why: its session's holder and owner (``RunGuard.session_ends``).
        self.ends_with = dict(ends_with or {})
        #: Other descriptors to wait on, each with what to call when it is readable (``RunRequest.watches``).
        self.watches = dict(watches or {})
        self.observer = observer
        self._stdout = stdout
        self._stderr = stderr
        self._stdin_fd = stdin_fd
        self._output_file_fd: int | None = None  # --output-file, closed when the run ends
        self._pty: Pty | None = None  # --pty, closed (terminal restored) when the run ends
        self._limits = OwnLimits()
        self._t0 = 0.0
        #: The engine's descriptors woke a wait: its limits are checked next round.
        self._engine_woke = False
        self.result = R.RunOutcome(
            run_id=spec.run_id,
            mode=engine.mode,
            guarantee=engine.guarantee,
            argv=list(spec.argv),
            cwd=spec.cwd or os.getcwd(),
            limits=spec.limits(),
            output_limit=spec.output_limit,
            output_file=spec.output_file,
            nested_in=outer_run(),
            pty=spec.pty,
        )

    # -- helpers -------------------------------------------------------
    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _step(self, name: str, **data) -> None:
        if name in self.result.steps:
            return
        self.result.steps[name] = round(self._now(), 6)
        self._tell("event", _EVENT_NAMES.get(name, name), data)

    def _tell(self, method: str, *args) -> None:
        """Call the observer; a failure is reported once and ends the observing, never the run."""
        if self.observer is None:
            return
        try:
            getattr(self.observer, method)(*args)
        except Exception as exc:  # noqa: BLE001 -- the stop and the proof come first
            self.observer = None
            what = args[0] if method == "event" else "the run's processes"
            message = (
                f"registry: could not record {what}: {exc}; "
                "later steps are not recorded (the stop and the proof went on)"
            )
            self.result.observer_error = message
            self.result.warnings.append(message)

    # -- the run -------------------------------------------------------
    def run(self) -> R.RunOutcome:
        res = self.result
        res.started_at = time.time()
        res.started_monotonic = self._t0 = time.monotonic()
        pump = None
        self._limits = OwnLimits()  # as the command inherits them; put back if it lowers corral's
        try:
            try:
                pump = self._start()
            except ExecError as exc:
                res.reason, res.detail = R.SPAWN_FAILED, str(exc)
                res.verified = True  # nothing ran
                return self._finish(spawn_exit=exc.exit_code)
            except SetupError as exc:
                res.reason, res.detail = R.SETUP_FAILED, str(exc)
                self._stop_and_verify(pump)  # nothing should exist; prove it anyway
                return self._finish()
            except UsageError:
                raise  # refused before anything started (what only the engine can check)
            except Exception as exc:  # a bug, or the engine failing after the command started
                res.reason, res.detail = R.INTERNAL_ERROR, f"while starting: {exc!r}"
                self._limits.restore()
                self._stop_and_verify(pump)
                return self._finish()
            try:
                self._limits.retrying(self._spawned)()
                self._watch(pump)
            except Exception as exc:  # a bug, a lost manager, a limit the command lowered: never skip the stop
                res.reason, res.detail = R.INTERNAL_ERROR, f"while watching: {exc!r}"
            self._limits.restore()
            try:
                self._stop_and_verify(pump)
            except Exception as exc:
                res.reason, res.detail = R.INTERNAL_ERROR, f"while stopping: {exc!r}"
                res.verified = False
                try:
                    self.engine.kill_all()
                except Exception:
                    pass
            if pump is not None:
                try:
                    self._drain(pump)
                except Exception as exc:
                    res.warnings.append(f"the command's last output could not be read: {exc!r}")
            self._limits.restore()
            outcome = self._finish()
            if pump is not None:
                # The run is over: now the reader may take its time.
                pump.flush(self._abort_fds(), self._abort_requested)
            return outcome
        finally:
            if pump is not None:
                pump.close()
            if self._output_file_fd is not None:
                os.close(self._output_file_fd)
            if self._pty is not None:
                self._pty.close()  # corral's terminal back as it was
            self.engine.close()

    def _drain(self, pump: "OutputPump") -> None:
        """Read what the command left in its pipes; output past the cap is the run's outcome.

        Output read after the main process exited still counts: a command
        that wrote past the cap and exited did exceed it (122), even if
        corral saw the exit first.
        """
        res = self.result
        pump.drain(_DRAIN_LIMIT)
        pump.finish()
        res.output_bytes = pump.total
        res.output_omitted_bytes = pump.omitted
        if pump.copy_error is not None:
            res.warnings.append(pump.copy_error)
        if pump.exceeded and res.reason == R.EXITED:
            self._step("limit_exceeded", limit="max_output")
            res.reason = R.OUTPUT

    def _abort_requested(self, fd: int) -> bool:
        if self.signals is not None and fd == self.signals.read_fd:
            return any(num in self.signals.stop_signals for num in self.signals.drain())
        return True  # the cancel pipe: a byte, or EOF

    def _abort_fds(self) -> tuple:
        """What may cut short the final delivery of output: a stop signal, a cancel."""
        return tuple(
            fd for fd in (self.signals.read_fd if self.signals is not None else None, self.cancel_fd) if fd is not None
        )

    def _command_stdin(self) -> int:
        """The command's stdin: /dev/null, corral's own, or the library's bytes."""
        spec = self.spec
        if spec.stdin == "null":
            return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        if isinstance(spec.stdin, bytes):
            # Bytes for stdin: a sealed-size memory file the command reads to EOF.
            stdin = os.memfd_create("corral-stdin", os.MFD_CLOEXEC)
            os.write(stdin, spec.stdin)
            os.lseek(stdin, 0, os.SEEK_SET)
            return stdin
        return self._stdin_fd

    def _start(self) -> "OutputPump | None":
        """The command's stdio, then the engine's start: the output pump on
        success (the run's to close); on failure nothing of it left open."""
        spec = self.spec
        # trio's pair: ``always_cleanup`` closes what only the command keeps
        # (its ends of the pipes, its stdin, the pty's terminal side) once it
        # runs or failed to; ``cleanup_on_fail`` what is the run's on success.
        with ExitStack() as always_cleanup, ExitStack() as cleanup_on_fail:
            pump = None
            shaped = spec.max_output is not None or spec.output_limit is not None or spec.output_file is not None
            if spec.pty:
                from .output import OutputPump
                from .pty import Pty

                # The command's stdio is the pty's terminal side; its output
                # comes back through the master (core/pty.py).
                # What is typed into it: corral's stdin ("inherit", the CLI's
                # --pty), the library's pipe, or its bytes; never /dev/null.
                self._pty = Pty(
                    stdin_fd=self._stdin_fd if spec.stdin in ("inherit", "pipe") else None,
                    typed=spec.stdin if isinstance(spec.stdin, bytes) else b"",
                )
                always_cleanup.callback(self._pty.close_slave)  # the command has its own
                pump = OutputPump(
                    {self._pty.master: self._stdout},
                    spec.max_output,
                    keep=spec.output_limit,
                    copy_fd=self._open_output_file(),
                )
                cleanup_on_fail.callback(pump.close)
                stdio = (self._pty.slave,) * 3
            else:
                stdin = self._command_stdin()
                if stdin != self._stdin_fd:
                    always_cleanup.callback(os.close, stdin)
                if shaped or callable(self._stdout) or callable(self._stderr):
                    from .output import OutputPump

                    copy_fd = self._open_output_file()
                    out_r, out_w = os.pipe2(os.O_CLOEXEC)
                    always_cleanup.callback(os.close, out_w)
                    err_r, err_w = os.pipe2(os.O_CLOEXEC)
                    always_cleanup.callback(os.close, err_w)
                    os.set_blocking(out_r, False)
                    os.set_blocking(err_r, False)
                    pump = OutputPump(
                        {out_r: self._stdout, err_r: self._stderr},
                        spec.max_output,
                        keep=spec.output_limit,
                        copy_fd=copy_fd,
                    )
                    cleanup_on_fail.callback(pump.close)
                    stdio = (stdin, out_w, err_w)
                else:
                    stdio = (stdin, self._stdout, self._stderr)
            env = command_env(spec.env, spec.run_id)  # CORRAL_RUN_ID: a corral inside knows (nesting.py)
            # What the command could ask to start work outside the run: a
            # sealed run hides it all, and its variables go; else the record lists it.
            channels = handoff.survey(env)
            if spec.sealed:
                env = channels.command_env(env)
            self.engine.start(
                spec.argv,
                stdin=stdio[0],
                stdout=stdio[1],
                stderr=stdio[2],
                env=env,
                cwd=spec.cwd,
                survey=channels,
            )
            self.result.handoff = handoff.DENIED if spec.sealed else channels.open
            self._limits.restore()  # the command may have lowered them already
            cleanup_on_fail.pop_all()
        if self._pty is not None:
            self._pty.raw()
        return pump

    def _spawned(self) -> None:
        """The step "spawned": read once the command runs (it may have
        lowered corral's limits already: the caller retries), where a
        failure is the watch's, which never skips the stop."""
        self._step(
            "spawned",
            pid=self.engine.main_pid,
            **{k: v for k, v in self.engine.describe().items() if k in ("unit", "control_group")},
        )

    def _open_output_file(self) -> int | None:
        """--output-file (``output.open_output_file``), closed when the run ends."""
        from .output import open_output_file

        self._output_file_fd = open_output_file(self.spec.output_file)
        return self._output_file_fd

    def _watch(self, pump: "OutputPump | None") -> None:
        """Wait until something ends the run; record why."""
        deadline = self.spec.wall
        next_watch = self._next_watch(self._now())
        while True:
            try:
                next_watch = self._watch_round(pump, deadline, next_watch)
            except (OSError, MemoryError) as exc:
                # The command lowered corral's limits between two restores (prlimit
                # --pid $PPID): put them back and look again; anything else is a failure.
                if lowered_limit(exc) and self._limits.restore():
                    continue
                raise
            if next_watch is False:
                return

    def _next_watch(self, now: float) -> float | None:
        """When the engine next needs ``check_limits()`` (``watch_interval``:
        asked again after each check; None: only after its events)."""
        wait = self.engine.watch_interval()
        return None if wait is None else now + wait

    def _watch_round(self, pump, deadline, next_watch):
        """One look at the run and one wait: False when the run ends (the
        reason recorded), else the next time limits are checked (None: only
        after the engine's events). The limits are checked when that time
        has come and after every wake-up by the engine's descriptors (an OOM
        kill, the group emptying), which no timer waits for."""
        res, engine = self.result, self.engine
        if engine.main_status() is not None:
            self._step("command_exited", status=engine.main_status())
            if deadline is not None and self._now() >= deadline and self.signals is not None and self.signals.continued:
                # corral was stopped past the deadline, and its tether stopped the run in its
                # place (engines/fallback_tether.py, tether.py): the run ended at its wall.
                res.reason = R.TIMEOUT
                return False
            # An OOM kill ends the main process like any SIGKILL: ask.
            res.reason = R.MEMORY if engine.oom_killed() else R.EXITED
            return False
        if (why := engine.lost_track()) is not None:
            res.reason, res.detail = R.INTERNAL_ERROR, why
            return False
        now = self._now()
        if deadline is not None and now >= deadline:
            self._step("deadline")
            res.reason = R.TIMEOUT
            return False
        if self._engine_woke or (next_watch is not None and now >= next_watch):
            self._engine_woke = False
            if (name := engine.check_limits()) is not None:
                self._step("limit_exceeded", limit=name)
                res.reason = ENDS_RUN[name].reason
                return False
            next_watch = self._next_watch(now)
        if pump is not None and pump.exceeded:
            self._step("limit_exceeded", limit=MAX_OUTPUT.field)
            res.reason = R.OUTPUT
            return False
        # The checks above read /proc and cgroup files, slow on a loaded machine:
        # wait from now, not from before them, or the deadline is noticed late.
        now = self._now()
        timeout = None
        for t in (deadline, next_watch):
            if t is not None:
                timeout = t - now if timeout is None else min(timeout, t - now)
        sig = self._wait(pump, timeout)
        if sig is not None:
            self._step("signal_received", signal=sig)
            res.reason, res.corral_signal = R.INTERRUPTED, sig
            return False
        return next_watch

    def _wait(self, pump, timeout: float | None) -> int | None:
        """One poll round: pump output, feed the engine; return a stop signal if one came."""
        poller = select.poll()
        engine_fds = self.engine.wait_fds()
        for fd in engine_fds:
            poller.register(fd, select.POLLIN)
        for fd in self.engine.priority_fds():  # cgroup files: POLLPRI only (see Engine.priority_fds)
            poller.register(fd, select.POLLPRI)
            engine_fds.append(fd)
        if pump is not None:
            for fd in pump.fds():
                poller.register(fd, select.POLLIN)
            for fd in pump.write_fds():  # output the caller has not read yet: never waited for
                poller.register(fd, select.POLLOUT)
        pty_in = self._pty.input_fds() if self._pty is not None else []
        pty_out = self._pty.write_fds() if self._pty is not None else []
        for fd in pty_in:
            poller.register(fd, select.POLLIN)
        for fd in pty_out:
            poller.register(fd, select.POLLOUT)
        if self.signals is not None:
            poller.register(self.signals.read_fd, select.POLLIN)
        if self.cancel_fd is not None:
            poller.register(self.cancel_fd, select.POLLIN)
        tokens = sys.modules.get(_TOKENS_MODULE)
        # And the registry token's readers, answered here.
        watches = {**self.watches, **(tokens.serving() if tokens is not None else {})}
        for fd in (*self.ends_with, *watches):
            poller.register(fd, select.POLLIN)
        # poll() takes at most INT_MAX ms (~24 days): a longer wait is cut into
        # rounds (the loop re-computes what it waits for after each).
        ms = None if timeout is None else min(max(0, timeout * 1000), _MAX_POLL_MS)
        try:
            events = baton.poll(poller, ms)
        except InterruptedError:
            events = []
        self._limits.restore()  # the command may have lowered corral's (prlimit --pid $PPID)
        stop_sig = None
        for fd, _ in events:
            if self.signals is not None and fd == self.signals.read_fd:
                for num in self.signals.drain():
                    if num in self.signals.stop_signals and stop_sig is None:
                        stop_sig = num
                    elif num == _signal.SIGWINCH and self._pty is not None:
                        self._pty.resize()
            elif self._pty is not None and fd in pty_in:
                self._pty.on_input()
            elif self._pty is not None and fd in pty_out:
                self._pty.push()
            elif self.cancel_fd is not None and fd == self.cancel_fd:
                # One byte per request (a second one skips the grace period):
                # a stop signal's number stops the run as that signal would
                # (the corral service forwards its client's), anything else
                # as SIGTERM. EOF (the writer died) is one request, then stop watching.
                data = os.read(self.cancel_fd, 64)
                if not data:
                    self.cancel_fd = None
                asked = data[-1] if data and data[-1] in STOP_SIGNALS else _signal.SIGTERM
                stop_sig = stop_sig or asked
            elif fd in self.ends_with:
                self.result.warnings.append(self.ends_with.pop(fd))  # once: it has exited
                stop_sig = stop_sig or _signal.SIGTERM
            elif fd in watches:
                watches[fd]()
            elif pump is not None and fd in pump.routes:
                pump.pump(fd)
            elif pump is not None:
                pump.writable(fd)
        woke = any(fd in engine_fds for fd, _ in events)
        self._engine_woke = self._engine_woke or woke
        if woke or self.signals is not None:
            self.engine.poll_events()
        return stop_sig

    def _stop_and_verify(self, pump: "OutputPump | None") -> None:
        """The stop sequence (``stopping``), with output pumped while it waits."""

        # The command may go on lowering corral's limits while it is stopped
        # (TERM ignored, the grace period): each operation survives that.
        # Past a hundred lost races, the command's process group is SIGKILLed
        # (Engine.kill_without_descriptors): it forfeits its grace period.
        def retrying(fn):
            return self._limits.retrying(fn, last_resort=self.engine.kill_without_descriptors)

        outcome = stop_and_verify(
            _LimitsRestored(self.engine, retrying),
            grace=self.spec.grace,
            verify_timeout=self.spec.verify_timeout,
            wait=retrying(lambda seconds: self._wait(pump, seconds) is not None),
            step=self._step,
            clock=self._now,
        )
        self.result.verified = outcome.verified
        self.result.remaining_pids = outcome.remaining
        if outcome.unproven is not None:
            self.result.warnings.append(outcome.unproven)
        # The main process's status, if it died during the stop.
        self.engine.poll_events()

    def _finish(self, spawn_exit: int | None = None) -> R.RunOutcome:
        res, engine = self.result, self.engine
        # A setup failure (125) means the command did not run: whatever the
        # engine saw (e.g. a service that failed before exec) is not its result.
        status = engine.main_status() if res.reason != R.SETUP_FAILED else None
        if status is not None:
            if os.WIFSIGNALED(status):
                res.command_signal = os.WTERMSIG(status)
            else:
                res.command_exit_status = os.waitstatus_to_exitcode(status)
        res.processes_seen = len(engine.seen)
        res.processes_stopped = engine.processes_stopped
        res.limits_enforced = dict(engine.limits_enforced)
        res.handed_off = engine.handed_off()
        res.warnings = [*engine.warnings, *res.warnings]  # the engine's, then a registry failure
        try:
            res.engine = engine.describe()
            if engine.auto_fallback_reason:
                res.engine["auto_fallback_reason"] = engine.auto_fallback_reason
        except Exception as exc:  # the stop and the proof are done: their outcome stands, said unproven
            res.engine = {}
            res.reason, res.detail = R.INTERNAL_ERROR, f"while describing the run: {exc!r}"
        if self.signals is not None:
            self.signals.drain()  # a SIGCONT said since the loop's last look
            if self.signals.continued:
                res.warnings.append(STOPPED_WARNING)
        if self._limits.restored:
            res.warnings.append(
                f"the command lowered corral's own limits ({', '.join(sorted(self._limits.restored))}); "
                "corral put them back"
            )
        res.ended_at = time.time()
        res.ended_monotonic = time.monotonic()
        res.exit_code = R.exit_code_for(res, spawn_exit)
        self._step("finished", exit_code=res.exit_code, outcome=res.reason)
        return res


__all__ = ["Supervisor"]


class _LimitsRestored:
    """The engine as a stop target (``stopping.StopTarget``) whose every
    operation is ``OwnLimits.retrying``: tried again after corral's limits
    were put back."""

    def __init__(self, engine, retrying):
        self.remaining = retrying(engine.remaining)
        self.signal_all = retrying(engine.signal_all)
        self.signal_new = retrying(engine.signal_new)
        self.kill_all = retrying(engine.kill_all)
        self.verify_empty = retrying(engine.verify_empty)
        self.unproven = retrying(engine.unproven)
