"""Supervised long-lived sessions: warm child processes that cannot leak.

    pool = SessionPool(max_sessions=8, idle_ttl=300)
    async with pool.session(("agent", conversation_id), ["agent-cli", "--serve"]) as s:
        await s.send(request)
        reply = await s.stdout.readline()
    ...
    await pool.shutdown()

A session is one command run under corral (its own unit in enforced mode)
with stdin and stdout as pipes, kept between requests and reused for the
same key. One request at a time per session.

Every exit path kills the session's whole process tree, verified:
- the request body raises (including a failed request while the child is
  alive, and cancellation): the session is stopped, not merely dropped;
- no request in flight for ``idle_ttl``: the idle timer stops it. The timer
  runs only between requests, never during one, however long;
- ``reset(key)``, ``shutdown()``;
- the supervising process dies: in enforced mode the manager stops the
  units (tether); in fallback each run's supervisor watches us.
A session whose process ended on its own is replaced on next use.

``max_sessions`` is a hard gate on live sessions: beyond it an idle
session (least recently used) is stopped to make room; if none is idle,
``session()`` waits up to ``acquire_timeout`` (``on_full="wait"``) or fails
at once (``on_full="fail"``) with PoolFull.
"""

import asyncio
import time
from collections.abc import Hashable, Sequence

from .api import RunHandle, Runner
from .common.errors import CorralError


class PoolFull(CorralError):
    """No session slot became free in time."""


class _Session:
    def __init__(self, key, handle: RunHandle, ctx):
        self.key = key
        self.handle = handle
        self._ctx = ctx  # the RunHandle's async context, entered
        self.lock = asyncio.Lock()
        self.started = time.monotonic()
        self.last_used = self.started
        self.in_flight = False
        self.idle_timer: asyncio.TimerHandle | None = None

    @property
    def alive(self) -> bool:
        return not self.handle.done


class SessionPool:
    def __init__(
        self,
        *,
        max_sessions: int = 8,
        idle_ttl: float = 300.0,
        acquire_timeout: float = 30.0,
        on_full: str = "wait",
        runner: Runner | None = None,
        **run_options,
    ):
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        if on_full not in ("wait", "fail"):
            raise ValueError("on_full must be 'wait' or 'fail'")
        self.max_sessions = max_sessions
        self.idle_ttl = idle_ttl
        self.acquire_timeout = acquire_timeout
        self.on_full = on_full
        self._runner = runner or Runner(**run_options)
        self._own_runner = runner is None
        self._sessions: dict[Hashable, _Session] = {}
        self._starting = 0  # slots reserved by sessions being started
        self._changed = asyncio.Condition()
        self._closed = False

    # -- the request path ----------------------------------------------
    def session(self, key: Hashable, argv: Sequence[str], **options) -> "_Request":
        """``async with pool.session(key, argv) as s:`` — ``s`` is the session's RunHandle."""
        return _Request(self, key, argv, options)

    async def _acquire(self, key, argv, options) -> _Session:
        while True:
            if self._closed:
                raise PoolFull("pool is shut down")
            sess = self._sessions.get(key)
            if sess is not None and not sess.alive:
                await self._stop(sess)  # ended on its own: reap it, then replace it
                continue
            if sess is None:
                sess = await self._start(key, argv, options)
            await sess.lock.acquire()
            if not sess.alive:  # died while we waited for the lock
                sess.lock.release()
                continue
            self._cancel_idle(sess)
            sess.in_flight = True
            return sess

    async def _start(self, key, argv, options) -> _Session:
        await self._reserve_slot()
        try:
            ctx = self._runner.start(argv, stdin="pipe", **options)
            handle = await ctx.__aenter__()
        except BaseException:
            self._starting -= 1
            await self._notify()
            raise
        self._starting -= 1
        sess = _Session(key, handle, ctx)
        self._sessions[key] = sess
        return sess

    async def _reserve_slot(self) -> None:
        deadline = time.monotonic() + self.acquire_timeout
        async with self._changed:
            while len(self._sessions) + self._starting >= self.max_sessions:
                victim = self._idle_lru()
                if victim is not None:
                    # Make room: stop an idle session (verified) outside the lock.
                    self._changed.release()
                    try:
                        await self._stop(victim)
                    finally:
                        await self._changed.acquire()
                    continue
                if self.on_full == "fail":
                    raise PoolFull(f"{self.max_sessions} sessions busy (on_full='fail')")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PoolFull(
                        f"no session slot free within {self.acquire_timeout:g}s ({self.max_sessions} sessions busy)"
                    )
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except TimeoutError:
                    pass
            self._starting += 1

    def _idle_lru(self) -> _Session | None:
        idle = [s for s in self._sessions.values() if not s.in_flight and not s.lock.locked()]
        return min(idle, key=lambda s: s.last_used) if idle else None

    async def _release(self, sess: _Session, failed: bool) -> None:
        sess.in_flight = False
        sess.last_used = time.monotonic()
        sess.lock.release()
        if failed or not sess.alive:
            # A failed request may have left the child in any state: kill it,
            # never just forget it.
            await self._stop(sess)
        else:
            self._arm_idle(sess)
            await self._notify()  # an idle session can be evicted for a waiter

    # -- idle reclaim --------------------------------------------------
    def _arm_idle(self, sess: _Session) -> None:
        loop = asyncio.get_running_loop()
        sess.idle_timer = loop.call_later(self.idle_ttl, lambda: loop.create_task(self._idle_expired(sess)))

    def _cancel_idle(self, sess: _Session) -> None:
        if sess.idle_timer is not None:
            sess.idle_timer.cancel()
            sess.idle_timer = None

    async def _idle_expired(self, sess: _Session) -> None:
        if not sess.in_flight and not sess.lock.locked() and self._sessions.get(sess.key) is sess:
            await self._stop(sess)

    # -- stopping ------------------------------------------------------
    async def _stop(self, sess: _Session) -> None:
        """Stop a session's run (verified) and free its slot."""
        self._cancel_idle(sess)
        if self._sessions.get(sess.key) is sess:
            del self._sessions[sess.key]
        try:
            await sess._ctx.__aexit__(None, None, None)  # stops the run if still going, verified
        finally:
            await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def reset(self, key: Hashable) -> None:
        """Stop the session for ``key`` (verified), if there is one."""
        sess = self._sessions.get(key)
        if sess is not None:
            await self._stop(sess)

    async def shutdown(self) -> None:
        """Stop every session (verified) and close the pool."""
        self._closed = True
        await asyncio.gather(*(self._stop(s) for s in list(self._sessions.values())), return_exceptions=True)
        if self._own_runner:
            await asyncio.to_thread(self._runner.close)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.shutdown()

    # -- triage ----------------------------------------------------------
    def stats(self) -> dict:
        """Sessions, their keys, ages, idle times and memory (resident, all processes)."""
        now = time.monotonic()
        sessions = []
        for sess in self._sessions.values():
            sessions.append(
                {
                    "key": sess.key,
                    "run_id": sess.handle._spec.run_id,
                    "age": now - sess.started,
                    "idle": 0.0 if sess.in_flight else now - sess.last_used,
                    "in_flight": sess.in_flight,
                    "alive": sess.alive,
                    "memory": _memory(sess),
                }
            )
        return {"sessions": sessions, "count": len(sessions), "max_sessions": self.max_sessions}


def _memory(sess: _Session) -> int:
    """Resident bytes of the session's processes."""
    from .kernel import procfs

    return sum(procfs.resident_bytes(pid) for pid in sess.handle.pids())


class _Request:
    def __init__(self, pool: SessionPool, key, argv, options):
        self._pool = pool
        self._key = key
        self._argv = argv
        self._options = options
        self._sess: _Session | None = None

    async def __aenter__(self) -> RunHandle:
        self._sess = await self._pool._acquire(self._key, self._argv, self._options)
        return self._sess.handle

    async def __aexit__(self, exc_type, exc, tb):
        # A cancelled request must still kill its child, and before the
        # cancellation propagates: finish the release through cancellation.
        await _complete(self._pool._release(self._sess, failed=exc_type is not None))


async def _complete(coro) -> None:
    """Await ``coro`` to the end even if we are cancelled meanwhile; then re-raise."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    while True:
        try:
            await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                break
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
