"""Every signal that would end corral ends the run instead (issue 13, item 2).

corral gets the signal once its command runs; it must stop the run, prove
it empty and exit 128+N, leaving nothing behind — in the fallback the run
would otherwise go on with no limit at all.
"""

import json
import os
import signal
import subprocess
import time

import pytest
from tethers import tether_kind  # noqa: F401  (the fixture: both tether programs)

from conftest import CORRAL, TIME_SCALE
from corral_systemd.kernel.signals import CHILD_DEFAULTS, stop_signals
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

#: Signals whose default action ends a process and that corral catches.
CAUGHT = [
    "SIGHUP",
    "SIGINT",
    "SIGTERM",
    "SIGQUIT",
    "SIGUSR1",
    "SIGUSR2",
    "SIGALRM",
    "SIGVTALRM",
    "SIGPROF",
    "SIGIO",
    "SIGPWR",
    "SIGSTKFLT",
    "SIGXCPU",
    "SIGTRAP",
    "SIGABRT",
    "SIGRTMIN",
    "SIGRTMAX",
]


def _wait_for(predicate, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("name", CAUGHT)
def test_signal_to_corral_stops_the_run(tmp_path, name):
    sig = int(getattr(signal, name))
    marker = new_marker()
    record = tmp_path / "record.json"
    env = dict(os.environ, **{MARKER_ENV: marker})
    argv = [
        *CORRAL,
        "--cgroup-mode",
        "fallback",
        "--wall",
        "60s",
        "--json",
        str(record),
        "--",
        "sh",
        "-c",
        "setsid sleep 600 & sleep 600",
    ]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert _wait_for(lambda: len(marked_pids(marker)) >= 3), "the command did not start"
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=30)
        survivors = marked_pids(marker)
    finally:
        proc.kill()
        proc.wait()
        kill_marked(marker)
    detail = err.decode(errors="replace")
    assert proc.returncode == 128 + sig, detail
    assert survivors == [], detail
    data = json.loads(record.read_text())
    assert data["outcome"] == "interrupted" and data["corral_signal"] == sig
    assert data["verified"] is True
    assert f"interrupted by signal {sig}" in detail


def test_caught_signals_are_every_terminating_one_but_faults():
    caught = set(stop_signals())
    assert {int(getattr(signal, n)) for n in CAUGHT} <= caught
    # Faults in corral itself keep their default action; SIGPIPE/SIGXFSZ stay ignored.
    for name in (
        "SIGSEGV",
        "SIGBUS",
        "SIGILL",
        "SIGFPE",
        "SIGSYS",
        "SIGPIPE",
        "SIGXFSZ",
        "SIGKILL",
        "SIGSTOP",
        "SIGCHLD",
        "SIGCONT",
        "SIGWINCH",
    ):
        assert int(getattr(signal, name)) not in caught, name
    assert set(range(signal.SIGRTMIN, signal.SIGRTMAX + 1)) <= caught


def test_the_command_starts_with_default_dispositions(tmp_path):
    """What corral catches (or Python ignores) is back at its default in the command."""
    out = tmp_path / "sigs"
    script = f"grep -E '^Sig(Cgt|Ign):' /proc/self/status > {out}"
    run = subprocess.run(
        [*CORRAL, "--cgroup-mode", "fallback", "--no-registry", "--", "sh", "-c", script],
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0, run.stderr
    masks = dict(line.split(":") for line in out.read_text().split("\n") if line)
    # sh itself may catch or ignore a few; none of corral's must leak through except what sh sets.
    ignored = int(masks["SigIgn"].strip(), 16)
    for sig in CHILD_DEFAULTS:
        if sig in (signal.SIGINT, signal.SIGQUIT):  # a non-interactive sh may ignore these for & jobs
            continue
        assert not ignored & (1 << (sig - 1)), f"signal {sig} ignored in the command"


#: The command stops corral (``kill -STOP $PPID``: a process of its uid may), once, or again
#: and again as each continue comes.
STOP_CORRAL = {
    "once": "kill -STOP $PPID; exec sleep 1000",
    "again-and-again": "while :; do kill -STOP $PPID 2>/dev/null; sleep 0.05; done",
}


@pytest.mark.parametrize("how", sorted(STOP_CORRAL))
@pytest.mark.parametrize(
    "tier",
    [
        "subreaper",
        pytest.param("pidns", marks=pytest.mark.pidns),
        pytest.param("cgroup-parent", marks=pytest.mark.cgroupv2),
        "cgroup-without-pidns",
    ],
)
def test_a_command_that_stops_corral_still_meets_its_deadline(tmp_path, tier, how, tether_kind):
    """corral SIGSTOPped by its own command: the run still ends at its deadline and
    the caller gets its answer (124, the run's processes gone). In the subreaper and
    cgroup tiers the tether's one timed wake continues corral (and, stopped again,
    stops the run itself), and the record says corral was stopped; in a pid namespace
    (the pidns tier, the cgroup tier where it can have one) the command cannot reach
    corral at all ($PPID is the namespace's init)."""
    from modes import mode_flags

    if tier == "pidns" and tether_kind == "python":
        pytest.skip("the pidns tier has no tether: once")
    flags = {"subreaper": ["--guarantee", "subreaper"], "cgroup-without-pidns": ["--guarantee", "cgroup"]}
    marker = new_marker()
    record = tmp_path / "record.json"
    argv = [*CORRAL, *(flags.get(tier) or mode_flags(tier)), "--wall", "2s", "--grace", "0.5s", "--json", str(record)]
    argv += ["--", "sh", "-c", STOP_CORRAL[how]]
    if tier == "cgroup-without-pidns":
        # A delegated subtree of its own below which no pid namespace can be had: the command reaches corral.
        import delegated

        if (why := delegated.unavailable()) is not None:
            pytest.skip(why)
        argv = delegated.program(argv, pid_namespaces=False)
    proc = subprocess.Popen(
        argv,
        env=dict(os.environ, **{MARKER_ENV: marker}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = proc.communicate(timeout=60 * TIME_SCALE)  # a stopped corral would hang here
        assert proc.returncode == 124, err
        r = json.loads(record.read_text())
        assert r["verified"] is True and r["outcome"] == "timeout", r
        if "namespace" not in r["engine"].get("pid_namespace", {}):  # else its $PPID is the namespace's init
            assert any("corral itself was stopped" in w for w in r["warnings"]), r["warnings"]
        assert marked_pids(marker) == []
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
        kill_marked(marker)
