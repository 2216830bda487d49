"""Detaching a process from corral's caller: the one way corral forks a
process that must not belong to whoever started it (a background run's
corral, a session's holder and the runs it starts, the credentials'
watcher).

``fork_detached`` forks; the child, before any other code of its own runs:

- is in a session of its own: no controlling terminal, no process group
  of the caller's, so a shell's job control and its terminal's signals
  (^C, hang-up) never reach it;
- has /dev/null as standard input, and as standard output and error
  unless given descriptors for them (a run's log);
- holds no other descriptor of its parent's but those it is told to keep
  (none of a caller's pipes keeps the caller's reader waiting on it);
- has no signal wakeup descriptor (the parent's is closed); optionally
  ignores the signals a terminal or a dying reader sends
  (INT, TERM, HUP, QUIT, TSTP, PIPE: a watcher that must outlive its
  parent); else keeps its parent's dispositions.

The parent's buffered Python output is flushed first, so no line is
written twice when the child ends. It returns 0 in the child, which must
end in exec or ``os._exit``, and the child's pid in the parent (fork's
contract); a fork refused raises OSError in the parent. The child never
returns into its parent's code with an exception: if detaching fails
there, it exits 125.
"""

import _signal  # not signal: the same numbers without enum's start-up cost
import os
import sys

TYPE_CHECKING = False  # collections is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from collections.abc import Iterable

#: What a terminal, a hang-up or a dying reader sends.
TERMINAL_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT, _signal.SIGTSTP, _signal.SIGPIPE)


def fd_limit() -> int:
    """The highest descriptor number this process may have, plus one (bounded: a
    soft RLIMIT_NOFILE of "unlimited" would make closing every one take long)."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if 0 < soft < (1 << 20) else 1 << 20


def fork_detached(
    *,
    stdout: int | None = None,
    stderr: int | None = None,
    keep: "Iterable[int]" = (),
    ignore_terminal_signals: bool = False,
) -> int:
    """fork(2), the child detached as the module says; 0 in the child, its pid in the parent.

    ``keep``: descriptors the child holds on to (numbers unchanged)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: this process started with that descriptor closed
            stream.flush()
    pid = os.fork()
    if pid:
        return pid
    try:
        _detach(stdout, stderr, keep, ignore_terminal_signals)
    except BaseException:
        os._exit(125)
    return 0


def _detach(stdout: int | None, stderr: int | None, keep: "Iterable[int]", ignore_terminal_signals: bool) -> None:
    os.setsid()
    try:
        _signal.set_wakeup_fd(-1)  # the parent's is closed below: its number could be reused
    except ValueError:
        pass  # not the main thread: none was set here
    if ignore_terminal_signals:
        for sig in TERMINAL_SIGNALS:
            _signal.signal(sig, _signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for target, fd in ((0, null), (1, null if stdout is None else stdout), (2, null if stderr is None else stderr)):
        if fd != target:
            os.dup2(fd, target)
    close_all_but(keep)


def close_all_but(keep: "Iterable[int]") -> None:
    """Close every descriptor from 3 up but those in ``keep``."""
    low = 3
    for fd in sorted(set(keep)):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, fd_limit())
