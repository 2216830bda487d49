"""prctl(2) calls Python does not expose."""

from . import libc

PR_SET_CHILD_SUBREAPER = 36

_libc = libc.library()
_libc.prctl.argtypes = [libc.c_int, libc.c_ulong, libc.c_ulong, libc.c_ulong, libc.c_ulong]


def _prctl(option: int, arg: int, arg3: int = 0) -> None:
    if _libc.prctl(option, arg, arg3, 0, 0) != 0:
        raise libc.errno_error()


def set_child_subreaper(enable: bool = True) -> None:
    """Orphans below this process re-parent to it instead of to init."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1 if enable else 0)


PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int) -> None:
    """``sig`` is sent to this process when the *thread* that forked it exits
    (not its process: a parent thread that ends fires it too)."""
    _prctl(PR_SET_PDEATHSIG, sig)


PR_SET_DUMPABLE = 4


def set_dumpable(dumpable: bool) -> None:
    """Not dumpable (False): another process of this uid without CAP_SYS_PTRACE
    can neither ptrace this one nor open its /proc/PID/fd, mem, environ or ns --
    corral's own processes, whose command runs as their uid. A child is dumpable
    again after its execve (a plain executable), or when it says so (True)."""
    _prctl(PR_SET_DUMPABLE, 1 if dumpable else 0)


PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER = 47, 3


def lower_ambient(cap: int) -> None:
    """Drop capability number ``cap`` from this process's ambient set (always allowed)."""
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER, cap)
