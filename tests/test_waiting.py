"""A waiting run costs nothing: while the command sleeps, corral sleeps too.

Two measures of corral's own process, never of the clock:

- its CPU time (and its children's: the command is a ``sleep``, which spends
  none), read by the kernel's accounting of a child that has exited
  (``wait4``): a run that waits 5 s longer must not cost corral measurably
  more CPU (each side the least of two runs, against the noise of a busy
  machine). Polling /proc every 0.2 s (what this guards against) cost 2-4 %
  of a core, and a caller's ``ulimit -t`` ended corral before its run;
- how often the run's cgroup is read while the command sleeps (the
  kernel's inotify IN_ACCESS on its files), over a window after the start. A
  unit run or a cgroup tier run used to read it every 0.1 s (60 times in the
  window; every 25 ms for an OOM kill under --mem); it now waits on the
  kernel's and the manager's events, and reads the group at waits that
  double while it idles (``engines.base.CgroupLimits``).
"""

import os
import subprocess
import threading
import time

import pytest
from test_registry import wait_for
from tethers import tether_kind  # noqa: F401  (the fixture: both tether programs)

from conftest import CORRAL, TIME_SCALE
from modes import KERNEL_LIMITS, mode_flags
from procscan import MARKER_ENV, kill_marked, new_marker

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
def test_a_waiting_run_spends_no_cpu(mode, tether_kind):
    if mode == "pidns" and tether_kind == "python":
        pytest.skip("the pidns tier has no tether: once")
    flags = [*mode_flags(mode), "--quiet", "--wall", "60s", "--"]
    short = min(_cpu_of([*CORRAL, *flags, "sleep", "0.2"]) for _ in range(2))
    long = min(_cpu_of([*CORRAL, *flags, "sleep", "5.2"]) for _ in range(2))
    assert long - short < SLACK, f"5 s more of waiting cost corral {long - short:.3f} s of CPU"


#: The window starts this long after the command is running (the group's
#: first readings come soon after the start, see ``CgroupLimits.SAMPLE_FIRST``) ...
SETTLE = 2.0
#: ... and lasts this long;
WINDOW = 6.0
#: each file of the run's group may be read this often in it: a handful (the
#: group read at doubling waits while it idles). A 0.1 s tick reads it 60 times.
READS = 6
#: Not counted: the notification files, re-read (re-armed) at every wake-up,
#: whatever woke corral (the manager's messages about other units too).
NOTIFYING = ("cgroup.events", "memory.events")


def _group_dirs(cgroup: str) -> list[str]:
    """The directories of a process's cgroup (its /proc/PID/cgroup, as it read
    it: in a pid namespace its pid is not this one's) corral reads: the unified
    hierarchy's and, in the hybrid layout, the v1 memory controller's."""
    from corral_systemd.kernel import cgroupfs

    mounts = cgroupfs.Mounts()
    dirs = []
    for line in cgroup.splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and mounts.unified is not None:
            dirs.append(cgroupfs.unified_dir(mounts, path))
        elif "memory" in controllers.split(",") and "memory" in mounts.v1:
            dirs.append(cgroupfs.v1_dir(mounts, "memory", path))
    return [d for d in dirs if d and os.path.isdir(d)]


def _reads_of(dirs: list[str], seconds: float) -> dict[str, int]:
    """How often each file in ``dirs`` was read in the next ``seconds``
    (inotify IN_ACCESS, drained as it comes: the kernel merges an event with
    an identical one still queued)."""
    import select

    from corral_systemd.kernel.inotify import Inotify

    in_access = 0x00000001
    watches = Inotify()
    names = {watches.watch(d, in_access): d for d in dirs}
    reads: dict[str, int] = {}
    poller = select.poll()
    poller.register(watches.fileno(), select.POLLIN)
    end = time.monotonic() + seconds
    try:
        while (left := end - time.monotonic()) > 0:
            poller.poll(left * 1000)
            for wd, _mask, name in watches.read():
                if wd in names and name and name.decode() not in NOTIFYING:
                    key = os.path.join(names[wd], name.decode())
                    reads[key] = reads.get(key, 0) + 1
    finally:
        watches.close()
    return reads


def _needs_kernel_memory_limit():
    if not KERNEL_LIMITS:
        pytest.skip("no memory controller for the manager here (unified harness): --mem is watched on a timer")


@pytest.mark.parametrize(
    "mode, limits",
    [
        pytest.param("scope", [], marks=pytest.mark.systemd),
        pytest.param("service", [], marks=pytest.mark.systemd),
        pytest.param("served-scope", [], marks=pytest.mark.systemd),
        pytest.param("cgroup-parent", [], marks=pytest.mark.cgroupv2),
        # --cpu-time: read when the limit could first be reached (60 s of CPU, at most 1 s a second per CPU)
        pytest.param("scope", ["--cpu-time", "60s"], marks=pytest.mark.systemd),
        pytest.param("cgroup-parent", ["--cpu-time", "60s"], marks=pytest.mark.cgroupv2),
        # --mem held by the kernel: its OOM kill counters are read on its event (the v1 eventfd, v2
        # memory.events), not every 25 ms (that no timer is set: test_a_memory_limit_the_kernel_tells_of_sets_no_timer)
        pytest.param("scope", ["--mem", "1G"], marks=pytest.mark.systemd),
    ],
    ids=lambda value: "-".join(value) if isinstance(value, list) else value,
)
def test_a_waiting_run_reads_its_group_a_handful_of_times(mode, limits, tmp_path):
    """While the command sleeps, each file of the run's cgroup is read at
    most ``READS`` times in ``WINDOW`` seconds (by whoever reads it: corral,
    in-process or the service), and the run ends as usual. Counted by the
    kernel (inotify), not by corral's wake-ups: the manager's messages about
    other units, which tests beside this one start, wake corral too (a
    private connection gets every one), and are no timer of corral's."""
    if "--mem" in limits:
        _needs_kernel_memory_limit()
    served = mode.startswith("served-")
    flags = mode_flags(mode.removeprefix("served-"))
    env = dict(os.environ)
    service = None
    if served:
        from serving import Service

        service = Service(tmp_path)
        env = service.env()
    marker = env[MARKER_ENV] = new_marker()
    ready = tmp_path / "ready"
    sleep = (SETTLE + WINDOW) * TIME_SCALE + 2
    command = f"cat /proc/$$/cgroup > {ready}.tmp && mv {ready}.tmp {ready}; exec sleep {sleep}"
    proc = subprocess.Popen(
        [*CORRAL, *flags, *limits, "--quiet", "--wall", "60s", "--", "sh", "-c", command],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(ready.exists, timeout=30)
        dirs = _group_dirs(ready.read_text())
        assert dirs, "the command's cgroup is not to be found"
        time.sleep(SETTLE * TIME_SCALE)
        reads = _reads_of(dirs, WINDOW * TIME_SCALE)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
        assert reads, f"nothing read {dirs} in the window: corral never looked (or inotify saw nothing)"
        often = {name: n for name, n in reads.items() if n > READS}
        assert not often, f"read in {WINDOW} s of waiting: {often}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_marked(marker)
        if service is not None:
            service.stop()


def test_limits_are_checked_on_the_engines_events_with_no_timer():
    """An engine that needs no timer (``watch_interval`` None: an OOM kill
    is a kernel event among its descriptors) has its limits checked when one
    of them wakes the loop: the run ends at once on the limit (121), not at
    its deadline. Before, the limits were checked on the timer only."""
    from fake_engine import FakeEngine

    from corral_systemd.core.spec import RunSpec
    from corral_systemd.core.supervisor import Supervisor

    class EventEngine(FakeEngine):
        """The OOM kill arrives as a byte on a pipe of its descriptors ("memory.events: oom_kill 1")."""

        def __init__(self):
            super().__init__()
            self.event_r, self.event_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            self.oom = False

        def wait_fds(self):
            return [*super().wait_fds(), self.event_r]

        def poll_events(self):
            super().poll_events()
            try:
                self.oom = self.oom or os.read(self.event_r, 1) == b"!"
            except BlockingIOError:
                pass

        def watch_interval(self):
            return None

        def check_limits(self):
            return "mem" if self.oom else None

    engine = EventEngine()
    timer = threading.Timer(0.3, os.write, (engine.event_w, b"!"))
    timer.start()
    try:
        result = Supervisor(RunSpec(argv=["x"], wall=30.0), engine).run()
        assert result.reason == "memory", result  # not "timeout": the deadline never came
    finally:
        timer.cancel()
        os.close(engine.event_r)
        os.close(engine.event_w)


def test_a_memory_limit_the_kernel_tells_of_sets_no_timer(tmp_path):
    """--mem held by the kernel, whose OOM kill marks memory.events (or the v1
    eventfd): no 25 ms look for one, only the group's first reading is due;
    where corral sums the memory itself ("watch") the look stays."""
    from test_accounting import _engine_on_fake_cgroup

    engine, _group = _engine_on_fake_cgroup(tmp_path)
    try:
        engine.limits_enforced["mem"] = "kernel"
        assert engine.watch_interval() > engine.LIMIT_WATCH_INTERVAL
        engine.limits_enforced["mem"] = "watch"
        assert engine.watch_interval() == pytest.approx(engine.LIMIT_WATCH_INTERVAL)
    finally:
        os.waitpid(engine._child.pid, 0)
        engine.cgroup.close()


def test_cpu_time_is_read_when_the_limit_could_first_be_reached():
    """--cpu-time with no kernel to enforce it: the next reading waits for
    the least time the run needs to reach it (its CPU time grows at most one
    second a second per CPU), never less than ``CPU_TIME_INTERVAL``."""
    from corral_systemd.common.limits import CPU_TIME_INTERVAL
    from corral_systemd.engines.base import cpu_time_wait

    cpus = os.cpu_count() or 1
    assert cpu_time_wait(60, None) == pytest.approx(60 / cpus)
    assert cpu_time_wait(60, 20 * 10**9) == pytest.approx(40 / cpus)
    assert cpu_time_wait(60, 60 * 10**9 - 1000) == CPU_TIME_INTERVAL
    assert cpu_time_wait(60, 61 * 10**9) == CPU_TIME_INTERVAL
