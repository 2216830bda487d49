"""The MCP server's runs: every one a run of the server's own corral session.

Two kinds, both corral's own processes (the server never forks a command itself):

- ``ExecRun`` (the ``exec`` tool): ``corral --session SID --quiet --json FILE
  --stdin inherit -- SHELL -c CMD``, a child of the server with a stdin pipe
  the server keeps (``write_stdin``) and one pipe for stdout and stderr
  together (corral's own warnings land there too; ``--quiet``: no summary
  line). Its output goes into an ``OutputBuffer`` as it comes, so a run
  that outlives its call goes on printing and nothing it printed is lost
  while it is within the buffer. Its end is corral's record (``--json``):
  exit code, outcome, and the proof.
- ``StartedRun`` (the ``start`` tool): ``corral --background`` in the session
  (``corral_systemd.Session.start``): its session's holder forks its corral,
  it is ready (port, file or log line) when the call returns, its output is
  its log on disk (``--log-max``), its end the registry's word (``corralctl wait``).

The session ends every one of them, proven, whenever the server ends: its
end (stdin EOF), its exit, or its death by SIGKILL (the session's holder
watches the server as its owner through a pidfd; each run's corral does too).

Failure modes: ``BadArguments`` (one line: the caller's mistake, nothing
started); ``RunFailed`` (one line: the run could not start or be ready).
"""

import asyncio
import json
import os
import shutil
import signal
import time

from .output import OutputBuffer, complete_utf8

#: How long the output pipe may stay open after corral exited (corral proved
#: the run empty, so only an escaped hand-off could hold it).
_EOF_AFTER_EXIT = 5.0
#: How long ``stop`` waits for an exec run's corral past its grace and verify timeout.
_STOP_SLACK = 10.0


class BadArguments(Exception):
    """The caller's mistake, in one line: nothing was started or changed."""


class RunFailed(Exception):
    """A run could not start, or could not be made ready, in one line."""


def shell() -> list[str]:
    """The shell a command string runs in: ``bash -c`` (no profile read), ``sh -c`` where bash is missing."""
    return ["bash", "-c"] if shutil.which("bash") else ["sh", "-c"]


def proof_of(record: dict) -> dict:
    """What the run's end proves, from its record or registry entry: whether
    every process of it was proven gone, by what (the guarantee tier, the
    proof's own words), and what was left if not."""
    keys = ("verified", "guarantee", "mode", "proof", "processes_seen", "processes_stopped", "remaining_pids")
    return {key: record[key] for key in keys if key in record}


def reason_of(record: dict) -> str:
    outcome = record.get("outcome") or "unknown"
    detail = record.get("detail")
    return f"{outcome}: {detail}" if detail else outcome


class ExecRun:
    """An ``exec`` run: a corral child of the server with its pipes."""

    kind = "exec"

    def __init__(
        self, run_id: str, cmd: str, process: asyncio.subprocess.Process, record_path: str, exited: asyncio.Event
    ):
        self.id = run_id
        self._exited = exited  # set when its corral has exited (``_ExitAware``)
        self.cmd = cmd
        self.process = process
        self.record_path = record_path
        self.output = OutputBuffer()
        #: Where the last answer that handed out output ended (the default cursor).
        self.handed = 0
        self.started = time.time()
        self._grew = asyncio.Event()
        self._eof = asyncio.Event()
        self._record: dict | None = None
        self._pump = asyncio.ensure_future(self._read_output())

    async def _read_output(self) -> None:
        assert self.process.stdout is not None
        while chunk := await self.process.stdout.read(65536):
            self.output.append(chunk)
            self._grew.set()
        self._eof.set()
        self._grew.set()

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    async def ended(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the run's corral to exit, then for
        its output to end (bounded). True when it is over."""
        # Not process.wait(): it also waits for the pipes' EOF, which a process the run
        # handed off (outside corral's proof) could hold open long after corral exited.
        try:
            if not self._exited.is_set():  # (wait_for with 0 times out before a set event's wait runs)
                await asyncio.wait_for(self._exited.wait(), timeout)
        except TimeoutError:
            return False
        try:
            await asyncio.wait_for(self._eof.wait(), _EOF_AFTER_EXIT)
        except TimeoutError:
            pass
        return True

    async def write(self, data: bytes, eof: bool, timeout: float) -> None:
        """Type ``data`` into the run's stdin (then close it, with ``eof``); a
        command that does not read within ``timeout`` is a RunFailed."""
        stdin = self.process.stdin
        if stdin is None or stdin.is_closing():
            raise BadArguments(f"{self.id}: its stdin is closed")
        try:
            if data:
                stdin.write(data)
                await asyncio.wait_for(stdin.drain(), timeout)
            if eof:
                stdin.close()
        except TimeoutError:
            raise RunFailed(f"{self.id}: the command did not read its stdin within the yield time") from None
        except (BrokenPipeError, ConnectionResetError):
            raise RunFailed(f"{self.id}: the command closed its stdin") from None

    def record(self) -> dict | None:
        """corral's record of the run, once its corral has exited (None if it wrote none)."""
        if self._record is None and not self.running:
            try:
                with open(self.record_path) as f:
                    self._record = json.load(f)
            except (OSError, ValueError):
                return None
        return self._record

    def stop_timeout(self) -> float:
        return 2.0 + 2.0 + _STOP_SLACK  # corral's default grace and verify timeout, then slack

    def stop(self) -> None:
        """SIGTERM to the run's corral (the server's own child, not yet reaped):
        corral runs its stop sequence and proves the run gone."""
        if self.running:
            self.process.send_signal(signal.SIGTERM)

    def end_facts(self) -> dict:
        """The run's end: exit code, reason, proof (corral's record); or, if
        corral wrote none (it was killed), its wait status alone."""
        record = self.record()
        code = self.process.returncode
        assert code is not None
        if record is None:
            code = 128 - code if code < 0 else code
            return {"exit_code": code, "reason": "corral wrote no record (killed?)", "proof": None}
        return {
            "exit_code": record.get("exit_code"),
            "reason": reason_of(record),
            "proof": proof_of(record),
            "corral_run_id": record.get("run_id"),
            "wall_time": record.get("wall_time"),
        }

    def take(self, cursor: int | None, limit: int, *, window: bool) -> dict:
        """Output from ``cursor`` (default: where the last answer ended): all of
        it cut to head and tail (``window``), or the first ``limit`` bytes (a page)."""
        start = self.handed if cursor is None else cursor
        if window:
            piece = self.output.window(start, limit)
        else:
            piece = self.output.read(start, start + limit)
        data = piece.data
        if self.running or piece.cursor < self.output.end:  # a character cut by a read waits for the next
            keep = complete_utf8(data) if not piece.omitted else len(data)
            piece.cursor -= len(data) - keep
            data = data[:keep]
        self.handed = max(self.handed, piece.cursor)
        facts: dict = {"output": data.decode("utf-8", "replace"), "cursor": piece.cursor}
        if piece.start != start or piece.lost:
            facts["output_lost_bytes"] = piece.lost
        if piece.omitted:
            facts["output_cut_bytes"] = piece.omitted
            facts["output_from"] = piece.start
        if piece.cursor < self.output.end:
            facts["more"] = True
        return facts

    async def output_grew(self, timeout: float) -> None:
        self._grew.clear()
        try:
            await asyncio.wait_for(self._grew.wait(), timeout)
        except TimeoutError:
            pass


class StartedRun:
    """A ``start`` run: a background run of the session (``Session.start``'s handle)."""

    kind = "start"

    def __init__(self, run_id: str, cmd: str, handle, ready: dict | None):
        self.id = run_id
        self.cmd = cmd
        self.handle = handle
        self.ready = ready
        self.handed = 0
        self.started = time.time()
        self.exit_code: int | None = None

    @property
    def corral_run_id(self) -> str:
        return self.handle.id

    def entry(self) -> dict | None:
        from ..state import registry as REG

        return REG.read_entry(REG.state_dir(), self.corral_run_id)

    @property
    def running(self) -> bool:
        if self.exit_code is not None:
            return False
        entry = self.entry()
        return entry is None or entry.get("state") != "finished"

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the run's end (``corralctl wait``); True when over."""
        try:
            self.exit_code = await self.handle.await_exit(max(timeout, 0.001))
        except TimeoutError:
            return False
        return True

    def end_facts(self) -> dict:
        entry = self.entry() or {}
        return {
            "exit_code": self.exit_code if self.exit_code is not None else entry.get("exit_code"),
            "reason": reason_of(entry),
            "proof": proof_of(entry),
            "corral_run_id": self.corral_run_id,
        }

    def take(self, cursor: int | None, limit: int) -> dict:
        """A page of its log from ``cursor`` (a byte offset in the log file)."""
        start = self.handed if cursor is None else cursor
        try:
            with open(self.handle.log, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(min(start, size))
                data = f.read(limit)
        except OSError as exc:
            raise RunFailed(f"{self.id}: cannot read its log: {exc.strerror}") from None
        facts: dict = {}
        if start > size:  # corral cut the log back past --log-max: read on from its end
            facts["log_cut"] = True
            start = size
        keep = complete_utf8(data) if self.running or start + len(data) < size else len(data)
        cursor = start + keep
        self.handed = max(self.handed, cursor)
        facts.update(output=data[:keep].decode("utf-8", "replace"), cursor=cursor)
        if cursor < size:
            facts["more"] = True
        return facts


def corral_argv(session_id: str, record_path: str, cmd: str, options: list[str], tty: bool) -> list[str]:
    """The command line of an exec run's corral."""
    from ..session import _CORRAL

    stdin = ["--pty"] if tty else ["--stdin", "inherit"]
    return [*_CORRAL, "--session", session_id, "--quiet", "--json", record_path, *stdin, *options, "--", *shell(), cmd]


async def spawn_exec(run_id: str, session_id: str, record_path: str, cmd: str, options: list[str], tty: bool, cwd):
    argv = corral_argv(session_id, record_path, cmd, options, tty)
    loop = asyncio.get_running_loop()
    exited = asyncio.Event()
    try:
        # asyncio.create_subprocess_exec, with a protocol that says when corral exited.
        transport, protocol = await loop.subprocess_exec(
            lambda: _ExitAware(exited, limit=2**16, loop=loop),
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=cwd,
        )
    except OSError as exc:
        raise RunFailed(f"corral could not be started: {exc}") from None
    return ExecRun(run_id, cmd, asyncio.subprocess.Process(transport, protocol, loop), record_path, exited)


class _ExitAware(asyncio.subprocess.SubprocessStreamProtocol):
    """The process's protocol, which also sets ``exited`` once it has exited (reaped
    by the loop's child watcher): a waiting call is woken by the exit, no tick."""

    def __init__(self, exited: asyncio.Event, **kwargs):
        super().__init__(**kwargs)
        self._exited_event = exited

    def process_exited(self) -> None:
        super().process_exited()
        self._exited_event.set()
