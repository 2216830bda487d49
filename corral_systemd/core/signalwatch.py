"""The stop signals as bytes on a pipe: what the supervisor's poll loop
waits on instead of running Python code in a signal handler."""

import _signal  # not signal: the same numbers without enum's start-up cost
import os

from ..kernel.signals import stop_signals

STOP_SIGNALS = stop_signals()


class SignalWatch:
    """Turns every stop signal (``kernel.signals``) and SIGCHLD into bytes on a pipe the loop polls.

    Only usable from the main thread (Python's signal rules). Restores the
    previous handlers and wakeup fd on exit.
    """

    def __init__(self, extra: tuple = ()):
        #: Further signals that count as "stop" (the library's child supervisor).
        self.stop_signals = (*STOP_SIGNALS, *extra)

    def __enter__(self):
        self.read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._old_wakeup = _signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        # SIGWINCH: a --pty run's terminal changed size (its default is to ignore).
        # SIGCONT: corral itself was stopped, and continued (a handler keeps the continue).
        watched = (*self.stop_signals, _signal.SIGCHLD, _signal.SIGWINCH, _signal.SIGCONT)
        self._old = {sig: _signal.signal(sig, _ignore) for sig in watched}
        return self

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            _signal.signal(sig, handler)
        _signal.set_wakeup_fd(self._old_wakeup)
        os.close(self.read_fd)
        os.close(self._write_fd)

    #: corral itself was continued (SIGCONT) while watching: it had been stopped.
    continued = False

    def drain(self) -> list[int]:
        try:
            nums = list(os.read(self.read_fd, 512))
        except BlockingIOError:
            return []
        self.continued = self.continued or _signal.SIGCONT in nums
        return nums


def _ignore(signum, frame):
    pass
