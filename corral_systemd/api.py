"""corral as a Python library: the CLI's runs, sync or async, over one core.

    import corral_systemd as corral

    result = corral.run(["pytest", "-q"], wall=600, mem="4G")
    result = await corral.arun(["make"], wall="5m")
    async with corral.start(["tail", "-f", "app.log"], wall=10) as run:
        async for chunk in run.stdout:
            ...
        result = await run.wait()
    with corral.Runner(mode="enforced") as runner:   # one manager connection and tether
        runner.run(["true"])

Guarantees are the CLI's: when a call returns or raises, every process the
command started is gone, proven — or ``Unverified`` is raised.

- Cancellation: if the awaiting task is cancelled, or the ``async with``
  body raises, the run is stopped and verified *before* the exception
  propagates (the stop itself is shielded from the cancellation).
- Errors are exceptions carrying the result: ``NotFound`` (127),
  ``CannotExecute`` (126), ``Unverified`` (120), ``SetupError`` /
  ``UsageError`` (125, before anything started). Limits being hit are
  results (``result.outcome`` is ``"timeout"``, ``"memory"``, ``"output"``).
- Threads: each run's supervisor loop runs in a worker thread (it is
  synchronous, the same code the CLI runs); a ``Runner`` is safe to share
  between threads and tasks. The systemd runs of one Runner take turns
  running Python and hand over only while they wait (``baton.py``): a run
  waiting for its command never holds up the others.
- Fallback runs (no systemd) execute in a child process of their own
  (``core/fallback_child.py``), because the fallback engine needs its process to own
  all of its descendants; where a run executes is ``execution.py``'s.

It is the whole public surface of the library (``make_spec``'s keywords,
``Runner``, ``RunHandle`` and its streams, the module-level
``run``/``arun``/``start``), each face thin over ``Execution``; a Runner's
shared manager session is ``core/manager_session.py``'s, as the corral service's.
"""

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable, Sequence

from .common.errors import CannotExecute, NotFound, SetupError, Unverified
from .core import result as R
from .core.execution import Execution
from .core.manager_session import NOT_READY, SharedSession
from .core.record import RunRecord, from_result
from .core.request import spec_from_keywords as make_spec
from .core.spec import RunSpec

__all__ = ["RunHandle", "RunResult", "Runner", "arun", "make_spec", "run", "start"]


class RunResult(RunRecord):
    """The CLI's ``--json`` record plus the captured output.

    Resource use is typed on ``engine`` (``cpu_usage_nsec``, ``memory_peak``,
    ``tasks_peak``, ``pids_limit_hits``, ``accounting_source``...); the
    properties below give the common ones in plain units (None: not known).
    """

    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def cpu_time(self) -> float | None:
        """CPU seconds of the whole run (user and system, every process)."""
        ns = self.engine.cpu_usage_nsec
        return None if ns is None else ns / 1e9

    @property
    def memory_peak(self) -> int | None:
        """Peak memory in bytes (the cgroup's; a fallback run's sampled RSS sum with ``mem=``)."""
        return self.engine.memory_peak


def _to_result(outcome: R.RunOutcome, stdout: bytes, stderr: bytes) -> RunResult:
    result = from_result(outcome, RunResult, stdout=stdout, stderr=stderr)
    if outcome.reason == R.SPAWN_FAILED:
        raise (NotFound if outcome.exit_code == 127 else CannotExecute)(outcome.detail, result)
    if outcome.exit_code == 120:
        if outcome.reason == R.INTERNAL_ERROR and not outcome.remaining_pids and outcome.verified:
            # Stopped and proven empty, but how the command ended is unknown
            # (e.g. the manager died under a service): still not a result.
            raise Unverified(
                f"the run was stopped and proven empty, but its outcome is unknown: {outcome.detail}", result
            )
        raise Unverified(f"could not prove every process stopped; remaining: {outcome.remaining_pids}", result)
    if outcome.reason == R.SETUP_FAILED:
        raise SetupError(outcome.detail)
    return result


class Runner:
    """Runs commands under corral, sharing what can be shared.

    In enforced (or auto, with a reachable manager) mode, one tether and a
    pool of bus connections serve every run: a run costs one
    StartTransientUnit and no extra process (``core/manager_session.py``, shared
    with the corral service). Defaults given here apply to
    every run unless overridden per call. Close it (or use ``with``) to end
    the tether; units still running then are stopped by the manager.
    """

    def __init__(self, **defaults):
        self._defaults = defaults
        self._shared = SharedSession()

    def close(self) -> None:
        self._shared.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await asyncio.to_thread(self.close)

    # -- runs ----------------------------------------------------------
    def _spec(self, argv, kwargs) -> tuple[RunSpec, bool, bool]:
        merged = {**self._defaults, **kwargs}
        capture = merged.pop("capture", True)
        register = merged.pop("register", True)
        return make_spec(argv, **merged), capture, register

    def _execution(self, spec, capture, register, out: list, err: list) -> Execution:
        if capture:
            return self._shared.execution(spec, out.append, err.append, register=register)
        return self._shared.execution(spec, _writer(1), _writer(2), register=register)

    def run(self, argv: Sequence[str], **kwargs) -> RunResult:
        """Run to completion in this thread. See ``make_spec`` for the options;
        ``capture=False`` passes output to this process's stdout/stderr."""
        spec, capture, register = self._spec(argv, kwargs)
        out: list[bytes] = []
        err: list[bytes] = []
        outcome = self._execution(spec, capture, register, out, err).execute()
        return _to_result(outcome, b"".join(out), b"".join(err))

    async def arun(self, argv: Sequence[str], **kwargs) -> RunResult:
        """``run`` for asyncio. Cancelling the task stops the run (verified) first."""
        async with self.start(argv, **kwargs) as handle:
            return await handle.wait()

    def start(self, argv: Sequence[str], **kwargs) -> "RunHandle":
        """A run with streamed output: ``async with runner.start(...) as run``."""
        spec, capture, register = self._spec(argv, kwargs)
        return RunHandle(self, spec, capture, register)


class RunHandle:
    """A started run: ``stdout``/``stderr`` async iterators, ``wait()``, ``stop()``.

    Streamed chunks are also kept for the final result. Leaving the
    ``async with`` block stops the run if it is still going (verified) —
    on an exception or cancellation before the exception propagates.
    """

    def __init__(self, runner: Runner, spec: RunSpec, capture: bool, register: bool = True):
        self._runner = runner
        self._spec = spec
        self._capture = capture
        self._register = register
        self.stdout = _Stream()
        self.stderr = _Stream()
        self._future: asyncio.Future | None = None
        self._execution: Execution | None = None
        self._result: RunResult | None = None
        self._stdin_w: int | None = None

    def pids(self) -> list[int]:
        """The run's live processes right now."""
        return self._execution.pids() if self._execution is not None else []

    @property
    def done(self) -> bool:
        """True once the run has ended (its processes are gone, verified or not)."""
        return self._future is not None and self._future.done()

    async def send(self, data: bytes | bytearray | memoryview | str) -> None:
        """Write to the command's stdin (``stdin="pipe"``): bytes, or a str (sent UTF-8 encoded).

        BrokenPipeError if the command is gone; TypeError for anything else.
        """
        if self._stdin_w is None:
            raise ValueError("start the run with stdin='pipe' to send to it")
        if isinstance(data, str):
            data = data.encode("utf-8")
        elif not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"send() takes bytes or str, not {type(data).__name__}")
        fd = self._stdin_w
        os.set_blocking(fd, False)
        loop = asyncio.get_running_loop()
        view = memoryview(data).cast("B")
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_writer(fd, ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_writer(fd)

    def close_stdin(self) -> None:
        if self._stdin_w is not None:
            os.close(self._stdin_w)
            self._stdin_w = None

    async def __aenter__(self) -> "RunHandle":
        loop = asyncio.get_running_loop()
        self.stdout._loop = self.stderr._loop = loop
        on_out: Callable[[bytes], None]
        on_err: Callable[[bytes], None]
        if self._capture:
            on_out, on_err = self.stdout._feed_threadsafe, self.stderr._feed_threadsafe
        else:
            on_out, on_err = _writer(1), _writer(2)
        shared = self._runner._shared
        session = shared.get_if_ready(self._spec)
        if session is NOT_READY:  # first systemd run of this Runner: connecting blocks
            session = await asyncio.to_thread(shared.get, self._spec)
        stdin_r = 0
        if self._spec.stdin == "pipe":
            stdin_r, self._stdin_w = os.pipe2(os.O_CLOEXEC)
        self._execution = shared.execution(
            self._spec, on_out, on_err, session=session, stdin_fd=stdin_r, register=self._register
        )

        def work():
            try:
                return self._execution.execute()
            finally:
                if stdin_r:
                    os.close(stdin_r)
                loop.call_soon_threadsafe(self.stdout._close)
                loop.call_soon_threadsafe(self.stderr._close)

        self._future = _in_thread(loop, work, name=f"corral-run-{self._spec.run_id}")
        return self

    async def __aexit__(self, exc_type, exc, tb):
        if not self._future.done():
            self._execution.cancel()
        try:
            await self._settle()
        finally:
            self.close_stdin()

    async def _settle(self) -> R.RunOutcome:
        """Wait for the worker thread, even through cancellation of the caller."""
        cancelled = False
        assert self._future is not None and self._execution is not None, "the run was never started"
        while True:
            try:
                outcome = await asyncio.shield(self._future)
                break
            except asyncio.CancelledError:
                if self._future.done() and self._future.cancelled():
                    raise
                cancelled = True
                self._execution.cancel()  # stop, then keep waiting for the verified end
        if cancelled:
            raise asyncio.CancelledError
        return outcome

    async def wait(self) -> RunResult:
        """The result once the run has ended (raises RunError subclasses as ``run``)."""
        if self._result is None:
            outcome = await self._settle()
            self._result = _to_result(outcome, self.stdout.collected(), self.stderr.collected())
        return self._result

    async def stop(self) -> RunResult:
        """Stop the run now (SIGTERM, grace, SIGKILL, verified) and return the result."""
        if self._execution is None:
            raise RuntimeError("stop() before the run was started (use it inside `async with`)")
        self._execution.cancel()
        return await self.wait()


class _Stream:
    """Chunks of one output stream, as an async iterator; also kept whole."""

    def __init__(self):
        self._loop = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._chunks: list[bytes] = []
        self._pending = b""  # read by readline, not yet returned

    def _feed_threadsafe(self, chunk: bytes) -> None:
        self._loop.call_soon_threadsafe(self._feed, chunk)

    def _feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._queue.put_nowait(chunk)

    def _close(self) -> None:
        self._queue.put_nowait(None)

    def collected(self) -> bytes:
        return b"".join(self._chunks)

    async def readline(self) -> bytes:
        """The next line (with its newline); what is left, or b"", at the end."""
        while b"\n" not in self._pending:
            chunk = await self._queue.get()
            if chunk is None:
                self._queue.put_nowait(None)
                line, self._pending = self._pending, b""
                return line
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line + b"\n"

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate()

    async def _iterate(self):
        while True:
            chunk = await self._queue.get()
            if chunk is None:
                self._queue.put_nowait(None)  # later iterators end too
                return
            yield chunk


def _in_thread(loop, fn, *, name: str) -> asyncio.Future:
    """Run ``fn`` in a thread of its own; its result as an asyncio future.

    Not the loop's default executor: a run can last for hours (a session),
    and a few of them would exhaust a shared pool for everyone else.
    """
    future = loop.create_future()

    def deliver(setter, value):
        if not future.done():
            setter(value)

    def target():
        try:
            value = fn()
        except BaseException as exc:  # delivered to the awaiting task
            loop.call_soon_threadsafe(deliver, future.set_exception, exc)
        else:
            loop.call_soon_threadsafe(deliver, future.set_result, value)

    threading.Thread(target=target, name=name, daemon=True).start()
    return future


def _writer(fd: int) -> Callable[[bytes], None]:
    from .common import baton
    from .core.output import write_all

    def write(data: bytes) -> None:
        with baton.released():  # our stdout's reader may be slow: not the other runs' problem
            write_all(fd, data)

    return write


# -- module-level faces: a run without a shared Runner ------------------


def run(argv: Sequence[str], **kwargs) -> RunResult:
    """Run ``argv`` under corral and return its RunResult (see ``make_spec``)."""
    with Runner() as runner:
        return runner.run(argv, **kwargs)


async def arun(argv: Sequence[str], **kwargs) -> RunResult:
    """``run`` for asyncio; cancelling the task stops the run (verified) first."""
    async with Runner() as runner:
        return await runner.arun(argv, **kwargs)


class start:
    """``async with corral_systemd.start(argv, ...) as run:`` — a RunHandle."""

    def __init__(self, argv: Sequence[str], **kwargs):
        self._runner = Runner()
        self._handle = self._runner.start(argv, **kwargs)

    async def __aenter__(self) -> RunHandle:
        return await self._handle.__aenter__()

    async def __aexit__(self, *exc):
        try:
            await self._handle.__aexit__(*exc)
        finally:
            await asyncio.to_thread(self._runner.close)
