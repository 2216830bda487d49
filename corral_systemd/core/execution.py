"""One run executed for the library: in this process, or in a fallback child.

The library's faces (``api.Runner.run``, ``RunHandle``) differ in how they
wait and where output goes; both hand the run to an ``Execution``, which
decides where it runs:

- systemd and ``--cgroup-parent`` runs run here (``assemble_and_run``), a
  Runner's systemd runs on its shared session (taking turns, ``baton.py``);
- fallback runs go to a child process (``fallback_child.py``), because the fallback
  engine needs its process to own all of its descendants. The spec goes to
  it as JSON, output comes back through pipes, the outcome as JSON;
  ``cancel()`` reaches it through a pipe that also reaches EOF if this
  process dies.

Guarantees: ``execute()`` returns the run's outcome (stopped and verified,
or saying it could not be) or raises what setting it up raised; every
descriptor it opened is closed when it returns.
"""

import os
import subprocess
import sys
import threading
from collections.abc import Callable

from ..common import jsoncodec
from ..common.cleanup import ExitStack
from ..common.errors import SetupError
from ..common.plainclass import asdict
from . import result as R
from .output import OutputPump
from .spec import RunSpec

#: A Runner's session when no manager answered (auto mode).
NO_SYSTEMD = object()


class Execution:
    """One run, driven synchronously in the calling thread.

    ``cancel()`` (any thread) asks the supervisor to stop the run; the stop
    is verified like any other.
    """

    def __init__(
        self,
        spec: RunSpec,
        session,
        on_stdout: Callable[[bytes], None] | int,  # an int: the command's own descriptor, uncaptured
        on_stderr: Callable[[bytes], None] | int,
        stdin_fd: int = 0,
        register: bool = True,
        renew_session: Callable[[RunSpec], object] | None = None,
        via: str = "library",
        guard: dict | None = None,
        held=None,
    ):
        self.spec = spec
        #: The command's process, forked by the caller (``kernel.held.HeldProcess``): the engine's to own.
        self._held = held
        self._register = register
        #: Who asked (the record's ``via``) and what else the RunGuard is told
        #: (the corral service passes a command line's env report and credentials).
        self._via = via
        self._guard = guard or {}
        #: The Runner's way to a new session (see _start_again).
        self._renew_session = renew_session
        self._stdin_fd = stdin_fd
        self._session = session
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._cancel_r, self._cancel_w = os.pipe2(os.O_CLOEXEC)
        self._child: subprocess.Popen | None = None
        self._engine = None
        self._lock = threading.Lock()
        self._done = False

    def cancel(self, signum: int | None = None) -> None:
        """Stop the run as corral stops it for signal ``signum`` (exit
        128+N; default: a library cancel, SIGTERM's stop). A second cancel
        skips the grace period."""
        with self._lock:
            if not self._done:
                # seen by the supervisor here or in the child: one byte, the signal
                os.write(self._cancel_w, bytes([signum]) if signum else b"x")

    def execute(self) -> R.RunOutcome:
        try:
            outcome = self._execute()
            outcome.via = self._via
            return outcome
        finally:
            with self._lock:
                self._done = True
                os.close(self._cancel_r)
                os.close(self._cancel_w)

    def _execute(self) -> R.RunOutcome:
        if self._use_child():
            return self._in_child()
        outcome = self._in_process()
        if self._start_again(outcome):
            first = outcome.detail
            outcome = self._in_process()
            outcome.warnings.append(
                f"the first start failed on the Runner's manager connection, which had ended ({first}); "
                "the command had not run (held at its gate) and was started again on a new connection"
            )
        return outcome

    def _start_again(self, outcome: R.RunOutcome) -> bool:
        """A Runner's shared connection can end under a start (the manager's
        daemon-reexec closes every connection; the session notices only when
        it next uses it). A scope's command is still held at its gate then,
        so it never ran: start it once more, as a new run on a new session.
        A service is not started again: its request may have reached the
        manager, and that would run the command twice."""
        if outcome.reason != R.SETUP_FAILED or self.spec.unit_type != "scope" or self._renew_session is None:
            return False
        if self._held is not None:
            return False  # the caller's process was the first start's: gone with it
        if not getattr(self._session, "lost", False) or self._cancelled():
            return False
        from ..common.plainclass import replace
        from .spec import new_run_id

        self.spec = replace(self.spec, run_id=new_run_id())
        try:
            self._session = self._renew_session(self.spec)
        except SetupError:
            return False
        return self._session is not None and not getattr(self._session, "lost", True)

    def _cancelled(self) -> bool:
        import select

        return bool(select.select([self._cancel_r], [], [], 0)[0])

    def _in_process(self) -> R.RunOutcome:
        from ..engines import open_engine
        from .assemble import assemble_and_run

        spec, session = self.spec, self._session
        # A shared session's runs take turns (baton.py): one of them runs
        # Python at a time and hands over only while it waits.
        baton = getattr(session, "baton", None)
        with baton.held() if baton is not None else ExitStack():  # an empty stack: no context
            return assemble_and_run(
                spec,
                lambda: open_engine(spec, session, held=self._held),
                guard={"registry": self._register, "owner_kind": "library", **self._guard},  # visible to corralctl
                supervisor={
                    "cancel_fd": self._cancel_r,
                    "stdout": self._on_stdout,
                    "stderr": self._on_stderr,
                    "stdin_fd": self._stdin_fd,
                },
                opened=self._opened,
            )

    def _opened(self, engine) -> None:
        self._engine = engine

    def pids(self) -> list[int]:
        """The run's live processes right now (read-only; any thread)."""
        if self._child is not None:
            from ..kernel import procfs

            # The child supervisor is the run's subreaper: the run is its subtree.
            return [p.pid for p in procfs.descendants(procfs.scan(), self._child.pid) if p.alive]
        engine = self._engine
        return engine.live_pids() if engine is not None else []

    def _use_child(self) -> bool:
        """Runs without a manager go to a child process (the rest of the
        ladder: the delegated cgroup, which may move its corral into a leaf;
        the subreaper, which owns its process's descendants); --cgroup-parent
        and systemd runs stay here."""
        spec = self.spec
        if spec.cgroup_parent is not None or spec.cgroup_mode == "enforced" or spec.guarantee == "unit":
            return False
        return spec.cgroup_mode == "fallback" or self._session in (None, NO_SYSTEMD)

    def _in_child(self) -> R.RunOutcome:
        spec = self.spec
        fields = asdict(spec)
        fields["register"] = self._register
        # auto found no manager here: the child climbs the rest of the ladder
        fields["skip_manager"] = spec.cgroup_mode == "auto"
        # trio's pair: ``always_cleanup`` holds what is ours for the whole run
        # (closed however it ends), ``childs_ends`` what the child inherits,
        # closed here as soon as it has them (the pipes' EOF needs them gone).
        # Every descriptor is owned by exactly one of them, or by a file
        # object or the pump, from the moment it exists: none is closed twice.
        with ExitStack() as always_cleanup:
            with ExitStack() as childs_ends:
                taken: set[int] = set()  # read ends the pump owns now

                def pipe(flags: int) -> tuple[int, int]:
                    r, w = os.pipe2(flags)
                    always_cleanup.callback(_close_unless_taken, r, taken)
                    childs_ends.callback(os.close, w)
                    return r, w

                stdin = None
                if isinstance(spec.stdin, bytes):
                    stdin = os.memfd_create("corral-stdin", os.MFD_CLOEXEC)
                    childs_ends.callback(os.close, stdin)
                    os.write(stdin, spec.stdin)
                    os.lseek(stdin, 0, os.SEEK_SET)
                    fields["stdin"] = "inherit"
                elif spec.stdin in ("inherit", "pipe"):
                    stdin = self._stdin_fd
                    fields["stdin"] = "inherit"
                spec_r, spec_w = os.pipe2(0)
                childs_ends.callback(os.close, spec_r)
                spec_file = always_cleanup.enter_context(os.fdopen(spec_w, "w"))
                result_r, result_w = os.pipe2(0)
                childs_ends.callback(os.close, result_w)
                result_file = always_cleanup.enter_context(os.fdopen(result_r, "r"))
                out_r, out_w = pipe(os.O_CLOEXEC)
                err_r, err_w = pipe(os.O_CLOEXEC)
                pump = OutputPump({out_r: self._on_stdout, err_r: self._on_stderr}, None)
                taken.update((out_r, err_r))  # the pump's to close, from here on
                always_cleanup.callback(pump.close)
                # The child gets the read end of our cancel pipe: readable when we
                # cancel, and at EOF when this process dies (only we hold the
                # write end), so one descriptor covers both. Its own session:
                # signals for our process group (Ctrl-C, `timeout`) are for us.
                self._child = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "corral_systemd.core.fallback_child",
                        str(spec_r),
                        str(result_w),
                        str(self._cancel_r),
                    ],
                    stdin=stdin if stdin is not None else subprocess.DEVNULL,
                    stdout=out_w,
                    stderr=err_w,
                    pass_fds=(spec_r, result_w, self._cancel_r),
                    start_new_session=True,
                )
            with spec_file:
                spec_file.write(jsoncodec.dumps(fields))
            pump.drain(None)  # EOF once the run (and the child) are gone
            self._child.wait()
            data = jsoncodec.loads(result_file.read() or "{}")
        if "error" in data or "run_id" not in data:
            raise SetupError(data.get("error", "the fallback supervisor died without a result"))
        outcome = R.RunOutcome(**data)
        return outcome


def _close_unless_taken(fd: int, taken: set[int]) -> None:
    """Close ``fd`` unless its ownership moved (to the pump) since it was made."""
    if fd not in taken:
        os.close(fd)
