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

from .fsread import read_bytes, write_bytes


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
                        if opt in ("memory", "pids", "name=systemd"):
                            v1[opt] = point
        self.unified = unified if unified and _is_cgroup_root(unified) else None
        self.v1 = {key: point for key, point in v1.items() if _is_cgroup_root(point)}

    @property
    def pure_v2(self) -> bool:
        return self.unified is not None and not self.v1

    _cached: "Mounts | None" = None
    _watch = None  # an open /proc/self/mounts: polls POLLPRI once the mount table changes

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
            watch = cls._watch
            if watch is None:
                watch = select.poll()
                cls._watch_file = open("/proc/self/mounts", "rb", buffering=0)
                watch.register(cls._watch_file, select.POLLPRI | select.POLLERR)
                cls._watch = watch
            elif cls._cached is not None and not watch.poll(0):
                return cls._cached
            cls._watch_file.seek(0)  # reading it again re-arms the notification
            cls._watch_file.read()
            cls._cached = mounts = cls()
            return mounts


_current_lock = threading.Lock()


def _is_cgroup_root(point: str) -> bool:
    return os.path.exists(os.path.join(point, "cgroup.procs"))


def unified_dir(mounts: Mounts, path: str) -> str | None:
    return None if mounts.unified is None else mounts.unified + path


def v1_dir(mounts: Mounts, controller: str, path: str) -> str | None:
    point = mounts.v1.get(controller)
    return None if point is None else point + path


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
    pids = []
    for root, _dirs, files in os.walk(directory):
        if "cgroup.procs" in files:
            try:
                pids.extend(int(x) for x in read_bytes(os.path.join(root, "cgroup.procs")).split())
            except OSError:
                pass  # removed while walking: it is empty now
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


def controllers(directory: str) -> set[str]:
    try:
        return set(read_bytes(os.path.join(directory, "cgroup.controllers")).decode().split())
    except OSError:
        return set()
