"""The supervisor's guarantees, driven in-process with the real fallback engine."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

from conftest import CORRAL
from corral_systemd.core.spec import RunSpec
from corral_systemd.core.supervisor import RunObserver, Supervisor
from corral_systemd.engines.fallback import FallbackEngine
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker


def _run_with_broken_kill(tmp_path):
    marker = new_marker()
    spec = RunSpec(
        argv=["sh", "-c", "setsid sleep 3600 & sleep 3600"],
        wall=0.3,
        grace=0.1,
        verify_timeout=0.3,
        env=dict(os.environ, **{MARKER_ENV: marker}),
    )
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


# -- the stop sequence and the drain, step by step (issue 15, "Test strength") --------------------
# Each test below goes red against one mutant that every other host test let
# pass. Bounds are on the record's own step timings, never on the wall time
# of a whole process (the machine may be loaded).


class _Hooks(RunObserver):
    """Calls ``on[name](data)`` at each step, and ``on_tick(processes)`` every 50 ms
    from a thread of the test's own while the command runs (the supervisor tells
    its observer nothing between steps: a waiting run reads nothing), with the
    processes carrying the run's marker (``marker``, set by ``_supervise``)."""

    def __init__(self, on=None, on_tick=None):
        self.on = on or {}
        self.on_tick = on_tick
        self.marker: str | None = None
        self._done = threading.Event()

    def event(self, name, data):
        if name == "started" and self.on_tick is not None:
            threading.Thread(target=self._ticks, daemon=True).start()
        if name in ("command_exited", "finished"):
            self._done.set()
        if name in self.on:
            self.on[name](data)

    def _ticks(self):
        from corral_systemd.kernel.procfs import read_stat

        while not self._done.wait(0.05):
            self.on_tick([info for pid in marked_pids(self.marker) if (info := read_stat(pid)) is not None])


def _supervise(argv, *, marker, stdout=None, observer=None, cancel_fd=None, engine_hook=None, **limits):
    """Run ``argv`` in-process on the fallback engine; afterwards undo what running it did to this process."""
    spec = RunSpec(argv=argv, env=dict(os.environ, **{MARKER_ENV: marker}), **limits)
    if isinstance(observer, _Hooks):
        observer.marker = marker
    engine = FallbackEngine(spec)
    if engine_hook is not None:
        engine_hook(engine)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        return Supervisor(
            spec,
            engine,
            stdout=stdout if stdout is not None else devnull,
            stderr=devnull,
            observer=observer,
            cancel_fd=cancel_fd,
        ).run()
    finally:
        os.close(devnull)
        from corral_systemd.kernel.prctl import set_child_subreaper

        set_child_subreaper(False)
        # What a broken stop left (a mutant's run) was re-parented to this process: kill it, wait
        # until none is alive, then reap it, so no zombie of ours outlives the test.
        deadline = time.monotonic() + 5
        while kill_marked(marker) or marked_pids(marker):
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        try:
            while os.waitpid(-1, os.WNOHANG) != (0, 0):
                pass
        except ChildProcessError:
            pass


def test_a_second_stop_request_skips_the_rest_of_the_grace_period(tmp_path):
    """Stop asked once: TERM, then the grace period. Asked again during it: SIGKILL at once."""
    ready = tmp_path / "ready"
    cancel_r, cancel_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    asked = []

    def ask_once_ready(_processes):
        if ready.exists() and not asked:
            asked.append(1)
            os.write(cancel_w, b"x")  # first request: TERM, then wait out the grace

    hooks = _Hooks(on={"term_sent": lambda _data: os.write(cancel_w, b"x")}, on_tick=ask_once_ready)
    marker = new_marker()
    try:
        result = _supervise(
            ["sh", "-c", f"trap '' TERM; touch {ready}; sleep 600"],
            marker=marker,
            observer=hooks,
            cancel_fd=cancel_r,
            wall=60,
            grace=8,
            verify_timeout=5,
        )
    finally:
        os.close(cancel_r)
        os.close(cancel_w)
    steps = result.steps
    assert result.verified and result.reason == "interrupted", result
    assert "kill_sent" in steps, steps  # the command ignores TERM
    assert steps["kill_sent"] - steps["term_sent"] < 3.0, f"the second request did not skip the grace: {steps}"


def test_a_second_signal_to_corral_skips_the_grace_period(tmp_path):
    """The CLI: SIGTERM, then SIGINT while the grace period runs: straight to SIGKILL."""
    state = tmp_path / "state"
    record = tmp_path / "record.json"
    ready = tmp_path / "ready"
    marker = new_marker()
    env = dict(os.environ, CORRAL_STATE_DIR=str(state), **{MARKER_ENV: marker})
    proc = subprocess.Popen(
        [
            *CORRAL,
            "--cgroup-mode",
            "fallback",
            "--grace",
            "8s",
            "--wall",
            "120s",
            "--json",
            str(record),
            "--",
            "sh",
            "-c",
            f"trap '' TERM INT; touch {ready}; sleep 600",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def wait_for(predicate, what):
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if predicate():
                return
            time.sleep(0.01)
        raise AssertionError(f"{what} did not happen")

    def term_logged():
        return any('"event":"term_sent"' in p.read_text() for p in state.glob("*.log"))

    try:
        wait_for(ready.exists, "the command's start")
        proc.send_signal(signal.SIGTERM)
        wait_for(term_logged, "term_sent")
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
        kill_marked(marker)
    data = json.loads(record.read_text())
    steps = data["steps"]
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert data["verified"] is True and "kill_sent" in steps, data
    assert steps["kill_sent"] - steps["term_sent"] < 3.0, f"the second signal did not skip the grace: {steps}"


_STOPPED_CHILD = """
import os, signal, sys
out = sys.argv[1]
os.setsid()  # its own session: the shell's death does not make the kernel SIGCONT it (orphaned group)
def on_term(signum, frame):
    with open(out, "w") as f:
        f.write("TERM handled")
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
open(out + ".ready", "w").close()
os.kill(os.getpid(), signal.SIGSTOP)
while True:
    signal.pause()
"""


def test_a_stopped_process_gets_sigcont_with_sigterm_and_handles_it(tmp_path):
    """A SIGSTOPped child with a TERM handler: SIGCONT comes with SIGTERM, so it cleans up within the grace."""
    child = tmp_path / "child.py"
    child.write_text(_STOPPED_CHILD)
    out = tmp_path / "handled"
    cancel_r, cancel_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    asked = []

    def stop_once_stopped(processes):
        if not asked and (tmp_path / "handled.ready").exists() and any(p.state == "T" for p in processes):
            asked.append(1)
            os.write(cancel_w, b"x")

    marker = new_marker()
    try:
        result = _supervise(
            ["sh", "-c", f"{sys.executable} {child} {out} & wait"],
            marker=marker,
            observer=_Hooks(on_tick=stop_once_stopped),
            cancel_fd=cancel_r,
            wall=60,
            grace=4,
            verify_timeout=5,
        )
    finally:
        os.close(cancel_r)
        os.close(cancel_w)
    assert asked, "test setup: the child never showed as stopped"
    assert result.verified, result
    assert out.exists() and out.read_text() == "TERM handled", (
        f"the stopped child never ran its TERM handler: {result.steps}"
    )
    assert "kill_sent" not in result.steps, f"SIGKILL was needed: {result.steps}"


def _held_stdout(held):
    """An engine hook: keep a copy of the command's stdout pipe, as a process outside the run would.

    A watchdog lets go of it after 6 s, so a drain without a limit fails the
    test instead of hanging it."""

    def hook(engine):
        start = engine.start

        def start_holding(argv, **kw):
            held.append(os.dup(kw["stdout"]))
            watchdog = threading.Timer(6.0, _let_go, (held,))
            watchdog.daemon = True
            watchdog.start()
            return start(argv, **kw)

        engine.start = start_holding

    return hook


def _let_go(held):
    while held:
        try:
            os.close(held.pop())
        except (IndexError, OSError):
            pass


def test_a_pipe_held_outside_the_run_delays_the_result_at_most_the_drain_limit():
    """The run is proven empty, but something outside it holds stdout open forever:
    corral reads on for the drain limit (0.5 s), not longer."""
    held, chunks = [], []
    marker = new_marker()
    try:
        result = _supervise(
            ["sh", "-c", "echo main"],
            marker=marker,
            stdout=chunks.append,
            engine_hook=_held_stdout(held),
            wall=60,
            grace=1,
            verify_timeout=5,
        )
    finally:
        _let_go(held)
    steps = result.steps
    assert result.verified and result.exit_code == 0, result
    assert b"".join(chunks) == b"main\n"
    drained = steps["finished"] - steps["verified"]
    assert drained < 1.2, f"drained {drained:.2f}s for a pipe held outside the run (limit 0.5 s): {steps}"


def test_output_written_after_the_proof_within_the_drain_limit_is_delivered():
    """Late output (from a holder outside the run, 0.2 s after the proof) is read until EOF, then the run ends."""
    held, chunks = [], []

    def write_late(_data):
        def late():
            os.write(held[0], b"late\n")
            _let_go(held)

        threading.Timer(0.2, late).start()

    marker = new_marker()
    try:
        result = _supervise(
            ["sh", "-c", "echo main"],
            marker=marker,
            stdout=chunks.append,
            observer=_Hooks(on={"verified": write_late}),
            engine_hook=_held_stdout(held),
            wall=60,
            grace=1,
            verify_timeout=5,
        )
    finally:
        time.sleep(0.3)  # the timer is done with its descriptor
        _let_go(held)
    steps = result.steps
    assert result.verified and result.exit_code == 0, result
    assert b"".join(chunks) == b"main\nlate\n", f"late output lost: {chunks}; {steps}"
    assert steps["finished"] - steps["verified"] < 1.2, steps


_SLOW_CLEANUP = """
import os, signal, sys, time
out = sys.argv[1]
def on_term(signum, frame):
    time.sleep(0.5)  # a cleanup that takes a while, well within the grace period
    with open(out, "w") as f:
        f.write("cleaned up")
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
open(out + ".ready", "w").close()
while True:
    signal.pause()
"""


def test_the_grace_period_lets_a_slow_cleanup_finish(tmp_path):
    """SIGTERM, then the grace period: a TERM handler that needs 0.5 s finishes before any SIGKILL."""
    script = tmp_path / "slow.py"
    script.write_text(_SLOW_CLEANUP)
    out = tmp_path / "cleaned"
    cancel_r, cancel_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    asked = []

    def stop_once_ready(_processes):
        if not asked and (tmp_path / "cleaned.ready").exists():
            asked.append(1)
            os.write(cancel_w, b"x")

    marker = new_marker()
    try:
        result = _supervise(
            [sys.executable, str(script), str(out)],
            marker=marker,
            observer=_Hooks(on_tick=stop_once_ready),
            cancel_fd=cancel_r,
            wall=60,
            grace=5,
            verify_timeout=5,
        )
    finally:
        os.close(cancel_r)
        os.close(cancel_w)
    assert asked and result.verified, result
    assert out.exists(), f"SIGKILLed before its cleanup finished: {result.steps}"
    assert "kill_sent" not in result.steps, result.steps
    assert result.steps["verified"] - result.steps["term_sent"] >= 0.4, result.steps
