"""The stop sequence alone (``stopping.stop_and_verify``), on a target
whose processes are a dict and a clock that only moves when waited on:
what is signalled when, and what the outcome claims."""

import signal

from corral_systemd.common.stopping import stop_and_verify


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeTarget:
    """pid -> the signals that end it (a process ignoring TERM has {KILL})."""

    def __init__(self, procs: dict, clock: FakeClock, born_at: dict | None = None, stuck=False):
        self.procs = dict(procs)
        self.clock = clock
        self.born_at = dict(born_at or {})  # pid -> (time, signals that end it)
        self.stuck = stuck  # KILL does not empty it (a D-state process)
        self.sent: list[tuple[int, int]] = []
        self._last: list[int] = []

    def _births(self):
        for pid, (when, ends) in list(self.born_at.items()):
            if self.clock() >= when:
                self.procs[pid] = ends
                del self.born_at[pid]

    def _send(self, pids, sigs):
        for pid in pids:
            for sig in sigs:
                self.sent.append((pid, sig))
                if sig in self.procs.get(pid, ()) and not (self.stuck and sig == signal.SIGKILL):
                    del self.procs[pid]

    def remaining(self):
        self._births()
        self._last = sorted(self.procs)
        return self._last

    def signal_all(self, *sigs):
        self._send(self.remaining(), sigs)
        return len(self._last)

    def signal_new(self, *sigs):
        fresh = [p for p in self._last if p in self.procs and all(s != signal.SIGTERM for q, s in self.sent if q == p)]
        self._send(fresh, sigs)
        return len(fresh)

    def kill_all(self):
        self._send(self.remaining(), (signal.SIGKILL,))

    def verify_empty(self):
        return self.remaining()

    def unproven(self):
        return None


def _run(target, clock, *, grace=2.0, verify=1.0, again_at=None):
    steps = []

    def wait(seconds):
        clock.now += seconds
        return again_at is not None and clock.now >= again_at

    outcome = stop_and_verify(
        target,
        grace=grace,
        verify_timeout=verify,
        wait=wait,
        step=lambda name, **data: steps.append((name, round(clock.now, 3), data)),
        clock=clock,
    )
    return outcome, steps


TERM, KILL, CONT = signal.SIGTERM, signal.SIGKILL, signal.SIGCONT


def test_term_ends_it_within_the_grace_period_no_kill():
    clock = FakeClock()
    target = FakeTarget({10: {TERM, KILL}, 11: {TERM, KILL}}, clock)
    outcome, steps = _run(target, clock)
    assert outcome.verified and outcome.remaining == []
    assert [s[0] for s in steps] == ["term_sent", "verified"]
    assert (10, CONT) in target.sent and not any(sig == KILL for _, sig in target.sent)


def test_a_term_ignorer_is_killed_after_the_whole_grace_period():
    clock = FakeClock()
    target = FakeTarget({10: {KILL}}, clock)
    outcome, steps = _run(target, clock, grace=2.0)
    assert outcome.verified
    names = {s[0]: s for s in steps}
    assert names["kill_sent"][1] >= 2.0 and names["kill_sent"][2]["pids"] == [10]


def test_a_second_request_skips_the_rest_of_the_grace_period():
    clock = FakeClock()
    target = FakeTarget({10: {KILL}}, clock)
    outcome, steps = _run(target, clock, grace=60.0, again_at=0.5)
    kill = next(s for s in steps if s[0] == "kill_sent")
    assert outcome.verified and kill[1] < 1.0


def test_a_process_born_in_the_grace_period_gets_term_too():
    clock = FakeClock()
    target = FakeTarget({10: {KILL}}, clock, born_at={20: (0.01, {TERM, KILL})})
    outcome, _ = _run(target, clock, grace=2.0)
    assert outcome.verified and (20, TERM) in target.sent and (20, KILL) not in target.sent


def test_what_never_goes_is_unverified_and_named():
    clock = FakeClock()
    target = FakeTarget({10: {KILL}}, clock, stuck=True)
    outcome, steps = _run(target, clock, grace=0.5, verify=1.0)
    assert not outcome.verified and outcome.remaining == [10]
    assert steps[-1][0] == "unverified" and steps[-1][1] >= 1.5


def test_an_empty_target_that_cannot_prove_the_run_gone_is_not_verified():
    clock = FakeClock()
    target = FakeTarget({}, clock)
    target.unproven = lambda: "a process left the group while alive"
    outcome, steps = _run(target, clock)
    assert not outcome.verified and outcome.unproven == "a process left the group while alive"
    assert [s[0] for s in steps] == ["unverified"]
