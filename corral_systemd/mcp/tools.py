"""The MCP tools: their JSON schemas, descriptions, argument checks and what each does.

Nothing here imports the MCP SDK: ``server.py`` puts these on the wire. Each
tool takes a dict of arguments and returns a dict (the tool's structured
result), or raises ``BadArguments`` (the caller's mistake: one line, nothing
started) or ``RunFailed`` (one line: the run could not start or be ready).
"""

import json
import os
import tempfile
from typing import Any

from ..common.errors import RunError as CorralRunError
from ..engines.kinds import GUARANTEES
from .runs import BadArguments, RunFailed, SessionRun, shell

#: ``max_output_bytes``: what an answer carries by default, and at most.
DEFAULT_OUTPUT = 16384
MAX_OUTPUT = 1 << 20
#: ``yield_ms`` and ``timeout_ms``: at most 10 minutes in one call.
MAX_WAIT_MS = 600_000

_SHELL = " ".join(shell())

_DURATION = {"type": ["string", "number"], "description": "A duration: '30s', '5m', '500ms', or seconds as a number."}
_SIZE = {"type": ["string", "integer"], "description": "A size: '512M', '2G', or bytes as an integer."}
_LIMITS = {
    "wall": {**_DURATION, "description": "Wall-clock limit of the run (e.g. '10m'): reaching it stops it, exit 124."},
    "mem": {**_SIZE, "description": "Memory limit of the run (e.g. '2G'): exceeding it stops it, exit 121."},
    "cpu_time": {**_DURATION, "description": "CPU time of the whole run: reaching it stops it, exit 123."},
}
#: The guarantee tier a run must have (``engines.kinds.GUARANTEES``; auto: the strongest to be had).
_GUARANTEE = {
    "type": "string",
    "enum": ["auto", *GUARANTEES],
    "description": "The guarantee tier the run must have (auto, the default: the strongest to be had "
    "here; a tier that cannot be had ends the run with exit 125 and one line).",
}
_RUN_ID = {"type": "string", "description": "A run id this server returned (exec or start)."}
_CURSOR = {
    "type": "integer",
    "minimum": 0,
    "description": "Absolute byte offset in the run's output to read from: the `cursor` an earlier answer "
    "returned. Default: where the last answer for this run ended.",
}
_MAX_OUTPUT = {
    "type": "integer",
    "minimum": 256,
    "maximum": MAX_OUTPUT,
    "default": DEFAULT_OUTPUT,
    "description": "At most this many bytes of output in the answer: its head and tail, one marker line "
    "between; `output_cut_bytes` says how much was left out (read it with read_output from `output_from`).",
}


def _schema(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


_RESULT = (
    "The end of a run is `exit_code` (the command's, or corral's: 124 wall, 121 memory, 123 CPU time, "
    "128+N a signal, 120 when corral could not prove every process gone), `reason`, and `proof`: "
    "`verified` true means no process the command started is left, daemons and double forks included, "
    "and `guarantee` names what held them."
)

TOOLS: dict[str, dict] = {
    "exec": {
        "description": (
            f"Run a shell command ({_SHELL} CMD) through corral in this server's session and wait up to "
            "yield_ms for it. If it ends by then: its exit code, reason, proof and output; everything it "
            "started (background jobs, setsid daemons) is stopped first. If not: its output so far and "
            "`run_id`; it keeps running (use write_stdin, read_output, wait, stop). stdout and stderr come "
            "as one stream. Every run ends, proven, when this server ends or its client goes away. " + _RESULT
        ),
        "inputSchema": _schema(
            {
                "cmd": {"type": "string", "minLength": 1, "description": f"The command line, run by `{_SHELL}`."},
                "workdir": {"type": "string", "description": "Working directory (default: the server's)."},
                "yield_ms": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_WAIT_MS,
                    "default": 10000,
                    "description": "Wait this long for the command to end before handing back a run_id.",
                },
                "max_output_bytes": _MAX_OUTPUT,
                "tty": {
                    "type": "boolean",
                    "default": False,
                    "description": "Run it on a pseudo-terminal (output as a terminal shows it).",
                },
                **_LIMITS,
                "guarantee": _GUARANTEE,
            },
            ("cmd",),
        ),
    },
    "write_stdin": {
        "description": (
            "Type into an exec run's stdin, wait up to yield_ms (or until it ends), and return what it "
            "printed since the last answer. With eof, close its stdin after the text."
        ),
        "inputSchema": _schema(
            {
                "run_id": _RUN_ID,
                "chars": {"type": "string", "description": "The text to write (add '\\n' to end a line)."},
                "yield_ms": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_MS, "default": 1000},
                "eof": {"type": "boolean", "default": False, "description": "Close the run's stdin afterwards."},
                "max_output_bytes": _MAX_OUTPUT,
            },
            ("run_id", "chars"),
        ),
    },
    "read_output": {
        "description": (
            "A page of a run's output from a cursor (an absolute byte offset), and the cursor to read "
            "from next: passing each answer's cursor back reads every byte once, none twice. `more` "
            "says more is already there. A run's output is its log (16 MiB, head and tail; "
            "`log_cut` when corral cut it back)."
        ),
        "inputSchema": _schema(
            {
                "run_id": _RUN_ID,
                "cursor": _CURSOR,
                "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_OUTPUT, "default": 65536},
            },
            ("run_id",),
        ),
    },
    "start": {
        "description": (
            f"Start a background run ({_SHELL} CMD) in this server's session, e.g. a dev server, and return "
            "once it is ready: ready_port (a TCP connect to 127.0.0.1 or ::1 succeeds), ready_file (the "
            "file exists), ready_log (a line of its output matches the regex), or once started. Not ready "
            "within ready_timeout: stopped, an error. It runs until stop, its wall limit, or the end of the "
            "session (this server's end): then it and everything it started are gone, proven. Its stdin "
            "is /dev/null; its output is a log (read_output)."
        ),
        "inputSchema": _schema(
            {
                "cmd": {"type": "string", "minLength": 1, "description": f"The command line, run by `{_SHELL}`."},
                "workdir": {"type": "string", "description": "Working directory (default: the server's)."},
                "ready_port": {"type": "integer", "minimum": 1, "maximum": 65535},
                "ready_file": {"type": "string"},
                "ready_log": {"type": "string", "description": "A Python regular expression."},
                "ready_timeout": {**_DURATION, "description": "How long to wait for readiness (default 30s)."},
                **_LIMITS,
                "guarantee": _GUARANTEE,
            },
            ("cmd",),
        ),
    },
    "list": {
        "description": "This server's session and its runs: id, kind, command, running or exit code.",
        "inputSchema": _schema({}),
    },
    "stop": {
        "description": (
            "Stop a run: SIGTERM to everything it started, SIGKILL after the grace, then proof that nothing "
            "is left. Returns its end (exit code, reason, proof)."
        ),
        "inputSchema": _schema({"run_id": _RUN_ID}, ("run_id",)),
    },
    "wait": {
        "description": (
            "Wait up to timeout_ms for a run to end. Ended: its exit code, reason and proof (and, for an "
            "exec run, the output not handed out yet). Still running: `running` true, nothing changed."
        ),
        "inputSchema": _schema(
            {
                "run_id": _RUN_ID,
                "timeout_ms": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_MS, "default": 30000},
                "max_output_bytes": _MAX_OUTPUT,
            },
            ("run_id",),
        ),
    },
}

_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict}


def check_arguments(tool: str, arguments: dict | None) -> dict:
    """The arguments checked against the tool's schema, defaults filled in;
    BadArguments naming the first wrong one."""
    schema = TOOLS[tool]["inputSchema"]
    given = dict(arguments or {})
    for name in given:
        if name not in schema["properties"]:
            raise BadArguments(f"{tool}: unknown argument {name!r} (takes {', '.join(schema['properties'])})")
    for name in schema["required"]:
        if given.get(name) is None:
            raise BadArguments(f"{tool}: {name} is required")
    checked: dict[str, Any] = {}
    for name, spec in schema["properties"].items():
        value = given.get(name, spec.get("default"))
        if value is None:
            checked[name] = None
            continue
        types = spec["type"] if isinstance(spec["type"], list) else [spec["type"]]
        ok = any(isinstance(value, _TYPES[t]) and not (isinstance(value, bool) and t != "boolean") for t in types)
        if not ok:
            raise BadArguments(f"{tool}: {name} must be {' or '.join(types)}, not {type(value).__name__}")
        low, high = spec.get("minimum"), spec.get("maximum")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if (low is not None and value < low) or (high is not None and value > high):
                raise BadArguments(f"{tool}: {name} must be from {low} to {high}, not {value}")
        if isinstance(value, str) and len(value) < spec.get("minLength", 0):
            raise BadArguments(f"{tool}: {name} must not be empty")
        if "enum" in spec and value not in spec["enum"]:
            raise BadArguments(f"{tool}: {name} must be one of {', '.join(spec['enum'])}, not {value!r}")
        checked[name] = value
    return checked


def limit_options(args: dict) -> dict:
    """The run's limits as the library takes them (``common.limits``), checked: BadArguments if not."""
    from ..common.limits import BY_FIELD

    limits = {}
    for field in _LIMITS:
        if args.get(field) is None:
            continue
        limit = BY_FIELD[field]
        try:
            value = limit.coerce(args[field], field)
        except ValueError as exc:
            raise BadArguments(str(exc)) from None
        if not 0 < value <= limit.maximum:
            raise BadArguments(f"{field} {args[field]!r}: out of range")
        limits[field] = value
    return limits


def _workdir(args: dict) -> str | None:
    workdir = args.get("workdir")
    if workdir is not None and not os.path.isdir(workdir):
        raise BadArguments(f"workdir {workdir!r}: not a directory")
    return workdir


RECORDS_PREFIX = "corral-mcp-"
_LOCK = "lock"


def _records_directory() -> tuple[str, int]:
    """A directory of this server's own for its runs' records (under $TMPDIR, 0700),
    and the descriptor of the lock it holds on it for as long as it lives.

    A server that ended without ``close`` (SIGKILLed) cannot remove its own: each
    server removes, as it starts, every directory of this user's whose lock no
    process holds (the kernel drops a dead process's flock), never one in use, in
    whatever pid namespace its server runs."""
    import fcntl
    import shutil
    import stat

    base = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(base) if n.startswith(RECORDS_PREFIX)]
    except OSError:
        names = []
    for name in names:
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(path, _LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # not a server's (no lock file), or gone meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its server lives
        finally:
            os.close(fd)  # (a lock taken is dropped with it: the directory is removed next)
        shutil.rmtree(path, ignore_errors=True)
    # Made under a name no other server prunes, and given its own once locked.
    staging = tempfile.mkdtemp(prefix="." + RECORDS_PREFIX)
    fd = os.open(os.path.join(staging, _LOCK), os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    path = os.path.join(base, os.path.basename(staging)[1:])
    os.rename(staging, path)
    return path, fd


class Tools:
    """The tools over one corral session (``corral_systemd.Session``, opened by the caller)."""

    def __init__(self, session):
        self.session = session
        self.runs: dict[str, SessionRun] = {}
        self._records, self._records_lock = _records_directory()
        self._next = 0

    async def call(self, tool: str, arguments: dict | None) -> dict:
        if tool not in TOOLS:
            raise BadArguments(f"unknown tool {tool!r} ({', '.join(TOOLS)})")
        args = check_arguments(tool, arguments)
        handler = getattr(self, "tool_" + tool)
        return await handler(args)

    def close(self) -> None:
        """Forget the records directory (the runs themselves end with the session)."""
        import shutil

        shutil.rmtree(self._records, ignore_errors=True)
        os.close(self._records_lock)

    def _new_id(self) -> str:
        self._next += 1
        return f"r{self._next}"

    def _run(self, run_id: str) -> SessionRun:
        run = self.runs.get(run_id)
        if run is None:
            raise BadArguments(f"unknown run_id {run_id!r} (list shows this server's runs)")
        return run

    def _options(self, args: dict) -> dict:
        """The run's limits and guarantee as the library takes them (BadArguments if malformed)."""
        options: dict = dict(limit_options(args))
        if args.get("guarantee") not in (None, "auto"):
            options["guarantee"] = args["guarantee"]
        return options

    # -- the tools ----------------------------------------------------------------------
    async def tool_exec(self, args: dict) -> dict:
        """``corral --yield``'s run, this server its front (``mcp.front``: no corral process
        start); where the session's holder cannot start it with this server's context,
        a ``corral --yield`` front does (``Session.aexec``), which can start it itself."""
        from . import front

        options, cwd = self._options(args), _workdir(args)
        run_id = self._new_id()
        record = os.path.join(self._records, f"{run_id}.json")
        yield_s = args["yield_ms"] / 1000
        log = None  # the run's log where this server is its front
        try:
            launched = await front.launch(
                self.session, args["cmd"], yield_s=yield_s, pty=args["tty"], record=record, cwd=cwd, options=options
            )
        except front.Refused as exc:  # corral's 125 (a guarantee not to be had here): nothing ran
            run = SessionRun(run_id, "exec", args["cmd"], None, record_path=record, refused=str(exc))
        except front.Unstarted as exc:
            raise RunFailed(str(exc)) from None
        except front.FrontNeeded:
            run = await self._exec_by_front(run_id, args, options, cwd, record)
            yield_s = 0  # the front waited it out
        else:
            log, handle = launched.log, None
            if launched.corral is not None:
                from ..session import HandedBack

                facts = {"run_id": launched.run_id, "log": launched.log, "cursor": 0}
                handle = HandedBack(facts, self.session, b"", record)
            run = SessionRun(
                run_id, "exec", args["cmd"], launched.run_id, handle=handle, record_path=record, corral=launched.corral
            )
        self.runs[run_id] = run
        ended = await run.ended(yield_s)
        if ended and log is not None and run.corral_run_id is not None:  # its corral's own lines: the front's
            front.take_report(log, run.corral_run_id)  # to take, as corral --yield's
        return self._answer(run, ended, args["max_output_bytes"])

    async def _exec_by_front(self, run_id: str, args: dict, options: dict, cwd: str | None, record: str) -> SessionRun:
        """The exec run through a ``corral --yield`` front (``Session.aexec``)."""
        from ..common.errors import SetupError, UsageError
        from ..session import HandedBack

        refused = handle = None
        try:
            outcome = await self.session.aexec(
                args["cmd"],
                yield_=args["yield_ms"] / 1000,
                pty=args["tty"],
                record=record,
                capture_output=False,  # the output is read from its log, with cursors
                cwd=cwd,
                **options,
            )
            handle = outcome if isinstance(outcome, HandedBack) else None
        except UsageError as exc:  # corral's 125 (a guarantee not to be had here): nothing ran
            refused = " ".join(str(exc).split())
        except SetupError as exc:
            raise RunFailed(" ".join(str(exc).split())) from None
        except CorralRunError:  # ended within the yield, as run() raises it (127, 126, 120): its record says it
            pass
        corral_run_id = None
        if refused is None:
            with open(record) as f:
                corral_run_id = json.load(f).get("run_id")
        return SessionRun(
            run_id, "exec", args["cmd"], corral_run_id, handle=handle, record_path=record, refused=refused
        )

    def _answer(self, run: SessionRun, ended: bool, limit: int) -> dict:
        facts: dict = {"run_id": run.id, "running": not ended}
        if ended:
            facts.update(run.end_facts())
        facts.update(run.take(None, limit, window=True))
        return facts

    async def tool_write_stdin(self, args: dict) -> dict:
        run = self._run(args["run_id"])
        if run.kind != "exec":
            raise BadArguments(f"write_stdin: {run.id} is a start run (stdin /dev/null); only exec runs take input")
        if not run.running:
            raise BadArguments(f"write_stdin: {run.id} has ended (exit {run.end_facts()['exit_code']})")
        timeout = args["yield_ms"] / 1000
        await run.write(args["chars"].encode(), args["eof"], timeout)
        ended = await run.ended(timeout)
        return self._answer(run, ended, args["max_output_bytes"])

    async def tool_read_output(self, args: dict) -> dict:
        run = self._run(args["run_id"])
        running = run.running
        return {"run_id": run.id, "running": running, **run.take(args["cursor"], args["max_bytes"], window=False)}

    async def tool_start(self, args: dict) -> dict:
        from ..common.errors import SetupError, UsageError

        ready = {key: args[f"ready_{key}"] for key in ("port", "file", "log") if args.get(f"ready_{key}") is not None}
        if len(ready) > 1:
            raise BadArguments("start: give at most one of ready_port, ready_file, ready_log")
        options = self._options(args)
        if args.get("ready_timeout") is not None:
            from ..common.limits import coerce_duration

            try:
                options["ready_timeout"] = coerce_duration(args["ready_timeout"], "ready_timeout")
            except ValueError as exc:
                raise BadArguments(str(exc)) from None
        cwd = _workdir(args)
        try:
            handle = await self.session.astart([*shell(), args["cmd"]], ready=ready or None, cwd=cwd, **options)
        except UsageError as exc:
            raise BadArguments(f"start: {exc}") from None
        except SetupError as exc:
            raise RunFailed(" ".join(str(exc).split())) from None
        run = SessionRun(self._new_id(), "start", args["cmd"], handle.id, handle=handle, ready=ready or None)
        self.runs[run.id] = run
        return {"run_id": run.id, "corral_run_id": run.corral_run_id, "running": True, "ready": ready or "started"}

    async def tool_list(self, args: dict) -> dict:
        runs = []
        for run in self.runs.values():
            item: dict = {"run_id": run.id, "kind": run.kind, "cmd": run.cmd, "running": run.running}
            if not item["running"]:
                item["exit_code"] = run.end_facts()["exit_code"]
            runs.append(item)
        return {"session": self.session.id, "server_pid": os.getpid(), "runs": runs}

    async def tool_stop(self, args: dict) -> dict:
        run = self._run(args["run_id"])
        await run.stop()
        return {"run_id": run.id, "running": run.running, **run.end_facts()}

    async def tool_wait(self, args: dict) -> dict:
        run = self._run(args["run_id"])
        ended = await run.ended(args["timeout_ms"] / 1000)
        if run.kind == "exec":
            return self._answer(run, ended, args["max_output_bytes"])
        return {"run_id": run.id, "running": not ended, **(run.end_facts() if ended else {})}
