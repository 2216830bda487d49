"""A ``--background`` run's log held to ``--log-max`` on disk, whoever writes it.

corral relays the command's output into the log under ``--log-max``
(``output.HeadTail``: the first half as it comes, one marker line and the last
half once the run is over). But the log is a file the run's uid can reach
without corral: by its path in the state directory, or through a descriptor
of corral's (or of the pid namespace's init, a clone of corral's) in
/proc/PID/fd. So the run's corral forks a keeper, before the engine and the
command exist, that holds the file itself to a bound:

    the run's corral ──fork──→ the keeper: poll() on an inotify watch of the
                                log's inode (IN_MODIFY: a write through any
                                descriptor, a truncate, a fallocate), on
                                corral's pidfd and on corral's "finish" pipe

With L = --log-max, HEAD = L - L//2 (what corral writes while the run goes
on) and ``ROOM`` (corral's own lines: the omission marker, warnings, the
summary; the keeper's note), BOUND = L + ROOM.

Guarantees:
- While the run's corral lives, a write that takes the log past BOUND wakes
  the keeper, which cuts the log back to its first HEAD bytes (ftruncate) and
  appends one note: ``[corral: ... N bytes written into this log by another
  process cut ...]`` (N: all it has cut so far). What corral writes once the
  run is over (its marker, the tail, the summary: at most L//2 + ROOM) fits
  in what is left, so corral's own policy is kept whole when the others'
  bytes came after its head.
- corral asks the keeper for a last look as it exits, after its last write,
  and waits for it (``finish``): the log it leaves is at most BOUND bytes.
- Nothing polls: the keeper sleeps in poll() until the file changes, and a
  run that writes nothing costs nothing.

What it does not hold:
- The file is longer than BOUND for as long as the keeper takes to wake: a
  single write of any size lands first, and the disk must hold it that long.
- The bound is on size, not content: a writer that rewrites bytes in place
  (pwrite, an O_TRUNC open, then writing at its own offset) can replace
  corral's head; the bytes of corral's head that came after another writer's
  are cut with them.
- The keeper watches the file corral writes, not its name: a log renamed
  away and replaced by another file is not this file.
- The keeper is a process of the run's uid, as reachable as corral itself (in
  the pidns tier, neither is visible from the run); killed, it holds nothing
  more. It watches until corral exits: the run's processes are proven gone by then.

Failure modes: ``start`` raises SetupError (the command never runs: 125)
when no inotify instance can be had (``fs.inotify.max_user_instances``) or no
process forked; a --log-max corral could not keep is not promised.
"""

import os
import select
import signal
import stat

from ..common.errors import SetupError

#: Room past --log-max for corral's own lines (marker, warnings, summary) and the keeper's note.
ROOM = 64 * 1024
#: How long corral waits for the keeper's last look before it exits anyway.
FINISH_WAIT = 5.0


def bound(log_max: int) -> int:
    """The most bytes the log is left holding (see above)."""
    return log_max + ROOM


def head(log_max: int) -> int:
    """What is left of the log when the keeper cuts it: corral's head (``HeadTail``'s first half)."""
    return log_max - log_max // 2


class LogKeeper:
    """The keeper of the log on ``fd``, as its corral (its parent) sees it."""

    def __init__(self, pid: int, pidfd: int, finish_w: int):
        self.pid, self._pidfd, self._finish_w = pid, pidfd, finish_w

    @classmethod
    def start(cls, fd: int, log_max: int) -> "LogKeeper | None":
        """Fork the keeper of the file open on ``fd``; None when it is no regular
        file (a pipe, /dev/null: nothing grows on disk). SetupError if it cannot be kept."""
        from ..kernel.inotify import IN_MODIFY, Inotify

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        finish_r = finish_w = corral = -1
        watch = None
        try:
            # Everything the keeper waits on exists before it does: no write is missed.
            watch = Inotify()
            watch.watch(f"/proc/self/fd/{fd}", IN_MODIFY)
            corral = os.pidfd_open(os.getpid())
            finish_r, finish_w = os.pipe2(os.O_CLOEXEC)
            pid = os.fork()
        except OSError as exc:
            for end in (finish_r, finish_w, corral):
                if end >= 0:
                    os.close(end)
            if watch is not None:
                watch.close()
            raise SetupError(f"--log-max cannot be held on the log: {exc.strerror or exc}") from None
        if pid == 0:  # pragma: no cover  (the keeper; tested through the runs it keeps)
            try:
                _keep(fd, watch.fileno(), corral, finish_r, log_max)
            finally:
                os._exit(0)
        watch.close()
        os.close(corral)
        os.close(finish_r)
        return cls(pid, os.pidfd_open(pid), finish_w)

    def finish(self) -> None:
        """Ask for the last look (after corral's last write) and wait for it, at most
        ``FINISH_WAIT`` (a stopped keeper is not waited for: it exits when corral does)."""
        try:
            os.write(self._finish_w, b"x")
        except OSError:
            pass  # it is gone already
        os.close(self._finish_w)
        if select.select([self._pidfd], [], [], FINISH_WAIT)[0]:
            os.waitpid(self.pid, 0)
        os.close(self._pidfd)


def _keep(log: int, watch: int, corral: int, finish: int, log_max: int) -> None:
    """The keeper's life: hold ``log`` to the bound on each change, until corral
    asks for the last look or exits."""
    from ..kernel.signals import stop_signals

    # A signal to corral's process group must not end the keeper before corral.
    for sig in stop_signals():
        signal.signal(sig, signal.SIG_IGN)
    low = 3  # none of corral's other descriptors (a pipe, a socket) is held open by the keeper
    for fd in sorted({log, watch, corral, finish}):
        os.closerange(low, fd)
        low = max(low, fd + 1)
    os.closerange(low, _fd_ceiling())
    try:  # corral's descriptor is write-only: the last byte kept is read through another
        reader: int | None = os.open(f"/proc/self/fd/{log}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        reader = None
    poller = select.poll()
    for fd in (watch, corral, finish):
        poller.register(fd, select.POLLIN)
    cut = 0
    while True:
        ready = {fd for fd, _ in poller.poll()}
        _drain(watch)  # before the look: a write after it wakes the next poll
        try:
            cut = _hold(log, reader, log_max, cut)
        except OSError:
            pass  # (an append-only file, EIO): tried again at the next change
        if ready - {watch}:
            return


def _hold(log: int, reader: int | None, log_max: int, cut: int) -> int:
    """Cut ``log`` back to corral's head if it is past the bound; bytes cut so far."""
    size = os.fstat(log).st_size
    if size <= bound(log_max):
        return cut
    keep = head(log_max)
    os.ftruncate(log, keep)
    cut += size - keep
    after_newline = keep == 0 or (reader is not None and os.pread(reader, 1, keep - 1) == b"\n")
    note = (
        f"[corral: the log grew past --log-max {log_max} + {ROOM} bytes (written by another process "
        f"than corral): cut back to its first {keep} bytes; {cut} bytes cut in all]\n"
    )
    os.pwrite(log, (b"" if after_newline else b"\n") + note.encode(), keep)  # at its end (O_APPEND) or here
    return cut


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 65536):
            pass
    except BlockingIOError:
        pass


def _fd_ceiling() -> int:
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if 0 < soft < (1 << 20) else 1 << 20
