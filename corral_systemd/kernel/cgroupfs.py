"""Where the cgroup hierarchies are mounted, and what they say about a group.

Handles both layouts corral meets: pure cgroup v2 (/sys/fs/cgroup is
cgroup2) and hybrid (v1 controllers, cgroup2 at /sys/fs/cgroup/unified).
Paths given to these functions are cgroup paths as systemd reports them
(``/user.slice/.../corral-x.scope``), relative to the hierarchy roots of
the caller's cgroup namespace.
"""

import errno
import os
import threading

from .fsread import raise_shortage, read_bytes, write_bytes

TYPE_CHECKING = False  # typing is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    import select
    from typing import BinaryIO


class Mounts:
    """Mount points of cgroup2 and of the v1 hierarchies we use.

    /proc/self/mounts can list mounts that a later mount over the same or a
    parent directory hides (a namespace remounting /sys/fs/cgroup does
    that), so the last entry wins and a point counts only if it shows a
    cgroup.procs file.
    """

    def __init__(self):
        unified: str | None = None
        v1: dict[str, str] = {}  # controller or "name=systemd" -> mount point
        with open("/proc/self/mounts") as f:
            for line in f:
                _, point, fstype, options, *_ = line.split()
                if fstype == "cgroup2":
                    unified = point
                elif fstype == "cgroup":
                    for opt in options.split(","):
                        if opt in ("memory", "pids", "cpu", "freezer", "name=systemd"):
                            v1[opt] = point
        self.unified = unified if unified and _is_cgroup_root(unified) else None
        self.v1 = {key: point for key, point in v1.items() if _is_cgroup_root(point)}

    _cached: "Mounts | None" = None
    _watch: "select.poll | None" = None  # a poll of /proc/self/mounts: POLLPRI once the mount table changes
    _watch_file: "BinaryIO | None" = None

    @classmethod
    def current(cls) -> "Mounts":
        """The mount table as of now, parsed again only when it changed.

        For a long-lived process (a library Runner) that reads it for every
        run. The kernel marks an open /proc/self/mounts with POLLPRI|POLLERR
        after any mount or unmount in our namespace (proc(5)), so a cached
        table is never used across a change.
        """
        import select

        with _current_lock:
            watch, mounts_file = cls._watch, cls._watch_file
            if watch is None or mounts_file is None:
                watch = select.poll()
                mounts_file = cls._watch_file = open("/proc/self/mounts", "rb", buffering=0)
                watch.register(mounts_file, select.POLLPRI | select.POLLERR)
                cls._watch = watch
            elif cls._cached is not None and not watch.poll(0):
                return cls._cached
            mounts_file.seek(0)  # reading it again re-arms the notification
            mounts_file.read()
            cls._cached = mounts = cls()
            return mounts


_current_lock = threading.Lock()


def _forget_in_child() -> None:
    """A forked child reads the mount table again with its own watch: its parent's
    file is closed here, at once, before its number could be taken again."""
    global _current_lock
    _current_lock = threading.Lock()  # a fork may have come while another thread held it
    if Mounts._watch_file is not None:
        Mounts._watch_file.close()
    Mounts._watch = Mounts._watch_file = Mounts._cached = None


os.register_at_fork(after_in_child=_forget_in_child)


def _is_cgroup_root(point: str) -> bool:
    return os.path.exists(os.path.join(point, "cgroup.procs"))


def unified_dir(mounts: Mounts, path: str) -> str | None:
    return None if mounts.unified is None else mounts.unified + path


def v1_dir(mounts: Mounts, controller: str, path: str) -> str | None:
    point = mounts.v1.get(controller)
    return None if point is None else point + path


def thaw_v1_frozen(pids, members: set[int]) -> list[str]:
    """Thaw every cgroup v1 freezer group (``freezer.state`` FROZEN or
    FREEZING) that holds one of ``pids`` and nothing but ``members``: a
    frozen process acts on no signal, SIGKILL included, until it is thawed
    (cgroup v2's cgroup.kill needs no thaw). A group that also holds other
    processes stays frozen (thawing it would wake strangers). Returns the
    groups thawed; needs write access to them (root)."""
    mounts = Mounts.current()
    if "freezer" not in mounts.v1:
        return []
    thawed = []
    for pid in pids:
        path = proc_cgroup(pid, "freezer")
        directory = v1_dir(mounts, "freezer", path) if path not in (None, "/") else None
        if directory is None or directory in thawed:
            continue
        try:
            state = read_bytes(os.path.join(directory, "freezer.state")).decode().strip()
            if state not in ("FROZEN", "FREEZING"):
                continue
            if not set(procs_below(directory)) <= members:
                continue
            with open(os.path.join(directory, "freezer.state"), "w") as f:
                f.write("THAWED")
            thawed.append(directory)
        except OSError:
            continue
    return thawed


def read_keyed(path: str) -> dict[str, int]:
    """A flat keyed file (cgroup.events, memory.events, oom_control)."""
    out = {}
    for line in read_bytes(path).decode().splitlines():
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value)
        except ValueError:
            pass
    return out


def read_int(path: str) -> int | None:
    try:
        text = read_bytes(path).strip()
    except OSError:
        return None
    return None if text == b"max" else int(text)


def procs_below(directory: str) -> list[int]:
    """Every pid in cgroup.procs of ``directory`` and its descendants."""
    pids: list[int] = []
    # os.walk skips what it cannot list: a shortage must raise instead.
    for root, _dirs, files in os.walk(directory, onerror=raise_shortage):
        if "cgroup.procs" in files:
            try:
                pids.extend(int(x) for x in read_bytes(os.path.join(root, "cgroup.procs")).split())
            except OSError as exc:
                raise_shortage(exc)  # no descriptor says nothing about the group
                # else removed while walking: it is empty now
    return pids


def populated(directory: str) -> bool | None:
    """cgroup v2 ``populated`` flag; None if the group no longer exists.

    A group removed while we read gives ENODEV: that is "gone" too.
    """
    try:
        return read_keyed(os.path.join(directory, "cgroup.events")).get("populated", 0) == 1
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            return None
        raise


def kill(directory: str) -> bool:
    """Write cgroup.kill (v2, Linux >= 5.14). False if unavailable."""
    try:
        write_bytes(os.path.join(directory, "cgroup.kill"), b"1")
        return True
    except FileNotFoundError:
        return False
    except OSError:
        return False


def controllers(directory: str, file: str = "cgroup.controllers") -> set[str]:
    """The controllers ``directory`` has (``file="cgroup.subtree_control"``:
    those it enables for its children); empty if unreadable."""
    try:
        return set(read_bytes(os.path.join(directory, file)).decode().split())
    except OSError:
        return set()


class KeyedWatch:
    """An open cgroup v2 flat-keyed file (``memory.events``, ``cgroup.events``)
    whose last contents outlive the group.

    The kernel marks an open cgroup notification file POLLPRI|POLLERR when
    it notifies a change (``cgroup_file_notify``: at once, or within 10 ms
    of the previous notification), and reading it again re-arms that: so a
    caller polls ``fileno()`` for POLLPRI (never POLLIN: a kernfs file always
    polls readable) and calls ``read()`` after each wake-up. ``values`` holds
    the counters as last read, also after the group is removed: its reads
    then fail (ENODEV), the descriptor is closed (a removed file would poll
    ready forever) and ``values`` stays as it was.
    """

    def __init__(self, path: str):
        self.path = path
        self.values: dict[str, int] = {}
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # OSError if the file is not there
        self.read()

    @property
    def alive(self) -> bool:
        return self.fd >= 0

    def fileno(self) -> int:
        return self.fd

    def read(self) -> bool:
        """Re-read the file (re-arming its notification); False once it is gone."""
        if self.fd < 0:
            return False
        try:
            data = os.pread(self.fd, 4096, 0)
        except OSError:
            self.close()
            return False
        values = {}
        for line in data.decode().splitlines():
            key, _, value = line.partition(" ")
            try:
                values[key] = int(value)
            except ValueError:
                pass
        self.values = values
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _read_keyed_or_empty(path: str) -> dict[str, int]:
    try:
        return read_keyed(path)
    except (OSError, ValueError):
        return {}


def _read_int_or_none(path: str) -> int | None:
    try:
        return read_int(path)
    except ValueError:
        return None


class Usage:
    """The kernel's own resource figures for one cgroup, as far as it offers
    them, keeping the largest value read of each (they only grow while the
    group lives; once it is removed they cannot be read at all, so callers
    sample while it exists). ``figures`` keys, absent when never read:

    - ``memory_peak``: bytes; v2 ``memory.peak`` (Linux >= 5.19, memory
      controller), else v1 ``memory.max_usage_in_bytes``;
    - ``cpu_usage_nsec``, ``cpu_user_nsec``, ``cpu_system_nsec``: v2
      ``cpu.stat`` (present in every v2 group, with or without the cpu
      controller), in ns;
    - ``tasks_peak``: ``pids.peak`` (v2, or the v1 pids hierarchy), else the
      largest ``pids.current`` seen;
    - ``io_read_bytes``, ``io_write_bytes``: ``io.stat`` rbytes/wbytes summed
      over devices (v2, io controller);
    - ``pids_limit_hits``: ``pids.events`` ``max``, how many forks the pids
      limit refused (v2, or the v1 pids hierarchy).
    """

    def __init__(self):
        self.figures: dict[str, int] = {}
        self._absent: set[str] = set()

    def _keep(self, name: str, value: int | None) -> None:
        if value is not None and value >= self.figures.get(name, 0):
            self.figures[name] = value

    def _read(self, read, directory: str, name: str):
        """``read(directory/name)``; a file missing from the group while the group
        is there (a controller it does not have: the hybrid layout's unified
        ``memory.peak``) is not read again at every sample of a waiting run."""
        path = os.path.join(directory, name)
        if path in self._absent:
            return None
        value = read(path)
        if not value and value != 0 and os.path.isdir(directory) and not os.path.exists(path):
            self._absent.add(path)
        return value

    def sample(self, unified: str | None, memory_v1: str | None = None, pids_v1: str | None = None) -> bool:
        """Read the figures now; files that are missing (or a group that is
        gone) add nothing. True when the group was there to read (its cgroup
        v2 ``cpu.stat``, or without a v2 group a v1 figure)."""
        integer, keyed = _read_int_or_none, _read_keyed_or_empty
        before = len(self.figures)
        cpu: dict = {}
        if unified:
            cpu = keyed(os.path.join(unified, "cpu.stat"))
            for key, name in (
                ("usage_usec", "cpu_usage_nsec"),
                ("user_usec", "cpu_user_nsec"),
                ("system_usec", "cpu_system_nsec"),
            ):
                if key in cpu:
                    self._keep(name, cpu[key] * 1000)
        for directory, name in ((unified, "memory.peak"), (memory_v1, "memory.max_usage_in_bytes")):
            if directory and (value := self._read(integer, directory, name)) is not None:
                self._keep("memory_peak", value)
                break
        for directory in (unified, pids_v1):
            if directory:
                value = self._read(integer, directory, "pids.peak")
                if value is None:
                    value = self._read(integer, directory, "pids.current")
                if value is not None:
                    self._keep("tasks_peak", value)
                    break
        for directory in (unified, pids_v1):
            if directory and "max" in (events := self._read(keyed, directory, "pids.events") or {}):
                self._keep("pids_limit_hits", events["max"])
                break
        if unified:
            io = self._read(_io_bytes, unified, "io.stat")
            if io is not None:
                self._keep("io_read_bytes", io[0])
                self._keep("io_write_bytes", io[1])
        return bool(cpu) if unified else len(self.figures) > before


def _io_bytes(path: str) -> tuple[int, int] | None:
    """(rbytes, wbytes) summed over the devices of an io.stat, None without one."""
    try:
        text = read_bytes(path).decode()
    except OSError:
        return None
    read = write = 0
    for line in text.splitlines():
        for field in line.split()[1:]:
            key, _, value = field.partition("=")
            if key == "rbytes":
                read += int(value)
            elif key == "wbytes":
                write += int(value)
    return read, write


def proc_cgroup(pid: int, hierarchy: str = "0") -> str | None:
    """``pid``'s cgroup path in ``hierarchy`` ("0": cgroup v2; or a v1
    hierarchy's controller list entry such as "name=systemd"), as
    /proc/PID/cgroup shows it; None if the process is gone or not in it."""
    try:
        text = read_bytes(f"/proc/{pid}/cgroup").decode()
    except OSError as exc:
        raise_shortage(exc)
        return None
    for line in text.splitlines():
        number, controllers, path = line.split(":", 2)
        if (number == "0" and hierarchy == "0") or (number != "0" and hierarchy in controllers.split(",")):
            return path
    return None
