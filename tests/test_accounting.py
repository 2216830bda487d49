"""Resource accounting, OOM detection and exec failures (issue 12, part 2).

What the record says of a run's resource use comes from the kernel's own
figures in the run's cgroup (memory.peak or v1 memory.max_usage_in_bytes,
cpu.stat, pids.peak, io.stat), read while the group exists; an OOM kill is
seen from memory.events kept open and watched (POLLPRI), so the manager
removing the group cannot hide it; a service that cannot be executed is
126/127 as a scope is.

Where a figure cannot exist in a layout (no memory controller for the unit,
no pids controller), the tests check that the record has none rather than
skip; they pass in the harness's hybrid and unified layouts and on a booted
machine with pure cgroup v2 and cpu/memory/pids delegated (the VM lane).
"""

import os
import select
import socket
import subprocess
import sys
import threading
import time
import types

import pytest

from conftest import REPEAT
from corral_systemd.kernel import cgroupfs
from modes import KERNEL_LIMITS, mode_flags

UNIT_TYPES = [pytest.param("scope", marks=pytest.mark.systemd), pytest.param("service", marks=pytest.mark.systemd)]
MiB = 2**20


def _detail(run) -> str:
    return f"stderr: {run.stderr.decode(errors='replace')}; engine: {(run.record or {}).get('engine')}"


def _kernel_at_least(major: int, minor: int) -> bool:
    release = os.uname().release.split("-")[0].split(".")
    return (int(release[0]), int(release[1])) >= (major, minor)


def _memory_peak_offered(record) -> bool:
    """The unit has the memory controller (the kernel enforced --mem) and the
    kernel keeps a peak: v1 memory.max_usage_in_bytes, or v2 memory.peak (Linux >= 5.19)."""
    if record["limits_enforced"].get("mem") != "kernel":
        return False
    return "memory" in cgroupfs.Mounts().v1 or _kernel_at_least(5, 19)


def _summary(run) -> str:
    return run.stderr.decode(errors="replace").strip().splitlines()[-1]


# -- the kernel's figures, from the unit's cgroup -------------------------


@pytest.mark.parametrize("unit_type", UNIT_TYPES)
def test_memory_peak_is_the_cgroups(corral, unit_type):
    run = corral(
        mode_flags(unit_type)
        + [
            "--wall",
            "30s",
            "--mem",
            "1G",
            "--",
            "python3",
            "-c",
            "import time; b = bytearray(200 << 20); time.sleep(0.5)",
        ]
    )
    assert run.returncode == 0, _detail(run)
    engine = run.record["engine"]
    if _memory_peak_offered(run.record):
        assert engine["memory_peak"] is not None and engine["memory_peak"] >= 200 * MiB, _detail(run)
        assert engine["memory_peak"] < 1024 * MiB, _detail(run)
        assert "cgroup" in engine["accounting_source"], _detail(run)
        assert "peak " in _summary(run) and "MiB" in _summary(run), _summary(run)
    else:
        # No memory controller for the unit (the harness's unified layout): no peak, none invented.
        assert engine["memory_peak"] is None, _detail(run)
        assert "peak " not in _summary(run)


# The spin in a child the main process never waits for: its second is in no
# rusage of the main process (which counts what it waited for), only in the group.
SPIN_IN_UNWAITED_CHILD = (
    "import os, time\n"
    "r, w = os.pipe()\n"
    "if os.fork() == 0:\n"
    "    t = time.process_time()\n"
    "    while time.process_time() - t < 1.0: pass\n"
    "    os._exit(0)\n"
    "os.close(w); os.read(r, 1)\n"  # EOF: the child has exited (a zombie, never reaped here)
    "os._exit(0)\n"
)


@pytest.mark.parametrize("unit_type", UNIT_TYPES)
def test_cpu_time_is_the_cgroups(corral, unit_type):
    run = corral(mode_flags(unit_type) + ["--wall", "30s", "--", "python3", "-c", SPIN_IN_UNWAITED_CHILD])
    assert run.returncode == 0, _detail(run)
    engine = run.record["engine"]
    assert cgroupfs.Mounts().unified is not None  # cpu.stat is in every cgroup v2 group
    cpu = engine["cpu_usage_nsec"]
    # About one second of CPU (the last 0.1 s may be missing: a busy group is read every
    # base.CgroupLimits.SAMPLE_FIRST).
    assert cpu is not None and 0.7e9 <= cpu <= 10e9, _detail(run)
    user, system = engine["cpu_user_nsec"], engine["cpu_system_nsec"]
    assert user is not None and system is not None, _detail(run)
    assert abs(user + system - cpu) <= 0.1 * cpu + 20e6, _detail(run)
    # The group's figure, as corral read it or as the manager did (its last
    # reading, after corral's: the larger wins, see base.usage_facts), never
    # the main process's own rusage, which has not the child's second.
    assert {"cgroup", "manager"} & set(engine["accounting_source"].split("+")), _detail(run)
    assert "cpu " in _summary(run), _summary(run)


@pytest.mark.parametrize("unit_type", UNIT_TYPES)
def test_tasks_peak_counts_the_runs_processes(corral, unit_type):
    run = corral(
        mode_flags(unit_type)
        + ["--wall", "30s", "--pids", "1000", "--", "sh", "-c", "for i in 1 2 3 4 5; do sleep 0.5 & done; wait"]
    )
    assert run.returncode == 0, _detail(run)
    engine = run.record["engine"]
    if run.record["limits_enforced"].get("pids") == "kernel":
        assert engine["tasks_peak"] is not None and 6 <= engine["tasks_peak"] < 100, _detail(run)
    else:
        assert engine["tasks_peak"] is None, _detail(run)  # no pids controller: nothing to count with


@pytest.mark.parametrize("unit_type", UNIT_TYPES)
def test_figures_of_a_stopped_run(corral, unit_type):
    """Leftovers stopped at the deadline: the figures include their CPU time."""
    run = corral(mode_flags(unit_type) + ["--wall", "2s", "--", "sh", "-c", 'python3 -c "while 1: pass" & sleep 60'])
    assert run.returncode == 124, _detail(run)
    cpu = run.record["engine"]["cpu_usage_nsec"]
    assert cpu is not None and 0.3e9 <= cpu <= 10e9, _detail(run)  # (the spinner shares a busy machine)


# -- OOM kills ---------------------------------------------------------------


@pytest.mark.parametrize("unit_type", UNIT_TYPES)
def test_memory_hog_is_121(corral, unit_type):
    run = corral(
        mode_flags(unit_type) + ["--wall", "10s", "--mem", "64M", "--", "python3", "-c", "b = bytearray(400 << 20)"]
    )
    assert run.returncode == 121, _detail(run)
    assert run.record["outcome"] == "memory" and run.record["verified"], _detail(run)
    engine = run.record["engine"]
    if run.record["limits_enforced"]["mem"] == "kernel" and "memory" not in cgroupfs.Mounts().v1:
        # cgroup v2 memory controller: memory.events was watched.
        assert engine["memory_events"] is not None, _detail(run)
        if unit_type == "scope":  # (a service's 121 may also come from the manager's Result=oom-kill)
            # The watch read the group under the limit: the kill itself, or
            # (in the VM lane, as a user, where corral's reads lag the manager
            # removing the group) its "oom" or "max" before the group went --
            # or the group went first (accounting_final false) and the
            # manager's own Result=oom-kill said it (252 point releases give
            # scopes one; seen once in the lane's system manager under TCG).
            events = engine["memory_events"]
            seen = events["oom_kill"] >= 1 or events["oom"] >= 1 or events["max"] >= 1
            told = engine["accounting_final"] is False and engine["unit_result"] == "oom-kill"
            assert seen or told, _detail(run)


# -- 126/127: services as scopes ---------------------------------------------


def _exec_cases(tmp_path):
    plain = tmp_path / "not-executable"
    plain.write_text("#!/bin/sh\necho never\n")
    plain.chmod(0o644)
    garbage = tmp_path / "garbage"  # executable bit, but no format the kernel knows (ENOEXEC)
    garbage.write_bytes(b"\x7fELF but not really\n")
    garbage.chmod(0o755)
    return [
        (str(tmp_path / "missing"), 127, ("No such file or directory",)),
        ("no-such-command-corral-test", 127, ("No such file or directory",)),
        (str(plain), 126, ("Permission denied",)),
        (str(tmp_path), 126, ("Is a directory", "Permission denied")),
        (str(garbage), 126, None),
    ]


@pytest.mark.parametrize("unit_type", UNIT_TYPES)
def test_cannot_execute_is_126_and_not_found_is_127(corral, unit_type, tmp_path):
    for command, expected, messages in _exec_cases(tmp_path):
        run = corral(mode_flags(unit_type) + ["--", command])
        detail = f"{command}: {_detail(run)}"
        assert run.returncode == expected, detail
        assert run.record["outcome"] == "spawn_failed", detail
        assert run.record["command_exit_status"] is None, detail
        if messages is not None:
            assert any(f"{command}: {message}" in _summary(run) for message in messages), detail
        assert "exit 203" not in _summary(run), detail


@pytest.mark.systemd
def test_service_systemd_cannot_execute_is_126(corral, tmp_path):
    """What only systemd meets (ENOEXEC here: corral's own check passes):
    EXIT_EXEC (203) from the manager becomes 126, said so."""
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x7fELF but not really\n")
    garbage.chmod(0o755)
    run = corral(mode_flags("service") + ["--", str(garbage)])
    assert run.returncode == 126, _detail(run)
    assert run.record["outcome"] == "spawn_failed" and run.record["verified"], _detail(run)
    assert f"{garbage}: systemd could not execute it" in _summary(run), _detail(run)


@pytest.mark.systemd
def test_service_exiting_203_by_itself_keeps_its_status(corral):
    """A command that ran (its start job done) and exited 203 is not an exec failure."""
    run = corral(mode_flags("service") + ["--", "sh", "-c", "sleep 0.2; exit 203"])
    assert run.returncode == 203, _detail(run)
    assert run.record["outcome"] == "exited" and run.record["command_exit_status"] == 203, _detail(run)


@pytest.mark.systemd
def test_service_path_lookup_is_the_commands(tmp_path):
    """A service's executable is found as a scope's exec finds it: relative
    PATH entries from the command's cwd, not corral's."""
    import corral_systemd as corral

    mode_flags("service")  # skips or fails without a manager, as the CLI tests do
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "corral-test-tool"
    tool.write_text("#!/bin/sh\necho found\n")
    tool.chmod(0o755)
    env = {"PATH": "bin:/usr/bin:/bin"}
    result = corral.run(["corral-test-tool"], cwd=str(tmp_path), env=env, unit_type="service", wall=20)
    assert result.exit_code == 0 and result.stdout == b"found\n", result


# -- the mechanisms, on this host --------------------------------------------


class _FakeConnection:
    """Enough of a manager connection for ``poll_events`` (nothing arrives)."""

    unique_name = None  # a private connection: no AddRef, no matches

    def __init__(self):
        import collections

        self.signals = collections.deque()

    def read_pending(self):
        pass


class _FakeSession:
    """What SystemdEngine takes from a Runner's session, with no manager behind it."""

    manager_kind = "user"
    tether_unit = "corral-accounting-test-tether.scope"

    @property
    def apis(self):
        from corral_systemd.dbus.systemd1 import ManagerAPIs

        return ManagerAPIs(None)  # no version read: 252's paths

    def channel(self, unit, path):
        return _FakeConnection()


def _fake_unit_cgroup(tmp_path, unit):
    """A unit's cgroup on a fake unified tree: its files as the kernel shows them."""
    from corral_systemd.engines.unitcgroup import UnitCgroup

    cg = f"/corral.slice/{unit}"
    group = tmp_path / "unified" / cg.lstrip("/")
    group.mkdir(parents=True)
    files = {
        "cgroup.controllers": "memory pids\n",
        "memory.max": f"{64 * MiB}\n",
        "memory.swap.max": "0\n",
        "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
        "cgroup.events": "populated 1\nfrozen 0\n",
        "memory.peak": f"{3 * MiB}\n",
        # Far more than the real `sh -c 'exit 0'` uses: its rusage is a floor for the total.
        "cpu.stat": "usage_usec 5000000\nuser_usec 3000000\nsystem_usec 2000000\n",
        "pids.peak": "1\n",
        "pids.current": "1\n",
    }
    for name, text in files.items():
        (group / name).write_text(text)
    mounts = types.SimpleNamespace(unified=str(tmp_path / "unified"), v1={})
    return UnitCgroup(cg, mounts), group


def test_remaining_names_the_processes_only_name_systemd_still_lists(tmp_path):
    """Hybrid layout: verification reads both trees. A process in the unit's
    name=systemd group but no longer in its unified group (moved out in one
    hierarchy) is left, and named as such, so it is killed by pid; one in
    both is simply left; without a unified tree nothing is "v1 only".
    (A mutant that swapped this check's ``and`` survived the engines mutation run.)"""
    from corral_systemd.engines.unitcgroup import UnitCgroup

    cg = "/corral.slice/corral-remaining-test.scope"
    unified, v1 = tmp_path / "unified" / cg.lstrip("/"), tmp_path / "v1" / cg.lstrip("/")
    for group in (unified, v1):
        group.mkdir(parents=True)

    def state(unified_pids, v1_pids):
        (unified / "cgroup.procs").write_text("".join(f"{p}\n" for p in unified_pids))
        (unified / "cgroup.events").write_text(f"populated {int(bool(unified_pids))}\nfrozen 0\n")
        (v1 / "cgroup.procs").write_text("".join(f"{p}\n" for p in v1_pids))

    hybrid = UnitCgroup(
        cg, types.SimpleNamespace(unified=str(tmp_path / "unified"), v1={"name=systemd": str(tmp_path / "v1")})
    )
    state([], [4242])
    assert hybrid.remaining() == ([4242], [4242])  # out of the unified group only
    state([4242], [4242])
    assert hybrid.remaining() == ([4242], [])  # in both: left, not "v1 only"
    state([], [])
    assert hybrid.remaining() == ([], [])
    v1_only_layout = UnitCgroup(cg, types.SimpleNamespace(unified=None, v1={"name=systemd": str(tmp_path / "v1")}))
    state([], [4242])
    assert v1_only_layout.remaining() == ([4242], [])


def _engine_on_fake_cgroup(tmp_path, unit="corral-accounting-test.scope"):
    """A SystemdEngine whose unit's cgroup is a fake tree (no manager), its
    main process a real child of ours that has exited."""
    from corral_systemd.core.spec import RunSpec
    from corral_systemd.engines.systemd import SystemdEngine

    engine = SystemdEngine(RunSpec(argv=["hog"], mem=64 * MiB, unit_type="scope"), _FakeSession())
    engine.unit = unit
    cgroup, group = _fake_unit_cgroup(tmp_path, unit)
    enforced, warnings = cgroup.limits_set(engine.spec)
    assert enforced == {"mem": "kernel"} and warnings == []
    cgroup.arm(oom_eventfd=True)
    engine.cgroup, engine._started = cgroup, True
    pid = os.posix_spawn("/bin/sh", ["sh", "-c", "exit 0"], os.environ)
    from corral_systemd.kernel.spawn import Child

    engine._child = Child(pid, -1, None, None, "sh")
    return engine, group


def test_oom_kill_seen_before_the_manager_removes_the_group(tmp_path):
    """The OOM kill is counted in memory.events, the main process dies, and
    the manager removes the group before corral asks: the counters corral
    read on memory.events' change still say so (before: exit 137)."""
    engine, group = _engine_on_fake_cgroup(tmp_path)
    try:
        (group / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")
        (group / "memory.peak").write_text(f"{64 * MiB}\n")
        os.waitid(os.P_PID, engine._child.pid, os.WEXITED | os.WNOWAIT)  # the main process has exited
        engine.poll_events()  # woken by memory.events (POLLPRI) and the pidfd at once
        assert engine.main_status() is not None
        os.rename(group, tmp_path / "removed")  # the manager removes the unit's cgroup
        assert engine.oom_killed()
        info = engine.describe()
        assert info["memory_events"] == {"max": 7, "oom": 1, "oom_kill": 1}
        assert info["memory_peak"] == 64 * MiB and info["cpu_usage_nsec"] == 5_000_000_000
        assert info["accounting_source"] == "cgroup"
    finally:
        os.waitpid(engine._child.pid, 0)
        engine.cgroup.close()


def test_limit_reached_and_an_unprompted_sigkill_is_an_oom_kill(tmp_path):
    """memory.events said the group hit memory.max (``max``), its ``oom_kill``
    was never read before the manager removed the group, and the main process
    died of a SIGKILL corral did not send: the kernel's OOM kill (the VM
    lane's user scope under emulation). The same SIGKILL sent by corral's
    stop, or an exit, is not."""
    cgroup, group = _fake_unit_cgroup(tmp_path, "corral-oom-rule.scope")
    try:
        cgroup.arm(oom_eventfd=False)
        (group / "memory.events").write_text("low 0\nhigh 0\nmax 1\noom 0\noom_kill 0\n")
        cgroup.read_watches()
        os.rename(group, tmp_path / "removed")
        assert cgroup.oom_counted(main_sigkilled_unprompted=True)
        assert not cgroup.oom_counted(main_sigkilled_unprompted=False)
    finally:
        cgroup.close()


def test_usage_keeps_the_largest_reading(tmp_path):
    (tmp_path / "cpu.stat").write_text("usage_usec 2000\nuser_usec 1500\nsystem_usec 500\nnr_periods 0\n")
    (tmp_path / "memory.peak").write_text("4096\n")
    (tmp_path / "pids.current").write_text("3\n")
    (tmp_path / "io.stat").write_text("8:0 rbytes=100 wbytes=20 rios=1 wios=1\n8:16 rbytes=5 wbytes=0 rios=1 wios=0\n")
    usage = cgroupfs.Usage()
    usage.sample(str(tmp_path))
    (tmp_path / "pids.current").write_text("1\n")
    usage.sample(str(tmp_path))
    usage.sample(str(tmp_path / "gone"))  # a removed group adds nothing
    assert usage.figures == {
        "cpu_usage_nsec": 2_000_000,
        "cpu_user_nsec": 1_500_000,
        "cpu_system_nsec": 500_000,
        "memory_peak": 4096,
        "tasks_peak": 3,
        "io_read_bytes": 105,
        "io_write_bytes": 20,
    }


def test_usage_facts_take_the_larger_reading():
    from corral_systemd.engines.base import usage_facts

    assert usage_facts({}, {})["accounting_source"] is None
    facts = usage_facts({"cpu_usage_nsec": 5, "memory_peak": 9}, {"cpu_usage_nsec": 7, "tasks_peak": 2})
    assert facts["cpu_usage_nsec"] == 7 and facts["memory_peak"] == 9 and facts["tasks_peak"] == 2
    assert facts["accounting_source"] == "cgroup+manager"
    assert usage_facts({"cpu_usage_nsec": 7}, {"cpu_usage_nsec": 7})["accounting_source"] == "cgroup"
    assert usage_facts({}, {"cpu_usage_nsec": 7})["accounting_source"] == "manager"


def test_supervisor_wakes_for_a_priority_fd():
    """An engine's priority_fds() are polled for POLLPRI: the loop wakes and
    calls poll_events() when one is marked (a TCP socket's urgent byte
    stands in for a cgroup file's change: POLLPRI, no POLLIN)."""
    from corral_systemd.core.spec import RunSpec
    from corral_systemd.core.supervisor import Supervisor
    from corral_systemd.engines.base import Engine

    server = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(server.getsockname())
    receiver, _ = server.accept()

    class PriorityEngine(Engine):
        mode = "cgroup"

        def start(self, argv, **kwargs):
            pass

        def priority_fds(self):
            return [receiver.fileno()] if self._status is None else []

        def poll_events(self):
            ready = select.select([], [], [receiver], 0)[2]
            if ready:
                receiver.recv(1, socket.MSG_OOB)
                self._status = 0  # "the main process exited"

        def signal_all(self, *sigs):
            return 0

        def kill_all(self):
            pass

        def verify_empty(self):
            return []

    timer = threading.Timer(0.3, lambda: sender.send(b"!", socket.MSG_OOB))
    timer.start()
    try:
        started = time.monotonic()
        result = Supervisor(RunSpec(argv=["x"], wall=5.0), PriorityEngine()).run()
        assert result.reason == "exited", result
        assert time.monotonic() - started < 2.0
    finally:
        timer.cancel()
        for s in (sender, receiver, server):
            s.close()


@pytest.mark.cgroupv2
def test_keyed_watch_outlives_its_group():
    """A real cgroup v2 group: POLLPRI when cgroup.events changes, the last
    values kept once the group is removed, and the descriptor closed then
    (a removed kernfs file polls ready forever)."""
    from modes import delegated_cgroup_parent

    parent = delegated_cgroup_parent()
    if parent is None:
        mode_flags("cgroup-parent")  # skips, or fails where the environment is required
    group = os.path.join(parent, f"corral-watch-{os.getpid()}")
    os.mkdir(group)
    child = None
    try:
        watch = cgroupfs.KeyedWatch(os.path.join(group, "cgroup.events"))
        assert watch.values["populated"] == 0
        child = subprocess.Popen(["sleep", "60"])
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(child.pid))
        poller = select.poll()
        poller.register(watch.fileno(), select.POLLPRI)
        assert poller.poll(2000), "no POLLPRI after the group was populated"
        assert watch.read() and watch.values["populated"] == 1
        child.kill()
        child.wait()
        deadline = time.monotonic() + 2
        while watch.values["populated"] != 0 and time.monotonic() < deadline:
            poller.poll(100)
            watch.read()
        assert watch.values["populated"] == 0
        usage = cgroupfs.Usage()
        usage.sample(group)
        assert "cpu_usage_nsec" in usage.figures
        os.rmdir(group)
        assert not watch.read() and not watch.alive
        assert watch.values["populated"] == 0
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        if os.path.isdir(group):
            os.rmdir(group)


def test_a_memory_limit_the_kernel_rounded_to_pages_reads_back_as_set(tmp_path):
    """--mem 100000000 is not a multiple of the page size: the kernel stores
    99999744 (whole pages) and enforces that. It reads back as set (kernel),
    not as missing (before: "watch", and a warning that there was no memory
    controller); a value that is really different still does not."""
    from corral_systemd.core.spec import RunSpec

    page = os.sysconf("SC_PAGE_SIZE")
    cgroup, group = _fake_unit_cgroup(tmp_path, "corral-rounded.scope")
    spec = RunSpec(argv=["x"], mem=100_000_000, unit_type="scope")
    (group / "memory.max").write_text(f"{100_000_000 - 100_000_000 % page}\n")
    assert cgroup.limits_set(spec) == ({"mem": "kernel"}, [])
    (group / "memory.max").write_text(f"{100_000_000 - page - 100_000_000 % page}\n")
    enforced, warnings = cgroup.limits_set(spec)
    assert enforced == {"mem": "watch"} and warnings


@pytest.mark.systemd
def test_a_memory_limit_off_the_page_size_is_enforced_by_the_kernel(corral):
    if not KERNEL_LIMITS:
        pytest.skip("no memory controller for the manager here (unified harness)")
    run = corral(["--cgroup-mode", "enforced", "--mem", "100000000", "--", "true"])
    assert run.returncode == 0 and run.record["limits_enforced"]["mem"] == "kernel", run.record
    assert b"no memory controller" not in run.stderr


#: Spins for 0.5 s of CPU, prints its own CPU time (all of it: CLOCK_PROCESS_CPUTIME_ID), exits at once.
SPIN_THEN_REPORT = (
    "import os, time\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < 0.5: pass\n"
    "os.write(1, b'%.6f' % time.process_time()); os._exit(0)\n"
)


@pytest.mark.parametrize(
    "mode",
    [
        "fallback",
        pytest.param("scope", marks=pytest.mark.systemd),
        pytest.param("service", marks=pytest.mark.systemd),
        pytest.param("served-scope", marks=pytest.mark.systemd),
        pytest.param("served-service", marks=pytest.mark.systemd),
    ],
)
def test_the_cpu_time_of_a_short_run_is_its_exact_total(corral, mode, tmp_path):
    """A 0.5 s spin: the record's CPU time is what the process itself
    counted (no less than 1 % or 5 ms under, its exit's cost over), every time -- as a benchmark runner reports
    it (before: 12 of 60 such runs said ~0.40 s, the last sample of a group
    the manager removed first). The main process's own getrusage (read by
    its waiter, leaving it a zombie) is the floor. A service's main process
    is the manager's: its figure is exact when corral read its group empty
    or the manager's (on the bus, AddRef keeps the unit), else said a lower bound."""
    env = None
    served = mode.startswith("served-")
    if served:
        from serving import Service

        service = Service(tmp_path)
        env = service.env()
    try:
        flags = mode_flags(mode.removeprefix("served-"))
        # 8 runs where tests repeat (host, harness); 3 on an emulated guest (REPEAT=1).
        for _ in range(8 if REPEAT > 1 else 3):
            run = corral([*flags, "--", sys.executable, "-c", SPIN_THEN_REPORT], env=env)
            assert run.returncode == 0, run.stderr
            assert run.record["via"] == ("service" if served else "cli")
            own = float(run.stdout)
            engine = run.record["engine"]
            recorded = engine["cpu_usage_nsec"] / 1e9
            if (
                mode.endswith("service")
                and engine["accounting_final"] is False
                and "manager" not in (engine["accounting_source"] or "")
            ):
                # A service's main process is the manager's child (no rusage of
                # it here), and on a private connection the unit cannot be kept
                # to ask the manager's final figure (a hybrid layout's manager
                # has none: CPUUsageNSec [not set]): when the group went before
                # corral's last read, the record says so (the summary's ">="),
                # and its figure is a lower bound, never more.
                assert recorded <= own + 0.005, (recorded, own, engine)
                continue
            # Never less than the process counted (the bug: ~20 % less). More by
            # what it spent after printing its figure -- its exit, the run's too:
            # tens of ms on an emulated guest's service (24 and 33 ms seen under
            # TCG, where tests run once: REPEAT 1).
            exit_cost = 0.03 if REPEAT > 1 else 0.06
            assert -max(0.01 * own, 0.005) <= recorded - own <= max(0.05 * own, exit_cost), (recorded, own, engine)
    finally:
        if served:
            service.stop()
