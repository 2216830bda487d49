"""The command line: typer for everything but ``status``; errors are one line and exit 125."""

import sys

from ..core.spec import CGROUP_MODES
from ..state import registry as REG
from .audit import audit_verify
from .gc import gc, parse_keep
from .logs import logs, wait
from .ps import ps
from .status import CtlError, status
from .stop import stop


def _app():
    import typer

    app = typer.Typer(
        add_completion=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        no_args_is_help=True,
        context_settings={"help_option_names": ["--help", "-h"]},
        help="Look at and act on corral runs (the run registry: $CORRAL_STATE_DIR, else /run/corral "
        "for root, $XDG_RUNTIME_DIR/corral for other users).",
    )

    @app.callback()
    def _main(
        version: bool = typer.Option(
            False, "--version", is_eager=True, help="Print the version and exit.", callback=_version
        ),
    ):
        """Look at and act on corral runs."""

    audit = typer.Typer(help="The runs' audit logs.", no_args_is_help=True)
    app.add_typer(audit, name="audit")
    service = typer.Typer(
        help="The corral service: corral hands it runs over a socket (io.corral.Run), as fast as systemd-run.",
        no_args_is_help=True,
    )
    app.add_typer(service, name="service")
    which = {
        "user": typer.Option(False, "--user", help="The user manager's service (default for users other than root)."),
        "system": typer.Option(False, "--system", help="The system manager's service, for root (default for root)."),
    }

    @service.command("install")
    def _service_install(
        user: bool = which["user"],
        system: bool = which["system"],
        runtime: bool = typer.Option(
            False, "--runtime", help="Until the next reboot only (the runtime unit directory)."
        ),
        idle_exit: float = typer.Option(
            60.0, "--idle-exit", metavar="SECONDS", help="The service exits after this long idle."
        ),
    ):
        """Write corral.socket and corral.service for this installation, enable and start the socket."""
        raise typer.Exit(service_command("install", user, system, runtime=runtime, idle_exit=idle_exit))

    @service.command("status")
    def _service_status(as_json: bool = typer.Option(False, "--json", help="JSON instead of a line.")):
        """Whether corral will hand its runs to a service, and why not: 0 yes, 3 no."""
        raise typer.Exit(service_command("status", False, False, as_json=as_json))

    @service.command("uninstall")
    def _service_uninstall(user: bool = which["user"], system: bool = which["system"]):
        """Stop and disable the service and its socket; remove the unit files install wrote."""
        raise typer.Exit(service_command("uninstall", user, system))

    @app.command("ps")
    def _ps(
        as_json: bool = typer.Option(False, "--json", help="JSON instead of a table."),
        session: str | None = typer.Option(None, "--session", metavar="SESSION", help="Only this session's runs."),
    ):
        """Live runs: id, mode, unit, age, time to deadline, processes, memory, cwd, command."""
        raise typer.Exit(ps(as_json, session=session))

    @app.command("status")
    def _status(run: str = typer.Argument(..., metavar="RUN")):
        """active (0), expired (10), finished (11) or unknown (12)."""
        raise typer.Exit(status(run))

    @app.command("stop")
    def _stop(
        run: str = typer.Argument(..., metavar="RUN"),
        timeout: float | None = typer.Option(
            None,
            "--timeout",
            metavar="SECONDS",
            help="Seconds to wait for the owner to finish the run. Default: the run's grace + verify timeout + 10 s.",
        ),
    ):
        """Stop a run through its owner (its corral, or its unit when corral is gone), verified."""
        raise typer.Exit(stop(run, timeout))

    session = typer.Typer(
        help="Sessions: runs that end together, when the session is ended, its owner exits or it is idle.",
        no_args_is_help=True,
    )
    app.add_typer(session, name="session")

    @session.command("start")
    def _session_start(
        name: str | None = typer.Option(None, "--name", metavar="NAME", help="A name for the session."),
        owner: int | None = typer.Option(
            None, "--owner", metavar="PID", help="End the session when this process exits (watched by pidfd)."
        ),
        idle_timeout: str = typer.Option(
            "30m",
            "--idle-timeout",
            metavar="DURATION",
            help="End the session after this long with no run started and none in the foreground.",
        ),
        max_runs: int | None = typer.Option(
            None, "--max-runs", metavar="N", help="At most N runs of the session at once; one more is refused (125)."
        ),
        mem: str | None = typer.Option(
            None, "--mem", metavar="SIZE", help="Memory of all the session's runs together (systemd mode: its slice)."
        ),
        pids: str | None = typer.Option(
            None, "--pids", metavar="COUNT", help="Processes and threads of all its runs together (systemd mode)."
        ),
        cpus: str | None = typer.Option(
            None, "--cpus", metavar="CPUS", help="CPU quota of all its runs together, in CPUs (systemd mode)."
        ),
        cgroup_mode: str = typer.Option(
            "auto",
            "--cgroup-mode",
            metavar="MODE",
            help=f"{'|'.join(CGROUP_MODES)}. auto: a slice and a holder unit where a systemd manager answers, "
            "else a holder process; enforced: the manager or exit 125; fallback: a holder process.",
        ),
        as_json: bool = typer.Option(False, "--json", help="The session's entry as JSON instead of its id."),
    ):
        """Start a session; print its id. Runs join with --session ID or CORRAL_SESSION=ID."""
        from .sessions import start

        if cgroup_mode not in CGROUP_MODES:
            raise CtlError(f"--cgroup-mode {cgroup_mode!r}: one of {', '.join(CGROUP_MODES)}")
        timeout = _duration(idle_timeout, "--idle-timeout")
        assert timeout is not None
        limits = {"mem": mem, "pids": pids, "cpus": cpus}
        raise typer.Exit(start(name, owner, timeout, max_runs, as_json, limits=limits, cgroup_mode=cgroup_mode))

    @session.command("ls")
    def _session_ls(as_json: bool = typer.Option(False, "--json", help="JSON instead of a table.")):
        """Open sessions: id, name, state, owner, runs going, age."""
        from .sessions import ls

        raise typer.Exit(ls(as_json))

    @session.command("end")
    def _session_end(session_id: str = typer.Argument(..., metavar="SESSION")):
        """End a session: stop every run of it; 0 when every process is proven gone, else 120."""
        from .sessions import end

        raise typer.Exit(end(session_id))

    @app.command("hook")
    def _hook(
        agent: str = typer.Argument(..., metavar="AGENT", help="claude-code or codex."),
        print_settings: bool = typer.Option(False, "--print-settings", help="Print the settings snippet."),
    ):
        """An agent's hook: its shell calls run through corral in a session it owns (docs/hooks.md)."""
        from .hooks import main as hook

        raise typer.Exit(hook([agent, *(["--print-settings"] if print_settings else [])]))

    @app.command("logs")
    def _logs(
        run: str = typer.Argument(..., metavar="RUN"),
        follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the run has ended."),
        tail: int | None = typer.Option(None, "--tail", metavar="N", min=0, help="Start at the last N lines."),
        since: int | None = typer.Option(
            None,
            "--since",
            metavar="BYTES",
            min=0,
            help="Start at this byte (a cursor: the last call's plus the bytes it printed).",
        ),
    ):
        """A --background run's output log (RUN: its id or --name)."""
        raise typer.Exit(logs(run, follow, tail, since=since))

    @app.command("send")
    def _send(
        run: str = typer.Argument(..., metavar="RUN"),
        text: str | None = typer.Argument(None, metavar="[TEXT]", help="What to type (default: --file, or stdin)."),
        file: str | None = typer.Option(None, "--file", metavar="PATH", help="Send this file's bytes (- for stdin)."),
        line: bool = typer.Option(False, "--line", help="End what is sent with a newline, as Enter would."),
        eof: bool = typer.Option(False, "--eof", help="Then close the run's stdin: the command reads end of file."),
        timeout: str = typer.Option(
            "30s", "--timeout", metavar="DURATION", help="Give up when the command has not read it all by then: 124."
        ),
    ):
        """Type into a run's kept stdin (a --background or --yield run with --stdin keep or --pty)."""
        from .send import send

        raise typer.Exit(send(run, text, file, eof, line, _duration(timeout, "--timeout")))

    @app.command("wait")
    def _wait(
        run: str = typer.Argument(..., metavar="RUN"),
        timeout: str | None = typer.Option(
            None, "--timeout", metavar="DURATION", help="Give up after this long: exit 124."
        ),
    ):
        """Wait for a run to end; exit with its exit code, as corral returned it."""
        raise typer.Exit(wait(run, _duration(timeout, "--timeout")))

    @app.command("gc")
    def _gc(
        dry_run: bool = typer.Option(False, "--dry-run", help="Report only; stop and remove nothing."),
        keep_finished: str = typer.Option(
            f"{REG.KEEP_FINISHED / 3600:g}h",
            "--keep-finished",
            metavar="DURATION",
            help="Remove finished runs (entry and event log) that finished longer ago than this.",
        ),
        as_json: bool = typer.Option(False, "--json", help="JSON report."),
    ):
        """Reclaim what crashed corrals left; prune old finished runs.

        Removes finished runs (entry and event log) that finished longer ago
        than --keep-finished; stops runs whose corral is gone, corral-* units no
        live corral owns, and removes stray credential directories. Active and
        expired runs, and runs whose owner still runs, are never removed.
        """
        raise typer.Exit(gc(dry_run, as_json, keep_finished=parse_keep(keep_finished)))

    @app.command("mcp")
    def _mcp(
        idle_timeout: str = typer.Option(
            "24h",
            "--idle-timeout",
            metavar="DURATION",
            help="End the session (every run of it) after this long with no run started and none in the foreground.",
        ),
    ):
        """An MCP server over stdio (tools: exec, write_stdin, read_output, start, list, stop, wait) whose runs
        are one corral session owned by the server: they end, proven, when its client goes away."""
        from ..mcp import main as mcp_main

        timeout = _duration(idle_timeout, "--idle-timeout")
        assert timeout is not None
        raise typer.Exit(mcp_main(timeout))

    @audit.command("verify")
    def _verify(run: str = typer.Argument(..., metavar="RUN")):
        """Check a run's hash-chained event log; point at the first bad line."""
        raise typer.Exit(audit_verify(run))

    return app


def _duration(text: str | None, what: str) -> float | None:
    if text is None:
        return None
    from ..common.units import parse_duration

    try:
        return parse_duration(text, what=what)
    except ValueError as exc:
        raise CtlError(str(exc)) from None


def _version(value: bool) -> None:
    if value:
        import typer

        from ..common.version import __version__

        print(f"corralctl {__version__}")
        raise typer.Exit(0)


def service_command(action: str, user: bool, system: bool, **options) -> int:
    import os

    from ..common.programs import socket_paths
    from . import service_units as units

    if user and system:
        raise CtlError("--user and --system: choose one")
    manager = "system" if system or (not user and os.geteuid() == 0) else "user"
    try:
        if action == "install":
            for written in units.install(manager, options["runtime"], options["idle_exit"]):
                print(f"corralctl: wrote {written}")
            print(f"corralctl: corral.socket enabled and started ({manager} manager)")
            return 0
        if action == "uninstall":
            managers = [manager]
            if not (user or system):  # neither named: whichever has corral's units (root's --user install too)
                other = "user" if manager == "system" else "system"
                if not units.installed(manager) and units.installed(other):
                    managers = [other]
            for each in managers:
                removed, looked, warning = units.uninstall(each)
                for path in removed:
                    print(f"corralctl: removed {path} ({each} manager)")
                if not removed:
                    print(f"corralctl: nothing to remove: no unit written by corralctl in {' or '.join(looked)}")
                if warning:
                    print(f"corralctl: warning: {warning}", file=sys.stderr)
            return 0
    except (units.ServiceUnitError, OSError) as exc:
        raise CtlError(str(exc)) from None
    paths = socket_paths()
    if not paths:
        report = units.status(None, "CORRAL_SERVICE is off")
    tried = []
    for path in paths:  # as corral tries them
        report = units.status(path, None)
        tried.append({"socket": path, "reason": report["reason"]})
        if report["in_use"] or not report.get("absent"):
            break
    report["tried"] = tried
    print(units.status_json(report) if options.get("as_json") else units.status_text(report))
    return 0 if report["in_use"] else 3


def _whole_short_help(command) -> None:
    """Each command's line in a group's --help is its help's first paragraph,
    whole (click cuts it at about 45 characters with "...")."""
    for sub in getattr(command, "commands", {}).values():
        if sub.help and not sub.short_help:
            sub.short_help = " ".join(sub.help.split("\n\n", 1)[0].split())
        _whole_short_help(sub)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) == 2 and args[0] == "status" and not args[1].startswith("-"):
            return status(args[1])  # fast path: no typer
        if args[:1] == ["hook"] and "--help" not in args and "-h" not in args:
            from .hooks import main as hook  # fast path: an agent runs it on every tool call

            return hook(args[1:])
        import click
        import typer

        command = typer.main.get_command(_app())
        _whole_short_help(command)
        no_args = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2
        try:
            rv = command.main(args=args, prog_name="corralctl", standalone_mode=False)
            return rv if isinstance(rv, int) else 0
        except click.exceptions.Exit as exc:
            return exc.exit_code
        except no_args as exc:  # `corralctl`, `corralctl audit`: the help, as --help gives it
            print(exc.ctx.get_help())
            return 0
        except click.UsageError as exc:
            usage = exc.ctx.get_usage().replace("\n", " ").strip() if exc.ctx is not None else ""
            print(f"corralctl: {exc.format_message()}" + (f" ({usage})" if usage else ""), file=sys.stderr)
            return 125
        except click.ClickException as exc:
            print(f"corralctl: {exc.format_message()}", file=sys.stderr)
            return 125
        except click.Abort:
            print("corralctl: aborted", file=sys.stderr)
            return 130
    except CtlError as exc:
        print(f"corralctl: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"corralctl: {exc}", file=sys.stderr)
        return 125


def entry() -> None:
    sys.exit(main())
