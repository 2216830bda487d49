"""Every way a run is asked for becomes a ``RunRequest`` here, checked once.

    a command line: corral's argv (the CLI; the corral service for a
    client, with the client's environment and working directory)  ──┐
    keyword arguments (the library: ``spec_from_keywords``)          ──┴─→ RunRequest / RunSpec

The options are declared once (``core.options.OPTIONS``, the limits among them read
from ``common.limits``); the parser below reads that table, and so does
the CLI's click command, which only prints (``--help``, ``--version``,
completion) and is built from it. A value is coerced once, by its
``Limit`` (text parsed as the CLI parses it, a number taken as it is), and
range-checked once, by ``RunSpec``; each choice list is ``spec.py``'s.
No click and no typer here: a run's start-up pays for neither.

The command line is read as click reads it (``allow_interspersed_args``
off): options until ``--`` or the first argument that is not one, then the
command; ``--opt VALUE`` or ``--opt=VALUE``, ``-pVALUE`` or ``-p VALUE``; a
repeated single option keeps its last value; a long option names one
option exactly (no abbreviations).

Failure modes: ``UsageError`` (exit 125, one line) for anything malformed,
before anything starts; ``Printing`` for a command line that asks corral
to print (the CLI's click command prints it; the service leaves it to the
client's own process).
"""

import os

from ..common.errors import UsageError
from ..common.limits import LIMITS, coerce_duration, coerce_size
from ..common.plainclass import field, plainclass
from .options import (  # noqa: F401  (re-exported)
    _BY_FLAG,
    _BY_NAME,
    COMMAND_METAVAR,
    KEPT_STDIN,
    OPTIONS,
    STDOUT_PATHS,
    Option,
)
from .spec import RunSpec


class Printing(Exception):
    """The command line asks corral to print something (help, version,
    completion) and exit: no run. ``option`` is the flag that asked."""

    def __init__(self, option: str):
        super().__init__(option)
        self.option = option


@plainclass
class RunRequest:
    """A run as asked for: the spec and how to report on it."""

    spec: RunSpec
    #: --json: where the record goes (absolute, or one of STDOUT_PATHS); None: nowhere.
    json_path: str | None = None
    #: --json-fd: the caller's descriptor the record goes to (``core.record_fd``); None: not asked.
    json_fd: int | None = None
    quiet: bool = False
    #: What --env-clear/--env-keep/--env-drop did (the record's ``environment``).
    environment: dict | None = None
    registry: bool = True
    #: RunGuard's other keywords (``guard_options``).
    extra: dict = field(default_factory=dict)
    #: --background and its readiness (``core.background``); None: a foreground run.
    background: "Background | None" = None
    #: --yield: seconds the front waits before handing the run back (``core.handback``); None: not asked.
    yield_after: float | None = None
    #: --name: the run's name in the registry.
    name: str | None = None
    #: A --background run's output log, once its corral is detached (``core.background``).
    output_log: str | None = None
    #: A detached run's corral keeps the command's stdin (``core.stdin_keeper``), and where a
    #: --yield run's corral writes its own lines (warnings, summary), apart from the output.
    keep_stdin: bool = False
    report_path: str | None = None
    #: A detached run's corral: the write end of its front's ready pipe, told once
    #: the command has started (``core.background.StartedPipe``); None: no front waits.
    started_fd: int | None = None
    #: --background: a connection whose hang-up stops the run while it is not yet ready, as
    #: a served caller's does (a compiled client's, for the front its session's holder forked).
    hangup_fd: int | None = None
    #: --background in a session, read by its holder: this process is the holder's fork
    #: (the compiled client's front, ``ctl/session_spawner.py``), so the run's corral is
    #: forked here, below the holder, with this request as it is (never read again).
    below_holder: bool = False
    #: The command line it was read from, and the --cgroup-mode it defaulted to (the
    #: program's): a session's holder reads it again for a background run's corral.
    args: list[str] = field(default_factory=list)
    default_mode: str = "auto"
    #: Descriptors the supervisor's poll also waits on, and what it calls when one is
    #: readable (a background run's log keeper: ``core.logkeeper``).
    watches: dict = field(default_factory=dict)

    @property
    def record_to_stdout(self) -> bool:
        return self.json_path in STDOUT_PATHS

    def guard_options(self) -> dict:
        """The RunGuard's keywords for this run."""
        labels: dict[str, object] = {"name": self.name} if self.name is not None else {}
        if self.output_log is not None:  # the detached corral of a --background run
            labels.update(background=True, output_log=self.output_log)
        options = {"environment": self.environment, "registry": self.registry, "labels": labels}
        return options if self.started_fd is None else dict(options, started_fd=self.started_fd)


#: READY_KINDS: how a background run says it is ready (the option that asks for each).
READY_KINDS = {"port": "--ready-port", "file": "--ready-file", "log": "--ready-log"}


@plainclass
class Background:
    """--background: the run detached from this corral, and when it counts as ready."""

    #: One of READY_KINDS, or None: ready once the command has started.
    ready: str | None
    #: The port (int), the file (absolute path) or the compiled pattern.
    target: object
    ready_timeout: float
    log_max: int
    #: The output log (``<state dir>/<run id>.out``); set when the run is launched.
    log: str | None = None
    #: --stdin keep (or --pty): the command's stdin is a pipe its corral keeps (``core.stdin_keeper``).
    keep_stdin: bool = False


def check_name(text: str | None, option: str = "--name") -> str | None:
    """A run's or a session's name: 1 to 64 of letters, digits, '.', '_', '-'; not an id's shape."""
    if text is None:
        return None
    from ..common import unit_names

    if not 0 < len(text) <= 64 or not _NAME_CHARS.issuperset(text) or text[0] in ".-":
        raise UsageError(f"invalid {option} {text!r}: 1 to 64 letters, digits, '.', '_' and '-', not first '.' or '-'")
    if unit_names.looks_like_run(text):
        raise UsageError(f"invalid {option} {text!r}: it reads as a run id")
    return text


def _background(values: dict, given, path, request: RunRequest) -> Background | None:
    asked = [kind for kind, flag in READY_KINDS.items() if values.get(f"ready_{kind}") is not None]
    kept = values.get("stdin") == KEPT_STDIN
    yielding = values.get("yield_after") is not None
    if not values.get("background") and not yielding:
        # (--ready-timeout and --log-max have defaults: given or not, they say nothing here)
        if asked:
            raise UsageError(f"{READY_KINDS[asked[0]]} is for --background runs")
        if kept:
            raise UsageError("--stdin keep is for --background and --yield runs (corralctl send writes to it)")
        return None
    if yielding and values.get("background"):
        raise UsageError("--yield and --background: one or the other (--yield hands a run back if it outlives it)")
    if yielding and asked:
        raise UsageError(f"{READY_KINDS[asked[0]]} is for --background runs, not --yield")
    what = "--yield" if yielding else "--background"
    if len(asked) > 1:
        raise UsageError(f"{READY_KINDS[asked[0]]} and {READY_KINDS[asked[1]]}: one readiness test at a time")
    spec = request.spec
    if not request.registry:
        raise UsageError(f"{what} needs the registry (corralctl logs, wait and stop find the run there)")
    if spec.stdin != "null" and not spec.pty:
        raise UsageError(f"{what}: the command's stdin is /dev/null or kept (--stdin keep, --pty), not corral's own")
    if spec.output_file is not None or spec.output_limit is not None:
        raise UsageError(f"{what}: its output goes to the run's log (--log-max caps it)")
    kind = asked[0] if asked else None
    target: object = None
    if kind == "port":
        text = given("ready_port")
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise UsageError(f"invalid --ready-port {text!r}: a TCP port, 1 to 65535")
        target = int(text)
    elif kind == "file":
        target = path(given("ready_file"))
    elif kind == "log":
        import re

        try:
            target = re.compile(given("ready_log"))
        except re.error as exc:
            raise UsageError(f"invalid --ready-log {given('ready_log')!r}: {exc}") from None
    try:
        timeout = coerce_duration(given("ready_timeout", "30s"), "--ready-timeout")
        log_max = coerce_size(given("log_max", "16M"), "--log-max")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if log_max is None or log_max <= 0:
        raise UsageError("--log-max must be greater than 0")
    return Background(kind, target, timeout, log_max, keep_stdin=kept or spec.pty)


def _yield_after(values: dict, request: RunRequest) -> float | None:
    """--yield: its seconds, checked with what it needs (a session: a run handed
    back ends with it; a record in a file: the run may end after corral returned)."""
    text = values.get("yield_after")
    if text is None:
        return None
    try:
        seconds = coerce_duration(text, "--yield")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if request.spec.session is None:
        raise UsageError("--yield needs a session (--session or CORRAL_SESSION): a run handed back ends with it")
    if request.record_to_stdout:
        raise UsageError("--yield: --json - cannot follow a run that is handed back; give --json PATH")
    return seconds


# -- the command line -----------------------------------------------------------------------------
def parse_command_line(
    args: list[str], *, default_mode: str = "auto", environ: dict | None = None, cwd: str | None = None
) -> RunRequest:
    """``corral``'s arguments (after the program name) as a RunRequest.

    ``environ``/``cwd``: the caller's, when they are not this process's
    (the corral service reading a client's command line); relative paths
    are taken from ``cwd``. ``Printing`` for --help and the like;
    ``UsageError`` for anything else that is not a run."""
    values, command = parse_options(args)
    values.setdefault("cgroup_mode", default_mode)
    request = from_options(values, command, environ=environ, cwd=cwd)
    request.args, request.default_mode = list(args), default_mode
    return request


def parse_options(args: list[str]) -> tuple[dict, list[str]]:
    """(the options given, by ``Option.name``: text, a list for "many", True
    for a flag; the command). Nothing is converted here but the split."""
    values: dict = {}
    value: str | bool
    printing: list[str] = []
    command: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            command = list(args[i + 1 :])
            break
        attached: str | None
        if arg.startswith("--"):
            flag, eq, rest = arg.partition("=")
            attached = rest if eq else None
        elif arg.startswith("-") and len(arg) > 1:
            flag, attached = arg[:2], (arg[2:] or None)
        else:
            command = list(args[i:])
            break
        option = _lookup(flag)
        if option.takes == "flag":
            if attached is not None:
                if flag.startswith("--"):
                    raise UsageError(f"Option {flag!r} does not take a value.")
                _lookup("-" + attached[0])  # -hX: click reads each letter as a flag; none of corral's others is short
            value = True
        elif attached is not None:
            value = attached
        else:
            i += 1
            if i == len(args):
                raise UsageError(f"Option {flag!r} requires an argument.")
            value = args[i]
        if option.printing:
            printing.append(flag)
        elif option.takes == "many":
            values.setdefault(option.name, []).append(value)
        else:
            values[option.name] = value
        i += 1
    # As click: the whole line is split first (an unknown option or a missing
    # value fails there), then a printing option wins over every value check.
    if printing:
        raise Printing(printing[0])
    # Checked in the order first given, as click does (its parameters are
    # processed by invocation order): the same line gives the same first error.
    for name, chosen in values.items():
        option = _BY_NAME[name]
        if option.choices and chosen not in option.choices:
            shown = ", ".join(repr(c) for c in option.choices)
            raise UsageError(f"Invalid value for {option.flags[0]!r}: {chosen!r} is not one of {shown}.")
    return values, command


def _lookup(flag: str) -> Option:
    option = _BY_FLAG.get(flag)
    if option is None:
        import difflib

        # click's words (corral's messages were click's before this parser).
        message = f"No such option {flag!r}."
        if flag.startswith("--"):
            close = sorted(difflib.get_close_matches(flag, [f for f in _BY_FLAG if f.startswith("--")]))
            shown = ", ".join(repr(f) for f in close)
            if len(close) == 1:
                message += f" Did you mean {shown}?"
            elif close:
                message += f" (Did you mean one of: {shown}?)"
        raise UsageError(message)
    return option


def from_options(
    values: dict, command: list[str], *, environ: dict | None = None, cwd: str | None = None
) -> RunRequest:
    """A RunRequest from options as ``parse_options`` returns them (or the
    click command's parameters: the same names; None or [] for "not given")."""
    if not command:
        raise UsageError(f"Missing argument {COMMAND_METAVAR!r}.")

    def given(name, default=None):
        value = values.get(name)
        return default if value is None else value

    def path(text: str | None) -> str | None:
        return None if text is None else os.path.abspath(os.path.join(cwd or "", text))

    try:
        limits = {limit.field: limit.coerce(given(limit.field)) for limit in LIMITS}
        spec = RunSpec(
            argv=list(command),
            **limits,
            grace=coerce_duration(given("grace", "2s"), "--grace"),
            verify_timeout=coerce_duration(given("verify_timeout", "2s"), "--verify-timeout"),
            cgroup_mode=given("cgroup_mode", "auto"),
            guarantee=given("guarantee", "auto"),
            cgroup_parent=given("cgroup_parent"),
            # --pty relays corral's stdin to the terminal; a kept one (--stdin keep) is the
            # run's corral's own stdin, made so when it is detached (core.stdin_keeper)
            stdin="inherit" if values.get("pty") else _spec_stdin(given("stdin", "null")),
            manager=given("manager", "auto"),
            unit_type=given("unit_type", "scope"),
            slice=given("slice", "corral.slice"),
            properties=list(given("property", [])),
            network=given("network", "host"),
            handoff=given("handoff", "allow"),
            pty=bool(values.get("pty")),
            output_limit=coerce_size(given("output_limit"), "--output-limit"),
            output_file=path(given("output_file")),
            cwd=cwd,
            env=None if environ is None else dict(environ),
            credential_requests=credential_pairs(given("credential", []), cwd=cwd),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    json_path, json_fd = given("json"), given("json_fd")
    if json_fd is not None:
        from .record_fd import number

        if json_path is not None:
            raise UsageError("--json and --json-fd: the record goes to one of them")
        if values.get("background"):
            raise UsageError("--json-fd is for foreground runs (a --background run's record: --json PATH)")
        json_fd = number(json_fd)
    if json_path is not None and json_path not in STDOUT_PATHS:
        _refuse_descriptor_path(json_path)
        json_path = os.path.abspath(os.path.join(cwd or "", json_path))
        check_output_path(json_path)
    if spec.output_file is not None:
        check_output_path(spec.output_file, option="--output-file")
    environment = None
    clear, keep, drop = bool(values.get("env_clear")), given("env_keep", []), given("env_drop", [])
    if clear or keep or drop:
        if keep and not clear:
            raise UsageError("--env-keep needs --env-clear (without it every variable is kept)")
        from ..common.envfilter import filter_environment

        spec.env, environment = filter_environment(
            os.environ if environ is None else environ, clear=clear, keep=keep, drop=drop
        )
    request = RunRequest(
        spec,
        json_path=json_path,
        json_fd=json_fd,
        quiet=bool(values.get("quiet")),
        environment=environment,
        registry=not values.get("no_registry"),
        name=check_name(given("name")),
    )
    spec.session = given("session") or (os.environ if environ is None else environ).get("CORRAL_SESSION") or None
    if spec.session is not None and not request.registry:
        raise UsageError("a run in a session needs the registry (the session learns its runs there): no --no-registry")
    request.background = _background(values, given, path, request)
    request.yield_after = _yield_after(values, request)
    return request


def _spec_stdin(text: str) -> str:
    return "null" if text == KEPT_STDIN else text


def _refuse_descriptor_path(path: str) -> None:
    """``--json /dev/fd/N``: a descriptor's name, which corral would open anew
    (and the command would still inherit N): UsageError naming --json-fd."""
    from .record_fd import LOWEST

    for prefix in ("/dev/fd/", "/proc/self/fd/"):
        number = path[len(prefix) :]
        if path.startswith(prefix) and number.isascii() and number.isdigit() and int(number) >= LOWEST:
            raise UsageError(f"--json {path!r}: for a descriptor use --json-fd {int(number)}")


def check_output_path(path: str, option: str = "--json") -> None:
    """A file corral will write: a regular file or none yet, in a writable directory."""
    import stat

    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # EACCES on the way there, ENAMETOOLONG...
        raise UsageError(f"{option} {path!r}: {exc.strerror or exc}") from None
    # The record replaces the file by rename: anything but a regular file
    # (a directory, a symlink such as /dev/stdout, a device, a fifo) would
    # be destroyed, so refuse it.
    if mode is not None and not stat.S_ISREG(mode):
        raise UsageError(f"{option} {path!r} exists and is not a regular file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"{option} {path!r}: directory {parent!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{option} {path!r}: directory {parent!r} is not writable")


# -- credentials ----------------------------------------------------------------------------------
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def credential_pairs(texts, *, cwd: str | None = None) -> list[tuple[str, str]]:
    """``NAME=PATH`` texts (--credential; the library's ``{NAME: PATH}`` as
    such texts) as (NAME, absolute PATH: relative to ``cwd``) pairs, each
    NAME once. UsageError for a malformed one or a NAME given twice."""
    pairs = []
    for text in texts:
        name, sep, where = text.partition("=")
        if not sep or not name or not where:
            raise UsageError(f"invalid --credential {text!r}: expected NAME=PATH")
        if name in (".", "..") or len(name) > 255 or not _NAME_CHARS.issuperset(name):
            raise UsageError(f"invalid --credential name {name!r}: letters, digits, '.', '_' and '-' only")
        pairs.append((name, os.path.abspath(os.path.join(cwd or "", where))))
    names = [n for n, _ in pairs]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise UsageError(f"--credential {dup[0]!r} given twice")
    return pairs


# -- keyword arguments (the library) ----------------------------------------------------------------
def spec_from_keywords(
    argv,
    *,
    wall=None,
    mem=None,
    pids=None,
    max_output=None,
    cpu_time=None,
    cpus=None,
    grace=2.0,
    verify_timeout=2.0,
    mode: str = "auto",
    guarantee: str = "auto",
    unit_type: str = "service",
    manager: str = "auto",
    slice: str = "corral.slice",
    cgroup_parent: str | None = None,
    stdin: None | bytes | str = None,
    env=None,
    cwd=None,
    credentials=None,
    properties=None,
    output_limit=None,
    output_file=None,
    network: str = "host",
    handoff: str = "allow",
    pty: bool = False,
    session: str | None = None,
) -> RunSpec:
    """The library's keyword arguments as a RunSpec (UsageError if bad); the
    public ``corral_systemd.make_spec``. A limit is text (parsed as the CLI
    parses it) or a number (seconds, bytes, a count, CPUs); paths are str or
    os.PathLike; ``mode`` is --cgroup-mode, ``guarantee`` --guarantee.

    ``unit_type`` defaults to "service" here (the CLI's default is "scope"):
    the manager starts the command, so the host process, which is usually
    multi-threaded, never forks or spawns for a run; the command's output
    goes to pipes anyway, and a service costs the host about a third less
    CPU per run (bench/runner_bench.py). "scope" keeps the command a child
    of the host (its exact environment and argv, held at corral-gate: ``kernel.spawn.spawn_held``).

    ``credentials`` maps NAME to a file PATH, as ``--credential NAME=PATH``:
    the command finds a copy as ``$CREDENTIALS_DIRECTORY/NAME``, removed when
    the run ends (a bad NAME, or one given twice, is a UsageError).

    ``properties`` maps unit property names to values, as ``-p NAME=VALUE``
    (``{"IOWeight": 50}``): systemd runs only; properties corral sets itself,
    or that the unit type does not take, are a UsageError.

    ``output_limit`` (bytes, or "128K"), as ``--output-limit``: the captured
    stdout and stderr hold the first and the last half of that many bytes of
    the two together, with one marker line where the middle was left out;
    the result's ``output_omitted_bytes`` says how much (0: nothing). The run
    is not stopped (``max_output`` stops it). ``output_file``, as
    ``--output-file``: the whole stream is also written there (0600).

    ``network="none"``, as ``--network none``: the command has only a
    loopback interface, checked before it runs (SetupError if that cannot
    be had); the run is sealed too, as with ``handoff="deny"``: no service
    manager, bus, atd or terminal multiplexer server outside the run can be
    reached (SetupError if that cannot be had). A Runner's scope runs cannot
    do either (the host must not fork): use services, the library's default.

    ``session`` (an id or a name), as ``--session``: the run joins that open
    session and ends with it; default: ``$CORRAL_SESSION`` of this process
    (so a tool running inside a session's run joins it, as corral does);
    ``""`` joins none.

    ``pty=True``, as ``--pty``: the command's stdin, stdout and stderr are a
    pseudo-terminal of its own (its controlling terminal); everything it
    writes arrives as stdout (CR LF line ends), and ``stdin="pipe"`` (what
    ``send`` writes) or ``stdin=bytes`` is typed into it. Services (the
    default) and fallback runs; a Runner's scope cannot (SetupError).
    """
    try:
        argv = [os.fspath(a) for a in argv]
    except TypeError:
        raise UsageError("argv must be a sequence of strings (or paths)") from None
    if cwd is not None:
        text = os.fspath(cwd) if isinstance(cwd, (str, os.PathLike)) else None
        if not isinstance(text, str) or "\0" in text or not os.path.isdir(text):
            raise UsageError(f"cwd {cwd!r} is not a directory")
        cwd = os.path.abspath(text)
    if env is not None and not hasattr(env, "items"):
        raise UsageError("env must be a mapping of names to values")
    given = {"wall": wall, "mem": mem, "pids": pids, "max_output": max_output, "cpu_time": cpu_time, "cpus": cpus}
    try:
        return RunSpec(
            argv=argv,
            **{limit.field: limit.coerce(given[limit.field], what=limit.field) for limit in LIMITS},
            grace=coerce_duration(grace, "grace"),
            verify_timeout=coerce_duration(verify_timeout, "verify_timeout"),
            cgroup_mode=mode,
            guarantee=guarantee,
            cgroup_parent=cgroup_parent,
            stdin="null" if stdin is None else stdin,
            manager=manager,
            unit_type=unit_type,
            slice=slice,
            env=None if env is None else {str(k): str(v) for k, v in env.items()},
            cwd=cwd,
            credential_requests=credential_pairs(f"{name}={os.fspath(p)}" for name, p in (credentials or {}).items()),
            properties=[f"{name}={value}" for name, value in (properties or {}).items()],
            output_limit=coerce_size(output_limit, "output_limit"),
            output_file=None if output_file is None else os.path.abspath(os.fspath(output_file)),
            network=network,
            handoff=handoff,
            pty=pty,
            # as corral: a tool inside a session's run joins it too
            session=(os.environ.get("CORRAL_SESSION") or None) if session is None else (session or None),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
