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

#: The limits whose lowering stops corral from working: descriptors, processes (the
#: tether, a child supervisor), address space (Python's allocations).
WATCHED = (resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC, resource.RLIMIT_AS)


class OwnLimits:
    def __init__(self):
        self._soft = {which: resource.getrlimit(which)[0] for which in WATCHED}
        #: The limits found lowered and put back (for the record).
        self.restored: set[str] = set()

    def restore(self) -> None:
        for which, soft in self._soft.items():
            try:
                current, hard = resource.getrlimit(which)
                if _below(current, soft):
                    resource.setrlimit(which, (soft if not _below(hard, soft) else hard, hard))
                    self.restored.add(_NAMES[which])
            except (OSError, ValueError):
                pass  # cannot: what fails for it is caught where it fails


def _below(value: int, other: int) -> bool:
    """``value`` is a lower limit than ``other`` (RLIM_INFINITY is the highest)."""
    if value == resource.RLIM_INFINITY:
        return False
    return other == resource.RLIM_INFINITY or value < other


_NAMES = {resource.RLIMIT_NOFILE: "nofile", resource.RLIMIT_NPROC: "nproc", resource.RLIMIT_AS: "as"}
