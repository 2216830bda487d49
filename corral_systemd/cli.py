"""The ``corral`` command line in this process: read it, run it, report.

    argv  →  core.request.parse_command_line  →  the run (core.assemble)
          →  warnings, the --json record, one summary line  →  the exit code

Reading the command line is ``core/request.py``'s (the corral service reads
a client's with the same code); this module only runs the request and
prints. What prints and exits instead of running (--help, --version, shell
completion) goes to a click command built from the same option table
(``request.OPTIONS``): typer and click are imported for that alone. Bad
input is one line and exit 125 (``main``), before anything starts. This
module never touches /proc.
"""

import os
import sys

from .common.errors import CorralError
from .common.programs import PROGRAMS
from .core.request import Printing, RunRequest, parse_command_line

TYPE_CHECKING = False  # typing is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from typing import Any


def main(argv: list[str] | None = None, *, prog: str = "corral", default_mode: str | None = None) -> int:
    """Entry point: the exit code. Every failure before the run is one line and 125."""
    from .kernel import startup

    startup.prepare()  # stdio open, the environment as given (kernel/startup.py)
    args = sys.argv[1:] if argv is None else list(argv)
    mode = default_mode or PROGRAMS.get(prog, "auto")
    if _completion_asked(prog):
        return _print(args, prog, mode)
    try:
        request = parse_command_line(args, default_mode=mode)
    except Printing:
        return _print(args, prog, mode)
    except CorralError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code
    try:
        return run(request)
    except CorralError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code


def detached_run(default_mode: str, run_id: str, started_fd: int | None, args: list[str]) -> int:
    """A session's background run's own corral: the holder's forked child, already
    made its caller's process context (``ctl/session_spawner.py``), its stdout and
    stderr the run's log. The command line is read here, as the front read it (the
    caller's environment and working directory); ``started_fd``: the front's ready
    pipe, or None. Its exit code (a CorralError: ``core.background.fork_run_corral`` says it)."""
    from .common.errors import UsageError
    from .core.background import detach, run_detached
    from .state.registry import output_path, state_dir

    request = parse_command_line(args, default_mode=default_mode)
    if request.background is None:
        raise UsageError("not a --background command line")
    detach(request, run_id, output_path(state_dir(), run_id))
    request.started_fd = started_fd
    return run_detached(request, run)  # its log held to --log-max on disk (core.logkeeper)


def served_front(request: RunRequest, prog: str, connection: int) -> int:
    """A compiled client's ``--background`` command line, read by its session's
    holder; this process is the holder's fork, made the client's process
    context with its stdio (``ctl/session_spawner.py``): run here as ``main``
    runs it, its exit code the client's. The client's ``connection`` hanging
    up (the client gone) before the run is ready stops it, as a served caller's."""
    request.hangup_fd = connection
    try:
        return run(request)
    except CorralError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code


def run(request: RunRequest) -> int:
    """Run ``request`` here; print its warnings, record and summary; its exit code."""
    if request.json_fd is not None:  # before anything starts: 125 if it is no place for the record
        from .core import record_fd

        record_fd.check(request.json_fd)
        record_fd.keep_from_command(request.json_fd)
    if request.yield_after is not None:
        return _run_yielding(request)
    if request.background is not None:
        return _run_in_background(request)
    from . import dbus
    from .core.assemble import assemble_and_run
    from .core.result import NEVER_RAN, reason_line, summary_line
    from .core.signalwatch import SignalWatch
    from .engines import open_engine

    dbus.light_import = True  # this process is corral's own: see dbus/_dbus_fast.py

    spec = request.spec
    with SignalWatch() as signals:
        result = assemble_and_run(  # SetupError -> 125, nothing started
            spec,
            lambda: open_engine(spec),
            guard=request.guard_options(),
            supervisor={"signals": signals, "watches": request.watches},
        )
    reason = reason_line(result)
    if reason:  # 126, 127: why, first and on its own line (--quiet: the only one)
        print(reason, file=sys.stderr)
    if not request.quiet:
        for warning in result.warnings:
            print(f"corral: warning: {warning}", file=sys.stderr)
    if request.json_path is not None or request.json_fd is not None:
        try:
            _write_record(request, result)
        except OSError as exc:
            print(f"corral: cannot write --json record: {exc}", file=sys.stderr)
    if not request.quiet or (result.reason in NEVER_RAN and not reason):  # why nothing ran is never swallowed
        print(summary_line(result), file=sys.stderr)
    return result.exit_code


def _run_in_background(request: RunRequest) -> int:
    """--background: the run detached (``core.background``); its id (or the
    start record) on stdout once it is ready; else why not, and the log's tail."""
    from .common import jsoncodec
    from .core import background

    start_record = request.record_to_stdout
    try:
        started = background.launch(request, run)
        if not request.quiet:
            for warning in started.warnings:
                print(f"corral: warning: {warning}", file=sys.stderr)
    except (background.EndedEarly, background.NotReady) as exc:
        if exc.tail:
            sys.stderr.flush()
            sys.stderr.buffer.write(exc.tail if exc.tail.endswith(b"\n") else exc.tail + b"\n")
        print(f"corral: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"corral: --background: {exc}", file=sys.stderr)
        return 125
    if start_record:
        print(jsoncodec.dumps(started.record(), sort_keys=True))
    else:
        print(started.run_id)
    return 0


def _run_yielding(request: RunRequest) -> int:
    """--yield: the run's output as it comes; ended within the yield, its own lines
    and exit code, as a plain run's; else one line (the run handed back) and 119."""
    from .core import background, handback
    from .core.output import write_all

    yield_after = request.yield_after
    if request.json_path is not None:  # no earlier record to mistake for this run's
        try:
            os.unlink(request.json_path)
        except FileNotFoundError:
            pass
    try:
        done = handback.follow(request, run, lambda data: write_all(1, data, raise_broken=False))
    except background.NotReady as exc:
        if exc.tail:
            sys.stdout.buffer.write(exc.tail)
            sys.stdout.flush()
        print(f"corral: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"corral: --yield: {exc}", file=sys.stderr)
        return 125
    if not request.quiet:
        for warning in done.warnings:
            print(f"corral: warning: {warning}", file=sys.stderr)
    if done.exit_code is not None:
        sys.stderr.flush()
        write_all(2, done.report, raise_broken=False)
        return done.exit_code
    if request.json_path is not None:  # until the run ends and its corral writes its record there
        facts = {"run_id": done.run_id, "running": True, "cursor": done.cursor, "log": done.log}
        handback.write_if_absent(facts, request.json_path)
    print(
        f"corral: handed back: {done.run_id} still running after {yield_after:g}s; its output from byte "
        f"{done.cursor}: corralctl logs {done.run_id} --since {done.cursor} (send, wait, stop)",
        file=sys.stderr,
    )
    from .core.result import HANDED_BACK

    return HANDED_BACK


def _write_record(request: RunRequest, result) -> None:
    """The record where --json or --json-fd says: a file, standard output
    (after everything the command wrote there), or the caller's descriptor."""
    from .core.record_json import record_bytes, write_record

    if request.json_fd is not None:
        from .core import record_fd

        record_fd.write(record_bytes(result), request.json_fd)
    elif request.record_to_stdout:
        from .core.output import write_all

        sys.stdout.flush()
        write_all(1, record_bytes(result), raise_broken=True)
    elif request.json_path is not None:
        write_record(result, request.json_path)


# -- what prints instead of running: click, built from request.OPTIONS ------------------------------
def _completion_asked(prog: str) -> bool:
    """The shell's completion function is calling (click's ``_PROG_COMPLETE``)."""
    return f"_{prog.replace('-', '_').upper()}_COMPLETE" in os.environ


def _print(args: list[str], prog: str, default_mode: str) -> int:
    """--help, --version, completion: click prints it; its exit code."""
    import click

    try:
        rv = click_command(default_mode).main(args=args, prog_name=prog, standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        print(f"{prog}: {exc.format_message()}", file=sys.stderr)
        return 125
    except CorralError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code
    except click.Abort:
        print(f"{prog}: aborted", file=sys.stderr)
        return 130


_COMMANDS: dict = {}


#: --help's examples, after the exit codes.
EXAMPLES = (
    ("corral --wall 10m --mem 2G -- make test", "a CI step: every process gone when it returns"),
    (
        'corral --session "$S" --background --ready-port 3000 -- npm run dev',
        "a dev server for the next tool call, ended with session $S (S=$(corralctl session start))",
    ),
)


def _epilog() -> str:
    """Exit codes (``result.exit_codes``) and examples, one per line (click keeps
    a paragraph that starts with \\b as written)."""
    from .core.result import exit_codes

    codes = "\n".join(f"  {code:<8} {meaning}" for code, meaning in exit_codes())
    examples = "\n".join(f"  {line}\n      {what}" for line, what in EXAMPLES)
    return f"\b\nExit codes:\n{codes}\n\n\b\nExamples:\n{examples}"


def click_command(default_mode: str = "auto"):
    """corral's click command for one default --cgroup-mode, made by typer
    from ``request.OPTIONS`` (so --help, the man page test and completion
    read the one table): it prints, and never runs a command."""
    if default_mode in _COMMANDS:
        return _COMMANDS[default_mode]
    import enum
    import inspect

    import typer

    from .common.errors import UsageError
    from .core.request import COMMAND_METAVAR, OPTIONS

    def version(value: bool):
        if value:
            from .common.version import __version__

            print(f"corral {__version__}")
            raise typer.Exit(0)

    parameters = [
        inspect.Parameter(
            "command",
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=list[str],
            default=typer.Argument(..., metavar=COMMAND_METAVAR, help="The command to run and its arguments."),
        )
    ]
    annotation: Any
    default: Any
    for option in OPTIONS:
        if option.name in ("help", "install_completion", "show_completion"):
            continue  # click's and typer's own
        if option.name == "version":
            annotation, default = (
                bool | None,
                typer.Option(None, *option.flags, callback=version, is_eager=True, help=option.help),
            )
        elif option.takes == "flag":
            annotation, default = bool, typer.Option(False, *option.flags, help=option.help)
        elif option.takes == "many":
            annotation = list[str] | None
            default = typer.Option(None, *option.flags, metavar=option.metavar, help=option.help)
        elif option.choices:
            # typer shows a choice list from an Enum; the choices are spec.py's.
            choice = enum.Enum(option.name, {c: c for c in option.choices}, type=str)  # type: ignore[misc]
            shown = default_mode if option.name == "cgroup_mode" else option.default
            annotation, default = choice, typer.Option(choice(shown), *option.flags, help=option.help)
        else:
            annotation = str | None if option.default is None else str
            default = typer.Option(option.default, *option.flags, metavar=option.metavar, help=option.help)
        parameters.append(
            inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
        )

    def corral(**_options):
        """Run COMMAND under limits; when corral returns, every process it started is gone."""
        # Reached only when nothing asked to print: ``main`` reads such a line itself.
        raise UsageError("nothing to print")

    corral.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    app = typer.Typer(
        add_completion=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["--help", "-h"]},
    )
    app.command(
        context_settings={"allow_interspersed_args": False, "help_option_names": ["--help", "-h"]},
        epilog=_epilog(),
    )(corral)
    _COMMANDS[default_mode] = command = typer.main.get_command(app)
    return command
