"""The MCP server's runs: every one a background run of the server's own corral session.

The server never forks a command, nor keeps a run's pipes: both tools start
runs through the library, on the mechanism the CLI uses, so a run is the
same run as on the command line.

- ``exec``: ``corral --yield``'s run (docs/exec.md) with this server as its front
  (``mcp.front``: its arguments read by corral's own parser, ``background.launch``
  in this process, no corral process start): a background run of the session
  from its start, its stdin kept by its own corral (a pipe, or its terminal's
  input with ``tty``), its output its log; ended within the yield, its record;
  else handed back, still running, nothing moved. (``Session.aexec``, a
  ``corral --yield`` process, where the holder cannot start it with this
  server's context.)
- ``start``: ``Session.astart`` (``corral --background``), ready (port, file
  or log line) when the call returns; stdin /dev/null.

Either way the run's corral is the session's holder's child, its output the log
``mcp.output`` reads with cursors, ``write_stdin`` is ``corralctl send``'s sender
(``core.stdin_keeper.send``), ``stop`` is ``corralctl stop``, and a wait is woken
by its corral's exit (a pidfd in the event loop: no thread, no tick). Its end
is its record (an exec run's ``--json`` file: the proof) or its registry entry
(a start run's: what that keeps of the proof).

The session ends every one of them, proven, whenever the server ends: its
end (stdin EOF), its exit, or its death by SIGKILL (the session's holder
watches the server as its owner through a pidfd; each run's corral does too).

Failure modes: ``BadArguments`` (one line: the caller's mistake, nothing
started); ``RunFailed`` (one line: the run could not start or be ready).
"""

import asyncio
import json
import os
import time

from ..session import shell  # noqa: F401  (the tools' shell, as the library runs a string)
from .output import read_log


class BadArguments(Exception):
    """The caller's mistake, in one line: nothing was started or changed."""


class RunFailed(Exception):
    """A run could not start, or could not be made ready, in one line."""


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


async def _readable(fd: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``fd`` to turn readable, in the event loop
    (no thread, no tick); True if it did."""
    loop = asyncio.get_running_loop()
    woke = loop.create_future()

    def readable() -> None:
        if not woke.done():
            woke.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await asyncio.wait_for(woke, max(timeout, 0.001))
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
    return True


class SessionRun:
    """One run of the server's session (``kind`` "exec" or "start").

    ``handle`` is the library's ``BackgroundRun`` (a ``HandedBack`` for an exec run
    that outlived its yield); None for an exec run that ended within it, or that
    corral refused (``refused``: its one line, exit 125, nothing ran). ``corral``:
    the run's corral as ``core.background.launch`` kept it (this server its front,
    ``mcp.front``): its end is the holder's word once it has reaped it, so its
    record is there when it says so (the token holder's pidfd answered some quick
    runs before their record was written: "corral wrote no record")."""

    def __init__(
        self,
        run_id: str,
        kind: str,
        cmd: str,
        corral_run_id: str | None,
        *,
        handle=None,
        record_path: str | None = None,
        ready: dict | None = None,
        refused: str | None = None,
        corral=None,
    ):
        self.id = run_id
        self.kind = kind
        self.cmd = cmd
        self.corral_run_id = corral_run_id
        self.handle = handle
        self.record_path = record_path
        self.ready = ready
        self.refused = refused
        self.corral = corral
        #: Where the last answer that handed out output ended (the default cursor).
        self.handed = 0
        self.started = time.time()
        self._record: dict | None = None

    # -- its end ------------------------------------------------------------------------
    def record(self) -> dict | None:
        """An exec run's record, once its corral wrote it at the run's end (None before)."""
        if self._record is None and self.record_path is not None:
            try:
                with open(self.record_path) as f:
                    record = json.load(f)
            except (OSError, ValueError):
                return None
            if not record.get("running"):  # not the hand-back facts: the run's own record
                self._record = record
        return self._record

    def _corral(self) -> int | None:
        """The run's live corral (the kernel's word: its owner token's holder), or None."""
        from ..core.stdin_keeper import corral_of

        return None if self.corral_run_id is None else corral_of(self.corral_run_id)

    @property
    def running(self) -> bool:
        if self.corral is not None:
            return self.corral.ended() is None
        if self.handle is None or self.record() is not None:
            return False
        return self._corral() is not None

    async def ended(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the run's corral to exit (the kept
        corral's word, else its pidfd, read in the event loop); True when the run is over."""
        loop = asyncio.get_running_loop()
        if self.corral is not None:
            deadline = loop.time() + timeout
            if await self._kept_corral_ended(timeout):
                return True
            if self.corral is not None:  # the yield is over
                return False
            timeout = deadline - loop.time()  # the holder went quiet: its pidfd, for what is left
        pid = self._corral() if self.running else None
        if pid is None:
            return True
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return True
        try:
            if self._corral() != pid:  # the pid was reused before the pidfd pinned it: that corral is gone
                return True
            return await _readable(pidfd, timeout)
        finally:
            os.close(pidfd)

    async def _kept_corral_ended(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the holder's word on the kept corral's end (its
        channel, read in the event loop); True once given (the corral let go). A wake
        without it (the holder gone, its channel at its end): the corral is let go,
        False, and the caller waits on the pidfd instead (no spin on that channel)."""
        corral = self.corral
        if corral.ended() is None and not await _readable(corral.wait_fd(), timeout):
            return False
        code = corral.ended()  # None: the holder went quiet
        corral.close()
        self.corral = None
        return code is not None

    def end_facts(self) -> dict:
        """The run's end: exit code, reason, proof (its record; a start run's, or an exec
        run whose corral wrote none -- it was killed --, its registry entry)."""
        if self.refused is not None:
            return {"exit_code": 125, "reason": self.refused, "proof": None}
        record = self.record()
        if record is not None:
            return {
                "exit_code": record.get("exit_code"),
                "reason": reason_of(record),
                "proof": proof_of(record),
                "corral_run_id": record.get("run_id"),
                "wall_time": record.get("wall_time"),
            }
        from ..state import registry as REG

        entry = REG.read_entry(REG.state_dir(), self.corral_run_id) if self.corral_run_id else None
        entry = entry or {}
        facts = {"exit_code": entry.get("exit_code"), "reason": reason_of(entry), "proof": proof_of(entry) or None}
        if self.kind == "exec":
            facts["reason"] = "corral wrote no record (killed?)"
        return {**facts, "corral_run_id": self.corral_run_id}

    # -- its output and stdin ----------------------------------------------------------
    def take(self, cursor: int | None, limit: int, *, window: bool) -> dict:
        """Its log from ``cursor`` (default: where the last answer ended): all of it
        cut to head and tail (``window``), or a page of at most ``limit`` bytes."""
        if self.corral_run_id is None:  # refused: nothing ran, nothing printed
            return {"output": "", "cursor": 0}
        from ..state import registry as REG

        start = self.handed if cursor is None else cursor
        try:
            path = REG.output_path(REG.state_dir(), self.corral_run_id)
            facts = read_log(path, start, limit, window=window, running=self.running)
        except OSError as exc:
            raise RunFailed(f"{self.id}: cannot read its log: {exc.strerror or exc}") from None
        self.handed = max(self.handed, facts["cursor"])
        return facts

    async def write(self, data: bytes, eof: bool, timeout: float) -> None:
        """Type ``data`` into its kept stdin (``HandedBack.write_stdin``: ``corralctl send``'s
        sender), then close it with ``eof``; BadArguments when it keeps none (any more),
        RunFailed when the command did not read it within ``timeout``."""
        from ..common.errors import UsageError

        try:
            await self.handle.awrite_stdin(data, eof=eof, timeout=timeout)
        except UsageError as exc:
            raise BadArguments(f"{self.id}: {' '.join(str(exc).split())}") from None
        except TimeoutError:
            raise RunFailed(f"{self.id}: the command did not read its stdin within the yield time") from None

    async def stop(self) -> None:
        """``corralctl stop``: its corral's stop sequence, every process proven gone; RunFailed if not."""
        from ..common.errors import Unverified

        if not self.running:
            return
        try:
            await self.handle.astop()
        except Unverified as exc:
            if self.running:
                raise RunFailed(f"{self.id}: stop: {' '.join(str(exc).split())}") from None
        await self.ended(30.0)  # the stop is proven: its corral writes its record and exits
