"""--credential NAME=PATH: secrets that exist only while the run does.

The command finds a copy of each credential as ``$CREDENTIALS_DIRECTORY/NAME``.
Who makes that directory depends on the mode (the record and the registry
say which: ``credentials_delivery``):

- a systemd service (``--unit-type service``): **systemd**, through its own
  credential mechanism. corral passes ``LoadCredential=NAME:PATH`` (PATH made
  absolute; only the path goes over D-Bus and into the transient unit file,
  the manager reads the file itself, as the manager's user) and the manager
  mounts a private ramfs on ``$XDG_RUNTIME_DIR/credentials/<unit>`` (the user
  manager) or ``/run/credentials/<unit>`` (the system manager), which it
  removes whenever the unit stops: the command ended, corral stopped the run,
  or corral died and the tether made the manager stop the unit.
  Delivery is verified inside the unit before the command runs: an
  ``ExecStartPre=`` checks that every NAME is a readable file in
  ``$CREDENTIALS_DIRECTORY`` and exits ``CHECK_FAILED`` otherwise. That
  matters: systemd 252 builds the directory in a mount namespace of its own
  and moves it into place, which reaches the unit only if ``/run`` (or
  ``$XDG_RUNTIME_DIR``) is a *shared* mount; where it is not (a container, a
  test harness) every unit silently gets an empty directory. A file the
  manager cannot read fails the unit with status 243 (EXIT_CREDENTIALS).
  Either way the run fails as a setup error (125, one line) before the
  command starts, and nothing is recorded as the command's result.
- fallback, ``--cgroup-parent`` and scopes: **corral**, a private directory
  (0700, files 0400) on a tmpfs. corral reads the source file once and never
  logs its contents. The directory is removed:

  - by corral when the run ends, whatever the outcome (``finally``);
  - if corral is SIGKILLed, by a *watcher*: a tiny child forked before the
    run starts, in its own session, ignoring terminal signals, that blocks
    reading a pipe whose only write end corral holds. When corral dies for
    any reason the kernel closes that end, the read returns EOF, and the
    watcher removes the directory and exits. It costs one fork and no
    polling, and needs no systemd (so it covers fallback runs, whose
    leftover processes cannot be stopped once corral is gone).
  - as a last resort by ``corralctl gc`` (a watcher killed by hand).

  A scope cannot use systemd's mechanism: scopes run no process of the
  manager's making, so systemd has no credentials for them.

``SetCredential=`` is never used: it would put the secret itself into the
transient unit file and expose it as a D-Bus property of the unit.

Where corral's directory lives: ``<state dir>/credentials/<run id>`` when the
state directory is on a tmpfs or ramfs, else ``/dev/shm/corral-<uid>/<run
id>``; a directory that is not a tmpfs is refused (a secret must not reach a
disk). A base that is not ours and private (another user made
``/dev/shm/corral-<uid>`` first, a symlink, writable by others) is never
used: a random-named private one is made beside it (``credentials_base``).
corral and its watcher hold a shared flock on the run's directory while
they live, so ``corralctl gc`` leaves a live run's credentials alone,
whichever registry (if any) the run is in.
"""

import os

from ..common.credential_check import (  # noqa: F401  (the mechanism, documented here)
    CHECK_FAILED,
    CHECK_SCRIPT,
    EXIT_CREDENTIALS,
    MAX_CREDENTIAL_SIZE,
    source_problem,
)
from ..common.errors import SetupError, UsageError

_MEMORY_FS = ("tmpfs", "ramfs")


def fstype(path: str) -> str | None:
    """File system type of the mount that holds ``path``."""
    path = os.path.realpath(path)
    best, kind = "", None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                point = left.split()[4].replace("\\040", " ")
                if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                    best, kind = point, right.split()[0]
    except OSError:
        return None
    return kind


def shared_base() -> str:
    """The per-user base on /dev/shm: predictable, so another user may have made it first."""
    return f"/dev/shm/corral-{os.geteuid()}"


def credentials_base(state_directory: str, warnings: list | None = None) -> str:
    """The private directory (0700, ours, on a tmpfs) that holds the runs' credential directories.

    ``<state dir>/credentials`` when the state directory is on a tmpfs, else
    ``/dev/shm/corral-UID``. Such a predictable path may be unusable: made
    by another user (``/dev/shm`` is world-writable), a symlink, writable by
    others. It is then never used; a private alternative is made next to it
    with a random name, O_EXCL (``corral-UID.XXXXXXXX``, ``credentials.XXXXXXXX``),
    where ``corralctl gc`` looks too, and a warning says so. SetupError
    (125, one line) when no tmpfs is usable.
    """
    from .registry import ensure_private_dir

    candidates = [os.path.join(state_directory, "credentials"), shared_base()]
    for candidate in candidates:
        parent = os.path.dirname(candidate)
        if not (os.path.isdir(parent) and fstype(parent) in _MEMORY_FS):
            continue
        try:
            return ensure_private_dir(candidate)
        except OSError as exc:
            refused = str(exc)
        import tempfile

        try:
            alternative = tempfile.mkdtemp(prefix=os.path.basename(candidate) + ".", dir=parent)
        except OSError as exc:
            raise SetupError(f"--credential: {refused}; no private alternative in {parent}: {exc.strerror}") from None
        if warnings is not None:
            warnings.append(f"--credential: {refused}; using {alternative} instead")
        return alternative
    raise SetupError(
        f"--credential: no tmpfs for the credentials directory (neither {state_directory} nor /dev/shm is a tmpfs)"
    )


def candidate_bases(state_directory: str) -> list[str]:
    """Every base corral may have used for this user: the two predictable
    ones and their random-named alternatives (for corralctl gc)."""
    out = []
    for base in (os.path.join(state_directory, "credentials"), shared_base()):
        parent, name = os.path.split(base)
        out.append(base)
        try:
            out += [
                os.path.join(parent, n)
                for n in sorted(os.listdir(parent))
                if n.startswith(name + ".") and len(n) == len(name) + 9
            ]
        except OSError:
            pass
    return out


def in_use(path: str) -> bool:
    """Is a live run using this credentials directory? Its corral and its
    watcher hold a shared flock on it as long as they live."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return True  # cannot tell: treat as live
    finally:
        os.close(fd)
    return False


def removable(path: str, run_id: str | None, state_directory: str) -> str | None:
    """Why corralctl must not remove ``path`` as a run's credentials directory, or None.

    Only a directory directly below one of corral's own private bases
    (``candidate_bases``), named as a run id (``run_id``'s if given), a real
    directory of ours, and not in use by a live run.
    """
    from .registry import unsafe_dir_reason, valid_run_id

    if not isinstance(path, str) or not os.path.isabs(path):
        return "not an absolute path"
    path = os.path.normpath(path)
    parent, name = os.path.split(path)
    if parent not in candidate_bases(state_directory):
        return f"{parent} is not one of corral's credentials directories"
    if not valid_run_id(name) or (run_id is not None and name != run_id):
        return f"{name!r} is not this run's directory"
    try:
        reason = unsafe_dir_reason(parent) or unsafe_dir_reason(path)
    except OSError as exc:
        return exc.strerror or str(exc)
    if reason:
        return reason
    if in_use(path):
        return "in use by a live run (locked)"
    return None


class PrivateCredentials:
    """The private directory, its files and its watcher."""

    def __init__(self, pairs: list[tuple[str, str]], run_id: str, state_directory: str):
        self.pairs = pairs
        self.names = [name for name, _ in pairs]  # each once: core.request.credential_pairs
        self.watcher_pid: int | None = None
        self._pipe_w: int | None = None
        self._lock_fd = -1
        self.warnings: list[str] = []
        self._contents = self._read_sources()
        self.path: str = os.path.join(credentials_base(state_directory, self.warnings), run_id)

    def _read_sources(self) -> list[tuple[str, bytes]]:
        out = []
        for name, path in self.pairs:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            except OSError as exc:
                raise UsageError(f"--credential {name}: cannot open {path}: {exc.strerror}") from None
            try:
                import stat

                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise UsageError(f"--credential {name}: {path} is not a regular file")
                data = os.read(fd, MAX_CREDENTIAL_SIZE + 1)
                chunk = data
                while chunk and len(data) <= MAX_CREDENTIAL_SIZE:
                    chunk = os.read(fd, MAX_CREDENTIAL_SIZE + 1 - len(data))
                    data += chunk
            except OSError as exc:
                raise UsageError(f"--credential {name}: cannot read {path}: {exc.strerror}") from None
            finally:
                os.close(fd)
            if len(data) > MAX_CREDENTIAL_SIZE:
                raise UsageError(f"--credential {name}: {path} is larger than 1 MiB")
            out.append((name, data))
        return out

    def create(self) -> None:
        """Make the directory, start the watcher, write the files. SetupError on failure."""
        import fcntl

        try:
            os.mkdir(self.path, 0o700)
        except OSError as exc:
            raise SetupError(f"--credential: cannot create {self.path}: {exc.strerror}") from None
        try:
            # Held (shared) by corral and its watcher while they live: corralctl gc
            # never removes a directory a live run uses, registered here or not.
            self._lock_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            fcntl.flock(self._lock_fd, fcntl.LOCK_SH)
            self._start_watcher()
            for name, data in self._contents:
                fd = os.open(
                    os.path.join(self.path, name),
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o400,
                )
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)
        except OSError as exc:
            self.close()
            raise SetupError(f"--credential: cannot write {self.path}: {exc.strerror}") from None
        except BaseException:
            self.close()
            raise
        finally:
            self._contents = []

    def _start_watcher(self) -> None:
        from ..kernel.detach import fork_detached

        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        pid = fork_detached(keep=(read_fd, self._lock_fd), ignore_terminal_signals=True)
        if pid == 0:  # the watcher
            try:
                while True:
                    try:
                        if not os.read(read_fd, 64):
                            break  # EOF: corral is gone or done
                    except InterruptedError:
                        continue
                remove_tree(self.path)
            finally:
                os._exit(0)
        os.close(read_fd)
        self._pipe_w = write_fd
        self.watcher_pid = pid

    def close(self) -> None:
        """Remove the directory and end the watcher. Safe to call twice."""
        if self.path is not None:
            remove_tree(self.path)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        if self._pipe_w is not None:
            os.close(self._pipe_w)
            self._pipe_w = None
            try:
                if self.watcher_pid is not None:
                    os.waitpid(self.watcher_pid, 0)
            except ChildProcessError:
                pass


def remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
