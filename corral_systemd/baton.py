"""Taking turns: the runs of one library Runner execute Python one at a time.

Why. A Runner drives each run's supervisor loop (the CLI's synchronous
code) in a thread of its own. CPython releases the GIL around every system
call; with 8 runs in flight, each release lets another runnable supervisor
thread take the GIL, and the caller must queue to get it back: a futex
wake and wait per system call, about 800 futex calls per run, measured
(strace, 8 scope runs in flight). That hand-off, not Python itself, is what
a contended machine makes expensive.

A ``Baton`` makes a Runner's supervisor threads take turns at the level of
their *waits*: a thread holds the baton while it works and gives it up only
while it blocks waiting for an event (``poll``, ``wait_event``). Threads
that hold no baton (the D-Bus reader, the caller's event loop, the CLI, a
fallback run) are not affected: these functions then just wait.

Guarantees and failure modes:
- No deadlock as long as no thread waits for another baton holder without
  going through this module. Runs are independent; they share only the
  manager connection, whose send lock is never held across a baton wait
  (``Connection.send`` waits for buffer space without giving the baton up).
- A blocking call that is not a wait (a slow fsync, posix_spawn) delays the
  Runner's other runs for its length: the baton is not fair game for
  long work. Every wait a run makes for an outside event goes through here,
  and so does passing output on to the host's own stdout/stderr
  (``released``), which its reader may leave full.
- A thread that is already running (holding the baton) and finds an event
  ready keeps the baton: a zero-timeout poll comes first, so an idle run
  does not cost a hand-off.
"""

from _thread import _local, allocate_lock  # not threading: the CLI imports this module too
from contextlib import contextmanager

_local = _local()


class Baton:
    """One per Runner session: its supervisor threads run one at a time."""

    def __init__(self):
        self._lock = allocate_lock()

    @contextmanager
    def held(self):
        """Run the body holding the baton (waits in it give it up)."""
        outer = getattr(_local, "baton", None)
        if outer is self:  # re-entry: already ours
            yield
            return
        self._lock.acquire()
        _local.baton = self
        try:
            yield
        finally:
            _local.baton = outer
            self._lock.release()


@contextmanager
def released():
    """Give the baton up (if held) for the body: a call that may block for
    long but is not a wait on an event (writing to the host's own stdout)."""
    baton = getattr(_local, "baton", None)
    if baton is None:
        yield
        return
    baton._lock.release()
    try:
        yield
    finally:
        baton._lock.acquire()


def poll(poller, timeout_ms):
    """``poller.poll(timeout_ms)``, giving the baton up (if held) while blocked."""
    baton = getattr(_local, "baton", None)
    if baton is None or timeout_ms == 0:
        return poller.poll(timeout_ms)
    events = poller.poll(0)
    if events:
        return events
    baton._lock.release()
    try:
        return poller.poll(timeout_ms)
    finally:
        baton._lock.acquire()


def wait_event(event, timeout: float | None) -> bool:
    """``event.wait(timeout)``, giving the baton up (if held) while blocked."""
    baton = getattr(_local, "baton", None)
    if baton is None or event.is_set():
        return event.wait(timeout)
    baton._lock.release()
    try:
        return event.wait(timeout)
    finally:
        baton._lock.acquire()
