"""A process's inheritable and ambient capability sets, lowered (never raised).

What exec carries of a process's capabilities (capabilities(7)): the
inheritable set unchanged, the ambient set into the new program's permitted
and effective sets (a program without file capabilities). A session's holder
may carry bits there that its caller lacks (systemd 257's user manager gives
its services an inheritable CAP_WAKE_ALARM); its child lowers both sets to the
caller's before exec, so the program starts with the caller's capabilities.

Only lowering is done here, which the kernel always allows: a set that asks
for a bit this process lacks is refused (OSError EPERM), nothing changed.
"""

from . import libc
from .prctl import lower_ambient

_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set


class _Header(libc.Structure):
    _fields_ = [("version", libc.c_uint32), ("pid", libc.c_int)]


class _Data(libc.Structure):
    _fields_ = [("effective", libc.c_uint32), ("permitted", libc.c_uint32), ("inheritable", libc.c_uint32)]


def status_sets(status: dict[str, str]) -> tuple[int, int]:
    """(inheritable, ambient) from a /proc/PID/status mapping; 0 for a line it lacks."""
    return int(status.get("CapInh", "0"), 16), int(status.get("CapAmb", "0"), 16)


def lower_to(inheritable: int, ambient: int, have_amb: int) -> None:
    """Make this process's inheritable and ambient sets exactly these (its
    effective and permitted sets untouched); ``have_amb``: its ambient set now
    (/proc/self/status: capget(2) does not tell it). OSError if either holds a
    bit this process's own set lacks (that would be a gain) or the kernel refuses."""
    lib = libc.library()
    header, data = _Header(_VERSION_3, 0), (_Data * 2)()
    if lib.capget(libc.byref(header), data) != 0:
        raise libc.errno_error()
    have_inh = data[0].inheritable | (data[1].inheritable << 32)
    if inheritable & ~have_inh or ambient & ~have_amb:
        raise OSError(1, f"capabilities {inheritable:#x}/{ambient:#x} are not a subset of this process's")
    # The ambient set first: each of its bits must stay in the inheritable set while it is there.
    extra = have_amb & ~ambient
    for cap in range(64):
        if extra >> cap & 1:
            lower_ambient(cap)
    if inheritable != have_inh:
        data[0].inheritable, data[1].inheritable = inheritable & 0xFFFFFFFF, inheritable >> 32
        if lib.capset(libc.byref(header), data) != 0:
            raise libc.errno_error()
