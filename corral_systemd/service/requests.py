"""One ``io.corral.Run.Run`` call, from its parameters to its reply.

    validate the parameters  →  read the command line (``core.request``, as
    the CLI reads it, with the client's environment and cwd)  →  decide whether it is served
    here  →  accepted  →  run it on the service's Runner, the client's
    descriptors as the command's stdio, its control pipe and pidfd watched
    →  the reply: exit code, warnings, summary line, record

Failure modes, each a typed Varlink error (the service stays up):
``org.varlink.service.InvalidParameter`` (a malformed call),
``io.corral.Run.UsageError`` (what the CLI exits 125 on, before anything
runs), ``io.corral.Run.NotServed`` (the client runs it itself: nothing ran
here), ``io.corral.Run.SetupError`` (125: nothing ran), ``io.corral.Run.Busy``.
"""

import os

from ..common.errors import SetupError, UsageError
from ..common.programs import PROGRAMS as _PROGRAMS
from ..common.unit_names import run_of_cgroup
from ..varlink.wire import VarlinkError

INVALID = "org.varlink.service.InvalidParameter"


class NotServed(VarlinkError):
    def __init__(self, reason: str):
        super().__init__("io.corral.Run.NotServed", {"reason": reason})


def _invalid(name: str) -> VarlinkError:
    return VarlinkError(INVALID, {"parameter": name})


def _text(value) -> bool:
    return isinstance(value, str) and "\0" not in value


def check_parameters(parameters, fds: list[int]) -> dict:
    """The call's parameters, each checked for type and range, with the
    descriptor indexes resolved to descriptors. InvalidParameter names the first bad one."""
    if not isinstance(parameters, dict):
        raise _invalid("parameters")
    checked = {}
    if not isinstance(parameters.get("program"), str) or parameters["program"] not in _PROGRAMS:
        raise _invalid("program")
    checked["program"] = parameters["program"]
    argv = parameters.get("argv")
    if not isinstance(argv, list) or not all(_text(a) for a in argv):
        raise _invalid("argv")
    checked["argv"] = argv
    env = parameters.get("environment")
    if not isinstance(env, list) or not all(_text(e) and e.find("=") > 0 for e in env):
        raise _invalid("environment")
    checked["environment"] = dict(e.split("=", 1) for e in env)
    cwd = parameters.get("cwd")
    if not isinstance(cwd, str) or "\0" in cwd or not os.path.isabs(cwd):
        raise _invalid("cwd")
    checked["cwd"] = cwd
    umask = parameters.get("umask")
    if type(umask) is not int or not 0 <= umask <= 0o777:
        raise _invalid("umask")
    checked["umask"] = umask
    for name in ("stdin", "stdout", "stderr", "control", *_HELD, "record"):
        index = parameters.get(name)
        if index is None:  # not passed: /dev/null, captured output, the connection (see the interface)
            checked[name] = None
            continue
        if type(index) is not int or not 0 <= index < len(fds):
            raise _invalid(name)
        checked[name] = fds[index]
    json_fd = parameters.get("json_fd")
    if json_fd is not None and (type(json_fd) is not int or json_fd < 0):
        raise _invalid("json_fd")
    if (json_fd is None) != (checked["record"] is None):
        raise _invalid("record")  # the descriptor and the number the caller knows it by: both, or neither
    checked["json_fd"] = json_fd
    if len({checked[name] is None for name in _HELD}) != 1:
        raise _invalid("process")  # all three, or none
    if checked["control"] is not None and not _pipe_read_end(checked["control"]):
        raise _invalid("control")  # watched for bytes and end of file: only a pipe's read end will do
    return checked


#: The command's process, forked and held by the caller (``kernel.gate``): its pidfd, the gate, the exit pipe.
_HELD = ("process", "gate", "exit")


def _pipe_read_end(fd: int) -> bool:
    import fcntl
    import stat

    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    except OSError:
        return False


def own_control_pipe(checked: dict) -> int | None:
    """The control pipe through an open file of the service's own (non-blocking:
    its flags are the service's to set, never the caller's), or None."""
    from ..kernel.held import Refused, reopen_pipe

    if checked["control"] is None:
        return None
    try:
        return reopen_pipe(checked["control"])
    except Refused as exc:
        raise NotServed(str(exc)) from None


def held_process(checked: dict, peer_pid: int):
    """The caller's held child (``kernel.held.HeldProcess``), checked to be
    one the service may make a scope of, or None when the call has none.
    NotServed (nothing ran: the caller runs the command itself) when it is
    not the caller's held child, or when the caller's paths are not the
    service's (another mount namespace or root directory: the service opens
    --output-file, credentials and the like, the command chdirs)."""
    from ..kernel.held import HeldProcess, Refused

    if checked["process"] is None:
        return None
    try:
        pidfd, gate, exit_pipe = (os.dup(checked[name]) for name in _HELD)
        held = HeldProcess(pidfd, gate, exit_pipe, parent=peer_pid)
    except Refused as exc:
        raise NotServed(f"the caller's process: {exc}") from None
    try:
        if in_a_run(held.pid):
            raise NotServed("a run inside a corral run stays inside it")
        if (why := _other_filesystem_view(held.pid)) is not None:
            raise NotServed(why)
    except BaseException:
        held.abandon()
        raise
    return held


def _other_filesystem_view(pid: int) -> str | None:
    """Why paths would not name the same files for ``pid`` as for the service, or None."""
    for what, mine, theirs in (
        ("mount namespace", "/proc/self/ns/mnt", f"/proc/{pid}/ns/mnt"),
        ("root directory", "/", f"/proc/{pid}/root"),
    ):
        try:
            a, b = os.stat(mine), os.stat(theirs)
        except OSError as exc:
            return f"the caller's {what} cannot be compared with the service's ({exc.strerror})"
        if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
            return f"the caller's {what} is not the service's: its paths would name other files"
    return None


#: Output captured for a caller that passed no descriptor for it, per stream.
CAPTURE_LIMIT = 1 << 20  # base64, both streams: within a client's wire.MAX_MESSAGE


class Capture:
    """A stream's bytes, kept up to CAPTURE_LIMIT (the rest counted, not kept)."""

    def __init__(self):
        self.chunks: list[bytes] = []
        self.kept = self.dropped = 0

    def __call__(self, data: bytes) -> None:
        room = CAPTURE_LIMIT - self.kept
        if room > 0:
            self.chunks.append(data[:room])
            self.kept += min(room, len(data))
        self.dropped += max(0, len(data) - max(room, 0))

    def text(self) -> str:
        import base64

        return base64.b64encode(b"".join(self.chunks)).decode()


def in_a_run(pid: int) -> bool:
    """The process (the client) is inside a corral run's cgroup, as the kernel says."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return any(run_of_cgroup(line.rstrip("\n").split(":", 2)[-1]) is not None for line in f)
    except OSError:
        return True  # gone or unreadable: not served (the client, if alive, runs it itself)


def manager_for(spec_manager: str, environ: dict) -> str:
    """Which manager the client's corral would use: its --manager, or for
    auto what ``dbus.discovery.bus_address`` picks, from the client's environment."""
    from ..dbus.discovery import user_manager_reachable

    if spec_manager != "auto":
        return spec_manager
    return "user" if user_manager_reachable(environ) else "system"


def parse(checked: dict, manager_kind: str, peer_pid: int):
    """The command line as the ``RunRequest`` this service runs, or NotServed /
    UsageError (as VarlinkError)."""
    from ..core.request import Printing, parse_command_line

    try:
        request = parse_command_line(
            checked["argv"],
            default_mode=_PROGRAMS[checked["program"]],
            environ=checked["environment"],
            cwd=checked["cwd"],
        )
    except Printing:
        raise NotServed("help, version and completion are printed by corral itself") from None
    except UsageError as exc:
        raise VarlinkError("io.corral.Run.UsageError", {"message": str(exc)}) from None
    _check_record_fd(request, checked)
    spec = request.spec
    if spec.pty:
        raise NotServed("--pty: the terminal is the client's own")
    if request.yield_after is not None:
        raise NotServed("--yield: the client's corral follows the run and hands it back")
    if request.background is not None and any(checked[name] is not None for name in ("stdin", "stdout", "stderr")):
        # A caller with descriptors has a corral of its own: it starts the run
        # with its own context (its session's holder does, with that context).
        raise NotServed("--background: the client's corral starts it, with the client's own context")
    if request.background is not None and spec.session is None:
        raise NotServed("--background outside a session: its corral would be a child of this service")
    if not spec.may_be_systemd:
        raise NotServed("the fallback and --cgroup-parent engines run in the corral process")
    if spec.sealed and spec.unit_type == "scope":
        raise NotServed(
            "a sealed scope (--network none, --handoff deny): its command is forked and sealed by corral itself"
        )
    if "CORRAL_RUN_ID" in checked["environment"] or in_a_run(peer_pid):
        raise NotServed("a run inside a corral run stays inside it")
    from ..state.registry import state_dir

    if request.registry and state_dir(checked["environment"]) != state_dir():
        raise NotServed("the caller's registry (CORRAL_STATE_DIR, XDG_RUNTIME_DIR) is not the service's")
    wanted = manager_for(spec.manager, checked["environment"])
    if wanted != manager_kind:
        raise NotServed(f"the {wanted} manager is asked for; this service uses the {manager_kind} manager")
    return request


def _check_record_fd(request, checked: dict) -> None:
    """--json-fd N: the client passed its descriptor N (``record``, closed in its
    held child) and writes the record there. UsageError (125) for a descriptor
    that takes no record, as the CLI's; NotServed when the client passed none or
    another (an older client; a ``--json-fd`` it read among the command's arguments)."""
    from ..core import record_fd

    if request.json_fd != checked["json_fd"]:
        raise NotServed("--json-fd: the client did not pass the descriptor its command line names")
    if request.json_fd is not None:
        try:
            record_fd.check(checked["record"], shown=request.json_fd)
        except UsageError as exc:
            raise VarlinkError("io.corral.Run.UsageError", {"message": str(exc)}) from None


def execute_background(request, checked: dict, connection_fd: int, accepted) -> dict:
    """A caller without descriptors (``parse`` declines the others): the run's
    corral is started by its session's holder with the caller's environment, cwd
    and umask (``core.background.ServedCaller``); the reply is corral's output:
    the run id (or the start record) in ``stdout``, base64, and the exit code.
    The connection hanging up before the run is ready stops it."""
    from ..core import background
    from ..kernel.context import ProcessContext

    stdout, stderr = Capture(), Capture()
    context = ProcessContext.here(checked["environment"])
    context.cwd, context.umask = checked["cwd"], checked["umask"]

    accepted()
    try:
        started = background.launch(request, None, background.ServedCaller(context, connection_fd))
    except (background.EndedEarly, background.NotReady) as exc:
        if exc.tail:
            stderr(exc.tail if exc.tail.endswith(b"\n") else exc.tail + b"\n")
        stderr(f"corral: {exc}\n".encode())
        return {"exit_code": exc.exit_code, "stdout": stdout.text(), "stderr": stderr.text()}
    except SetupError as exc:
        raise VarlinkError("io.corral.Run.SetupError", {"message": str(exc)}) from None
    except UsageError as exc:
        raise VarlinkError("io.corral.Run.UsageError", {"message": str(exc)}) from None
    if request.record_to_stdout:
        import json

        stdout(json.dumps(started.record(), sort_keys=True).encode() + b"\n")
    else:
        stdout(started.run_id.encode() + b"\n")
    warnings = [] if request.quiet else list(started.warnings)
    return {
        "exit_code": 0,
        "run_id": started.run_id,
        "stdout": stdout.text(),
        "stderr": stderr.text(),
        "warnings": warnings,
    }


def execute(service, request, checked: dict, held, peer_pidfd: int, connection_fd: int, accepted) -> dict:
    """Run it; the reply's parameters. ``accepted()`` is called once the run
    is taken (before anything starts). SetupError as a VarlinkError.
    Without a control pipe, the connection hanging up stops the run.
    ``held``: the caller's held child (``held_process``), which a scope is
    made of; closed here whatever happens (a child never released then exits)."""
    from ..common.cleanup import ExitStack
    from ..core.record_json import record_bytes
    from ..core.result import NEVER_RAN, reason_line, summary_line

    with ExitStack() as cleanup:
        if held is not None:
            cleanup.callback(held.close)
        spec = request.spec
        auto = spec.cgroup_mode == "auto"
        spec.manager = service.manager_kind
        # Served runs are systemd runs: auto's fallback would run in this process.
        spec.cgroup_mode = "enforced"
        spec.umask = checked["umask"]
        if spec.unit_type != "scope" and held is not None:
            held.close()  # the manager starts a service's command: the caller's child exits at its gate
            held = None
        elif spec.unit_type == "scope" and held is None:
            # A caller without a process of its own to pass: the command's
            # parent is a holder of this run's own, never the service.
            from ..kernel.held import Refused
            from .holder import Holder

            try:
                holder = Holder()
            except (OSError, Refused) as exc:
                raise NotServed(f"no holder for the command's process: {exc}") from None
            cleanup.callback(holder.close)
            held = holder.held
            cleanup.callback(held.close)
        captured = {name: Capture() for name in ("stdout", "stderr") if checked[name] is None}
        stdin = checked["stdin"]
        if stdin is None:
            spec.stdin = "null"
            stdin = -1
        control = own_control_pipe(checked)
        if control is not None:
            cleanup.callback(os.close, control)
        # Taken: from here the command may run (a client that is gone by now
        # fails this send, and nothing has started). NotServed below is still
        # "nothing ran": the client then runs it itself.
        accepted()
        try:
            execution = service.sessions.execution(
                spec,
                captured.get("stdout", checked["stdout"]),
                captured.get("stderr", checked["stderr"]),
                stdin_fd=stdin,
                guard=request.guard_options(),
                via="service",
                held=held,
            )
        except SetupError as exc:
            raise NotServed(f"no manager session: {exc}") from None
        watched = control if control is not None else connection_fd
        service.watcher.watch(execution, watched, peer_pidfd, hangup_only=control is None)
        try:
            outcome = execution.execute()
        except SetupError as exc:
            if auto:  # in-process auto mode may still fall back: nothing ran here
                raise NotServed(f"setting up failed: {exc}") from None
            raise VarlinkError("io.corral.Run.SetupError", {"message": str(exc)}) from None
        except UsageError as exc:
            raise VarlinkError("io.corral.Run.UsageError", {"message": str(exc)}) from None
        finally:
            service.watcher.unwatch(execution, watched, peer_pidfd)
    reply: dict = {"exit_code": outcome.exit_code, "run_id": outcome.run_id}
    for name, capture in captured.items():
        reply[name] = capture.text()
        if capture.dropped:
            reply[f"{name}_dropped_bytes"] = capture.dropped
    if not request.quiet:
        reply["warnings"] = list(outcome.warnings)
    # 126, 127: why, on a line of its own before the summary line (--quiet: the only one); the
    # clients print it as is. Why nothing ran is never swallowed.
    reason = reason_line(outcome)
    lines = [reason] if reason else []
    if not request.quiet or (outcome.reason in NEVER_RAN and not reason):
        lines.append(summary_line(outcome))
    if lines:
        reply["summary"] = "\n".join(lines)
    if request.json_path is not None or request.json_fd is not None:
        reply["record"] = record_bytes(outcome).decode()
    if request.json_fd is not None:
        reply["record_fd"] = request.json_fd  # the client's own descriptor: it writes the record there
    elif request.json_path is not None:
        reply["record_path"] = "-" if request.record_to_stdout else request.json_path
    return reply
