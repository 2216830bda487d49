"""Taking turns: the runs of one library Runner execute Python one at a time.

Why. A Runner drives each run's supervisor loop (the CLI's synchronous
code) in a thread of its own. CPython releases the GIL around every system
call; with 8 runs in flight, each release lets another runnable supervisor
thread take the GIL, and the caller must queue to get it back: a futex
wake and wait per system call, about 800 futex calls per run, measured
(strace, 8 scope runs in flight; about 150 with the baton). That hand-off,
not Python itself, is what a contended machine makes expensive.

A ``Baton`` makes a Runner's supervisor threads take turns at the level of
their *waits*: a thread holds the baton while it works and gives it up only
while it blocks waiting for an event (``poll``, ``wait_event``) or in a
call that may block for long (``released``). Threads that hold no baton
(the D-Bus reader, the caller's event loop, the CLI, a fallback run) are
not affected: these functions then just wait.

Guarantees and failure modes:
- Fair: the baton passes to waiting threads in the order they asked for
  it (a direct hand-off, not a free-for-all in which the releasing thread
  usually wins again).
- A turn is bounded: a run that always has something ready (a command
  writing output without pause) keeps the baton at most ``TURN`` seconds
  while others wait, then queues behind them, so it cannot hold up the
  other runs' deadlines, stops and starts.
- No deadlock as long as no thread waits for another baton holder without
  going through this module. Runs are independent; they share only the
  manager connection, whose send lock is never held across a baton wait
  (``Connection.send`` waits for buffer space without giving the baton up).
- A blocking call that is not routed through here (a slow fsync on a
  disk-backed state directory) delays the Runner's other runs for its
  length. Every wait a run makes for an outside event goes through here,
  and so does passing output on to the host's own stdout/stderr.
- Interrupts: a KeyboardInterrupt (``Runner.run`` in the main thread) that
  arrives while a thread waits to get the baton back is held until the
  baton is back, then raised, so ownership is neither lost nor doubled.
  (Python can still raise it between two bytecodes of the hand-off
  itself, a window of a few instructions, not guarded.)
"""

# Neither threading, collections nor contextlib: the CLI imports this module too (start-up).
from _collections import deque
from _thread import _local as _ThreadLocal
from _thread import allocate_lock
from time import monotonic

#: The longest a thread keeps the baton, while others wait, when it never has to wait itself.
TURN = 0.005

_local = _ThreadLocal()  # .baton: the baton this thread holds, if any


class Baton:
    """One per Runner session: its supervisor threads run one at a time, in turn."""

    def __init__(self):
        self._mutex = allocate_lock()  # guards the two fields below; held only briefly
        self._held = False
        self._waiters: deque = deque()  # one locked lock per waiting thread, oldest first
        self._since = 0.0  # when the holder got the baton

    def _take(self) -> BaseException | None:
        """Get the baton (queueing behind earlier waiters). Never gives up
        half-way: an exception raised while blocked (KeyboardInterrupt, in
        the main thread) is returned, to be raised by the caller once the
        baton is held."""
        with self._mutex:
            if not self._held:
                self._held = True
                self._since = monotonic()
                return None
            handoff = allocate_lock()
            handoff.acquire()
            self._waiters.append(handoff)
        pending = None
        while True:
            try:
                handoff.acquire()  # released by _give, which passes the baton to us
                break
            except BaseException as exc:  # noqa: B036 - raised once the baton is ours
                pending = pending or exc
                # Interrupted just before or just after getting it? _give
                # dequeues under the mutex: no longer queued means ours.
                with self._mutex:
                    if handoff not in self._waiters:
                        handoff.acquire(False)  # already ours either way
                        break
        self._since = monotonic()
        return pending

    def _give(self) -> None:
        with self._mutex:
            if self._waiters:
                self._waiters.popleft().release()  # still held: now by the oldest waiter
            else:
                self._held = False

    def _others_waiting_too_long(self) -> bool:
        return bool(self._waiters) and monotonic() - self._since >= TURN

    def held(self) -> "_Held":
        """``with baton.held():`` runs the body holding the baton (waits in it give it up)."""
        return _Held(self)


class _Held:
    """``Baton.held()``'s context: takes the baton on entry (unless this thread
    already holds it: re-entry), gives it back on exit."""

    def __init__(self, baton: Baton):
        self.baton = baton
        self.outer: Baton | None = None

    def __enter__(self) -> None:
        self.outer = _current()
        if self.outer is self.baton:  # re-entry: already ours
            return
        pending = self.baton._take()
        _local.baton = self.baton
        if pending is not None:
            self.__exit__()
            raise pending

    def __exit__(self, *exc_info) -> None:
        if self.outer is not self.baton:
            _local.baton = self.outer
            self.baton._give()


def _current() -> Baton | None:
    return getattr(_local, "baton", None)


def released() -> "_Released":
    """``with released():`` gives the baton up (if held) for the body: a call that
    may block for long but is not a wait on an event (writing to the host's own stdout)."""
    return _Released()


class _Released:
    def __init__(self):
        self.baton: Baton | None = None

    def __enter__(self) -> None:
        self.baton = _current()
        if self.baton is not None:
            self.baton._give()
            _local.baton = None  # not ours meanwhile: a nested wait must not give it again

    def __exit__(self, *exc_info) -> None:
        if self.baton is not None:
            pending = self.baton._take()
            _local.baton = self.baton
            if pending is not None:
                raise pending


def poll(poller, timeout_ms):
    """``poller.poll(timeout_ms)``, giving the baton up (if held) while blocked.

    Something already ready is returned at once, keeping the baton, unless
    other runs have waited for this turn to end for ``TURN`` seconds."""
    baton = _current()
    if baton is None or timeout_ms == 0:
        return poller.poll(timeout_ms)
    events = poller.poll(0)
    if events and not baton._others_waiting_too_long():
        return events
    with released():
        return events or poller.poll(timeout_ms)


def wait_event(event, timeout: float | None) -> bool:
    """``event.wait(timeout)`` (a ``threading.Event``), giving the baton up (if held) while blocked."""
    baton = _current()
    if baton is None or event.is_set():
        return event.wait(timeout)
    with released():
        return event.wait(timeout)
