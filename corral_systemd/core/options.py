"""corral's options, each declared once: its flags, what it takes, its help, its default, its
choices, its limit. The command-line parser (``request.parse_options``) and the CLI's click
command (``cli.click_command``: --help, the man page test, completion) both read this table.
No click and no typer here."""

from ..common.limits import LIMITS, Limit
from ..common.plainclass import plainclass
from .spec import CGROUP_MODES, GUARANTEE_CHOICES, HANDOFFS, MANAGERS, NETWORKS, STDIN_MODES, UNIT_TYPES

#: --json values that mean "standard output" (the record follows the command's output there).
STDOUT_PATHS = ("-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")
#: --stdin's value for a pipe the run's corral keeps (``core.stdin_keeper``: corralctl send).
KEPT_STDIN = "keep"
#: The command's place in a usage line and in messages.
COMMAND_METAVAR = "-- COMMAND [ARG...]"


@plainclass(frozen=True)
class Option:
    """One option of corral's command line (``OPTIONS``)."""

    #: The keyword its value is kept under (``parse_options``, the click command's parameter).
    name: str
    flags: tuple[str, ...]
    #: "value" (one, the last given wins), "many" (repeatable) or "flag" (no value).
    takes: str
    help: str
    metavar: str = ""
    #: What the CLI's --help shows as the default (text, as typed); None: none.
    default: str | None = None
    choices: tuple[str, ...] = ()
    #: Prints and exits (--help, --version, completion): never a run.
    printing: bool = False
    limit: Limit | None = None


def _limit_option(limit: Limit) -> Option:
    return Option(limit.field, (limit.option,), "value", limit.help, limit.metavar, limit=limit)


_LIMIT = {limit.field: _limit_option(limit) for limit in LIMITS}

#: Every option of ``corral``, in --help's order.
OPTIONS: tuple[Option, ...] = (
    _LIMIT["wall"],
    Option("grace", ("--grace",), "value", "Time between SIGTERM and SIGKILL when stopping.", "DURATION", "2s"),
    Option(
        "verify_timeout",
        ("--verify-timeout",),
        "value",
        "Bound on proving every process gone; past it, exit 120.",
        "DURATION",
        "2s",
    ),
    _LIMIT["mem"],
    _LIMIT["pids"],
    _LIMIT["max_output"],
    _LIMIT["cpu_time"],
    _LIMIT["cpus"],
    Option(
        "output_limit",
        ("--output-limit",),
        "value",
        "Show at most SIZE bytes of stdout+stderr: the first and the last half, one marker line "
        "between (the run is not stopped).",
        "SIZE",
    ),
    Option(
        "output_file",
        ("--output-file",),
        "value",
        "Also keep the whole stdout+stderr stream here (mode 0600).",
        "PATH",
    ),
    Option(
        "property",
        ("--property", "-p"),
        "many",
        "NAME=VALUE: pass a unit property, as systemd-run -p (repeatable; those corral sets are refused).",
        "PROPERTY",
    ),
    Option(
        "cgroup_mode",
        ("--cgroup-mode",),
        "value",
        "auto: a systemd unit where a manager answers, else the strongest tier below it (--guarantee); "
        "enforced: a unit or nothing (125); fallback: no manager.",
        default="auto",
        choices=CGROUP_MODES,
    ),
    Option(
        "guarantee",
        ("--guarantee",),
        "value",
        "What holds the run, strongest first: unit (a systemd unit), cgroup (a delegated cgroup v2 "
        "subtree), pidns (a PID namespace of its own), subreaper. auto: the strongest to be had "
        "(with --cgroup-mode fallback: subreaper); a tier named and not to be had: 125.",
        default="auto",
        choices=GUARANTEE_CHOICES,
    ),
    Option(
        "cgroup_parent",
        ("--cgroup-parent",),
        "value",
        "Delegated cgroup v2 directory to run in (no systemd needed).",
        "PATH",
    ),
    Option(
        "stdin",
        ("--stdin",),
        "value",
        "The command's stdin: /dev/null, corral's own, or (keep: --background and --yield runs) a pipe "
        "the run's corral keeps for corralctl send.",
        default="null",
        choices=(*STDIN_MODES, KEPT_STDIN),
    ),
    Option(
        "pty",
        ("--pty",),
        "flag",
        "Run the command on a pseudo-terminal of its own, relayed to corral's stdin and stdout "
        "(a terminal stdin in raw mode, restored after).",
    ),
    Option(
        "network",
        ("--network",),
        "value",
        "none: the command gets a network namespace of its own with only lo, and the seal of --handoff deny "
        "(checked before it runs; if it cannot be had, the command never runs, 125).",
        default="host",
        choices=NETWORKS,
    ),
    Option(
        "handoff",
        ("--handoff",),
        "value",
        "deny: no service manager, bus, atd or terminal multiplexer server outside the run is reachable "
        "(checked before it runs; if it cannot be had, the command never runs, 125). allow: the record "
        "lists those the command could reach.",
        default="allow",
        choices=HANDOFFS,
    ),
    Option(
        "manager",
        ("--manager",),
        "value",
        "Which systemd manager to use in enforced mode.",
        default="auto",
        choices=MANAGERS,
    ),
    Option(
        "unit_type",
        ("--unit-type",),
        "value",
        "Transient unit type in enforced mode.",
        default="scope",
        choices=UNIT_TYPES,
    ),
    Option("slice", ("--slice",), "value", "Slice for the run's unit.", "SLICE", "corral.slice"),
    Option(
        "json",
        ("--json",),
        "value",
        "Write the run record (JSON, mode 0600) here; - or /dev/stdout: to standard output, "
        "after the command's output (see --json-fd).",
        "PATH",
    ),
    Option(
        "json_fd",
        ("--json-fd",),
        "value",
        "Write the run record (JSON) to this inherited descriptor (3 or more) instead, "
        "apart from the command's output; the command does not inherit it.",
        "FD",
    ),
    Option("env_clear", ("--env-clear",), "flag", "Start the command with an empty environment (see --env-keep)."),
    Option(
        "env_keep",
        ("--env-keep",),
        "many",
        "With --env-clear: keep variables matching this glob (repeatable).",
        "NAME",
    ),
    Option("env_drop", ("--env-drop",), "many", "Remove variables matching this glob (repeatable).", "NAME"),
    Option(
        "credential",
        ("--credential",),
        "many",
        "NAME=PATH: give the run a copy of PATH as $CREDENTIALS_DIRECTORY/NAME, "
        "removed when the run ends (repeatable).",
        "CREDENTIAL",
    ),
    Option("no_registry", ("--no-registry",), "flag", "Do not register the run (corralctl will not see it)."),
    Option(
        "session",
        ("--session",),
        "value",
        "Run in this session (its id or name; default: $CORRAL_SESSION): it ends with the session "
        "(corralctl session start/end).",
        "SESSION",
    ),
    Option(
        "background",
        ("--background",),
        "flag",
        "Detach the run from this corral: wait until it is ready (--ready-*), print its id and exit 0; "
        "its output goes to a log (corralctl logs), its end to corralctl wait.",
    ),
    Option(
        "yield_after",
        ("--yield",),
        "value",
        "Wait this long for the run (in a session): ended by then, exit as a plain run (its output, "
        "record, exit code); else handed back, still running, as a background run of the session: its id "
        "on stderr, exit 119 (corralctl logs --since, send, wait, stop).",
        "DURATION",
    ),
    Option("name", ("--name",), "value", "A name for the run (corralctl status/logs/wait/stop NAME).", "NAME"),
    Option(
        "ready_port",
        ("--ready-port",),
        "value",
        "--background: ready once this TCP port accepts a connection on 127.0.0.1 or ::1 "
        "(--network none: listens in the run's own network namespace).",
        "PORT",
    ),
    Option("ready_file", ("--ready-file",), "value", "--background: ready once this file exists.", "PATH"),
    Option("ready_log", ("--ready-log",), "value", "--background: ready once a line of its output matches.", "REGEX"),
    Option(
        "ready_timeout",
        ("--ready-timeout",),
        "value",
        "--background: not ready by then: stopped, exit 124.",
        "DURATION",
        "30s",
    ),
    Option(
        "log_max",
        ("--log-max",),
        "value",
        "--background: keep at most SIZE bytes of its output in the log (head and tail, one marker line); "
        "the file itself, whoever writes it, is cut back to its head past SIZE + 64K.",
        "SIZE",
        "16M",
    ),
    Option("quiet", ("--quiet",), "flag", "No summary line on stderr."),
    Option("version", ("--version",), "flag", "Show the version and exit.", printing=True),
    # Made by click and typer themselves (cli.py): here so that this parser knows them.
    Option("install_completion", ("--install-completion",), "flag", "", printing=True),
    Option("show_completion", ("--show-completion",), "flag", "", printing=True),
    Option("help", ("--help", "-h"), "flag", "", printing=True),
)
_BY_FLAG = {flag: option for option in OPTIONS for flag in option.flags}
_BY_NAME = {option.name: option for option in OPTIONS}
