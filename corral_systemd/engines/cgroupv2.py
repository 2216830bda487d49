"""Direct cgroup v2 engine: a child group in a delegated directory.

For ``--cgroup-parent PATH``: no systemd involved. The run gets
``PATH/corral-<run id>``; the command is held at a gate until it has been
moved in, so nothing it starts can be outside the group. Limits go to
memory.max / pids.max when the parent delegates those controllers; SIGKILL
is one write to cgroup.kill; the run is proven gone when cgroup.events
says ``populated 0`` and the group's rmdir succeeds.
"""

import errno
import os
import signal

from ..errors import SetupError
from ..kernel import cgroupfs
from ..kernel.pidfd import signal_cgroup_members
from ..kernel.spawn import fork_command
from .base import CgroupMemoryLimit, Engine



class CgroupEngine(CgroupMemoryLimit, Engine):
    mode = "cgroup"

    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        parent = os.path.abspath(spec.cgroup_parent)
        if not os.path.isdir(parent):
            raise SetupError(f"--cgroup-parent {parent}: no such directory")
        mounts = cgroupfs.Mounts()
        if mounts.unified is None or not (parent + "/").startswith(mounts.unified.rstrip("/") + "/"):
            raise SetupError(f"--cgroup-parent {parent}: not inside a cgroup v2 hierarchy")
        if not os.access(os.path.join(parent, "cgroup.procs"), os.W_OK) or not os.access(parent, os.W_OK):
            raise SetupError(f"--cgroup-parent {parent}: not delegated to us (cannot write)")
        self.path = os.path.join(parent, f"corral-{spec.run_id}")
        try:
            os.mkdir(self.path)
        except OSError as exc:
            raise SetupError(f"cannot create cgroup {self.path}: {exc.strerror}") from None
        self._removed = False
        self._stopped = set()
        self._last: list[int] = []
        try:
            self._apply_limits(parent)
        except BaseException:
            self._rmdir()
            raise

    def _apply_limits(self, parent):
        spec = self.spec
        available = cgroupfs.controllers(self.path)
        if spec.mem is not None:
            if "memory" in available:
                self._write("memory.max", str(spec.mem))
                if os.path.exists(os.path.join(self.path, "memory.swap.max")):
                    self._write("memory.swap.max", "0")
                self.limits_enforced["mem"] = "kernel"
            else:
                self.limits_enforced["mem"] = "watch"
                self.warnings.append(f"--mem: {parent} does not delegate the memory controller; memory is watched by corral instead")
        if spec.pids is not None:
            if "pids" in available:
                self._write("pids.max", str(spec.pids))
                self.limits_enforced["pids"] = "kernel"
            else:
                self.limits_enforced["pids"] = "none"
                self.warnings.append(f"--pids: {parent} does not delegate the pids controller; the limit is not enforced")

    def _write(self, name, value):
        try:
            with open(os.path.join(self.path, name), "w") as f:
                f.write(value)
        except OSError as exc:
            raise SetupError(f"cannot set {name} in {self.path}: {exc.strerror}") from None

    # -- start ---------------------------------------------------------
    def start(self, argv, *, stdin, stdout, stderr, env, cwd):
        child = fork_command(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd, gated=True)
        try:
            self._write("cgroup.procs", str(child.pid))
        except BaseException:
            child.abandon()
            raise
        self._child = child
        self.seen.add(child.pid)
        child.release()

    # -- limits --------------------------------------------------------
    def oom_killed(self):
        if self.spec.mem is None or self._removed:
            return False
        try:
            return cgroupfs.read_keyed(os.path.join(self.path, "memory.events")).get("oom_kill", 0) > 0
        except OSError:
            return False

    # -- stopping ------------------------------------------------------
    def _procs(self) -> list[int]:
        if self._removed:
            return []
        return cgroupfs.procs_below(self.path)

    def live_pids(self):
        return self._procs()

    def signal_all(self, *sigs):
        pids = self._procs()
        self.seen.update(pids)
        done = signal_cgroup_members(pids, sigs, self.path)
        self._stopped.update(done)
        return len(done)

    def signal_new(self, *sigs):
        fresh = [pid for pid in self._last if pid not in self._stopped]
        done = signal_cgroup_members(fresh, sigs, self.path) if fresh and not self._removed else []
        self._stopped.update(done)
        return len(done)

    def kill_all(self):
        pids = self._procs()
        self.seen.update(pids)
        self._stopped.update(pids)
        if self._removed or not cgroupfs.kill(self.path):
            self.signal_all(signal.SIGKILL)

    def verify_empty(self):
        self.reap()
        if self._removed:
            return []
        if cgroupfs.populated(self.path):
            return self._procs() or [-1]
        self._sample()
        return [] if self._rmdir() else [-1]

    def _sample(self):
        peak = cgroupfs.read_int(os.path.join(self.path, "memory.peak"))
        if peak is not None:
            self.memory_peak = peak

    def _rmdir(self) -> bool:
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                return False
            raise
        self._removed = True
        return True

    def close(self):
        if not self._removed:
            self._rmdir()
        if self._child is not None and self._child.pidfd >= 0:
            os.close(self._child.pidfd)
            self._child.pidfd = -1

    def describe(self):
        info = {"control_group": self.path}
        if getattr(self, "memory_peak", None) is not None:
            info["memory_peak"] = self.memory_peak
        return info

    @property
    def processes_stopped(self) -> int:
        return len(self._stopped)
