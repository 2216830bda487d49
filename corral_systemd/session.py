"""``corral_systemd.Session``: the library's face of a session (``corralctl session``).

    with corral_systemd.Session(idle_timeout="10m", limits={"mem": "2G"}) as session:  # owner: this process
        web = session.start([... "http.server", "8000"], ready={"port": 8000})
        session.run(["curl", "-s", "localhost:8000"])                  # a foreground run in it
        print(web.logs(tail=5)); web.stop()
    # leaving the block ends the session: every run of it stopped, proven (else Unverified)

The session and its background runs are corral's own processes, started as
``corralctl session start`` and ``corral --background`` are (this process never
forks for them: a host is usually multi-threaded), so each run is the same run
as on the command line: the same limits, stop sequence, proof and record.
Foreground runs are the library's own (``Runner.run`` with ``session=``).

Failure modes: ``UsageError`` for bad input (as the CLI's 125 says it);
``SetupError`` when the session cannot be started (the cap, ``CORRAL_MAX_SESSIONS``)
or a background run cannot start or be ready (its exit code and the log's tail
in the message); ``Unverified`` when ending the session could not prove every
process gone (exit 120).
"""

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Sequence

from .common.errors import SetupError, Unverified, UsageError
from .core.result import HANDED_BACK

_CTL = [sys.executable, "-m", "corral_systemd.ctl"]
_CORRAL = [sys.executable, "-m", "corral_systemd"]
#: The library's keyword names that are not the option table's (``core.options``).
_RENAMED = {"mode": "cgroup_mode"}
#: Options ``Session.start`` sets itself.
_OWN = {"session", "json", "background", "ready_port", "ready_file", "ready_log"}


def _flag(key: str) -> str:
    """The CLI option for a library keyword of a background run (read from the option table)."""
    from .core.options import _BY_NAME

    name = _RENAMED.get(key, key)
    option = _BY_NAME.get(name)
    if option is None or option.takes != "value" or name in _OWN:
        raise UsageError(f"Session.start: unknown keyword {key!r}")
    return option.flags[0]


_READY = {"port": "--ready-port", "file": "--ready-file", "log": "--ready-log"}


#: Keywords whose numbers are seconds (the CLI wants a unit for them).
_DURATIONS = {"wall", "cpu_time", "grace", "verify_timeout", "ready_timeout", "idle_timeout", "timeout"}


def _value(key: str, value) -> str:
    """A keyword's value as the CLI reads it: text as given; a number as the
    library takes it (a duration in seconds, a size in bytes, a count, CPUs)."""
    if key in _DURATIONS and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{float(value):g}s"
    return str(value)


class Session:
    """Runs that end together: when this object's session ends (``end()``,
    leaving ``with``), when its owner exits (default: this process), or when
    idle for ``idle_timeout``. ``defaults`` apply to every run of it."""

    def __init__(
        self,
        *,
        name: str | None = None,
        owner: int | None = None,
        idle_timeout: str | float = "30m",
        max_runs: int | None = None,
        limits: dict | None = None,
        cgroup_mode: str = "auto",
        **defaults,
    ):
        self.name = name
        self.owner = os.getpid() if owner is None else owner
        self.idle_timeout = idle_timeout
        self.max_runs = max_runs
        #: Aggregate over all the session's runs: ``{"mem": "2G", "pids": 500, "cpus": 1.5}``
        #: (systemd mode: its slice's MemoryMax, TasksMax, CPUQuota).
        self.limits = dict(limits or {})
        self.cgroup_mode = cgroup_mode
        self._defaults = defaults
        #: What ``corralctl session start`` said besides the id (limits not enforced, say).
        self.warnings: list[str] = []
        #: The session's id, once started.
        self.id: str | None = None

    # -- the session --------------------------------------------------------------------
    def open(self) -> "Session":
        args = [
            "session",
            "start",
            "--owner",
            str(self.owner),
            "--idle-timeout",
            _value("idle_timeout", self.idle_timeout),
            "--json",
        ]
        if self.name is not None:
            args += ["--name", self.name]
        if self.max_runs is not None:
            args += ["--max-runs", str(self.max_runs)]
        for key, value in self.limits.items():
            if key not in ("mem", "pids", "cpus"):
                raise UsageError(f"Session: unknown limit {key!r} (mem, pids, cpus)")
            args += [f"--{key}", _value(key, value)]
        args += ["--cgroup-mode", self.cgroup_mode]
        r = _ctl(args)
        if r.returncode != 0:
            raise (UsageError if r.returncode == 125 and "CORRAL_MAX_SESSIONS" not in r.stderr else SetupError)(
                r.stderr.strip() or f"corralctl session start: exit {r.returncode}"
            )
        self.id = json.loads(r.stdout)["session"]
        self.warnings = [line.split(": ", 2)[-1] for line in r.stderr.splitlines() if line.strip()]
        return self

    def end(self) -> None:
        """Stop every run of the session and prove each gone; Unverified if that cannot be proven."""
        if self.id is None:
            return
        r = _ctl(["session", "end", self.id])
        if r.returncode == 120:
            raise Unverified(r.stderr.strip())
        if r.returncode != 0:
            raise SetupError(r.stderr.strip() or f"corralctl session end: exit {r.returncode}")

    def __enter__(self) -> "Session":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.end()

    async def __aenter__(self) -> "Session":
        return await asyncio.to_thread(self.open)

    async def __aexit__(self, *exc) -> None:
        await asyncio.to_thread(self.end)

    # -- runs -----------------------------------------------------------------------------
    def _id(self) -> str:
        if self.id is None:
            raise UsageError("the session is not started (use it in a with block, or call open())")
        return self.id

    def run(self, argv: Sequence[str], **kwargs):
        """A foreground run in the session (``corral_systemd.run``'s keywords)."""
        from .api import run

        return run(argv, **{**self._defaults, **kwargs, "session": self._id()})

    async def arun(self, argv: Sequence[str], **kwargs):
        from .api import arun

        return await arun(argv, **{**self._defaults, **kwargs, "session": self._id()})

    def start(self, argv: Sequence[str], *, background: bool = True, ready=None, env=None, cwd=None, **kwargs):
        """A background run in the session; returns once it is ready: ``ready`` is
        ``{"port": N}``, ``{"file": PATH}``, ``{"log": REGEX}`` or None (once started).
        Its corral is a process of its own (``corral --background``)."""
        if not background:
            raise UsageError("Session.start runs in the background; use run() or arun() for a foreground run")
        args = [*_CORRAL, "--background", "--session", self._id(), "--json", "-"]
        for key, value in {**self._defaults, **kwargs}.items():
            flag = _flag(key)
            if value is not None:
                args += [flag, _value(key, value)]
        if ready is not None:
            if not isinstance(ready, dict) or len(ready) != 1 or next(iter(ready)) not in _READY:
                raise UsageError('ready must be {"port": N}, {"file": PATH} or {"log": REGEX}')
            ((kind, target),) = ready.items()
            args += [_READY[kind], os.fspath(target) if kind == "file" else str(target)]
        args += ["--", *[os.fspath(a) for a in argv]]
        r = subprocess.run(
            args,
            capture_output=True,
            text=True,
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
        if r.returncode == 125:
            raise UsageError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "bad input")
        if r.returncode != 0:
            raise SetupError(f"the background run did not become ready (exit {r.returncode}): {r.stderr.strip()}")
        return BackgroundRun(json.loads(r.stdout), self)

    async def astart(self, argv: Sequence[str], **kwargs):
        return await asyncio.to_thread(self.start, argv, **kwargs)

    def exec(
        self,
        argv_or_cmd: "Sequence[str] | str",
        *,
        yield_: float | str = 10.0,
        stdin: str = "keep",
        pty: bool = False,
        record: "str | os.PathLike | None" = None,
        env=None,
        cwd=None,
        **kwargs,
    ):
        """Run a command in the session and wait up to ``yield_`` (``corral --yield``).

        Ended by then: its ``RunResult`` (the record; ``stdout`` is its output, stdout and
        stderr as one stream), as ``run`` returns one (NotFound, CannotExecute, Unverified
        raised alike). Still running: a ``HandedBack`` run of the session (its output so far,
        ``write_stdin``, ``read_output``, ``wait``, ``stop``). A string is a command line for
        ``bash -c`` (``sh -c`` without bash). ``stdin``: "keep" (a pipe for ``write_stdin``)
        or "null"; ``pty``: on a terminal of its own, what ``write_stdin`` sends typed into it.
        ``record``: the file the run's record goes to (``--json``; the caller's to remove):
        a handed-back run's facts until it ends, then its record (``HandedBack.record()``);
        default: a temporary file, gone once this returns."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="corral-exec-") as place:
            record_path = os.fspath(record) if record is not None else os.path.join(place, "record.json")
            args = self._exec_args(argv_or_cmd, yield_, stdin, pty, record_path, kwargs)
            r = subprocess.run(
                args, capture_output=True, env=None if env is None else dict(env), cwd=cwd, stdin=subprocess.DEVNULL
            )
            return self._exec_outcome(r.returncode, record_path, r.stdout, r.stderr, record is not None)

    async def aexec(
        self,
        argv_or_cmd: "Sequence[str] | str",
        *,
        yield_: float | str = 10.0,
        stdin: str = "keep",
        pty: bool = False,
        record: "str | os.PathLike | None" = None,
        capture_output: bool = True,
        env=None,
        cwd=None,
        **kwargs,
    ):
        """``exec`` for asyncio: the front (``corral --yield``) is a child of this
        process awaited in the event loop (its exit wakes the caller: no thread, no
        tick). ``capture_output`` False: its output is not held in memory (``stdout``,
        ``output`` empty): read it from the run's log (``HandedBack.read_output``, or
        the log the record's ``run_id`` names). Cancelled while it waits: the front is
        sent SIGTERM, which stops the run (verified), as Ctrl-C stops ``corral --yield``."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="corral-exec-") as place:
            record_path = os.fspath(record) if record is not None else os.path.join(place, "record.json")
            args = self._exec_args(argv_or_cmd, yield_, stdin, pty, record_path, kwargs)
            front = await asyncio.create_subprocess_exec(
                *args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if capture_output else subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=None if env is None else dict(env),
                cwd=cwd,
            )
            try:
                out, said = await front.communicate()
            except asyncio.CancelledError:
                if front.returncode is None:
                    front.terminate()
                raise
            assert front.returncode is not None
            return self._exec_outcome(front.returncode, record_path, out or b"", said, record is not None)

    def _exec_args(self, argv_or_cmd, yield_, stdin: str, pty: bool, record_path: str, kwargs: dict) -> list[str]:
        """The front's command line: ``corral --yield Y --session S --json RECORD --quiet ...``."""
        return [*_CORRAL, *self.exec_arguments(argv_or_cmd, yield_, stdin, pty, record_path, kwargs)]

    def exec_arguments(self, argv_or_cmd, yield_, stdin: str, pty: bool, record_path: str, kwargs: dict) -> list[str]:
        """``exec``'s arguments to corral (no program name): what a front that is not a
        process of its own (``corralctl mcp``'s) reads with ``core.request.parse_command_line``."""
        if stdin not in ("keep", "null"):
            raise UsageError(f"Session.exec: stdin must be 'keep' or 'null', not {stdin!r}")
        argv = [*shell(), argv_or_cmd] if isinstance(argv_or_cmd, str) else [os.fspath(a) for a in argv_or_cmd]
        args = ["--yield", _value("wall", yield_), "--session", self._id(), "--json", record_path]
        args += ["--quiet", *(["--pty"] if pty else ["--stdin", stdin])]
        for key, value in {**self._defaults, **kwargs}.items():
            if key == "stdin":
                raise UsageError("Session.exec: stdin is its own keyword")
            if value is not None:
                args += [_flag(key), _value(key, value)]
        return [*args, "--", *argv]

    def _exec_outcome(self, code: int, record_path: str, output: bytes, said_bytes: bytes, kept: bool):
        """What the front's exit and its ``--json`` file say: a RunResult, a HandedBack run, or the error."""
        try:
            with open(record_path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            record = None
        said = said_bytes.decode(errors="replace").strip()
        if code == 125 and record is None:
            raise UsageError(said.splitlines()[-1] if said else "bad input")
        if record is None:
            raise SetupError(f"the run could not start (exit {code}): {said}")
        # Handed back: its facts; or, had it ended before the front wrote them, its record
        # with an exit code of its own (a command's own 119 is a result).
        if record.get("running") or (code == HANDED_BACK and record.get("exit_code") != HANDED_BACK):
            return HandedBack(record, self, output, record_path if kept else None)
        return _result(record, output, said_bytes)


def shell() -> list[str]:
    """The shell a command string runs in: ``bash -c`` (no profile read), ``sh -c`` where bash is missing."""
    import shutil

    return ["bash", "-c"] if shutil.which("bash") else ["sh", "-c"]


class BackgroundRun:
    """A started background run of a Session: ``logs()``, ``wait()``, ``stop()``; for
    asyncio, ``alogs()``, ``await_exit()``, ``astop()`` (each in a worker thread)."""

    def __init__(self, record: dict, session: Session):
        self.id: str = record["run_id"]
        self.name: str | None = record.get("name")
        self.log: str = record["log"]
        self.unit: str | None = record.get("unit")
        self.session = session

    def logs(self, tail: int | None = None) -> str:
        r = _ctl(["logs", self.id, *([] if tail is None else ["--tail", str(tail)])])
        if r.returncode != 0:
            raise SetupError(r.stderr.strip())
        return r.stdout

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code, as corral returned it (TimeoutError if still going at ``timeout``)."""
        r = _ctl(["wait", self.id, *([] if timeout is None else ["--timeout", _value("timeout", timeout)])])
        if r.returncode == 124 and "still running" in r.stderr:
            raise TimeoutError(r.stderr.strip())
        return r.returncode

    def stop(self) -> None:
        r = _ctl(["stop", self.id])
        if r.returncode != 0:
            raise Unverified(r.stdout.strip() + " " + r.stderr.strip())

    async def alogs(self, tail: int | None = None) -> str:
        return await asyncio.to_thread(self.logs, tail)

    async def await_exit(self, timeout: float | None = None) -> int:
        return await asyncio.to_thread(self.wait, timeout)

    async def astop(self) -> None:
        """``stop()`` without blocking the event loop (the stop waits out its grace period)."""
        await asyncio.to_thread(self.stop)


def _result(record: dict, output: bytes, said: bytes):
    """A run that ended within the yield: its RunResult, or the library's error for it."""
    from .api import RunResult
    from .common.errors import CannotExecute, NotFound
    from .core.result import SPAWN_FAILED

    result = RunResult.model_validate({**record, "stdout": output, "stderr": said})
    if record.get("outcome") == SPAWN_FAILED:
        raise (NotFound if result.exit_code == 127 else CannotExecute)(record.get("detail") or "", result)
    if result.exit_code == 120:
        raise Unverified(f"could not prove every process stopped; remaining: {result.remaining_pids}", result)
    return result


class HandedBack(BackgroundRun):
    """A ``Session.exec`` run that outlived its yield: a background run of the session.
    ``output`` is what it printed so far and ``cursor`` where that ends in its log;
    ``read_output`` reads on from there, each byte once. ``write_stdin`` types into it
    (``stdin="keep"`` or ``pty=True``). Async: ``awrite_stdin``, ``aread_output``, and
    ``await_exit``, ``astop``."""

    def __init__(self, facts: dict, session: Session, output: bytes, record_path: str | None = None):
        from .state import registry as REG

        run_id = facts["run_id"]
        log = facts.get("log") or REG.output_path(REG.state_dir(), run_id)
        super().__init__({"run_id": run_id, "log": log}, session)
        self.output = output
        self.cursor: int = facts.get("cursor", len(output))
        #: The ``record`` file ``exec`` was given (None: a temporary one, gone).
        self.record_path = record_path

    def record(self) -> dict | None:
        """The run's record, once its corral has written it at the run's end (``--json``):
        None while it runs, without a ``record`` file, or if its corral was killed first."""
        if self.record_path is None:
            return None
        try:
            with open(self.record_path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            return None
        return None if record.get("running") else record

    def write_stdin(self, text: "str | bytes", *, eof: bool = False, timeout: float | None = 30.0) -> None:
        """Type ``text`` into the run's kept stdin (then close it, with ``eof``).
        UsageError when it keeps none (or it is closed, or the run has ended);
        TimeoutError when the command did not read it all within ``timeout``."""
        from .core import stdin_keeper as K

        data = text.encode() if isinstance(text, str) else bytes(text)
        try:
            written = K.send(self.id, data, eof, timeout)
        except BrokenPipeError:
            raise UsageError(f"{self.id}: nothing reads its stdin any more") from None
        if written < len(data):
            raise TimeoutError(f"{self.id}: the command read {written} of {len(data)} bytes within {timeout}s")

    def read_output(self, cursor: int | None = None, max_bytes: int = 1 << 20) -> tuple[bytes, int]:
        """(its output from ``cursor``, default where the last read ended; the cursor to
        read on from). Every byte once when each read starts where the last one ended."""
        from .ctl.logs import output_log
        from .ctl.status import CtlError

        start = self.cursor if cursor is None else cursor
        try:
            fd = output_log(os.path.dirname(self.log), self.id)
        except CtlError as exc:
            raise SetupError(str(exc)) from None
        try:
            data = os.pread(fd, max_bytes, start)
        finally:
            os.close(fd)
        self.cursor = start + len(data)
        return data, self.cursor

    async def awrite_stdin(self, text: "str | bytes", **kwargs) -> None:
        await asyncio.to_thread(self.write_stdin, text, **kwargs)

    async def aread_output(self, cursor: int | None = None, max_bytes: int = 1 << 20) -> tuple[bytes, int]:
        return await asyncio.to_thread(self.read_output, cursor, max_bytes)


def _ctl(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([*_CTL, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)
