"""``corral --background``: the run detached from the calling corral, handed back once ready.

    corral (the front)  ──fork──→  corral (the run's own: setsid, stdin /dev/null,
        │   ready pipe ←─────────────  stdout+stderr → <state dir>/<run id>.out)
        │                            runs the request as a foreground run would,
        │                            the log held to --log-max on disk (``logkeeper``)
        ├─ waits: the command started (one line on the ready pipe), then
        │  ready (a port, a file, a line of the log), or the run's corral exited
        └─ the run id (or the start record) on stdout; exit 0

The detached corral is the run's supervisor for its whole life: the same
engine, limits, stop sequence, proof, registry entry and record as a
foreground run; it ends with its own ``--wall``, ``corralctl stop`` or a
signal, never with the front. It holds none of the caller's descriptors
(only the log and /dev/null), so a caller reading corral's stdout to its end
does not wait for the background run.

Failure modes (the front's exit code): the run's corral exited before the
run was ready: its exit code, the log's tail on stderr (``EndedEarly``); not
ready within ``--ready-timeout``, or the front was asked to stop (SIGINT,
SIGTERM, SIGHUP) while waiting: the run is stopped through its corral (its
own verified stop sequence) and the front says 124 (128+N for a signal), or
120 when that stop could not be proven. A readiness target that already
answers before the run starts (a port something else listens on, a file that
exists) is a ``UsageError``: corral could not tell that the run made it.

A run with a network namespace of its own (``--network none``) is ready by
port once a socket listens on it in that namespace, read from outside it
(``kernel.netns.listening``, through the started command's /proc directory):
the front's own connect would reach the host's port, which a host process
could hold (ready falsely); for the same reason the host's port being taken
does not refuse such a run.

The front learns of the command's start only from the ready pipe: its read
end is the front's, its write end the run's corral's alone (close-on-exec,
so neither the command nor corral's helpers hold it; corral is not dumpable,
so the command cannot open it through /proc). The run's corral writes one
line (the command's pid and start time, the run's mode and unit) once the
registry has the start, and closes it. Nothing the command can write (the
state directory is its uid's) is read by the front: a forged registry entry
or event steers nothing. Until that line the front sleeps in poll(2) on the
pipe, the corral's end (a pidfd, or the holder's connection), its own
signals and a served caller's connection, with no timeout but the
--ready-timeout. Then it looks for readiness each time the run's log grows
(inotify: a server saying it listens, --ready-log's line) or --ready-file's
directory changes, and else at waits growing with the time since the start
(``look_wait``): a target nothing announces (a server whose output is
buffered says nothing until much later) is seen at most 10 % of that time
late (5 ms at least, 0.25 s at most), and a long wait costs a few looks a
second. The
stop signals are blocked across the fork, so one sent to the run's corral
before it has its own dispositions is not lost in the front's handlers.

Nothing here prints: ``cli`` reports what ``launch`` returns or raises.
"""

import os
import select
import signal
import socket
import time

from ..common import jsoncodec
from ..common.errors import CorralError, SetupError, UsageError
from ..common.plainclass import field, plainclass

TYPE_CHECKING = False  # typing is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..kernel.context import ProcessContext

#: Once the command has started, the front looks for readiness after this share of the
#: time since the start, at least FIRST_LOOK and at most LAST_LOOK seconds (``look_wait``).
LOOK_SHARE = 0.1
FIRST_LOOK = 0.005
LAST_LOOK = 0.25
#: The longest single poll(2) wait (poll's own limit is INT_MAX ms; --ready-timeout can be longer).
_LONGEST_POLL_MS = 3600 * 1000
#: Bytes of the log shown when the run ends before it is ready.
TAIL_BYTES = 4096


@plainclass
class Started:
    """A background run that is ready: what ``--json -`` prints."""

    run_id: str
    name: str | None
    log: str
    unit: str | None
    mode: str | None
    #: The run's own corral (it supervises the run to its end).
    corral_pid: int
    #: Who keeps its corral: "holder" (the session's holder: the run stays below it, whether
    #: the holder forked the corral or the front it forked did) or "front" (detached from it).
    started_by: str = "front"
    #: Why the session's holder did not start it, where it did not.
    warnings: list[str] = field(default_factory=list)
    #: The run's own corral as the front watches it (``launch(keep_corral=True)``: the caller closes it).
    corral: "_Corral | None" = None

    def record(self) -> dict:
        return {
            "run_id": self.run_id,
            "name": self.name,
            "log": self.log,
            "unit": self.unit,
            "mode": self.mode,
            "corral_pid": self.corral_pid,
            "started_by": self.started_by,
            "warnings": self.warnings,
        }


class StartedPipe:
    """The run's corral's end of the ready pipe: a ``core.supervisor.RunObserver`` (by
    duck typing) that hands every step to ``inner`` (the registry's, or None) and,
    once the command has started and ``inner`` has recorded it, writes the front one
    line (JSON: the command's pid and start time, the run's mode and unit) and closes
    the pipe. A front that is gone (EPIPE) changes nothing for the run."""

    def __init__(self, inner, fd: int, mode: str, unit: str | None):
        self.inner, self.mode, self.unit = inner, mode, unit
        self.fd: int | None = fd

    def event(self, name: str, data: dict) -> None:
        if self.inner is not None:
            self.inner.event(name, data)  # first: the id the front prints finds the started run
        if name == "started" and self.fd is not None:
            from ..kernel.procfs import read_stat

            pid = data.get("pid")
            stat = read_stat(pid) if type(pid) is int else None
            told = {"pid": pid, "starttime": stat.starttime if stat else None, "mode": self.mode}
            told["unit"] = data.get("unit") or self.unit
            try:
                os.write(self.fd, jsoncodec.dumps(told).encode() + b"\n")
            except OSError:
                pass
            finally:
                os.close(self.fd)
                self.fd = None


class NotReady(CorralError):
    """The run never became ready: stopped (``exit_code``: 124, 128+N, or 120 unproven)."""

    def __init__(self, message: str, exit_code: int, tail: bytes = b""):
        super().__init__(message)
        self.exit_code = exit_code
        self.tail = tail


class EndedEarly(CorralError):
    """The run's corral exited before the run was ready: its exit code, the log's tail."""

    def __init__(self, message: str, exit_code: int, tail: bytes):
        super().__init__(message)
        self.exit_code = exit_code
        self.tail = tail


@plainclass
class ServedCaller:
    """A caller the corral service starts a background run for (``io.corral.Run.Run``
    without descriptors): ``context`` is its environment, cwd and umask with the
    service's own rlimits, credentials and the like (as its foreground runs get
    them). The run's corral is the session's holder's child or nothing runs; the
    caller's ``connection`` hanging up before the run is ready stops it (None:
    nothing to watch)."""

    context: "ProcessContext"
    connection: int | None


def launch(request, run_here, caller: ServedCaller | None = None, keep_corral: bool = False) -> Started:
    """Start ``request`` (``request.background`` set) detached; return once it is ready.

    In a session, the run's corral is started by the session's holder, as its
    child (``ctl/session_spawner.py``), with this process's context (or the
    ``caller``'s) -- or, where this process is the holder's own fork
    (``request.below_holder``), forked here with this request as it is, below the
    holder as surely (its child subreaper: the corral is its child once this
    front exits); where the holder cannot give it that context
    (``kernel.context.cannot_carry``) or cannot be reached, this process forks
    it, and ``Started.warnings`` says why (for a ``caller``: SetupError).
    ``run_here(request)`` runs a request in this process and returns its
    exit code (``cli.run``): the forked corral calls it. ``keep_corral``: the
    run's corral stays watched (``Started.corral``, the caller's to close), so
    the caller can wait for its end (``core.handback``)."""
    from ..state import registry as REG

    bg = request.background
    _check_target_free(bg, own_network=request.spec.network == "none")
    directory = REG.ensure_state_dir()
    # Said here, in one line, not from the detached corral's log (the holder's own
    # fork was forked while its session was open: its run's Join decides alone).
    session = None
    if request.spec.session is not None and not request.below_holder:
        from ..state import sessions as S

        try:
            session = S.open_session(request.spec.session, directory)
        except S.NotJoinable as exc:
            raise SetupError(str(exc)) from None
    if request.name is not None:
        for entry in REG.list_entries(directory):
            if entry.get("name") == request.name and REG.effective_state(entry)[0] != "finished":
                raise UsageError(f"--name {request.name!r}: run {entry.get('run_id')} of that name is still going")
    run_id = request.spec.run_id
    bg.log = REG.output_path(directory, run_id)
    log_fd = os.open(bg.log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    started_r, started_w = os.pipe2(os.O_CLOEXEC)  # the ready pipe (the module's docstring)
    # Asked to stop while waiting (SIGINT, SIGTERM, SIGHUP): the run is stopped
    # too. Caught from before the fork, so no moment leaves it running unready;
    # the wakeup pipe ends the front's poll (the forked corral has none: fork_detached).
    asked: list[int] = []
    wake_r, wake_w, previous, previous_wake = -1, -1, {}, -1
    if caller is None:
        wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        previous_wake = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        previous = {sig: signal.signal(sig, lambda signum, frame: asked.append(signum)) for sig in _STOP_SIGNALS}
    corral: _Corral | None = None
    warnings: list[str] = []
    try:
        try:
            if session is not None:
                corral = _by_holder(request, *session, directory, log_fd, started_w, warnings, caller)
            if corral is None and caller is not None:
                raise SetupError(warnings[-1] if warnings else "a served background run must be in a session")
            if corral is None:
                detach(request, run_id, bg.log)
                pid = fork_run_corral(log_fd, (started_w,), lambda: _as_run_corral(request, run_here, started_w))
                corral = _Forked(pid, "holder" if request.below_holder else "front")
        except BaseException:
            _remove(bg.log)
            raise
        finally:
            os.close(log_fd)
            os.close(started_w)  # the run's corral holds the only write end now
        hangup = request.hangup_fd if caller is None else caller.connection
        started = _await_ready(request, bg, corral, started_r, asked, wake_r, hangup)
        started.warnings = warnings
        if keep_corral:
            started.corral, corral = corral, None
        return started
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caller is None:
            signal.set_wakeup_fd(previous_wake)
            os.close(wake_r)
            os.close(wake_w)
        os.close(started_r)
        if corral is not None:
            corral.close()


def detach(request, run_id: str, log: str) -> None:
    """Make ``request`` the detached run of ``run_id`` whose output is ``log``:
    at most --log-max bytes of it shown (head and tail, one marker); with
    ``--json -`` the start record is the front's, so no run record on stdout."""
    bg = request.background
    request.spec.run_id = run_id
    request.spec.output_limit = bg.log_max
    if request.json_path is not None and request.record_to_stdout:
        request.json_path = None
    request.background, request.output_log = None, log
    request.keep_stdin = bg.keep_stdin
    if request.yield_after is not None:  # its front shows these lines if the run ends within the yield
        from ..state.registry import report_path

        request.report_path = report_path(os.path.dirname(log), run_id)
        request.yield_after = None


def run_detached(request, run_here) -> int:
    """The detached corral's run (``request`` made so by ``detach``; stdout and
    stderr: its log): ``run_here(request)``, its exit code, with the log held to
    --log-max on disk for as long as this corral lives, whoever writes it
    (``core.logkeeper``: its bound and what it does not hold). SetupError (125,
    nothing started) if the log cannot be kept."""
    from .logkeeper import LogKeeper

    if request.report_path is not None:  # this corral's own lines apart from the command's (fd 2: the log)
        import sys

        fd = os.open(request.report_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        sys.stderr = open(fd, "w", buffering=1)
    stdin = None
    if request.keep_stdin:
        from .stdin_keeper import StdinKeeper

        try:
            stdin = StdinKeeper(request.spec.run_id)  # fd 0 is now its pipe: the command inherits it
        except OSError as exc:
            raise SetupError(f"the run's stdin cannot be kept: {exc}") from None
        request.spec.stdin = "inherit"
        request.watches[stdin.fileno()] = stdin.serve  # corralctl send, answered in the supervisor's poll
    keeper = LogKeeper.start(1, request.spec.output_limit)
    if keeper is not None:
        request.watches[keeper.fileno()] = keeper.look  # in the supervisor's own poll
    try:
        return run_here(request)
    finally:
        if keeper is not None:
            keeper.close()  # the last look, after this corral's last write to the log
        if stdin is not None:
            stdin.close()


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def fork_run_corral(
    log_fd: int, keep: "tuple[int, ...]", become: "Callable[[], int]", stderr: int | None = None
) -> int:
    """Fork a background run's own corral: the one way both its starters do it
    (the front, ``launch``; a session's holder, ``ctl/session_spawner.py``, which
    forks a compiled client's front so too). Returns the child's pid; never
    returns in the child.

    The child is detached (``kernel.detach``: its own session, /dev/null for
    stdin, ``log_fd`` as stdout and stderr, or ``stderr`` for that; no
    descriptor of its parent's but ``keep``); Python's ``sys.stdin``,
    ``stdout`` and ``stderr`` are made again on 0, 1 and 2, as an interpreter's
    start makes them (``kernel.startup.fresh_stdio``); every signal its parent
    handled in Python (the front's stop handlers, a holder's own) is at its
    default action (SIGINT too, where a fresh interpreter would raise
    KeyboardInterrupt: until the run's corral has its own, a stop signal ends
    it at once), what was ignored is still ignored. The stop signals are
    blocked across the fork, so one sent to the child before that is taken
    then, by the default action, never by the parent's handlers. Then
    ``become()`` is the run's corral: its return is the child's exit code; a
    CorralError's line goes to stderr with its exit code (as ``cli.main`` says
    it), anything else is 125. Python's buffered output is written before the exit."""
    from ..kernel.detach import fork_detached

    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        pid = fork_detached(stdout=log_fd, stderr=log_fd if stderr is None else stderr, keep=keep)
        if pid == 0:
            _handlers_at_default()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    if pid:
        return pid
    code = 125
    try:  # the run's own corral, from here to os._exit: nothing returns into the parent's code
        from ..kernel.startup import fresh_stdio

        fresh_stdio()
        code = become()
    except CorralError as exc:
        code = exc.exit_code
        _say(f"corral: {exc}\n")
    except BaseException as exc:  # pragma: no cover - reported in the log
        _say(f"corral: the background run could not start: {exc!r}\n")
    finally:
        import sys

        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except BaseException:
                pass
        os._exit(code)
    raise AssertionError("unreachable")  # pragma: no cover


def _handlers_at_default() -> None:
    """Every signal with a Python handler back at its default action, as exec leaves it."""
    for signum in range(1, signal.NSIG):
        try:
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # a number with no signal behind it, or one Python may not set


def _say(line: str) -> None:
    try:
        os.write(2, line.encode(errors="backslashreplace"))
    except OSError:
        pass


def _as_run_corral(request, run_here, started_fd: int) -> int:
    """The front's forked corral: ``request`` (made detached by ``detach``) run here."""
    request.started_fd = started_fd
    return run_detached(request, run_here)


def _check_target_free(bg, own_network: bool) -> None:
    # A run with a network namespace of its own starts with nothing listening
    # in it: the host's port is not the run's, taken or not.
    if bg.ready == "port" and not own_network and _port_answers(bg.target):
        raise UsageError(f"--ready-port {bg.target}: something already accepts connections there")
    if bg.ready == "file" and os.path.lexists(bg.target):
        raise UsageError(f"--ready-file {bg.target!r} already exists: remove it first")


def _port_answers(port: int) -> bool:
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(0.5)
                if s.connect_ex((host, port)) == 0:
                    return True
        except OSError:
            continue  # no IPv6 here
    return False


class _LogLines:
    """Complete lines of the log as they are appended (for --ready-log)."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self._partial = b""

    def new_lines(self) -> list[str]:
        chunks = []
        while chunk := os.read(self._fd, 65536):
            chunks.append(chunk)
        if not chunks:
            return []
        *lines, self._partial = (self._partial + b"".join(chunks)).split(b"\n")
        return [line.decode(errors="replace") for line in lines]

    def close(self) -> None:
        os.close(self._fd)


def _await_ready(
    request, bg, corral: "_Corral", started_r: int, asked: list[int], wake_r: int, hangup: int | None
) -> Started:
    """Wait (in poll, see the module's docstring) until the run is ready, its corral
    ended, the front was asked to stop or --ready-timeout passed."""
    run_id = request.spec.run_id
    lines = _LogLines(bg.log) if bg.ready == "log" else None
    deadline = time.monotonic() + bg.ready_timeout
    told = _Told(started_r)
    announced = _announcer(bg)
    try:
        while True:
            if announced is not None:
                announced.read()  # emptied: the looks below are what it woke
            if hangup is not None and _hung_up(hangup) and not asked:
                asked.append(signal.SIGHUP)
            code = corral.ended()
            if code is not None:
                raise EndedEarly(f"{run_id} ended before it was ready (exit {code})", code, _tail(bg.log))
            started = told.read()
            if started is not None and _ready(bg, lines, started if request.spec.network == "none" else None):
                unit, mode = started.get("unit"), started.get("mode")
                return Started(run_id, request.name, bg.log, unit, mode, corral.pid, corral.started_by)
            if asked:
                code = _stop(request, corral)
                raise NotReady(
                    f"{run_id}: stopped before it was ready ({signal.Signals(asked[0]).name})",
                    120 if code == 120 else 128 + asked[0],
                    _tail(bg.log),
                )
            now = time.monotonic()
            if now >= deadline:
                code = _stop(request, corral)
                raise NotReady(
                    f"{run_id} was not {_awaited(bg) if started is not None else 'started'} "
                    f"within {bg.ready_timeout:g}s: stopped",
                    120 if code == 120 else 124,
                    _tail(bg.log),
                )
            wait, fds = deadline - now, [corral.wait_fd(), *told.fds()]
            if started is not None:
                wait = min(wait, look_wait(now - told.at))
                fds += [] if announced is None else [announced.fileno()]
            _sleep_until_woken(wait, fds, wake_r, hangup)
    finally:
        if lines is not None:
            lines.close()
        if announced is not None:
            announced.close()


def look_wait(since_start: float) -> float:
    """Seconds until the front's next timed look for readiness, ``since_start``
    seconds after the command started: ``LOOK_SHARE`` of that, from ``FIRST_LOOK``
    up to ``LAST_LOOK``. A server that listens within 50 ms of its start and says
    nothing is seen within 5 ms of it (the shell's ``until nc -z …; do sleep 0.01``
    within 10 or so); one that takes minutes costs four looks a second."""
    return max(FIRST_LOOK, min(LAST_LOOK, since_start * LOOK_SHARE))


def _announcer(bg):
    """An inotify descriptor (``kernel.inotify``) readable when the run may have become
    ready: its log grew, or --ready-file's directory changed; None where there is no
    target, or the watch cannot be had (the timed looks alone then)."""
    if bg.ready is None:
        return None
    from ..kernel import inotify as I

    try:
        watcher = I.Inotify()
    except OSError:
        return None
    try:
        if bg.ready == "file":
            watcher.watch(os.path.dirname(bg.target), I.IN_CREATE | I.IN_MOVED_TO | I.IN_ONLYDIR)
        else:
            watcher.watch(bg.log, I.IN_MODIFY)
    except OSError:  # the file's directory does not exist yet
        watcher.close()
        return None
    return watcher


class _Told:
    """The front's end of the ready pipe: the run's corral's one line, once it has come."""

    def __init__(self, fd: int):
        os.set_blocking(fd, False)
        self._fd: int | None = fd
        self.started: dict | None = None
        #: When the line came (time.monotonic()).
        self.at = 0.0

    def fds(self) -> list[int]:
        """The pipe, while the line may still come (not after it, nor after EOF)."""
        return [] if self._fd is None else [self._fd]

    def read(self) -> dict | None:
        """The line's data (``StartedPipe``) once it has come, else None; never blocks.
        One write below PIPE_BUF: the line comes whole, or EOF (the corral ended) comes."""
        if self._fd is not None:
            try:
                line = os.read(self._fd, 4096)
            except BlockingIOError:
                return None
            self._fd = None
            try:
                data = jsoncodec.loads(line) if line else None
            except ValueError:
                data = None
            if isinstance(data, dict):
                self.started, self.at = data, time.monotonic()
        return self.started


def _sleep_until_woken(seconds: float, fds: list[int], wake_r: int, hangup: int | None) -> None:
    """Sleep in poll(2) for up to ``seconds``, or until one of ``fds`` is readable, a
    signal was caught (``wake_r``: its wakeup pipe, then emptied) or ``hangup`` hangs up."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    if wake_r >= 0:
        poller.register(wake_r, select.POLLIN)
    if hangup is not None:
        poller.register(hangup, select.POLLRDHUP)
    if any(fd == wake_r for fd, _ in poller.poll(min(int(seconds * 1000) + 1, _LONGEST_POLL_MS))):
        try:
            os.read(wake_r, 256)  # the handler has run: ``asked`` says which signal
        except BlockingIOError:
            pass


def _hung_up(fd: int) -> bool:
    """Has the served caller's connection ``fd`` hung up (never waits)?"""
    poller = select.poll()
    poller.register(fd, select.POLLRDHUP | select.POLLHUP)
    return bool(poller.poll(0))


def _awaited(bg) -> str:
    if bg.ready == "port":
        return f"accepting connections on port {bg.target}"
    if bg.ready == "file":
        return f"showing {bg.target}"
    return f"printing a line matching {bg.target.pattern!r}"


def _ready(bg, lines: "_LogLines | None", inside: dict | None) -> bool:
    """Is the run ready? ``inside``: the started command (pid, start time) whose
    network namespace, the run's own, a --ready-port is looked for in (None: the host's)."""
    if bg.ready is None:
        return True
    if bg.ready == "port":
        return _port_answers(bg.target) if inside is None else _listens_inside(inside, bg.target)
    if bg.ready == "file":
        return os.path.lexists(bg.target)
    assert lines is not None
    return any(bg.target.search(line) for line in lines.new_lines())


def _listens_inside(started: dict, port: int) -> bool:
    """A socket listens on ``port`` in the started command's network namespace
    (``netns.listening``: read from outside it, the command pinned by its start time).
    A connect from here would reach the host's port, which any host process could hold."""
    from ..kernel import netns

    pid, starttime = started.get("pid"), started.get("starttime")
    if type(pid) is not int or type(starttime) is not int or pid <= 0:
        return False
    return netns.listening(pid, starttime, port) is True


def _stop(request, corral: "_Corral") -> int:
    """Stop the run through its corral (SIGTERM: its verified stop sequence); its exit code.

    A corral that does not finish its stop in time is SIGKILLed (its engine's
    tether or unit ends the run then) and the stop counts as unproven."""
    spec = request.spec
    corral.signal(signal.SIGTERM)
    give_up = time.monotonic() + spec.grace + spec.verify_timeout + 10
    while time.monotonic() < give_up:
        if (code := corral.ended()) is not None:
            return code
        time.sleep(0.01)
    corral.signal(signal.SIGKILL)
    corral.ended(wait=True)
    return 120


# -- the run's own corral, as the front watches it ---------------------------------------------
class _Corral:
    pid: int
    started_by: str

    def ended(self, wait: bool = False) -> int | None:
        """Its exit code once it has exited (as a shell reports one: 128+N for a signal), else None."""
        raise NotImplementedError

    def signal(self, signum: int) -> None:
        raise NotImplementedError

    def wait_fd(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Forked(_Corral):
    """This process's unreaped child: its number cannot have been reused.
    ``started_by``: "holder" where this process is below the session's holder
    (its fork: the child is the holder's once this front exits), else "front"."""

    def __init__(self, pid: int, started_by: str):
        self.pid, self.started_by = pid, started_by
        self._code: int | None = None
        self._pidfd: int | None = None

    def wait_fd(self) -> int:
        """A descriptor that turns readable when it has exited (a pidfd)."""
        if self._pidfd is None:
            self._pidfd = os.pidfd_open(self.pid)
        return self._pidfd

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def ended(self, wait: bool = False) -> int | None:
        if self._code is None:
            done, status = os.waitpid(self.pid, 0 if wait else os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                self._code = code if code >= 0 else 128 - code
        return self._code

    def signal(self, signum: int) -> None:
        if self._code is None:
            os.kill(self.pid, signum)


class _HeldByHolder(_Corral):
    """The session's holder's child: signalled through the pidfd the holder sent,
    its exit code the holder's last reply once it has reaped it."""

    started_by = "holder"

    def __init__(self, channel, pid: int, pidfd: int):
        self.channel, self.pid, self.pidfd = channel, pid, pidfd
        self._code: int | None = None

    def ended(self, wait: bool = False) -> int | None:
        import select

        from ..varlink.wire import ProtocolError

        while self._code is None:
            if not (self.channel.buffered() or select.select([self.channel.sock], [], [], None if wait else 0)[0]):
                return None
            try:
                got = self.channel.receive()
            except (OSError, ProtocolError):
                got = None
            if got is None:  # the holder is gone: the corral's end is all that can be known
                if select.select([self.pidfd], [], [], None if wait else 0)[0]:
                    self._code = 120
                return self._code
            reply, fds = got
            for fd in fds:
                os.close(fd)
            code = (reply.get("parameters") or {}).get("exit_code")
            if type(code) is int:
                self._code = code
        return self._code

    def wait_fd(self) -> int:
        """Readable when the holder tells its exit code (or hangs up)."""
        return self.channel.sock.fileno()

    def signal(self, signum: int) -> None:
        try:
            signal.pidfd_send_signal(self.pidfd, signum)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        self.channel.sock.close()
        os.close(self.pidfd)


def _remove(path: str | None) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except OSError:
            pass


def _by_holder(
    request,
    session_id: str,
    token: "dict | None",
    directory: str,
    log_fd: int,
    started_fd: int,
    warnings: list[str],
    caller=None,
) -> "_Corral | None":
    """Ask the session's holder to start the run's corral as its child, handing it
    the ready pipe's write end; None (and the reason in ``warnings``) where it
    cannot be had faithfully. ``session_id`` and ``token``: the session and its
    holder's token, as ``state.sessions.open_session`` read them."""
    from ..kernel.context import ProcessContext, cannot_carry
    from ..state import sessions as S
    from ..varlink.wire import Channel, ProtocolError, VarlinkError

    # The holder's word on where it is (its token, read before the Spawn call:
    # the holder serves one connection at a time), then the call to the same process.
    token = S.looked_again(session_id, token) or {}
    connected = S.connect_holder(session_id, timeout=10)  # the holder the kernel names, not an entry
    if connected is None:
        raise SetupError(f"session {session_id} has ended")
    sock, holder = connected
    if caller is not None:
        context = caller.context
    else:
        # The environment the command line was read with (the run's corral reads it again
        # with it: --env-clear and the like apply there), not the command's.
        context = ProcessContext.here(dict(os.environ))
    why = cannot_carry(holder, context, token.get("place") if token.get("pid") == holder else None)
    if why is not None:
        sock.close()
        warnings.append(f"started by this corral, not by session {session_id}'s holder: {why}")
        return None
    # This process's own working directory as it is (renamed, or its path gone:
    # the same directory); a served caller's by its path (the service checked it is the same file system).
    cwd_fd = os.open("." if caller is None else context.cwd, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    channel = Channel(sock)
    try:
        parameters = {
            "default_mode": request.default_mode,
            "run_id": request.spec.run_id,
            "argv": list(request.args),
            "context": context.to_json(),
            "log": 0,
            "cwd": 1,
            "started": 2,
            # The gate with the answer, released here once it is read (a holder of an
            # earlier version, which ignores this, lets its child go itself).
            "caller_releases": True,
        }
        reply, fds = channel.call(S.SPAWN_METHOD, parameters, fds=[log_fd, cwd_fd, started_fd])
        sock.settimeout(None)
    except VarlinkError as exc:
        channel.close()
        if exc.name.endswith(".SessionEnding"):
            raise SetupError(f"session {session_id} is ending") from None
        warnings.append(f"started by this corral: session {session_id}'s holder refused ({exc.name})")
        return None
    except (OSError, ProtocolError) as exc:
        channel.close()  # with a gate that came with half an answer: unreleased, no run there
        try:
            S.joinable(session_id, directory)  # refused because the session began to end?
        except S.NotJoinable as ended:
            raise SetupError(str(ended)) from None
        warnings.append(f"started by this corral: session {session_id}'s holder did not answer ({exc})")
        return None
    finally:
        os.close(cwd_fd)
    gated = "gate" in reply  # a holder of an earlier version sends none: it lets its child go itself
    if (
        type(reply.get("pid")) is not int
        or reply.get("pidfd") != 0
        or (reply.get("gate"), len(fds)) != ((1, 2) if gated else (None, 1))
    ):
        for fd in fds:
            os.close(fd)
        channel.close()  # a gate among them closed unreleased: no run of the holder's
        raise SetupError(f"session {session_id}'s holder answered with no process")
    if gated:
        S.release(fds[1])  # answered, so the run is the holder's: its corral may go on
    return _HeldByHolder(channel, reply["pid"], fds[0])


def _tail(path: str | None) -> bytes:
    if path is None:
        return b""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, TAIL_BYTES, max(0, size - TAIL_BYTES))
    finally:
        os.close(fd)
