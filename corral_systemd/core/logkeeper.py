"""A ``--background`` run's log held to ``--log-max`` on disk, whoever writes it.

corral relays the command's output into the log under ``--log-max``
(``output.HeadTail``: the first half as it comes, one marker line and the last
half once the run is over). But the log is a file the run's uid can reach
without corral: by its path in the state directory, or through a descriptor
of corral's in /proc/PID/fd. So the run's corral watches the file itself: an
inotify watch of the log's inode (IN_MODIFY: a write through any descriptor,
a truncate, a fallocate), one more descriptor in the supervisor's own
``poll`` (``Supervisor(watches=)``): no process, no thread, no timer.

With L = --log-max, HEAD = L - L//2 (what corral writes while the run goes
on) and ``ROOM`` (corral's own lines: the omission marker, warnings, the
summary; the keeper's note), BOUND = L + ROOM.

Guarantees:
- While the run is supervised, a write that takes the log past BOUND wakes
  corral, which cuts the log back to its first HEAD bytes (ftruncate) and
  appends one note, ``[corral: the log grew past --log-max ...; N bytes cut
  in all]`` (a later cut replaces it: one note, N counting every cut).
- corral takes a last look as it exits, after its last write (``close``):
  the log it leaves is at most BOUND bytes.
- corral's own writes alone never reach BOUND (at most L bytes of output, one
  marker line and its own lines, which ROOM is for): when nothing else writes
  the log, nothing is cut and --log-max's head and tail are as before.

What it does not hold:
- The file is longer than BOUND for as long as corral takes to wake: a
  single write of any size lands first, and the disk must hold it that long.
- A cut keeps the head, whoever wrote it: what corral writes once the run is
  over (its marker, the tail, the summary: at most L//2 + ROOM) fits after a
  cut, but the others' bytes written since the last cut take room too, and
  corral's lines that take the log past BOUND are cut with them.
- The bound is on size, not content: a writer that rewrites bytes in place
  (pwrite, an O_TRUNC open, then writing at its own offset) can replace
  corral's head; the bytes of corral's head that came after another writer's
  are cut with them.
- The watch is on the file corral writes, not its name: a log renamed away
  and replaced by another file is not this file.
- A corral the run stopped (SIGSTOP) cuts nothing until it is continued.

Failure modes: ``start`` raises SetupError (the command never runs: 125)
when no inotify instance can be had (``fs.inotify.max_user_instances``);
a --log-max corral could not keep is not promised.
"""

import os
import stat

from ..common.errors import SetupError

#: Room past --log-max for corral's own lines (marker, warnings, summary) and the keeper's note.
ROOM = 64 * 1024


def bound(log_max: int) -> int:
    """The most bytes the log is left holding (see above)."""
    return log_max + ROOM


def head(log_max: int) -> int:
    """What is left of the log when it is cut: corral's head (``HeadTail``'s first half)."""
    return log_max - log_max // 2


class LogKeeper:
    """The watch on the log open on ``fd`` in this process (corral's stdout)."""

    def __init__(self, fd: int, log_max: int, watch, reader: int | None):
        self._fd, self._log_max, self._watch, self._reader = fd, log_max, watch, reader
        self._cut = 0

    @classmethod
    def start(cls, fd: int, log_max: int) -> "LogKeeper | None":
        """Watch the file open on ``fd``; None when it is no regular file (a pipe,
        /dev/null: nothing grows on disk). SetupError if it cannot be watched."""
        from ..kernel.inotify import IN_MODIFY, Inotify

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            watch = Inotify()
        except OSError as exc:
            raise SetupError(f"--log-max cannot be held on the log: {exc.strerror or exc}") from None
        try:
            watch.watch(f"/proc/self/fd/{fd}", IN_MODIFY)
        except OSError as exc:
            watch.close()
            raise SetupError(f"--log-max cannot be held on the log: {exc.strerror or exc}") from None
        try:  # corral's descriptor is write-only: the last byte kept is read through another
            reader: int | None = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            reader = None
        return cls(fd, log_max, watch, reader)

    def fileno(self) -> int:
        """Readable when the log changed (for the supervisor's poll)."""
        return self._watch.fileno()

    def look(self) -> None:
        """The log changed: cut it back if it is past the bound."""
        self._watch.read()  # before the look: a write after it wakes the next poll
        try:
            self._cut = _hold(self._fd, self._reader, self._log_max, self._cut)
        except OSError:
            pass  # (an append-only file, EIO): tried again at the next change

    def close(self) -> None:
        """The last look, after corral's last write to the log."""
        self.look()
        self._watch.close()
        if self._reader is not None:
            os.close(self._reader)
            self._reader = None


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
        f"[corral: the log grew past --log-max {log_max} + {ROOM} bytes (written by a process other "
        f"than corral): cut back to its first {keep} bytes; {cut} bytes cut in all]\n"
    )
    os.pwrite(log, (b"" if after_newline else b"\n") + note.encode(), keep)  # at its end (O_APPEND) or here
    return cut
