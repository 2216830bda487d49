"""A kernel timer that continues this process if something stopped it.

SIGSTOP cannot be caught, blocked or ignored, and any process of the same
uid may send it: a process that must act on its own (a session's holder,
whose idle timeout and owner's exit nothing else acts on) can be frozen by
what it holds. Only SIGCONT resumes it, and the kernel resumes a stopped
process when a SIGCONT is *generated* for it, whatever its mask. A POSIX
timer of its own (``timer_create``, CLOCK_MONOTONIC) generates one every
``seconds``: a stopped process is resumed within that long, and its next
wait returns at once on whatever passed meanwhile (a deadline, a pidfd).

No other process can disarm the timer (it is the process's own, gone only at
its exit or exec; not inherited by a fork) and a process that is not
dumpable cannot be made to by ptrace. What it does not defeat: a process of
the uid that sends SIGSTOP again and again, faster than the resumed process
can act between two (the resumed one makes progress at each tick, no more).

SIGCONT gets a handler that does nothing: an ignored signal's periodic timer
is parked by Linux 6.13 and later until the signal is no longer ignored (and
SIGCONT's default action counts as ignored), so each tick wakes the process
once (a signal, and the wakeup fd of a ``_signal.set_wakeup_fd`` caller).
"""

import _signal  # not signal: the same numbers without enum's start-up cost

from . import libc

_CLOCK_MONOTONIC = 1
_SIGEV_SIGNAL = 0


class _SigEvent(libc.Structure):
    """``struct sigevent`` (64 bytes: its value, signal, kind, then a union)."""

    _fields_ = [
        ("sigev_value", libc.c_void_p),
        ("sigev_signo", libc.c_int),
        ("sigev_notify", libc.c_int),
        ("_rest", libc.c_int * 12),
    ]


class _Timespec(libc.Structure):
    _fields_ = [("tv_sec", libc.c_long), ("tv_nsec", libc.c_long)]


class _ITimerSpec(libc.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def continue_every(seconds: float) -> None:
    """Have the kernel send this process SIGCONT every ``seconds`` from now
    on (see the module). OSError where the timer cannot be had."""
    _signal.signal(_signal.SIGCONT, lambda signum, frame: None)
    lib = libc.library()
    event = _SigEvent(sigev_signo=int(_signal.SIGCONT), sigev_notify=_SIGEV_SIGNAL)
    timer = libc.c_void_p()
    if lib.timer_create(_CLOCK_MONOTONIC, libc.byref(event), libc.byref(timer)) != 0:
        raise libc.errno_error("timer_create")
    every = _Timespec(int(seconds), int(seconds % 1 * 1_000_000_000))
    if lib.timer_settime(timer, 0, libc.byref(_ITimerSpec(every, every)), None) != 0:
        raise libc.errno_error("timer_settime")
