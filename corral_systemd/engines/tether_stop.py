"""The stop a compiled tether execs when corral is gone or late (packaging/tether/tether.c).

``corral-tether`` does the waiting; the stop stays the one stop sequence in
Python (``common.stopping``, through ``fallback_tether.stop_run`` and
``stop_late``, the code the Python tether runs), in the tether's own process
(its pid, so ``MarkedProcesses`` passes it over; its session; its ignored
signals), with the done pipe at fd 3 and corral's pidfd at fd 4. Run as

    python -I -S -c BOOT PACKAGE_PARENT KIND WHAT GRACE VERIFY_TIMEOUT PHASE

(``fallback_tether._stop_argv``; the tether adds PHASE): KIND and WHAT name the
target (``fallback_tether.stop_target``), PHASE is ``dead`` (end of file on the
pipe: stop the run) or ``late`` (corral continued and still silent: stop the run
in its place, continue corral, then wait for its word as ever). Failure modes:
arguments not as above, exit 125 (nothing is stopped: the tether's caller is
corral's own code, so this is a bug, not input); the stop unproven, exit 1
(corralctl stop and gc find what is left, as for any dead corral's run).
"""

import _signal  # not signal: the same numbers without enum's start-up cost
import sys

from ..kernel.detach import TERMINAL_SIGNALS
from .fallback_tether import CORRAL_FD, DONE_FD, stop_late, stop_run


def main(argv: list[str] | None = None) -> None:
    from ..kernel.prctl import set_dumpable

    set_dumpable(False)  # its exec made it dumpable: the run's commands are of its uid (corral's pidfd at fd 4)
    args = sys.argv[2:] if argv is None else argv
    for sig in TERMINAL_SIGNALS:  # kept across the exec; said again, not relied upon
        _signal.signal(sig, _signal.SIG_IGN)
    try:
        kind, what, grace, verify_timeout, phase = args
        stop = {"dead": stop_run, "late": _stop_late}[phase]
        target, grace_s, verify_s = (kind, what), float(grace), float(verify_timeout)
        if kind not in ("marked", "cgroup"):
            raise ValueError(kind)
    except (ValueError, KeyError):
        sys.exit(125)
    try:
        stop(target, grace_s, verify_s)
    except Exception:
        sys.exit(1)
    sys.exit(0)


def _stop_late(target: tuple[str, str], grace: float, verify_timeout: float) -> None:
    stop_late(target, grace, verify_timeout, DONE_FD, CORRAL_FD)
