"""prctl(2) calls Python does not expose."""

import ctypes
import os

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def set_child_subreaper(enable: bool = True) -> None:
    """Orphans below this process re-parent to it instead of to init."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1 if enable else 0)


def is_child_subreaper() -> bool:
    value = ctypes.c_int(0)
    if _libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.addressof(value), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return bool(value.value)


def set_parent_death_signal(sig: int) -> None:
    """Deliver ``sig`` to this process when the thread that forked it exits."""
    _prctl(PR_SET_PDEATHSIG, sig)
