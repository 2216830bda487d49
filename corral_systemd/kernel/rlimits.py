"""corral's own resource limits, which the command can lower.

The command runs as corral's uid, so it may ``prlimit --pid`` its parent:
with ``RLIMIT_NOFILE`` at 4, corral could open nothing (no /proc scan, no
pidfd, no record), and it would fail in the middle of its stop. ``OwnLimits``
remembers corral's soft limits as they were when the run started (the
command inherited those; they are never changed before it has started) and
``restore()`` puts back any the command lowered, as far as the hard limit
allows (a soft limit may be raised up to it without privilege). A hard limit
lowered under what corral needs cannot be raised again: whatever then fails
is the supervisor's to catch (the stop and the proof still run; 120).
"""

import resource

from .fsread import SHORTAGE

#: The limits whose lowering stops corral from working: descriptors, processes (the
#: tether, a child supervisor), address space (Python's allocations).
WATCHED = (resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC, resource.RLIMIT_AS)


class OwnLimits:
    def __init__(self):
        self._soft = {which: resource.getrlimit(which)[0] for which in WATCHED}
        #: The limits found lowered and put back (for the record).
        self.restored: set[str] = set()

    def restore(self) -> bool:
        """Put back what was lowered; True if this call raised any limit
        (what just failed for want of it may be tried again)."""
        raised = False
        for which, soft in self._soft.items():
            try:
                current, hard = resource.getrlimit(which)
                if _below(current, soft):
                    new = soft if not _below(hard, soft) else hard
                    resource.setrlimit(which, (new, hard))
                    self.restored.add(_NAMES[which])
                    raised = raised or _below(current, new)
            except (OSError, ValueError):
                pass  # cannot: what fails for it is caught where it fails
        return raised

    def retrying(self, fn, last_resort=None):
        """``fn`` made to survive the command lowering these limits while it
        runs: a call that fails for want of one (EMFILE, EAGAIN, ENOMEM,
        MemoryError) is tried again after ``restore`` raised it -- at most
        ``RETRIES`` times in a row, so a command that wins every race cannot
        hold corral in a loop. A command that lowers them over and over wins
        most races (a /proc scan opens a file per process): then
        ``last_resort()`` (what stops the command without a descriptor; True
        if it did something) is called once and as many tries follow. Then,
        or when nothing was lowered, the error is raised."""

        def call(*args, **kwargs):
            for round_ in (1, 2):
                for _ in range(RETRIES):
                    try:
                        return fn(*args, **kwargs)
                    except (OSError, MemoryError) as exc:
                        if not lowered_limit(exc) or not self.restore():
                            raise
                if round_ == 1 and not (last_resort is not None and last_resort()):
                    break
            return fn(*args, **kwargs)

        return call


#: How many times in a row a call is tried again after the limits were put back.
RETRIES = 100


def lowered_limit(exc: BaseException) -> bool:
    """``exc`` is what a watched limit set too low makes a call raise."""
    return isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno in SHORTAGE)


def _below(value: int, other: int) -> bool:
    """``value`` is a lower limit than ``other`` (RLIM_INFINITY is the highest)."""
    if value == resource.RLIM_INFINITY:
        return False
    return other == resource.RLIM_INFINITY or value < other


_NAMES = {resource.RLIMIT_NOFILE: "nofile", resource.RLIMIT_NPROC: "nproc", resource.RLIMIT_AS: "as"}
