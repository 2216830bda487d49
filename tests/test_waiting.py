"""A waiting run costs nothing: while the command sleeps, corral sleeps too.

corral's own CPU time (and its children's: the command is a ``sleep``, which
spends none) is read by the kernel's accounting of a child that has exited
(``wait4``): a run that waits 5 s longer must not cost corral measurably more
CPU (each side the least of two runs, against the noise of a busy machine).
Polling /proc every 0.2 s (what this guards against) cost 2-4 % of a core, and
a caller's ``ulimit -t`` ended corral before its run.
"""

import os
import subprocess

import pytest

from conftest import CORRAL
from modes import mode_flags

#: CPU seconds corral may spend more for 5 s more of waiting: under 1 % of a core.
SLACK = 0.04


def _cpu_of(argv: list[str]) -> float:
    """User + system CPU seconds of ``argv`` and everything it waited for."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, proc.stderr.read()
    proc.stderr.close()
    return usage.ru_utime + usage.ru_stime


@pytest.mark.parametrize("mode", ["fallback", pytest.param("pidns", marks=pytest.mark.pidns)])
def test_a_waiting_run_spends_no_cpu(mode):
    flags = [*mode_flags(mode), "--quiet", "--wall", "60s", "--"]
    short = min(_cpu_of([*CORRAL, *flags, "sleep", "0.2"]) for _ in range(2))
    long = min(_cpu_of([*CORRAL, *flags, "sleep", "5.2"]) for _ in range(2))
    assert long - short < SLACK, f"5 s more of waiting cost corral {long - short:.3f} s of CPU"
