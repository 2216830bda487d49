"""--cpu-time (exit 123), --cpus, and the pids limit's hits, in every engine.

CPU time is burnt with ``time.process_time()`` loops, so each process uses
a known amount whatever the machine's load; what is asserted is what the
kernel counted (the record's figures) and what is left in /proc (the run's
marker), never how long anything took on the clock.
"""

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import CORRAL, TIME_SCALE, marker_env
from modes import KERNEL_LIMITS, all_modes, mode_flags

#: Burns SECONDS of CPU in this process, then exits.
BURN = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < float(sys.argv[1]): pass"
#: Burns CPU until killed.
SPIN = "while True: pass"
#: --cpu-time overshoot allowed by the record: the 0.1 s sampling and the
#: TERM's delivery, for each of the 2 CPUs the tree keeps busy, plus slack.
OVERSHOOT = (2 * (0.1 + 0.5) + 0.5) * TIME_SCALE


def _detail(run) -> str:
    record = run.record or {}
    return f"stderr: {run.stderr.decode(errors='replace')[-600:]}; engine: {record.get('engine')}"


def _cpu_seconds(run) -> float:
    cpu = run.record["engine"]["cpu_usage_nsec"]
    assert cpu is not None, _detail(run)
    return cpu / 1e9


@pytest.mark.parametrize("mode", all_modes())
def test_cpu_time_stops_a_spinning_tree_123(corral, mode):
    """Two spinners, one in a session of its own, after a child that burnt
    CPU and was reaped: stopped at the limit, 123, nothing left, and the
    kernel's count within the documented overshoot."""
    tree = (
        f"python3 -c '{BURN}' 0.3; "  # used, exited and reaped before the others start
        f"setsid python3 -c '{SPIN}' & python3 -c '{SPIN}' & wait"
    )
    run = corral(mode_flags(mode) + ["--cpu-time", "1.5s", "--wall", "60s", "--", "sh", "-c", tree])
    assert run.returncode == 123, _detail(run)
    assert run.survivors == [], _detail(run)
    record = run.record
    assert record["outcome"] == "cpu_time" and record["verified"] is True, _detail(run)
    assert record["limits"]["cpu_time"] == 1.5 and record["limits_enforced"]["cpu_time"] == "watch"
    assert record["steps"]["limit_exceeded"] is not None
    assert 1.5 <= _cpu_seconds(run) <= 1.5 + OVERSHOOT, _detail(run)
    assert "CPU time limit reached" in run.stderr.decode()


@pytest.mark.parametrize("mode", all_modes())
def test_cpu_time_counts_what_was_reaped(corral, mode):
    """Only processes that exit (each well under the limit, reaped by the
    command's shell) use CPU, then the command idles: their sum reaches the
    limit all the same. Counting only the live processes, the run would end
    on its own with 0."""
    burns = "; ".join([f"python3 -c '{BURN}' 0.4"] * 5)
    run = corral(mode_flags(mode) + ["--cpu-time", "1s", "--wall", "60s", "--", "sh", "-c", f"{burns}; sleep 2"])
    assert run.returncode == 123, _detail(run)
    assert run.survivors == [], _detail(run)
    assert 1.0 <= _cpu_seconds(run) <= 1.0 + OVERSHOOT, _detail(run)


@pytest.mark.parametrize("mode", all_modes())
def test_cpu_time_not_reached_is_the_commands_exit(corral, mode):
    run = corral(mode_flags(mode) + ["--cpu-time", "30s", "--", "python3", "-c", BURN, "0.3"])
    assert run.returncode == 0, _detail(run)
    assert 0.25 <= _cpu_seconds(run) <= 5, _detail(run)
    assert run.record["engine"]["accounting_source"] is not None


#: Says "go", burns SECONDS of CPU, then prints the CPU time it used in all.
GO_BURN_AND_SAY = "print('go', flush=True)\n" + BURN + "\nprint(time.process_time(), flush=True)"


@pytest.mark.parametrize("mode", all_modes())
def test_a_run_that_ends_unwatched_keeps_its_cpu_total(tmp_path, marker, mode):
    """corral is stopped (SIGSTOP) while the command burns 0.3 s of CPU and
    ends, and stays stopped for a second: its manager sees the unit end and
    removes the group before corral can read it again. The record must still
    hold at least what the process itself counted -- systemd's own last
    reading (CPUAccounting=yes), read while AddRef holds the unit -- or say
    that its figures are a last sample (``accounting_final`` false), which
    only a unit nothing held (the private socket: no AddRef) may do."""
    record_path = tmp_path / "record.json"
    argv = CORRAL + ["--json", str(record_path), *mode_flags(mode), "--", "python3", "-c", GO_BURN_AND_SAY, "0.3"]
    proc = subprocess.Popen(argv, env=marker_env(marker), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"go\n"
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            used = float(proc.stdout.readline())
            time.sleep(1.0 * TIME_SCALE)  # the manager notices the end and removes the group
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")
    engine = json.loads(record_path.read_text())["engine"]
    cpu = engine["cpu_usage_nsec"]
    if cpu is not None and cpu / 1e9 >= used:
        return
    # Only a last sample (or none) may fall short, and then the record says so.
    assert engine["accounting_final"] is False, engine
    assert engine.get("transport") == "private" and "manager" not in (engine["accounting_source"] or ""), engine
    if cpu is not None:
        assert "cpu >=" in err.decode().splitlines()[-1], err.decode()


@pytest.mark.parametrize("mode", all_modes())
def test_cpus_half_holds_a_spinner_near_half_a_core(corral, mode):
    """--cpus 0.5 in the kernel: a spinner gets at most about half a CPU of
    the run's wall time. Where the quota cannot be set, the record and a
    warning say so."""
    run = corral(mode_flags(mode) + ["--cpus", "0.5", "--wall", "3s", "--", "python3", "-c", SPIN])
    assert run.returncode == 124, _detail(run)
    record = run.record
    assert record["limits"]["cpus"] == 0.5
    if mode in ("scope", "service") and KERNEL_LIMITS:
        # The manager has the cpu controller here (v1 cpu, or delegated v2): it must be read back as set.
        assert record["limits_enforced"]["cpus"] == "kernel", _detail(run)
    if mode == "fallback":
        assert record["limits_enforced"]["cpus"] == "none"
    if record["limits_enforced"]["cpus"] == "kernel":
        # The quota's period is 100 ms: a spinner may run a period's share beyond it.
        assert _cpu_seconds(run) <= 0.5 * record["wall_time"] + 0.3, _detail(run)
    else:
        assert record["limits_enforced"]["cpus"] == "none"
        assert "--cpus" in run.stderr.decode()


@pytest.mark.parametrize("mode", all_modes())
def test_pids_limit_hits_are_recorded(corral, mode):
    """Forks refused by --pids are counted where the kernel enforces it. The
    command outlives its refused forks (a shell would exit at the first one,
    and a unit that ends at once can be collected before corral reads its
    group: the VM lane's user manager did that)."""
    forks = (
        "import os, time\n"
        "for _ in range(10):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(1); os._exit(0)\n"
        "    except OSError:\n"
        "        pass\n"
        "time.sleep(1.5)"
    )
    run = corral(mode_flags(mode) + ["--pids", "4", "--wall", "30s", "--", "python3", "-c", forks])
    assert run.survivors == [], _detail(run)
    hits = run.record["engine"].get("pids_limit_hits")
    if run.record["limits_enforced"]["pids"] == "kernel":
        assert hits is not None and hits > 0, _detail(run)
    else:
        assert hits in (None, 0), _detail(run)


@pytest.mark.parametrize(
    "args",
    [
        ["--cpu-time", "-1s"],
        ["--cpu-time", "lots"],
        ["--cpus", "0"],
        ["--cpus", "abc"],
        ["--cpus", "5000"],
        ["--cpus", "nan"],
    ],
)
def test_bad_cpu_values_are_125_one_line(corral, args):
    run = corral([*args, "--", "true"], record=False)
    assert run.returncode == 125
    lines = run.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "cpu" in lines[0], lines
