"""``corral`` and ``corral-enforced``: hand the run to the corral service, or run it here.

When a corral service listens (``corralctl service install``; socket
activation), the command line goes to it exactly as typed, with this
process's environment, working directory, umask and standard streams
(their descriptors travel with the call), and this process waits for the
exit code. The service has the parser, the manager connection and the
tether already loaded and open, so a run costs what systemd-run's does.
Where nobody listens but the manager whose socket it is runs, the client
first starts the service as that manager's transient unit pair (no install
step: ``service/transient.py``; ``CORRAL_SERVICE=installed`` turns that
off). Without a service (no manager either, ``CORRAL_SERVICE=0``), or
when the service declines the run (``NotServed``: ``--pty``, the fallback
engine, another manager, a run inside a run, ``--help``...), it runs in this
process through ``cli.main``, exactly as before.

Guarantees are the in-process CLI's:

- a signal corral would stop the run for (Ctrl-C, SIGTERM, SIGHUP...) is
  written to the run's control pipe as one byte, its number: the service
  stops the run as corral would and the exit code is the same (128+N);
- this process SIGKILLed: the control pipe reaches end of file and the
  service also holds this process's pidfd: the run is stopped;
- the service dying before it took the run: nothing ran, so the run goes
  on here (with a warning); after it took the run: exit 120 (the run's
  units are stopped by the service's tether, which this process cannot
  verify);
- ``--json PATH`` is written by this process (its uid, its cwd), the
  summary line and warnings printed here;
- ``--json-fd N``: descriptor N travels with the call, the held child
  closes it (the command never has it) and this process writes the record
  there (``core.record_fd``); an N that is not open is left to the
  in-process run, which says so (125).

The hot path imports ``os``, ``sys``, ``_socket``, ``_signal`` and ``json``
only: no typer, dbus-fast, asyncio or pydantic (see ``service/`` for the
other side).
"""

import os
import sys

from .common.programs import PROGRAMS, manager_for, may_start_service, socket_paths


class _Declined(Exception):
    """The service will not run this (or is not there): run it here.
    ``warn``: say so on stderr (something went wrong, not just "no service")."""

    def __init__(self, why: str, warn: bool = False, absent: bool = False):
        super().__init__(why)
        self.warn = warn
        #: Nobody listens there: the next socket may be tried.
        self.absent = absent


def run_via_service(args: list[str], prog: str, path: str, record_fd: int | None = None) -> int:
    """The run's exit code from the service at ``path``; _Declined when it is
    not there or does not take the run (nothing has run then).

    The command's process is this process's child, forked before the call
    and held at a gate (``kernel.gate``): the service makes the run's unit
    around it and releases it; this process waits for it, reports its wait
    status on the exit pipe, and reaps it once the run's reply is here.
    ``record_fd``: the --json-fd the command line names (open here), passed
    with the call and closed in the held child."""
    import _signal
    import _socket
    import gc

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    pipes: list[int] = []  # control_r, control_w, exit_r, exit_w: closed on the way out
    child = None
    saved: dict = {}  # the signal handlers to put back if the run goes on in-process
    try:
        try:
            sock.connect(path)
        except OSError as exc:
            raise _Declined(f"{path}: {exc.strerror or exc}", absent=True) from None
        # Only once a service answers: where none listens (most runs without
        # one), the run goes on in-process without them.
        from .kernel.gate import fork_held
        from .kernel.prctl import set_child_subreaper, set_dumpable
        from .kernel.signals import stop_signals
        from .varlink import wire

        gc.enable()  # main's: the modules of this path are loaded
        try:
            if wire.peer_credentials(sock)[1] not in (0, os.getuid()):
                raise _Declined("the socket is not served by this user or root")
            channel = wire.Channel(sock)
            _hello(channel, path)
            pipes += os.pipe2(os.O_CLOEXEC)
            pipes += os.pipe2(os.O_CLOEXEC)
            control_r, control_w, exit_r, exit_w = pipes
            set_child_subreaper()  # the run's orphans become ours (the service finds them so)
            kept = () if record_fd is None else (record_fd,)  # the command never has it
            child = fork_held(close_in_child=(sock.fileno(), *pipes, *kept))
            # Not dumpable (startup.prepare did so already; its child made itself dumpable): the
            # command, which runs as this uid, cannot ptrace this process or open its descriptors
            # through /proc (its exit pipe, its control pipe, its connection to the service).
            set_dumpable(False)
            mask = os.umask(0o22)
            os.umask(mask)
            parameters = {
                "program": prog,
                "argv": args,
                "environment": [f"{name}={value}" for name, value in os.environ.items()],
                "cwd": os.getcwd(),
                "umask": mask,
                "stdin": 0,
                "stdout": 1,
                "stderr": 2,
                "control": 3,
                "process": 4,
                "gate": 5,
                "exit": 6,
            }
            fds = [0, 1, 2, control_r, child.pidfd, child.gate, exit_r]
            if record_fd is not None:
                parameters.update(json_fd=record_fd, record=len(fds))
                fds.append(record_fd)
            # From here a stop signal is the run's: forwarded as a byte.
            forward = lambda signum, frame: os.write(control_w, bytes([signum]))  # noqa: E731
            for signum in stop_signals():
                saved[signum] = _signal.signal(signum, forward)
            channel.send({"method": "io.corral.Run.Run", "parameters": parameters, "more": True}, fds)
            for fd in (control_r, exit_r, child.gate):
                os.close(fd)
            pipes[0] = pipes[2] = child.gate = -1
        except OSError as exc:  # no service, cwd gone: all handled in-process
            raise _Declined(str(exc)) from None
        return _await_run(channel, child, exit_w, prog)
    except _Declined:
        for signum, handler in saved.items():
            _signal.signal(signum, handler)
        if child is not None:
            child.discard()  # it never ran (held at its gate): nothing is left of it
            # The run goes on in this process, not dumpable (startup.prepare): a
            # child it forks makes itself dumpable where it must (kernel.spawn, seal).
        raise
    finally:
        sock.close()
        for fd in pipes:
            if fd >= 0:
                os.close(fd)


def _await_run(channel, child, exit_w: int, prog: str) -> int:
    """The replies, while the command's process is watched: its wait status
    goes to the service as soon as it has exited (it stays a zombie until the
    last reply). _Declined while nothing has run."""
    import select

    from .varlink import wire

    poller = select.poll()
    poller.register(channel.sock.fileno(), select.POLLIN)
    poller.register(child.pidfd, select.POLLIN)
    accepted = False
    while True:
        ready = [fd for fd, _ in poller.poll()] if not channel.buffered() else []
        if child.pidfd in ready and child.exited() is not None:
            poller.unregister(child.pidfd)
            try:
                os.write(exit_w, child.report())
            except OSError:
                pass  # the service is gone: the connection says so
        if ready and channel.sock.fileno() not in ready:
            continue
        try:
            got = channel.receive()
        except (OSError, wire.ProtocolError) as exc:
            got, why = None, str(exc)
        else:
            why = "the connection closed"
        if got is None:
            if not accepted:
                raise _Declined(f"the corral service ended before it took the run ({why})", warn=True)
            child.discard()
            print(
                f"{prog}: the corral service ended during the run ({why}): its tether stops the run, "
                "which this process cannot verify",
                file=sys.stderr,
            )
            return 120
        reply, fds = got
        wire.close_fds(fds)
        if "error" in reply:
            code = _error_reply(reply, prog, accepted)
            child.discard()
            return code
        parameters = reply.get("parameters") or {}
        if reply.get("continues"):
            accepted = True
            continue
        child.discard()  # exited, or (a run that never started it) still at its gate
        return _finish(parameters, prog)


def _hello(channel, path: str) -> None:
    """The hello, as chg's, before anything else: the service says its version
    (``org.varlink.service.GetInfo``); a service of another version -- one left
    running from before an upgrade -- never runs this client's command line
    (_Declined, said: the run goes on in-process)."""
    from .common.version import __version__
    from .varlink import wire
    from .varlink.wire import ProtocolError

    channel.send({"method": "org.varlink.service.GetInfo"})
    try:
        got = channel.receive()
    except ProtocolError as exc:
        raise _Declined(f"the corral service at {path} did not answer its hello ({exc})", warn=True) from None
    if got is not None:
        wire.close_fds(got[1])  # none is sent with an answer: any that came are not kept
    parameters = (got[0].get("parameters") if got is not None else None) or {}
    version = parameters.get("version") if isinstance(parameters, dict) else None
    if version != __version__:
        raise _Declined(
            f"the corral service at {path} is version {version or 'unknown'}, this corral {__version__}: "
            "the run goes on in-process (restart the service to serve it)",
            warn=True,
        )


def _error_reply(reply: dict, prog: str, accepted: bool) -> int:
    name = str(reply.get("error"))
    parameters = reply.get("parameters") or {}
    if name in ("io.corral.Run.UsageError", "io.corral.Run.SetupError"):
        print(f"{prog}: {parameters.get('message', name)}", file=sys.stderr)
        return 125
    if accepted and name != "io.corral.Run.NotServed":  # NotServed: nothing ran, even after accepted
        print(f"{prog}: the corral service failed during the run ({name} {parameters})", file=sys.stderr)
        return 120
    raise _Declined(f"{name} {parameters}", warn=name == "io.corral.Run.InternalError")


def _finish(parameters: dict, prog: str) -> int:
    """What corral prints and writes once the run is over."""
    record, path, fd = parameters.get("record"), parameters.get("record_path"), parameters.get("record_fd")
    for warning in parameters.get("warnings") or ():
        print(f"corral: warning: {warning}", file=sys.stderr)  # as cli._run prints them
    if record is not None and (path is not None or type(fd) is int):
        try:
            if type(fd) is int:
                from .core import record_fd

                record_fd.write(record.encode(), fd)
            elif path == "-":
                sys.stdout.flush()
                os.write(1, record.encode())
            elif path is not None:
                from .core.record_json import write_file

                write_file(record.encode(), path)
        except OSError as exc:
            print(f"{prog}: cannot write --json record: {exc}", file=sys.stderr)
    if summary := parameters.get("summary"):
        print(summary, file=sys.stderr)
    return int(parameters.get("exit_code", 120))


def main(argv: list[str] | None = None, *, prog: str = "corral") -> int:
    import gc

    gc.disable()  # while the modules load (see _in_process); on again once a path is taken
    from .kernel import startup

    startup.prepare()  # stdio open, the environment as given (kernel/startup.py)
    args = sys.argv[1:] if argv is None else list(argv)
    # Shell completion (click's _PROG_COMPLETE) is answered by the parser here.
    completing = "_" + prog.upper().replace("-", "_") + "_COMPLETE" in os.environ
    from .core.record_fd import named_in

    # Looked for before this process opens anything that could take its number.
    record_fd = named_in(args)
    # --json-fd naming no open descriptor: nothing to pass; the in-process run says so (125).
    nothing_to_pass = record_fd is not None and not _is_open(record_fd)
    for path in [] if completing or nothing_to_pass else socket_paths():
        try:
            return _served(args, prog, path, record_fd)
        except _Declined as why:
            if why.warn or os.environ.get("CORRAL_SERVICE_DEBUG"):
                print(f"{prog}: warning: running the command here, not in the corral service: {why}", file=sys.stderr)
            if why.warn or not why.absent:
                break  # a service answered (or died): the run is not another one's to take
    return _in_process(args, prog)


def _served(args: list[str], prog: str, path: str, record_fd: int | None) -> int:
    """``run_via_service`` at ``path``; where nobody listens there but the
    manager whose socket it is runs, the service is started first as its
    transient unit (``service/transient.py``; not with
    ``CORRAL_SERVICE=installed``). _Declined as ``run_via_service``."""
    try:
        return run_via_service(args, prog, path, record_fd)
    except _Declined as why:
        if not (why.absent and may_start_service()):
            raise
        kind = manager_for(path)
        if kind is None:
            raise  # no manager for this socket: the next one, or in-process
        from .service import transient

        if (failed := transient.start(kind, path)) is not None:
            said = f"the corral service could not be started in the {kind} manager: {failed}"
            raise _Declined(said, warn=True) from None
    return run_via_service(args, prog, path, record_fd)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _in_process(args: list[str], prog: str) -> int:
    """The command line run in this process, by the CLI (``cli.main``)."""
    import gc

    # The CLI's modules allocate tens of thousands of objects and free none of
    # them: the cyclic collector's passes over them while they load are wasted
    # (~5 ms of every start). It runs again for the run's own life, with those
    # objects frozen out of its passes (else the first pass scans them all).
    gc.disable()
    try:
        from .cli import main as in_process
    finally:
        gc.freeze()
        gc.enable()
    return in_process(args, prog=prog, default_mode=PROGRAMS[prog])


def _leave(code: int) -> None:
    """Exit with ``code`` without the interpreter's teardown (freeing every
    module's objects one by one: ~10 ms of every run, for nothing, as the
    process ends). Only for a process that is the program itself (the
    entry points): what it wrote is flushed first, and nothing of corral's
    waits for an exit handler (none is registered; every run's clean-up is
    done before its exit code exists). A flush that fails (stdout closed by
    the caller) changes nothing: the exit code is the run's."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _exit_code(code) -> int:
    """``sys.exit``'s reading of ``code``: an int as it is, None 0, else 1 (its text printed)."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def entry() -> None:
    try:
        code = main()
    except SystemExit as exc:  # click's and argparse's way out
        code = _exit_code(exc.code)
    _leave(code)


def entry_in_process() -> None:
    """``corral-inprocess PROG ARGS...``: the compiled client's way back
    (packaging/client/corral.c) when no service takes the run. Runs the
    command line in this process and never tries the service again (the
    compiled client already did). ``corral-inprocess --service-absent PROG
    ARGS...``: nobody listened on any socket the compiled client tried, so
    this is ``main``: the service may be started as a transient unit first
    (the compiled client leaves that step to this side)."""
    absent = sys.argv[1:2] == ["--service-absent"]
    argv = sys.argv[2:] if absent else sys.argv[1:]
    prog = argv[0] if argv else ""
    if prog not in PROGRAMS:
        print(f"corral-inprocess: the first argument must be corral or corral-enforced, not {prog!r}", file=sys.stderr)
        sys.exit(125)
    try:
        code = main(argv[1:], prog=prog) if absent and may_start_service() else _in_process(argv[1:], prog)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    _leave(code)


def entry_enforced() -> None:
    try:
        code = main(prog="corral-enforced")
    except SystemExit as exc:
        code = _exit_code(exc.code)
    _leave(code)
