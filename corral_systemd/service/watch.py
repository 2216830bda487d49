"""The clients' control pipes and pidfds, watched by one thread for all runs.

A run's client tells the service about itself through two descriptors:
its control pipe (a byte = a signal number to stop the run with; end of
file = the client is gone) and its pidfd, opened from the peer credentials
the kernel recorded at connect time (readable = the client exited, however
it died). ``Watcher.watch`` ties both to one run's ``Execution``; the
thread turns each event into ``Execution.cancel(signum)``.

Guarantee: until ``unwatch`` returns, every event on a watched descriptor
reaches its run; after it returns, none does (the descriptors stay the
caller's to close). A descriptor that fails to read counts as its client
gone: its run is stopped, the others go on. If the thread dies anyway (a
bug), ``failed`` says why and ``on_failure`` is called: the service stops
taking runs and stops the ones in flight, since no client's signal or
death would reach its run any more.
"""

import os
import select
import signal
import threading

#: A client gone (its control pipe at EOF, or its pidfd readable) stops the
#: run as a hang-up would: corral's controlling side went away.
CLIENT_GONE = signal.SIGHUP


class Watcher:
    def __init__(self, on_failure=None):
        #: Why the thread died (it never should), or None.
        self.failed: str | None = None
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._poll = select.poll()
        self._targets: dict[int, tuple[object, str]] = {}  # fd -> (execution, "control" | "pidfd")
        self._gone: set[int] = set()  # id() of the executions already told their client is gone
        #: Set by cancel_all (the service is stopping): a run watched later is stopped at once.
        self._stopping: int | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._poll.register(self._wake_r, select.POLLIN)
        self._thread = threading.Thread(target=self._loop, name="corral-service-watch", daemon=True)
        self._thread.start()

    def watch(self, execution, control_fd: int, pidfd: int, hangup_only: bool = False) -> None:
        """``control_fd``: a non-blocking open file of the service's own on the
        control pipe (``requests.own_control_pipe``), or with ``hangup_only``
        the connection itself (a caller without a control pipe): only its
        hang-up counts, nothing is read."""
        with self._lock:
            self._targets[control_fd] = (execution, "hangup" if hangup_only else "control")
            self._targets[pidfd] = (execution, "pidfd")
            self._poll.register(control_fd, _HANGUP if hangup_only else select.POLLIN)
            self._poll.register(pidfd, select.POLLIN)
            stopping = self._stopping
        os.write(self._wake_w, b"w")
        if stopping is not None:
            execution.cancel(stopping)

    def unwatch(self, execution, control_fd: int, pidfd: int) -> None:
        with self._lock:
            for fd in (control_fd, pidfd):
                if self._targets.pop(fd, None) is not None:
                    self._poll.unregister(fd)
            self._gone.discard(id(execution))

    def cancel_all(self, signum: int) -> None:
        """Stop every watched run as corral stops for ``signum`` (the service is stopping)."""
        with self._lock:
            self._stopping = signum
            executions = {id(e): e for e, _ in self._targets.values()}
        for execution in executions.values():
            execution.cancel(signum)  # type: ignore[attr-defined]

    def _loop(self) -> None:
        try:
            while True:
                events = self._poll.poll()
                with self._lock:  # an unwatch waits for this round: no event reaches a finished run
                    for fd, _ in events:
                        if fd == self._wake_r:
                            _drain(fd)
                        elif fd in self._targets and _ready(fd, self._targets[fd][1]):  # not stale (a reused number)
                            self._event(fd)
        except BaseException:
            import traceback

            self.failed = traceback.format_exc()
            if self._on_failure is not None:
                self._on_failure(self.failed)

    def _event(self, fd: int) -> None:
        execution, kind = self._targets[fd]
        if kind == "control":
            try:
                data = os.read(fd, 64)
            except BlockingIOError:
                return
            except OSError:
                data = b""  # unreadable after all: as good as its client gone
            for signum in data:
                execution.cancel(signum)  # type: ignore[attr-defined]
            if data:
                return
        # The client is gone (EOF, or its pidfd): one stop request per run,
        # whichever tells first, so the command still gets its grace period.
        if id(execution) not in self._gone:
            self._gone.add(id(execution))
            execution.cancel(CLIENT_GONE)  # type: ignore[attr-defined]
        del self._targets[fd]  # it would stay readable: stop polling it
        self._poll.unregister(fd)


_HANGUP = select.POLLRDHUP | select.POLLHUP


def _ready(fd: int, kind: str) -> bool:
    poller = select.poll()
    poller.register(fd, _HANGUP if kind == "hangup" else select.POLLIN)
    return any(events & (_HANGUP | select.POLLIN | select.POLLERR | select.POLLNVAL) for _, events in poller.poll(0))


def _drain(fd: int) -> None:
    try:
        os.read(fd, 4096)
    except BlockingIOError:
        pass
