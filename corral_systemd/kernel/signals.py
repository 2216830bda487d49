"""Which signals end corral's run instead of ending corral.

Every signal whose default action terminates a process would otherwise
kill corral at once and leave the run unsupervised (in the fallback, with no
limit at all). corral catches each of them and stops the run like SIGTERM:
stop, verify, exit 128+N. The exceptions, on purpose:

- SIGKILL cannot be caught (the tether and the credentials watcher handle
  corral's death);
- SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS report a fault in corral itself:
  a handler that returns would re-run the faulting instruction, so they keep
  their default action;
- SIGPIPE and SIGXFSZ stay ignored, as Python sets them: corral's own writes
  then fail with EPIPE/EFBIG, which it handles, and the run goes on.

SIGABRT is caught: a real ``abort()`` still ends corral (glibc re-raises it
with the default action), a ``kill -ABRT`` stops the run. Real-time signals
(SIGRTMIN..SIGRTMAX) terminate by default and are caught too.
"""

# _signal, not signal: the same numbers without the enum module's start-up
# cost (the CLI's client side reads this on every corral start).
import _signal

_NAMES = (
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGTRAP",
    "SIGABRT",
    "SIGUSR1",
    "SIGUSR2",
    "SIGALRM",
    "SIGTERM",
    "SIGSTKFLT",
    "SIGXCPU",
    "SIGVTALRM",
    "SIGPROF",
    "SIGIO",
    "SIGPWR",
)


def stop_signals() -> tuple[int, ...]:
    """Every catchable signal whose default action would end corral (see above)."""
    found = [getattr(_signal, name) for name in _NAMES if hasattr(_signal, name)]
    if hasattr(_signal, "SIGRTMIN"):
        found += range(_signal.SIGRTMIN, _signal.SIGRTMAX + 1)
    return tuple(dict.fromkeys(int(s) for s in found))


#: Signals a command starts with at their default action, whatever its
#: caller had: the ones corral catches, plus SIGPIPE/SIGXFSZ (Python ignores
#: them, and an ignored signal stays ignored across exec), SIGCHLD and
#: SIGWINCH (corral watches them). Every other signal's disposition is the
#: caller's (an ignored one stays ignored, as across exec); the mask is
#: empty. The same on every path: the in-process child (``kernel.spawn``),
#: a held child (``kernel.gate``, ``packaging/client/held.c``: a client's, corral-gate's).
CHILD_DEFAULTS = (*stop_signals(), _signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGCHLD, _signal.SIGWINCH)


#: rt_sigaction(2)'s number, per architecture (glibc's sigaction refuses the signals below).
_SYS_RT_SIGACTION = {"x86_64": 13, "aarch64": 134, "riscv64": 134, "ppc64le": 173, "s390x": 174}


def default_libc_signals() -> None:
    """Put glibc's own signals below SIGRTMIN (SIGCANCEL, SIGSETXID) at their
    default action: its posix_spawn leaves them ignored in the program it
    starts, and an ignored signal stays ignored across exec, where a forked
    child's exec has them at their default (corral-gate's Python twin:
    packaging/client/held.c does the same). Through the system call, with a
    zeroed kernel sigaction (SIG_DFL, no flags, an empty mask); an
    architecture not in the table keeps them as they are."""
    import os
    import sys

    # The kernel's architecture, and this interpreter's word size too: a 32-bit
    # Python on a 64-bit kernel has the 32-bit ABI's numbers.
    number = _SYS_RT_SIGACTION.get(os.uname().machine) if sys.maxsize > 2**32 else None
    if number is None:
        return
    from . import libc

    syscall = libc.library().syscall
    zeroed = libc.string_buffer(64)
    for sig in range(32, _signal.SIGRTMIN):
        syscall(libc.c_long(number), libc.c_int(sig), zeroed, None, libc.c_size_t(8))
