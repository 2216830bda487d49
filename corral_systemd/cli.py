"""The ``corral`` command line: parse, build a RunSpec, run, report.

Thin by design: parsing and validation (exit 125 on anything malformed,
before the command starts), then the supervisor does the work, then one
summary line and the exit code. This module never touches /proc.

Over 400 lines because every option is declared here, once, for both
readers of a command line: ``main`` (this process runs it) and ``parse``
(the corral service runs it for a client, ``service/requests.py``).
"""

import enum
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import click
import typer

from . import __version__
from .common.errors import CorralError, UsageError
from .common.limits import CPU_TIME, CPUS, MAX_OUTPUT, MEM, PIDS, WALL


class CgroupMode(str, enum.Enum):
    auto = "auto"
    enforced = "enforced"
    fallback = "fallback"


class StdinMode(str, enum.Enum):
    null = "null"
    inherit = "inherit"


class Manager(str, enum.Enum):
    auto = "auto"
    user = "user"
    system = "system"


class UnitType(str, enum.Enum):
    scope = "scope"
    service = "service"


class Network(str, enum.Enum):
    host = "host"
    none = "none"


@dataclass
class Invocation:
    """A parsed command line: everything ``_run`` needs."""

    spec: Any  # core.spec.RunSpec
    json_path: str | None = None
    quiet: bool = False
    environment: dict | None = None  # what --env-clear/--env-keep/--env-drop did (the record's)
    credentials: list = field(default_factory=list)
    registry: bool = True


class _ClientContext(threading.local):
    """Set while the corral service parses a client's command line: that
    client's environment and working directory stand in for this process's."""

    environ: dict | None = None
    cwd: str | None = None


_client = _ClientContext()


def _absolute(path: str) -> str:
    """``path`` made absolute against the caller's working directory."""
    return os.path.abspath(os.path.join(_client.cwd or "", path))


def _version(value: bool):
    if value:
        print(f"corral {__version__}")
        raise typer.Exit(0)


app = typer.Typer(
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["--help", "-h"]},
)


@app.command(context_settings={"allow_interspersed_args": False, "help_option_names": ["--help", "-h"]})
def corral(
    command: list[str] = typer.Argument(
        ..., metavar="-- COMMAND [ARG...]", help="The command to run and its arguments."
    ),
    wall: str | None = typer.Option(None, WALL.option, metavar=WALL.metavar, help=WALL.help),
    grace: str = typer.Option("2s", metavar="DURATION", help="Time between SIGTERM and SIGKILL when stopping."),
    verify_timeout: str = typer.Option(
        "2s", metavar="DURATION", help="Bound on proving every process gone; past it, exit 120."
    ),
    mem: str | None = typer.Option(None, MEM.option, metavar=MEM.metavar, help=MEM.help),
    pids: str | None = typer.Option(None, PIDS.option, metavar=PIDS.metavar, help=PIDS.help),
    max_output: str | None = typer.Option(None, MAX_OUTPUT.option, metavar=MAX_OUTPUT.metavar, help=MAX_OUTPUT.help),
    cpu_time: str | None = typer.Option(None, CPU_TIME.option, metavar=CPU_TIME.metavar, help=CPU_TIME.help),
    cpus: str | None = typer.Option(None, CPUS.option, metavar=CPUS.metavar, help=CPUS.help),
    output_limit: str | None = typer.Option(
        None,
        "--output-limit",
        metavar="SIZE",
        help="Show at most SIZE bytes of stdout+stderr: the first and the last half, one marker line "
        "between (the run is not stopped).",
    ),
    output_file: str | None = typer.Option(
        None, "--output-file", metavar="PATH", help="Also keep the whole stdout+stderr stream here (mode 0600)."
    ),
    property_: list[str] | None = typer.Option(
        None,
        "--property",
        "-p",
        metavar="PROPERTY",
        help="NAME=VALUE: pass a unit property, as systemd-run -p (repeatable; those corral sets are refused).",
    ),
    cgroup_mode: CgroupMode = typer.Option(CgroupMode.auto, help="auto: systemd when reachable, else fallback."),
    cgroup_parent: str | None = typer.Option(
        None, metavar="PATH", help="Delegated cgroup v2 directory to run in (no systemd needed)."
    ),
    stdin: StdinMode = typer.Option(StdinMode.null, help="The command's stdin: /dev/null or corral's own."),
    pty: bool = typer.Option(
        False,
        "--pty",
        help="Run the command on a pseudo-terminal of its own, relayed to corral's stdin and stdout "
        "(a terminal stdin in raw mode, restored after).",
    ),
    network: Network = typer.Option(
        Network.host,
        help="none: the command gets a network namespace of its own with only lo (checked before it runs; "
        "if it cannot be had, the command never runs, 125).",
    ),
    manager: Manager = typer.Option(Manager.auto, help="Which systemd manager to use in enforced mode."),
    unit_type: UnitType = typer.Option(UnitType.scope, help="Transient unit type in enforced mode."),
    slice_: str = typer.Option("corral.slice", "--slice", metavar="SLICE", help="Slice for the run's unit."),
    json_path: str | None = typer.Option(
        None,
        "--json",
        metavar="PATH",
        help="Write the run record (JSON, mode 0600) here; - or /dev/stdout: to standard output.",
    ),
    env_clear: bool = typer.Option(
        False, "--env-clear", help="Start the command with an empty environment (see --env-keep)."
    ),
    env_keep: list[str] | None = typer.Option(
        None, "--env-keep", metavar="NAME", help="With --env-clear: keep variables matching this glob (repeatable)."
    ),
    env_drop: list[str] | None = typer.Option(
        None, "--env-drop", metavar="NAME", help="Remove variables matching this glob (repeatable)."
    ),
    credential: list[str] | None = typer.Option(
        None,
        "--credential",
        metavar="CREDENTIAL",
        help="NAME=PATH: give the run a copy of PATH as $CREDENTIALS_DIRECTORY/NAME, "
        "removed when the run ends (repeatable).",
    ),
    no_registry: bool = typer.Option(
        False, "--no-registry", help="Do not register the run (corralctl will not see it)."
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No summary line on stderr."),
    version: bool | None = typer.Option(
        None, "--version", callback=_version, is_eager=True, help="Show the version and exit."
    ),
):
    """Run COMMAND under limits; when corral returns, every process it started is gone."""
    from .common.limits import BY_FIELD
    from .common.units import parse_duration, parse_size
    from .core.spec import RunSpec

    given = {"wall": wall, "mem": mem, "pids": pids, "max_output": max_output, "cpu_time": cpu_time, "cpus": cpus}
    try:
        limits: dict[str, Any] = {
            name: None if text is None else BY_FIELD[name].parse(text) for name, text in given.items()
        }
        spec = RunSpec(
            argv=list(command),
            **limits,
            grace=parse_duration(grace, what="--grace"),
            verify_timeout=parse_duration(verify_timeout, what="--verify-timeout"),
            cgroup_mode=cgroup_mode.value,
            cgroup_parent=cgroup_parent,
            stdin="inherit" if pty else stdin.value,  # --pty relays corral's stdin to the terminal
            manager=manager.value,
            unit_type=unit_type.value,
            slice=slice_,
            properties=list(property_ or []),
            network=network.value,
            pty=pty,
            output_limit=None if output_limit is None else parse_size(output_limit, what="--output-limit"),
            output_file=None if output_file is None else _absolute(output_file),
            cwd=_client.cwd,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not spec.argv or not spec.argv[0]:
        raise UsageError("no command given (usage: corral [OPTIONS] -- COMMAND [ARG...])")
    if not spec.slice.endswith(".slice"):
        raise UsageError(f"invalid --slice {spec.slice!r}: must end in .slice")
    if json_path is not None and not is_stdout(json_path):
        json_path = _absolute(json_path)
        _check_output_path(json_path)
    if spec.output_file is not None:
        _check_output_path(spec.output_file, option="--output-file")
    # -- issue 5: environment, credentials, registry (see runguard.py) --
    environment = None
    if _client.environ is not None:
        spec.env = dict(_client.environ)
    if env_clear or env_keep or env_drop:
        if env_keep and not env_clear:
            raise UsageError("--env-keep needs --env-clear (without it every variable is kept)")
        from .common.envfilter import filter_environment

        spec.env, environment = filter_environment(
            os.environ if _client.environ is None else _client.environ,
            clear=env_clear,
            keep=env_keep or (),
            drop=env_drop or (),
        )
    credentials = []
    if credential:
        from .state.credentials import parse_credential

        credentials = [parse_credential(text, cwd=_client.cwd) for text in credential]
    invocation = Invocation(spec, json_path, quiet, environment, credentials, registry=not no_registry)
    if _client.environ is not None:  # the service parses; it runs the invocation itself
        return invocation
    raise typer.Exit(_run(invocation))


#: --json values that mean "standard output" (the record follows the command's output there).
_STDOUT_PATHS = ("-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")


def is_stdout(path: str) -> bool:
    return path in _STDOUT_PATHS


def _print_record(result) -> None:
    """The record as JSON on standard output, after everything the command wrote there."""
    from .core.output import write_all
    from .core.record_json import record_bytes

    sys.stdout.flush()
    write_all(1, record_bytes(result), raise_broken=True)


def _check_output_path(path: str, option: str = "--json") -> None:
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


def _run(invocation: Invocation) -> int:
    from . import dbus
    from .core.assemble import assemble_and_run
    from .core.result import NEVER_RAN
    from .core.supervisor import SignalWatch
    from .engines import open_engine

    dbus.light_import = True  # this process is corral's own: see dbus/_dbus_fast.py

    spec, json_path = invocation.spec, invocation.json_path
    with SignalWatch() as signals:
        result = assemble_and_run(  # SetupError -> 125, nothing started
            spec,
            lambda: open_engine(spec),
            guard=guard_options(invocation),
            supervisor={"signals": signals},
        )
    if not invocation.quiet:
        for warning in result.warnings:
            print(f"corral: warning: {warning}", file=sys.stderr)
    if json_path is not None:
        from .core.record_json import write_record

        try:
            _print_record(result) if is_stdout(json_path) else write_record(result, json_path)
        except OSError as exc:
            print(f"corral: cannot write --json record: {exc}", file=sys.stderr)
    if not invocation.quiet or result.reason in NEVER_RAN:  # why nothing ran is never swallowed
        print(summary_line(result), file=sys.stderr)
    return result.exit_code


def guard_options(invocation: Invocation) -> dict:
    """The RunGuard's keywords for a command line's run."""
    return {
        "environment": invocation.environment,
        "credentials": invocation.credentials,
        "registry": invocation.registry,
    }


def parse(args: list[str], *, prog: str, default_mode: str, environ: dict, cwd: str) -> Invocation:
    """A client's command line as the corral service reads it: the same
    options, defaults and checks as ``main``, with ``environ`` and ``cwd``
    standing for the caller's. UsageError for anything ``main`` exits 125 on."""
    command = _command(default_mode)
    _client.environ, _client.cwd = environ, cwd
    try:
        invocation = command.main(args=args, prog_name=prog, standalone_mode=False)
        if not isinstance(invocation, Invocation):
            raise UsageError("nothing to run")
        return invocation
    except click.ClickException as exc:
        raise UsageError(exc.format_message()) from None
    except click.exceptions.Exit:  # --help, --version: printed in-process, never here (see service)
        raise UsageError("no run") from None
    finally:
        _client.environ = _client.cwd = None


_COMMANDS: dict[str, click.Command] = {}


def _command(default_mode: str) -> click.Command:
    """The click command for one default --cgroup-mode (built once: ~10 ms)."""
    if default_mode not in _COMMANDS:
        command = typer.main.get_command(app)
        if default_mode != "auto":
            for param in command.params:
                if param.name == "cgroup_mode":
                    param.default = CgroupMode(default_mode)
        _COMMANDS[default_mode] = command
    return _COMMANDS[default_mode]


def summary_line(result) -> str:
    from .common.limits import BY_REASON
    from .common.units import format_duration
    from .core.result import usage_summary

    mode = result.mode
    unit = result.engine.get("unit")
    if unit:
        mode = f"{mode} {unit}"
    if result.reason == "exited":
        if result.command_signal is not None:
            what = f"command killed by signal {result.command_signal}"
        else:
            what = f"command exited {result.command_exit_status}"
    elif (limit := BY_REASON.get(result.reason)) is not None:
        what = limit.reached
    else:
        what = {
            "interrupted": f"interrupted by signal {result.corral_signal}",
            "spawn_failed": result.detail,
            "setup_failed": result.detail,
            # 120 without its reason tells the user nothing to act on.
            "internal_error": f"corral lost track of the run: {result.detail}",
        }.get(result.reason, result.reason)
    line = (
        f"corral: {mode}: {what}; exit {result.exit_code}; {format_duration(result.wall_time)}; "
        f"{result.processes_stopped} process{'es' if result.processes_stopped != 1 else ''} stopped"
    )
    if usage := usage_summary(result):
        line += f"; {usage}"
    if result.output_omitted_bytes:
        line += f"; {result.output_omitted_bytes} bytes of output left out"
        if result.output_file:
            line += f" (all in {result.output_file})"
    if reason := result.engine.get("auto_fallback_reason"):
        # --cgroup-mode auto found no manager to use: say why, once (the record
        # has it too), so a run without systemd is never silently unconfined by one.
        line += f"; auto mode fell back: {reason}"
    if result.remaining_pids:
        line += f"; NOT VERIFIED, still present: {' '.join(map(str, result.remaining_pids))}"
    return line


def main(argv: list[str] | None = None, *, prog: str = "corral", default_mode: str = "auto") -> int:
    """Entry point: maps every failure to a one-line message and exit 125."""
    from .kernel import startup

    startup.prepare()  # stdio open, the environment as given (kernel/startup.py)
    command = _command(default_mode)
    try:
        rv = command.main(args=sys.argv[1:] if argv is None else argv, prog_name=prog, standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except CorralError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code
    except click.ClickException as exc:  # usage errors: unknown option, bad choice...
        print(f"{prog}: {exc.format_message()}", file=sys.stderr)
        return 125
    except click.Abort:
        print(f"{prog}: aborted", file=sys.stderr)
        return 130
