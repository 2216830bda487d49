"""Issue 28: the guarantee tiers, and the cgroup tier found without being named.

Each cgroup-tier run starts inside a delegated cgroup v2 subtree of its own
(``tests/delegated.py``: a fresh group as the root of a cgroup namespace,
cgroup2 mounted at /sys/fs/cgroup in a private mount namespace: what a
container with a writable cgroup gives). Proof is what the kernel shows: no
process carrying the run's marker in /proc (``Run.survivors``), and the
subtree removable afterwards (the wrapper exits 99 if anything was left in
it, 97 if a process that was not the run's was touched). A hybrid host's
unified hierarchy has no controllers: the kernel-limit tests run where the
root delegates memory and pids (the VM lane's pure v2 guest).
"""

import os
import sys

import delegated
import pytest
from tethers import tether_kind  # noqa: F401  (the fixture: both tether programs)

from conftest import CORRAL

NO_BUS = {k: v for k, v in os.environ.items() if k not in ("DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR")}
#: auto, with no manager to be found (the user manager asked for, no bus): the ladder starts below "unit".
AUTO = ["--cgroup-mode", "auto", "--manager", "user"]
DAEMONS = "setsid sleep 600 & nohup sleep 600 >/dev/null 2>&1 & (sleep 600 &); sh -c 'trap \"\" TERM; sleep 600' &"


@pytest.fixture
def subtree():
    if (why := delegated.unavailable()) is not None:
        pytest.skip(why)
    return delegated


def _ran_in_the_tier(run):
    out = run.stderr.decode()
    assert run.record is not None, out
    assert run.record["mode"] == "cgroup" and run.record["guarantee"] == "cgroup", run.record
    group = run.record["engine"]["control_group"]
    assert group == f"/sys/fs/cgroup/corral-{run.record['run_id']}", group
    assert out.rstrip().endswith("; guarantee cgroup"), out


def test_auto_finds_the_delegated_subtree_and_stops_every_daemon(corral, subtree):
    run = corral([*AUTO, "--", "sh", "-c", DAEMONS + " echo started"], env=NO_BUS, program=subtree.program(CORRAL))
    assert run.returncode == 0, run.stderr
    assert run.stdout == b"started\n"
    _ran_in_the_tier(run)
    assert run.survivors == []
    assert run.record["verified"] is True and run.record["processes_stopped"] >= 4
    # Why "unit" could not be had; nothing about the cgroup tier, which was had.
    reason = run.record["engine"]["auto_fallback_reason"]
    assert reason.startswith("no user bus") and "cgroup:" not in reason, reason


def test_the_wall_limit_stops_a_term_ignoring_tree(corral, subtree):
    run = corral(
        [*AUTO, "--wall", "1s", "--grace", "0.5s", "--", "sh", "-c", DAEMONS + " sleep 600"],
        env=NO_BUS,
        program=subtree.program(CORRAL),
    )
    assert run.returncode == 124, run.stderr
    _ran_in_the_tier(run)
    assert run.survivors == []
    assert run.record["steps"]["kill_sent"] is not None  # the TERM-ignoring one needed the kill


def test_other_processes_in_the_group_are_left_alone_and_limits_said_watched(corral, subtree):
    run = corral(
        [*AUTO, "--mem", "512M", "--pids", "100", "--", "sh", "-c", "setsid sleep 600 & echo ok"],
        env=NO_BUS,
        program=subtree.program(CORRAL, shared=True),
    )
    assert run.returncode == 0, run.stderr  # 97: the other process was touched; 99: the subtree kept something
    _ran_in_the_tier(run)
    assert run.survivors == []
    if subtree.controllers() >= {"memory", "pids"}:
        # The kernel could have enforced them, but not with a process in the group.
        assert any("holds other processes" in w for w in run.record["warnings"]), run.record["warnings"]
    assert run.record["limits_enforced"] == {"mem": "watch", "pids": "none"}, run.record


def test_kernel_limits_when_corral_is_alone_in_its_group(corral, subtree):
    if not subtree.controllers() >= {"memory", "pids"}:
        pytest.skip("this host's cgroup2 root delegates no memory and pids controllers (hybrid): the VM lane's guest")
    hog = "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])"
    run = corral(
        [*AUTO, "--mem", "64M", "--pids", "50", "--", sys.executable, "-c", hog],
        env=NO_BUS,
        program=subtree.program(CORRAL),
    )
    assert run.returncode == 121, run.stderr
    _ran_in_the_tier(run)
    assert run.record["limits_enforced"] == {"mem": "kernel", "pids": "kernel"}, run.record
    assert run.record["engine"]["memory_events"]["oom_kill"] >= 1, run.record["engine"]
    assert run.survivors == []


def test_two_corrals_in_one_group_at_once(corral, subtree):
    both = ["sh", "-c", '"$@" & a=$!; "$@" & b=$!; wait $a; ra=$?; wait $b; exit $((ra | $?))', "sh", *CORRAL]
    run = corral(
        [*AUTO, "--", "sh", "-c", "setsid sleep 600 & sleep 0.5"],
        env=NO_BUS,
        program=subtree.program(both),
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.decode().count("; guarantee cgroup") == 2, run.stderr
    assert run.survivors == []


def test_a_nested_corral_stays_in_the_outer_runs_group(corral, subtree):
    inner = [*CORRAL, "--json", "-", "--quiet", "--", "true"]
    run = corral([*AUTO, "--", *inner], env=NO_BUS, program=subtree.program(CORRAL))
    assert run.returncode == 0, run.stderr
    _ran_in_the_tier(run)
    record = __import__("json").loads(run.stdout)
    assert record["guarantee"] != "cgroup" and record["nested_in"] == run.record["run_id"], record
    assert "cgroup: nested in corral run" in record["engine"]["auto_fallback_reason"], record["engine"]


def test_a_process_that_moves_out_of_the_run_group_is_killed_and_unverified(corral, subtree):
    """Without a pid namespace (none to be had below the wrapper), a process that
    left the run group could have started others anywhere: killed, and 120."""
    d = "/sys/fs/cgroup/escape-$$"
    escape = f"mkdir -p {d} && sleep 1 && echo $$ >{d}/cgroup.procs && sleep 600"
    program = subtree.program(CORRAL, pid_namespaces=False)
    run = corral([*AUTO, "--", "sh", "-c", f"sh -c '{escape}' & sleep 2"], env=NO_BUS, program=program)
    out = run.stdout.decode() + run.stderr.decode()
    assert run.survivors == [], out
    assert "namespace" not in run.record["engine"]["pid_namespace"], run.record["engine"]
    assert run.returncode == 120, out
    assert run.record["engine"]["escape_tracking"]["escaped_pids"], run.record["engine"]
    assert "left its control group" in out


def test_a_process_that_moves_out_of_the_run_group_stays_in_its_pid_namespace(corral, subtree):
    """With the pid namespace the tier gives where it can, a process that left the run
    group is still in the namespace: the init's end (reaped by corral) proves it gone,
    so the run is verified; it was outside the group's limits, which the run says."""
    d = "/sys/fs/cgroup/escape-$$"
    escape = f"mkdir -p {d} && sleep 1 && echo $$ >{d}/cgroup.procs && exec sleep 600"
    run = corral([*AUTO, "--", "sh", "-c", f"sh -c '{escape}' & sleep 2"], env=NO_BUS, program=subtree.program(CORRAL))
    out = run.stdout.decode() + run.stderr.decode()
    assert run.survivors == [], out
    assert run.record["engine"]["pid_namespace"]["namespace"].startswith("pid:"), run.record["engine"]
    assert run.record["engine"]["escape_tracking"]["escaped_pids"], run.record["engine"]
    assert run.returncode == 0 and run.record["verified"] is True, out
    assert "left its control group while alive" in out and "ended with its pid namespace" in out, out


def test_groups_the_command_made_in_its_own_group_do_not_keep_it(corral, subtree):
    # The command may write its delegated group: a child group it made (and
    # a process moved there) is still the run's, killed, and removed with it.
    cmd = "g=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup); mkdir $g/inner $g/empty && "
    cmd += "sh -c 'echo $$ >'$g/inner/cgroup.procs'; exec sleep 600' & sleep 0.5"
    run = corral([*AUTO, "--", "sh", "-c", cmd], env=NO_BUS, program=subtree.program(CORRAL))
    assert run.returncode == 0, run.stderr  # 99: the subtree could not be removed
    _ran_in_the_tier(run)
    assert run.survivors == [] and run.record["verified"] is True


def test_a_tier_named_that_cannot_be_had_is_one_line_and_125(corral):
    # On a host whose /sys/fs/cgroup is not cgroup2 (or not delegated), as here outside a subtree.
    if (delegated.unavailable() is None) and open("/proc/self/mounts").read().count(" /sys/fs/cgroup cgroup2 "):
        pytest.skip("this process runs in a cgroup2 /sys/fs/cgroup")
    run = corral(["--guarantee", "cgroup", "--", "true"], record=False)
    assert run.returncode == 125
    lines = run.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("corral: --guarantee cgroup: "), lines


@pytest.mark.parametrize(
    "args",
    [
        ["--cgroup-mode", "fallback", "--guarantee", "unit"],
        ["--cgroup-mode", "enforced", "--guarantee", "subreaper"],
        ["--cgroup-parent", "/sys/fs/cgroup", "--guarantee", "pidns"],
        ["--guarantee", "bogus"],
    ],
)
def test_a_combination_that_asks_two_things_is_refused(corral, args):
    run = corral([*args, "--", "true"], record=False)
    assert run.returncode == 125, run.stderr
    assert len(run.stderr.decode().splitlines()) == 1, run.stderr


def test_fallback_mode_is_the_subreaper_as_ever_and_the_record_says_so(corral):
    run = corral(["--cgroup-mode", "fallback", "--", "true"])
    assert run.returncode == 0, run.stderr
    assert run.record["guarantee"] == "subreaper" and run.record["mode"] == "fallback"
    assert "auto_fallback_reason" not in run.record["engine"] or not run.record["engine"]["auto_fallback_reason"]
    assert run.stderr.decode().rstrip().endswith("; guarantee subreaper")


def test_the_library_carries_the_guarantee():
    import corral_systemd as corral_lib
    from corral_systemd.common.errors import UsageError

    result = corral_lib.run(["true"], mode="fallback", guarantee="subreaper", register=False)
    assert result.guarantee == "subreaper"
    with pytest.raises(UsageError):
        corral_lib.make_spec(["true"], mode="enforced", guarantee="subreaper")


def test_the_served_path_declines_a_tier_below_unit():
    from corral_systemd.core.request import parse_command_line

    spec = parse_command_line(["--guarantee", "cgroup", "--", "true"], default_mode="auto").spec
    assert not spec.may_be_systemd  # so the service's ``parse`` declines it: corral runs it itself
    spec = parse_command_line(["--guarantee", "unit", "--", "true"], default_mode="auto").spec
    assert spec.may_be_systemd and spec.tiers() == ("unit",)


def test_an_empty_leaf_a_corral_left_is_removed_by_the_next(corral, subtree):
    # A corral cannot remove the leaf it moved itself into; the next one does
    # (the kernel refuses the rmdir of one a live corral is in).
    stale = ["sh", "-c", 'mkdir /sys/fs/cgroup/corral-supervisor-1 && exec "$@"', "sh", *CORRAL]
    cmd = "test ! -e /sys/fs/cgroup/corral-supervisor-1 && echo removed"
    run = corral([*AUTO, "--", "sh", "-c", cmd], env=NO_BUS, program=subtree.program(stale))
    assert run.returncode == 0, run.stderr
    assert run.stdout == b"removed\n"
    _ran_in_the_tier(run)


@pytest.mark.parametrize("pid_namespaces", [False, True], ids=["tether", "namespace"])
def test_a_sigkilled_corral_still_stops_its_run_through_its_tether(subtree, tether_kind, pid_namespaces):
    """kill -9 corral mid-run: its tether (a child of corral holding a pipe
    only corral writes) runs the stop sequence on the run group, TERM-ignoring
    processes included; the wrapper sees the subtree empty by itself (96 if
    not within 10 s of corral's death; 137 is corral's own SIGKILL). With the
    pid namespace the tier gives where it can, the namespace's init dies with
    corral and the kernel ends the run first."""
    import signal
    import subprocess
    import time

    from conftest import TIME_SCALE
    from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

    marker = new_marker()
    script = "trap '' TERM; setsid sh -c \"trap '' TERM; exec sleep 600\" & sleep 600"
    argv = [*CORRAL, *AUTO, "--grace", "1s", "--wall", "60s", "--", "sh", "-c", script]
    try:
        env = {**NO_BUS, MARKER_ENV: marker, "CORRAL_TETHER": tether_kind}  # NO_BUS: os.environ at import
        program = subtree.program(argv, wait_empty=10 * TIME_SCALE, pid_namespaces=pid_namespaces)
        proc = subprocess.Popen(program, env=env)
        deadline = time.monotonic() + 30 * TIME_SCALE
        while len(marked_pids(marker)) < 6 and time.monotonic() < deadline:  # wrapper, corral, tether, 3 of the run
            time.sleep(0.05)
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            corral_pid = int(f.read().split()[0])  # the wrapper's child exec'd into corral
        os.kill(corral_pid, signal.SIGKILL)
        assert proc.wait(timeout=60 * TIME_SCALE) == 128 + signal.SIGKILL  # 96: the run outlived corral
        assert marked_pids(marker) == []
    finally:
        kill_marked(marker)
