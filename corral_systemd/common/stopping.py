"""The stop sequence, written once: TERM (with CONT, so a stopped process
can act on it), the grace period, KILL, then verification -- kill whatever
appears and look again until the target is proven empty or the time for
verification is up.

Two callers: the supervisor, for the run it owns (its engine is the
target), and corralctl, for what a dead corral left behind
(``ctl.reclaim``'s targets: a unit, a cgroup, a fallback run's sessions).

Guarantees: whatever the target lists when the sequence starts gets TERM
and CONT (with a grace period of 0: KILL at once, and no TERM); what is
born during the grace period gets them as it is seen (``signal_new``);
whatever is still listed after the grace period gets KILL, and so does
whatever appears during verification. The outcome is
``verified`` only if the target's ``verify_empty()`` returned ``[]`` and its
``unproven()`` had nothing to say.

Failure modes: nothing here raises on the target's behalf; a target that
cannot look (a lost manager) says so through ``verify_empty()`` (``[-1]``:
not empty, no pid to name) and the outcome is unverified.
"""

import _signal  # not signal: the same numbers without enum's start-up cost
import time

from .plainclass import field, plainclass

#: Looks at growing intervals: fast for the common case (everything died
#: at once), cheap for a slow shutdown.
FIRST_RECHECK = 0.0005
MAX_RECHECK = 0.05


TYPE_CHECKING = False  # typing is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol

    class StopTarget(Protocol):
        """What the sequence stops: ``engines.base.Engine`` is one."""

        def remaining(self) -> list[int]:
            """The target's processes now (cheap; for the loop)."""
            ...

        def signal_all(self, *sigs: int) -> int:
            """Send each of ``sigs`` to every process of the target; return how many."""
            ...

        def signal_new(self, *sigs: int) -> int:
            """Send ``sigs`` to processes of the last ``remaining()`` not yet signalled."""
            ...

        def kill_all(self) -> None:
            """SIGKILL every process of the target."""
            ...

        def verify_empty(self) -> list[int]:
            """Kernel (or manager) proof: ``[]`` if the target is empty, else what is left."""
            ...

        def unproven(self) -> str | None:
            """Why an empty target still does not prove the run gone, else None."""
            ...


@plainclass
class StopOutcome:
    """How a stop ended: every process proven gone, or what was left."""

    verified: bool
    #: What was left when verification gave up (``[]`` when verified or unproven).
    remaining: list[int] = field(default_factory=list)
    #: Set when the target was empty but could not prove the run gone.
    unproven: str | None = None


def _no_step(name: str, **data) -> None:
    pass


def stop_and_verify(
    target: "StopTarget",
    *,
    grace: float,
    verify_timeout: float,
    wait: "Callable[[float], bool]",
    step: "Callable[..., None]" = _no_step,
    clock: "Callable[[], float]" = time.monotonic,
) -> StopOutcome:
    """Stop ``target`` and prove it empty.

    ``wait(seconds)`` sleeps (the supervisor also pumps output meanwhile) and
    returns True when the stop was asked for again: the rest of the grace
    period is skipped. ``step(name, **data)`` records "term_sent",
    "kill_sent", "verified" and "unverified" as they happen.
    """
    if grace <= 0:
        # No grace period: SIGKILL at once, nothing is told first (benchmark
        # runners' immediate kill).
        if left := target.remaining():
            step("kill_sent", pids=sorted(left))
            target.kill_all()
    elif left := target.remaining():
        step("term_sent", pids=sorted(left))
        target.signal_all(_signal.SIGTERM, _signal.SIGCONT)
        grace_end = clock() + grace
        recheck = FIRST_RECHECK
        while target.remaining():
            time_left = grace_end - clock()
            if time_left <= 0:
                break
            target.signal_new(_signal.SIGTERM, _signal.SIGCONT)  # born since the TERM round
            if wait(min(recheck, time_left)):
                break  # asked again: do not wait out the grace period
            recheck = min(recheck * 2, MAX_RECHECK)
        if left := target.remaining():
            step("kill_sent", pids=sorted(left))
            target.kill_all()
    # Verification: keep killing what appears (fork chains) and looking
    # until the target is proven empty, within verify_timeout.
    verify_end = clock() + verify_timeout
    recheck = FIRST_RECHECK
    while True:
        left = target.verify_empty()
        if not left and (why := target.unproven()) is not None:
            # Empty, but processes of the run left it while alive (killed
            # since): no proof for what they started elsewhere.
            step("unverified", remaining=[])
            return StopOutcome(verified=False, unproven=why)
        if not left:
            step("verified")
            return StopOutcome(verified=True)
        if clock() >= verify_end:
            step("unverified", remaining=sorted(left))
            return StopOutcome(verified=False, remaining=sorted(left))
        target.kill_all()
        wait(min(recheck, max(0.0, verify_end - clock())))
        recheck = min(recheck * 2, MAX_RECHECK)
