"""Direct cgroup v2 engine: a child group in a delegated directory.

For ``--cgroup-parent PATH``: no systemd involved. The run gets
``PATH/corral-<run id>``; the command is held at a gate until it has been
moved in, so nothing it starts can be outside the group. Limits go to
memory.max / pids.max when the parent delegates those controllers; SIGKILL
is one write to cgroup.kill; the run is proven gone when cgroup.events
says ``populated 0`` and the group's rmdir succeeds. If corral dies, its
tether (``fallback_tether``, with the group as its target) stops the run.

Where the kernel allows one (``pidns.PidNamespace``: root, or unprivileged
user namespaces), the command also runs in a pid namespace of its own,
forked by the namespace's init and moved into the group while held before
its exec: it then sees no process outside the run, so it can neither stop
nor kill its corral, its tether or a session's holder (which share its uid),
and a process of the run that leaves the group stays in the namespace,
which the kernel ends with its init (SIGKILLed at the stop's last step, and
with corral). The proof then also needs the init reaped. Where none can be
had, the run is as before, and the record's ``engine.pid_namespace`` says why.

Only corral removes the group, and only after the last reads: its
``memory.events`` (OOM kills) and resource figures are read from the group
itself (``UnitCgroup``, the same reader the systemd engine uses).
memory.events is kept open and polled for POLLPRI, so an OOM kill is seen
when it happens, not at the next limit check.
"""

import _signal  # not signal: the same numbers without enum's start-up cost
import os

from ..common.errors import SetupError
from ..common.unit_names import group_name
from ..kernel import cgroupfs
from ..kernel.pidfd import RunTracker, signal_cgroup_members
from .base import CgroupLimits, Engine, fork_run_command, main_rusage, network_fact, usage_facts
from .cgroup_limits import asked
from .cgroup_target import remove_group
from .fallback_tether import FallbackTether
from .pidns import PidNamespace
from .tether import tether_facts
from .unitcgroup import UnitCgroup

TYPE_CHECKING = False  # typing is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from .delegated import Subtree


class CgroupEngine(CgroupLimits, Engine):
    mode = "cgroup"
    guarantee = "cgroup"

    def __init__(self, spec, *, delegated: "Subtree | None" = None):
        """In ``spec.cgroup_parent``, or in the ``delegated`` subtree corral runs
        in (``delegated.find_subtree``: auto's cgroup tier), whose warnings
        (what the limits cannot get there) become the engine's."""
        super().__init__()
        self.spec = spec
        mounts = cgroupfs.Mounts()
        if delegated is not None:
            parent = delegated.path
            self.warnings += delegated.warnings
        else:
            parent = checked_parent(spec.cgroup_parent, mounts)
        self.path = os.path.join(parent, group_name(spec.run_id))
        try:
            os.mkdir(self.path)
        except OSError as exc:
            raise SetupError(f"cannot create cgroup {self.path}: {exc.strerror}") from None
        self._removed = False
        self._stopped: set[int] = set()
        self._foreign: set[int] = set()  # corral's children beside the run (``ignore_child``)
        self._last: list[int] = []
        self.group = UnitCgroup.v2_directory(self.path, mounts)
        self.tracker = RunTracker("0")
        self._hold_main = True  # its session id stays ours until close() (see RunTracker)
        try:
            self._apply_limits(parent)
        except BaseException:
            self._rmdir()
            raise
        self.group.arm(oom_eventfd=False)  # memory.events (if delegated) and cgroup.events
        # If corral dies (SIGKILL, a crash), its tether stops the run: the stop
        # sequence on the group (``CgroupTarget``), as corralctl would.
        try:
            self._tether = FallbackTether(
                spec.run_id, spec.grace, spec.verify_timeout, cgroup=self.path, wall=spec.wall
            )
        except BaseException:
            self._rmdir()
            raise
        self._ns: PidNamespace | None = None
        self._said_escape = False
        try:
            self._ns = PidNamespace(spec, self.warnings)
            self._ns_absent = None
        except SetupError as exc:
            self._ns_absent = str(exc)
        except BaseException:
            self._tether.close()
            self._rmdir()
            raise

    # A class attribute elsewhere: here it depends on the namespace had.
    @property
    def command_reaches_corral(self) -> bool:  # type: ignore[override]
        return self._ns is None

    def helper_pids(self):
        return [self._tether.pid] + ([self._ns.init] if self._ns is not None else [])

    def ignore_child(self, pid):
        self._foreign.add(pid)

    def reap(self):
        if self._ns is None:
            super().reap()
        elif self._status is None:
            self._status = self._ns.main_status()
        self._reap_adopted(*self._foreign)

    @property
    def main_pid(self):
        return self._ns.main if self._ns is not None else super().main_pid

    def wait_fds(self):
        if self._ns is None:
            return super().wait_fds()
        fd = self._ns.wait_fd() if self._status is None else None
        return [] if fd is None else [fd]

    def _apply_limits(self, parent):
        enforced, warnings = write_limits(self.path, self.spec, parent)
        self.limits_enforced.update(enforced)
        self.warnings += warnings
        if self.spec.cpu_time is not None:
            self.limits_enforced["cpu_time"] = "watch"

    def _write(self, name, value):
        try:
            with open(os.path.join(self.path, name), "w") as f:
                f.write(value)
        except OSError as exc:
            raise SetupError(f"cannot set {name} in {self.path}: {exc.strerror}") from None

    # -- start ---------------------------------------------------------
    def start(self, argv, *, stdin, stdout, stderr, env, cwd, survey=None):
        stdio = {"stdin": stdin, "stdout": stdout, "stderr": stderr, "env": env, "cwd": cwd, "survey": survey}
        if self._ns is not None:
            # Held before its exec until it is in the group (``admit``): nothing it starts is outside.
            self._ns.start(argv, **stdio, admit=self._admit)
            pid = self._ns.main
        else:
            child = fork_run_command(self.spec, argv, **stdio, gated=True)
            try:
                self._admit(child.pid)
            except BaseException:
                child.abandon()
                raise
            self._child = child
            pid = child.pid
        self.seen.add(pid)
        # The group as /proc/PID/cgroup names it (relative to our cgroup namespace).
        path = cgroupfs.proc_cgroup(pid, "0")
        if path and path.endswith("/" + os.path.basename(self.path)):
            self.tracker.cgroup = path
            self._track([pid])
        else:
            self.warnings.append(
                f"cannot tell {self.path} in /proc/{pid}/cgroup ({path!r}): "
                "processes that leave the group are not tracked"
            )
        if self._ns is not None:
            self.reap()  # a command that ended at once: its status may be read already
            return
        try:
            child.release()
        except SetupError:
            self._child = None  # it never ran and is reaped (its seal not in place)
            raise

    def _admit(self, pid: int) -> None:
        """Move the command's held process into the run group."""
        self._write("cgroup.procs", str(pid))

    # -- limits --------------------------------------------------------
    def _has_group(self) -> bool:
        return not self._removed

    def _sample_group(self) -> dict:
        self._sample()
        return self.group.usage.figures

    def _oom_notified(self) -> bool:
        return not self._removed and self.group.oom_notifies()

    def priority_fds(self):
        return [] if self._removed else self.group.priority_fds()

    def poll_events(self):
        if not self._removed:
            self.group.read_watches()  # re-arms their POLLPRI
        had = self._status is not None
        super().poll_events()
        if not had and self._status is not None:
            self._sample()  # the main process exited: the figures so far

    def cpu_time_nsec(self):
        return self.group.usage.figures.get("cpu_usage_nsec")

    def oom_killed(self):
        if self.spec.mem is None:
            return False
        # corral removes the group itself, after its last read: the counters
        # are always there to read, so no inference from the main's SIGKILL.
        return self.group.oom_counted(main_sigkilled_unprompted=False)

    # -- stopping ------------------------------------------------------
    def _procs(self) -> list[int]:
        return [] if self._removed else self.group.pids()

    def live_pids(self):
        return self._procs()

    def signal_all(self, *sigs):
        self._sample()
        pids = self._procs()
        self.seen.update(pids)
        self._track(pids)
        done = signal_cgroup_members(pids, sigs, self.path)
        self._stopped.update(done)
        return len(done)

    def signal_new(self, *sigs):
        fresh = [pid for pid in self._last if pid not in self._stopped]
        done = signal_cgroup_members(fresh, sigs, self.path) if fresh and not self._removed else []
        self._stopped.update(done)
        return len(done)

    def kill_all(self):
        self._sample()
        pids = self._procs()
        self.seen.update(pids)
        self._track(pids)
        self.tracker.kill_escaped()
        self._stopped.update(pids)
        if self._removed or not self.group.kill(use_cgroup_kill=True):
            self.signal_all(_signal.SIGKILL)
        if self._ns is not None:
            self._ns.kill()  # and whatever of the run left the group: it is still in the namespace

    def verify_empty(self):
        self.reap()
        if not self._removed and (left := self.group.remaining()[0]):
            return left
        if self._ns is not None:
            # The group is empty; a process of the run that left it is still in the
            # namespace, which ends with its init: reaped, the kernel has ended them all.
            self._ns.kill()
            if not self._ns.reap_init():
                return [self._ns.init]
            self.reap()  # the init's last lines (the main process's status)
        # The group is empty: whatever of the run still lives is outside it.
        elif escaped := self.tracker.sweep(self._pinned_sessions()):
            self._stopped.update(escaped)
            return escaped
        if self._removed:
            return []
        self.group.sample_final()
        self.group.read_watches()
        return [] if self._rmdir() else [-1]

    def _sample(self):
        """Read the group's figures (and memory.events) while it exists."""
        if not self._removed:
            self.group.sample()
            self.group.read_watches()

    def _rmdir(self) -> bool:
        """Remove the run group (``cgroup_target.remove_group``); False while
        the kernel shows a process in it."""
        if not remove_group(self.path):
            return False
        self._removed = True
        self.group.close()  # a removed group's files would poll ready forever
        return True

    def unproven(self):
        why = super().unproven()
        if why is None or self._ns is None or not self._ns.reaped:
            return why
        # They never left the namespace, whose end the kernel showed: gone, but not
        # held by the group's limits while they lived. Said once, not a lack of proof.
        if not self._said_escape:
            self._said_escape = True
            pids = " ".join(map(str, sorted(self.tracker.escaped)))
            self.warnings.append(
                f"processes of the run left its control group while alive (pids {pids}): outside its limits "
                "from then on, and ended with its pid namespace"
            )
        return None

    def kill_without_descriptors(self) -> bool:
        return self._ns.kill_without_descriptors() if self._ns is not None else False

    def close(self):
        if self._ns is not None:
            self._ns.close()
        self.group.close()
        if not self._removed:
            self._rmdir()
        self._tether.close()
        self.tracker.close()
        self._release_main()
        if self._child is not None and self._child.pidfd >= 0:
            os.close(self._child.pidfd)
            self._child.pidfd = -1

    def registry_facts(self):
        return {"control_group": self.path}

    def describe(self):
        info = {
            "control_group": self.path,
            **usage_facts(self.group.usage.figures, rusage=main_rusage(self._child)),
            "accounting_final": self.group.final,
            **network_fact(self.spec),
            **self.tracker.facts(),
            **tether_facts(self._tether),
            "pid_namespace": self._ns.facts() if self._ns is not None else {"none": self._ns_absent},
        }
        if (events := self.group.memory_events()) is not None:
            info["memory_events"] = events
        return info

    @property
    def processes_stopped(self) -> int:
        return len(self._stopped)


def checked_parent(path: str, mounts: cgroupfs.Mounts) -> str:
    """``--cgroup-parent PATH`` made absolute, or SetupError: not a directory
    of the cgroup v2 hierarchy that corral may write."""
    parent = os.path.abspath(path)
    if not os.path.isdir(parent):
        raise SetupError(f"--cgroup-parent {parent}: no such directory")
    if mounts.unified is None or not (parent + "/").startswith(mounts.unified.rstrip("/") + "/"):
        raise SetupError(f"--cgroup-parent {parent}: not inside a cgroup v2 hierarchy")
    if not os.access(os.path.join(parent, "cgroup.procs"), os.W_OK) or not os.access(parent, os.W_OK):
        raise SetupError(f"--cgroup-parent {parent}: not delegated to us (cannot write)")
    return parent


def write_limits(path: str, spec, parent: str) -> tuple[dict[str, str], list[str]]:
    """Each cgroup limit of ``spec`` (``cgroup_limits.py``) written in the
    group ``path`` where ``parent`` delegates its controller ("kernel"), else
    its ``otherwise`` and a warning. SetupError if a write is refused."""
    enforced, warnings = {}, []
    available = cgroupfs.controllers(path)

    def write(name: str, value: str) -> None:
        try:
            with open(os.path.join(path, name), "w") as f:
                f.write(value)
        except OSError as exc:
            raise SetupError(f"cannot set {name} in {path}: {exc.strerror}") from None

    for limit, value in asked(spec):
        if limit.controller in available:
            write(limit.v2_file, limit.v2_value(value))
            for name, also in limit.v2_also:
                if os.path.exists(os.path.join(path, name)):
                    write(name, also)
            enforced[limit.field] = "kernel"
        else:
            enforced[limit.field] = limit.otherwise
            warnings.append(
                f"{limit.option}: {parent} does not delegate the {limit.controller} controller; {limit.otherwise_words}"
            )
    return enforced, warnings
