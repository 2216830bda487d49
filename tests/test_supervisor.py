"""The supervisor's guarantees, driven in-process with the real fallback engine."""

import os
import time

from corral_systemd.engines.fallback import FallbackEngine
from corral_systemd.spec import RunSpec
from corral_systemd.supervisor import Supervisor
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker


def _run_with_broken_kill(tmp_path):
    marker = new_marker()
    spec = RunSpec(argv=["sh", "-c", "setsid sleep 3600 & sleep 3600"], wall=0.3, grace=0.1, verify_timeout=0.3,
                   env=dict(os.environ, **{MARKER_ENV: marker}))
    engine = FallbackEngine(spec)
    engine.signal_all = lambda *sigs: 0  # signals go nowhere: nothing can stop the run
    engine.signal_new = lambda *sigs: 0
    engine.kill_all = lambda: None
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        result = Supervisor(spec, engine, stdout=devnull, stderr=devnull).run()
    finally:
        os.close(devnull)
    return result, marker


def test_unprovable_stop_is_120_with_remaining_pids(tmp_path):
    result, marker = _run_with_broken_kill(tmp_path)
    try:
        alive = marked_pids(marker)
        assert alive, "test setup: the run's processes should still be alive"
        assert result.exit_code == 120
        assert not result.verified
        assert set(alive) <= set(result.remaining_pids)
    finally:
        from corral_systemd.kernel.prctl import set_child_subreaper

        set_child_subreaper(False)  # the engine made this test process a subreaper
        kill_marked(marker)
        # reap what we (the test process, their subreaper) inherited
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if os.waitpid(-1, os.WNOHANG) == (0, 0):
                    time.sleep(0.01)
            except ChildProcessError:
                break
