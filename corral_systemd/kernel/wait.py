"""Waiting for a child without reaping it, and what the kernel says of its end.

``exited_with_usage`` is how corral learns that the command's main process
has exited while leaving it a zombie (WNOWAIT: its pid, and the session id
it made, stay its own until it is reaped), with the CPU time the kernel
accounts to it and to what it waited for: the figure a benchmark runner
reports, final to the microsecond. Used for the in-process child
(``kernel.spawn.Child``) and by the callers that hold a served run's
process (``kernel.gate``: the Python client, the holder).
"""

import os
import sys

#: waitid(2)'s number, for the call with a rusage (glibc's waitid has none), per machine.
_SYS_WAITID = {"x86_64": 247, "aarch64": 95, "riscv64": 95, "ppc64le": 272, "s390x": 281}


def exited_with_usage(pid: int) -> tuple[int, int | None, int | None] | None:
    """(wait status, user CPU ns, system CPU ns) once our child ``pid`` has
    exited, leaving it a zombie (WNOWAIT); None while it runs. The CPU is
    the kernel's getrusage(RUSAGE_BOTH) of the zombie: it and every
    descendant it waited for, in microseconds, final (what wait4 would give
    at reaping, what a benchmark runner reports). ``None`` figures where the
    raw call is not to be had (another machine), with the status from os.waitid."""
    from . import libc

    number = _SYS_WAITID.get(os.uname().machine)  # not platform: it imports re (ms of every start)
    if number is None:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return None if info is None else (wait_status(info), None, None)
    siginfo = libc.string_buffer(128)  # zeroed: si_pid stays 0 while the child runs
    rusage = libc.string_buffer(144)
    if libc.library().syscall(number, os.P_PID, pid, siginfo, os.WEXITED | os.WNOHANG | os.WNOWAIT, rusage) != 0:
        raise libc.errno_error()
    code, child, status = (int.from_bytes(siginfo.raw[at : at + 4], sys.byteorder, signed=True) for at in (8, 16, 24))
    if child == 0:
        return None
    wait = (status & 0xFF) << 8 if code == os.CLD_EXITED else (status & 0x7F) | (0x80 if code == os.CLD_DUMPED else 0)
    sec_u, usec_u, sec_s, usec_s = (int.from_bytes(rusage.raw[at : at + 8], sys.byteorder) for at in (0, 8, 16, 24))
    return wait, sec_u * 1_000_000_000 + usec_u * 1000, sec_s * 1_000_000_000 + usec_s * 1000


def wait_status(info) -> int:
    """A waitid() siginfo as the wait status waitpid() would have given."""
    if info.si_code == os.CLD_EXITED:
        return (info.si_status & 0xFF) << 8
    return (info.si_status & 0x7F) | (0x80 if info.si_code == os.CLD_DUMPED else 0)


def reap_adopted(known) -> list[int]:
    """Reap this process's exited children that are not in ``known``; return them.

    For a pid namespace's init (corral as a container's pid 1): every orphan
    of the namespace becomes its child, and one nobody reaps stays a zombie.
    ``known`` are the children whose status their owner will read (the run's
    own, corral's helpers): never reaped here, so no status is stolen. Only
    for a process that knows all its children (never a library's host)."""
    from .procfs import children

    reaped = []
    for pid in children(os.getpid()) or []:
        if pid in known:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state in (b"Z", b"X"):
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    reaped.append(pid)
            except ChildProcessError:
                pass
    return reaped
