"""``corralctl logs`` and ``corralctl wait``: a (background) run's output and its end.

A run is named by its id or its ``--name`` (``find_run``). The output log read
is always ``<state dir>/<run id>.out``, the name the id gives, opened without
following a symlink and only if it is a regular file of this uid: the entry's
own ``output_log`` (a file the run's uid can rewrite) is never a path to open.
``wait`` believes a run finished only as ``registry.effective_state`` does
(the owner's sealed token while the owner lives) and, once its corral is
gone, only when nothing the kernel shows is left of it (``stop._leftovers``).

Both wait blocked (``_await_change``): on the run's live corral, the process
the kernel names as its token's holder, through a pidfd (its exit is the
run's end), and ``logs --follow`` on the log too (inotify: a write). Only a
run whose corral is gone, its leftovers still there, is looked at again each
``LEFTOVERS_LOOK`` seconds: nothing else would say when they are gone.
"""

import os
import stat
import sys
import time

from ..state import registry as REG
from .status import CtlError, UnknownRun

#: ``wait``'s exit code when the run is still going at --timeout (as timeout(1)).
STILL_RUNNING = 124
#: How often a run whose corral is gone is looked at again (its leftovers, stopped by another).
LEFTOVERS_LOOK = 1.0


def find_run(text: str, directory: str) -> dict:
    """The entry for a run id (any form ``normalize_run_id`` takes) or a name:
    of the runs so named (in the caller's session, when ``CORRAL_SESSION`` is
    set), the one still going, else the newest. UnknownRun (a CtlError, 125)
    if none; CtlError if two live runs share the name. The one resolver of
    status, stop, logs and wait."""
    run_id = REG.normalize_run_id(text)
    if REG.valid_run_id(run_id):
        entry = REG.read_entry(directory, run_id)
        if entry is not None and entry.get("run_id") == run_id:
            return entry
    named = [e for e in REG.list_entries(directory) if e.get("name") == text and REG.valid_run_id(e.get("run_id", ""))]
    if session := os.environ.get("CORRAL_SESSION"):  # inside a session, its names are the ones meant
        named = [e for e in named if e.get("session") == session]
    if not named:
        raise UnknownRun(f"unknown run {text!r}")
    live = [e for e in named if REG.effective_state(e)[0] != "finished"]
    if len(live) > 1:
        ids = ", ".join(sorted(e["run_id"] for e in live))
        raise CtlError(f"{text!r} names {len(live)} runs still going ({ids}): give the run id")
    pool = live or named
    return max(pool, key=lambda e: e.get("registered_at") or 0)


def output_log(directory: str, run_id: str) -> int:
    """The run's output log, open for reading; CtlError if it has none."""
    path = REG.output_path(directory, run_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise CtlError(f"{run_id} has no output log (only --background runs keep one)") from None
    except OSError as exc:
        raise CtlError(f"{run_id}: cannot open its output log: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise CtlError(f"{run_id}: its output log is not a regular file of this user")
    os.set_blocking(fd, True)
    return fd


def _ended(directory: str, entry: dict) -> dict | None:
    """The entry, re-read, once it and the owner's token (while the owner holds one) say finished."""
    fresh = REG.read_entry(directory, entry["run_id"]) or entry
    if REG.effective_state(fresh)[0] != "finished" or fresh.get("state") != "finished":
        return None  # not over; or the token says finished and its entry is being written
    return fresh


def _nothing_left(directory: str, entry: dict) -> bool:
    """Nothing of the run left as the kernel and the manager show it (``reclaim._leftovers``:
    its units by the names its id gives, its cgroup, its marked processes)."""
    from .reclaim import _Bus, _leftovers

    return _leftovers(directory, entry, _Bus())[0] is None


def finished(directory: str, entry: dict) -> dict | None:
    """The entry, once the run is over as an authorisation check sees it, else None:
    its live corral says so (the token only it holds), or, with its corral gone,
    nothing of it is left."""
    fresh = _ended(directory, entry)
    if fresh is None:
        return None
    if REG.owner_alive(fresh) and REG.owner_token(fresh) is not None:
        return fresh
    return fresh if _nothing_left(directory, fresh) else None


def proven_gone(directory: str, entry: dict) -> bool:
    """Is the run over and nothing of it left (``_nothing_left``), whoever says it is
    over? Its entry's own ``verified`` is not asked: a process that outlived its
    corral could have written it."""
    fresh = _ended(directory, entry)
    return fresh is not None and _nothing_left(directory, fresh)


def logs(
    run: str, follow: bool = False, tail: int | None = None, directory: str | None = None, since: int | None = None
) -> int:
    """The run's output log to stdout: from byte ``since`` (a cursor: the last
    call's ``since`` plus the bytes it printed), the last ``tail`` lines, or
    all of it; ``follow``: then what it writes, until the run is over."""
    directory = directory or REG.state_dir()
    entry = find_run(run, directory)
    fd = output_log(directory, entry["run_id"])
    out = sys.stdout.buffer
    changes = None
    try:
        if since is not None:
            size = os.fstat(fd).st_size
            if since > size:  # --log-max cut it back past the cursor: what is after its head is gone
                said = f"the log is {size} bytes, cut back before byte {since}"
                print(f"corralctl: {entry['run_id']}: {said}", file=sys.stderr)
            os.lseek(fd, min(since, size), os.SEEK_SET)
        elif tail is not None:
            os.lseek(fd, _start_of_last_lines(fd, tail), os.SEEK_SET)
        if follow:
            changes = _RunWatch(directory, entry, fd)
        while True:
            while chunk := os.read(fd, 65536):
                out.write(chunk)
            out.flush()
            if not follow or finished(directory, entry) is not None:
                while chunk := os.read(fd, 65536):  # what came between the last read and the end
                    out.write(chunk)
                out.flush()
                return 0
            assert changes is not None  # follow: made above
            changes.wait(None)
    except BrokenPipeError:
        return 0
    finally:
        if changes is not None:
            changes.close()
        os.close(fd)


class _RunWatch:
    """A blocked wait for what may have ended the run, or (``log_fd``) grown its log:
    its entry written again (its state directory: inotify, a rename or a close after
    writing), its live corral's exit (the token's holder, the kernel's word: a
    pidfd; the service, for a served run), a write to the log. With no live
    holder, ``LEFTOVERS_LOOK`` at most: nothing else says when leftovers are gone."""

    def __init__(self, directory: str, entry: dict, log_fd: int | None = None):
        from ..kernel.inotify import IN_CLOSE_WRITE, IN_MODIFY, IN_MOVED_TO, Inotify

        self._token = REG.TOKEN_PREFIX + entry["run_id"]
        self._changes = Inotify()
        try:
            self._changes.watch(directory, IN_MOVED_TO | IN_CLOSE_WRITE)
            if log_fd is not None:
                self._changes.watch(f"/proc/self/fd/{log_fd}", IN_MODIFY | IN_CLOSE_WRITE)
        except OSError:
            self._changes.close()
            raise

    def wait(self, timeout: float | None) -> None:
        import select

        poller = select.poll()
        poller.register(self._changes.fileno(), select.POLLIN)
        pidfd = None
        pid = REG.token_holder(self._token)
        try:
            if pid is not None:
                try:
                    pidfd = os.pidfd_open(pid)
                except OSError:
                    return  # gone meanwhile: look again
                if REG.token_holder(self._token) != pid:
                    return  # not the run's holder any more (exited, the pid reused): look again
                poller.register(pidfd, select.POLLIN)
            else:
                timeout = LEFTOVERS_LOOK if timeout is None else min(timeout, LEFTOVERS_LOOK)
            poller.poll(None if timeout is None else max(0.0, timeout) * 1000 + 1)
            self._changes.read()
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def close(self) -> None:
        self._changes.close()


def _start_of_last_lines(fd: int, lines: int) -> int:
    """The offset of the last ``lines`` lines (a final line without newline counts)."""
    size = os.fstat(fd).st_size
    if lines <= 0:
        return size
    pos, seen = size, 0
    ends_open = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
    need = lines if ends_open else lines + 1
    while pos > 0:
        step = min(65536, pos)
        block = os.pread(fd, step, pos - step)
        for i in range(len(block) - 1, -1, -1):
            if block[i] == 0x0A:
                seen += 1
                if seen == need:
                    return pos - step + i + 1
        pos -= step
    return 0


def wait(run: str, timeout: float | None = None, directory: str | None = None) -> int:
    """Until the run is over: its exit code as corral returned it (124 at --timeout)."""
    directory = directory or REG.state_dir()
    entry = find_run(run, directory)
    end = None if timeout is None else time.monotonic() + timeout
    watch = _RunWatch(directory, entry)
    try:
        done = _await_finished(directory, entry, watch, end, timeout)
    finally:
        watch.close()
    if not isinstance(done, dict):
        return done
    code = done.get("exit_code")
    if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 255:
        print(f"corralctl: {done['run_id']}: finished ({done.get('outcome')}), exit status unknown", file=sys.stderr)
        return 120
    return code


def _await_finished(directory: str, entry: dict, watch: _RunWatch, end: float | None, timeout: float | None):
    """The finished entry (``finished``), or the exit code to return instead:
    ``STILL_RUNNING`` at ``end``, 120 for a run its corral left unfinished."""
    while (done := finished(directory, entry)) is None:
        if end is not None and time.monotonic() >= end:
            print(f"corralctl: {entry['run_id']} still running after {timeout:g}s", file=sys.stderr)
            return STILL_RUNNING
        if REG.effective_state(REG.read_entry(directory, entry["run_id"]) or entry)[0] == "expired" and not (
            REG.owner_alive(entry)
        ):
            print(
                f"corralctl: {entry['run_id']}: its corral is gone without finishing it "
                f"(corralctl stop {entry['run_id']} reclaims what is left)",
                file=sys.stderr,
            )
            return 120
        watch.wait(None if end is None else end - time.monotonic())
    return done
