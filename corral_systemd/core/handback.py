"""``corral --yield DURATION``: the run's result if it ends within the yield, else the run handed back.

    corral --yield 10s --session S -- CMD   (the front)
        │  core.background.launch: a background run of session S from its start (its
        │  corral is the session's holder's child; output → its log; stdin kept if asked)
        ├─ follows the log to ``sink`` as it grows (inotify), and waits for the run's
        │  corral to exit (the holder's word, or a pidfd), up to the yield
        ├─ ended: its exit code (the corral's: the run's own, as a plain run's) and
        │  the corral's own lines (warnings, reason, summary: ``report_path``)
        └─ still running: ``Yielded.exit_code`` None: the run goes on untouched, a
           background run of the session (corralctl logs --since CURSOR, send, wait, stop)

Handing back moves nothing: the run was the session's from its start, so
nothing is re-parented, restarted or lost at the yield; the front only stops
following it. What the front passed to ``sink`` is the log's first
``cursor`` bytes: ``corralctl logs RUN --since CURSOR`` reads on from there,
every byte once.

Asked to stop while it follows (SIGINT, SIGTERM, SIGHUP), the front stops
the run through its corral (its verified stop sequence) and says its exit
code, as a foreground run would.

Nothing here prints: ``cli`` reports what ``follow`` returns or raises
(``background.NotReady``: the run never started; ``OSError``).
"""

import _signal  # not signal: the same numbers without enum's start-up cost
import os
import select
import time
from collections.abc import Callable

from ..common.plainclass import field, plainclass

_STOP_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)


@plainclass
class Yielded:
    run_id: str
    #: The run's exit code; None: still running, handed back.
    exit_code: int | None
    #: Bytes of its output passed on (the log's offset to read on from).
    cursor: int
    #: The run's corral's own lines, once it has ended (as a plain run prints them on stderr).
    report: bytes = b""
    #: Why the session's holder did not start the run, where it did not (``Started.warnings``).
    warnings: list[str] = field(default_factory=list)
    #: The output log's path.
    log: str = ""


def follow(request, run_here, sink: Callable[[bytes], None]) -> Yielded:
    """Start ``request`` (``yield_after`` set, in a session) as a background run
    and follow it for ``request.yield_after`` seconds (see the module's doc)."""
    from . import background

    bg = request.background
    deadline = time.monotonic() + request.yield_after
    try:
        started = background.launch(request, run_here, keep_corral=True)
    except background.EndedEarly as exc:  # ended before the front saw it start: an end within the yield
        run_id, log = request.spec.run_id, bg.log
        cursor = _copy_log(log, 0, sink)
        return Yielded(run_id, exc.exit_code, cursor, _take_report(log, run_id), log=log)
    corral = started.corral
    assert corral is not None
    asked: list[int] = []
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    previous_wakeup = _signal.set_wakeup_fd(wake_w)
    previous = {sig: _signal.signal(sig, lambda signum, frame: asked.append(signum)) for sig in _STOP_SIGNALS}
    log_fd = os.open(started.log, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    from ..kernel.inotify import IN_MODIFY, Inotify

    grew = Inotify()
    try:
        grew.watch(f"/proc/self/fd/{log_fd}", IN_MODIFY)
        cursor = 0
        while True:
            cursor += _drain(log_fd, sink)
            code = corral.ended()
            if code is None and asked:
                code = background._stop(request, corral)
            if code is not None:
                cursor += _drain(log_fd, sink)
                report = _take_report(started.log, started.run_id)
                return Yielded(started.run_id, code, cursor, report, started.warnings, started.log)
            left = deadline - time.monotonic()
            if left <= 0:
                return Yielded(started.run_id, None, cursor, b"", started.warnings, started.log)
            poller = select.poll()
            for fd in (grew.fileno(), corral.wait_fd(), wake_r):
                poller.register(fd, select.POLLIN)
            poller.poll(left * 1000 + 1)
            grew.read()
            _empty(wake_r)
    finally:
        grew.close()
        os.close(log_fd)
        for sig, handler in previous.items():
            _signal.signal(sig, handler)
        _signal.set_wakeup_fd(previous_wakeup)
        os.close(wake_r)
        os.close(wake_w)
        corral.close()


def _drain(fd: int, sink: Callable[[bytes], None]) -> int:
    passed = 0
    while chunk := os.read(fd, 65536):
        sink(chunk)
        passed += len(chunk)
    return passed


def _empty(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _copy_log(path: str, start: int, sink: Callable[[bytes], None]) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        os.lseek(fd, start, os.SEEK_SET)
        return _drain(fd, sink)
    finally:
        os.close(fd)


def _take_report(log: str, run_id: str) -> bytes:
    """The run's corral's own lines, read once and removed (the front shows them)."""
    from ..state.registry import report_path

    path = report_path(os.path.dirname(log), run_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass


def write_if_absent(facts: dict, path: str) -> None:
    """``facts`` as the file ``path`` (0600) unless something is there already: the
    run's own record, written by its corral had it ended meanwhile, is never replaced."""
    import tempfile

    from ..common import jsoncodec

    fd, tmp = tempfile.mkstemp(prefix=".corral-handback-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(jsoncodec.dumps(facts, sort_keys=True).encode() + b"\n")
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
