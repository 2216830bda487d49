"""The supervisor's decisions, driven through a scripted engine (fake_engine.py).

No process is started: what is asserted is what the supervisor asked the
engine to do (which signals, in which order, after how long by its own
step timings) and what it concluded (reason, verified, exit code). The
same sequences run against real engines in test_supervisor.py and the
fault matrix; these pin the logic down fast and can fail on its own.
"""

import signal

from fake_engine import DIES_ON_TERM, IGNORES_TERM, UNKILLABLE, FakeEngine

from corral_systemd.core.spec import RunSpec
from corral_systemd.core.supervisor import Supervisor


def _run(engine, **spec):
    spec.setdefault("grace", 0.2)
    spec.setdefault("verify_timeout", 0.3)
    out = Supervisor(RunSpec(argv=["fake"], **spec), engine, stdout=lambda b: None, stderr=lambda b: None).run()
    assert engine.closed
    return out


def test_main_exits_alone_nothing_is_signalled():
    engine = FakeEngine(main_exits_after=0.05, main_status=3)
    out = _run(engine)
    assert (out.reason, out.exit_code, out.verified) == ("exited", 3, True)
    assert engine.sent == [] and "term_sent" not in out.steps


def test_left_behind_processes_get_term_and_cont_then_are_proven_gone():
    engine = FakeEngine(main_exits_after=0.05, others={2000: DIES_ON_TERM})
    out = _run(engine)
    assert engine.signals() == [signal.SIGTERM, signal.SIGCONT]  # CONT wakes a stopped process to die
    assert (out.exit_code, out.verified) == (0, True)
    assert "kill_sent" not in out.steps


def test_a_process_ignoring_term_is_killed_after_the_grace_period():
    engine = FakeEngine(main_exits_after=0.05, others={2000: IGNORES_TERM})
    out = _run(engine, grace=0.3)
    assert engine.signals()[:2] == [signal.SIGTERM, signal.SIGCONT] and engine.signals()[-1] == signal.SIGKILL
    waited = out.steps["kill_sent"] - out.steps["term_sent"]
    assert 0.3 <= waited < 0.3 + 0.5, out.steps  # the grace period, by the record's own clock
    assert (out.exit_code, out.verified) == (0, True)


def test_wall_limit_stops_the_run_124():
    engine = FakeEngine(others={2000: DIES_ON_TERM})
    out = _run(engine, wall=0.2)
    assert (out.reason, out.exit_code, out.verified) == ("timeout", 124, True)
    assert out.steps["deadline"] >= 0.2 and out.steps["term_sent"] >= out.steps["deadline"]
    assert engine.signals()[0] == signal.SIGTERM


def test_memory_limit_from_the_engine_is_121():
    engine = FakeEngine(over_limit_after=0.05)
    out = _run(engine)
    assert (out.reason, out.exit_code) == ("memory", 121)
    assert engine.signals()[0] == signal.SIGTERM


def test_what_cannot_be_killed_is_120_and_named():
    engine = FakeEngine(main_exits_after=0.05, others={2000: UNKILLABLE})
    out = _run(engine, verify_timeout=0.2)
    assert (out.exit_code, out.verified, out.remaining_pids) == (120, False, [2000])
    assert engine.signals().count(signal.SIGKILL) >= 2  # the verification loop keeps killing


def test_an_empty_group_with_escaped_processes_is_unproven_120():
    engine = FakeEngine(main_exits_after=0.05, unproven="processes of the run left its control group")
    out = _run(engine)
    assert (out.exit_code, out.verified, out.remaining_pids) == (120, False, [])
    assert any("left its control group" in w for w in out.warnings)
