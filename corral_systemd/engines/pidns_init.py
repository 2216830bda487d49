"""The init of a run's PID namespace: corral's child, pid 1 of the namespace.

It runs in the process ``PidNamespace`` cloned (``kernel.namespaces.clone_into``),
never returns. Steps 1 to 4 (but the second user namespace) are done here
in any case (``_prepare``: the maps and the mounts need the capabilities the
clone gave, which a non-root uid loses at an exec); then, where it was built,
the clone execs the compiled init (``packaging/pidns-init/init.c``), which
does the rest exactly as ``_serve`` does here, so that the namespace's pid 1
is not a copy of the interpreter: its address space then belongs to the user
namespace it exec'd in, which is above the command's (the second one, for
uid 0, is made after the exec). The Python init serves where the helper was
not built and for a sealed run (the seal is ``kernel.seal``'s). It speaks to
corral over two channels, both sockets (a
command running as root may open the init's descriptors, /proc/1/fd/N,
which reopens a pipe, never a socket): lines on ``status`` (init to corral)
and, on ``control`` (corral to init), one start message (the command, its
environment and directory, umask, terminal and the masks of a sealed run,
``start_message``'s format, and its three stdio descriptors, close-on-exec as they arrive: the command gets them as its
stdio only) and one byte that opens the gate.

In order:

1. ``PR_SET_PDEATHSIG`` SIGKILL, then a look at corral's pidfd: had corral
   died before the prctl, the signal would never come, so it exits. From
   then on corral's death (SIGKILL included) kills it, and the kernel kills
   every process of the namespace with it. The signal is tied to the
   *thread* that cloned it: the engine is opened and closed in the thread
   that runs the supervisor;
2. a session of its own (a terminal's signals are corral's), every stop
   signal ignored (the command starts with them at their defaults,
   ``kernel.signals.CHILD_DEFAULTS``); a pid 1 gets no signal from inside its
   namespace that it does not handle anyway;
3. not root: its user namespace maps the caller's uid and gid to themselves
   (``setgroups`` denied), so the command runs as the caller;
4. a mount namespace whose mounts do not propagate out, and a /proc of the
   namespace's own (the command, and a corral inside it, read pids as their
   namespace numbers them) that the command cannot unmount to find the
   host's: root's has none of the host's below it
   (``kernel.namespaces.mount_own_proc``); in a user namespace the command
   has no capability over the mounts, or, uid 0 there, is in one more user
   namespace below which they are a locked unit. uid 0 of a user namespace
   corral did not make (a rootless container, ``unshare -r``) keeps its
   capabilities over the mounts, and its user namespace (the caller's): the
   copies are detached where they can be (a container's own /proc), but one
   locked below (a copy of its parent's, ``unshare -r`` on a host) can be
   found by unmounting the new /proc: its processes listed, none of them
   signalled (outside the pid namespace);
5. every descriptor of corral's it was cloned with (its stdio, corral's
   signal pipe, the registry's files), but the two channels, now reads
   /dev/null: the command can open the init's descriptors (/proc/1/fd/N)
   as root, and would otherwise write into corral's. Those corral was given
   to pass on (not close-on-exec) stay: the command inherits them in every
   tier. Then ``ready``, or ``setup WHY`` and exit;
6. on the start message, not dumpable, before the command is forked:
   another process may open its descriptors, read its memory or ptrace it
   only with CAP_SYS_PTRACE over corral's user namespace, which root keeps
   and a command in the init's user namespace (3) never has, uid 0 there
   included; not before, as corral reads the init's /proc/PID/ns/pid until
   then. The command is dumpable again once it has exec'd;
7. the command forked as the fallback forks it
   (``kernel.spawn.fork_command``: its own session, the seal of a sealed
   run, a terminal, the umask), held at a gate before its exec: ``fork
   PID`` (its pid here), said while nothing but corral's code runs in the
   namespace, so the line is the init's; on corral's byte (corral holds a
   pidfd for it: it has found it in its own /proc) the gate opens, then
   ``run``, or ``exec ERRNO`` / ``setup WHY`` and exit (the command never
   ran);
8. it reaps every process that ends in the namespace (orphans re-parent to
   it), says ``exit STATUS`` once it has reaped the command's main process,
   and exits once it has no child left: then the namespace is empty.

A command running as root can still reach ``status`` (pidfd_getfd(2),
ptrace): corral takes no line written after the gate opened on its word
alone (``PidNamespace.start``, ``PidNamespace._ended``).
"""

import _signal  # not signal: the same numbers without enum's start-up cost
import _socket  # not socket: its enums cost every run's start
import os
import select

# At the top, not in the functions: corral imports this module before it
# clones the init (``PidNamespace``), so the init finds all of it loaded.
from ..common.plainclass import plainclass
from ..kernel.libc import errno_error
from ..kernel.namespaces import CLONE_NEWNS, CLONE_NEWUSER, map_self, mount_own_proc, set_dumpable
from ..kernel.prctl import set_parent_death_signal
from ..kernel.signals import stop_signals
from ..kernel.spawn import ExecError, fork_command


@plainclass(frozen=True)
class StartMessage:
    """What the init needs to fork the command (its stdio comes beside it)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    umask: int | None
    pty: bool
    #: A sealed run's masks, (path, how): only the Python init seals.
    masks: list[tuple[str, str]]


def start_message(m: StartMessage) -> bytes:
    """The start message's bytes after its stdio: an 8-byte big-endian
    length, then NUL-terminated fields, the one format both inits read
    (``packaging/pidns-init/init.c``): umask ("" or octal), pty ("0"/"1"),
    cwd ("" for none), argc, argv..., envc, NAME=VALUE..., maskc, (path, how)...
    No field can hold a NUL (execve's arguments and environment cannot)."""
    words = [
        "" if m.umask is None else f"{m.umask:o}",
        "1" if m.pty else "0",
        m.cwd or "",
        str(len(m.argv)),
        *m.argv,
        str(len(m.env)),
        *(f"{k}={v}" for k, v in m.env.items()),
        str(len(m.masks)),
        *(w for mask in m.masks for w in mask),
    ]
    data = b"".join(os.fsencode(w) + b"\0" for w in words)
    return len(data).to_bytes(8, "big") + data


def parse_start(data: bytes) -> StartMessage:
    """``start_message``'s fields (after the length); ValueError if malformed."""
    words = iter([os.fsdecode(w) for w in data.split(b"\0")[:-1]])
    try:
        umask, pty, cwd = next(words), next(words), next(words)
        argv = [next(words) for _ in range(int(next(words)))]
        env = dict(next(words).split("=", 1) for _ in range(int(next(words))))
        masks = [(next(words), next(words)) for _ in range(int(next(words)))]
    except (StopIteration, RuntimeError, ValueError):  # RuntimeError: a StopIteration in a generator
        raise ValueError("a malformed start message") from None
    return StartMessage(argv, env, cwd or None, int(umask, 8) if umask else None, pty == "1", masks)


def run(spec, *, status: int, control: int, corral_pidfd: int, uid: int, gid: int, userns: bool, lib, helper) -> None:
    """Be the namespace's init (see the module's docstring): with ``helper``
    (the compiled init's path), steps 1 to 4 here and the rest by the helper,
    exec'd; without, all of it here. Exits, never returns."""
    try:
        _prepare(status, corral_pidfd, uid, gid, userns, lib)
        if helper is not None:
            _exec_helper(helper, status, control, f"{uid}:{gid}" if userns and uid == 0 else "-")
        _serve(spec, status, control, uid, gid, userns, lib)
    except BaseException as exc:  # noqa: BLE001 -- whatever failed is said to corral, never raised into its code
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        _say(status, f"setup {why}")
    os._exit(125)


def _prepare(status, corral_pidfd, uid, gid, userns, lib) -> None:
    """Steps 1 to 4 but the second user namespace: what must happen before an
    exec (the maps and the mounts need the capabilities the clone gave, which
    a non-root uid loses when it execs)."""
    set_parent_death_signal(_signal.SIGKILL)
    poller = select.poll()
    poller.register(corral_pidfd, select.POLLIN)
    if poller.poll(0):
        os._exit(0)  # corral died before the prctl: nobody is left to serve
    os.close(corral_pidfd)
    _signal.set_wakeup_fd(-1)
    for sig in stop_signals():
        _signal.signal(sig, _signal.SIG_IGN)
    for sig in (_signal.SIGCHLD, _signal.SIGWINCH):
        _signal.signal(sig, _signal.SIG_DFL)
    os.setsid()
    if userns:
        set_dumpable(lib)
        map_self(uid, gid)
    try:
        mount_own_proc(lib)
    except OSError as exc:
        raise OSError(exc.errno, f"no /proc of its own can be mounted ({exc.strerror or exc})") from None


def _exec_helper(helper: str, status: int, control: int, unshare: str) -> None:
    """Become the compiled init (``packaging/pidns-init/init.c``), the two
    channels passed by number; it makes the second user namespace itself
    (``unshare``: "UID:GID" or "-"), after its exec, so that its address
    space belongs to the user namespace above the command's (step 6).
    Every other descriptor of corral's that is close-on-exec ends here."""
    os.set_inheritable(status, True)
    os.set_inheritable(control, True)
    try:
        os.execv(helper, [helper, str(status), str(control), unshare])
    except OSError as exc:
        raise OSError(exc.errno, f"{helper}: {exc.strerror}") from None


def _serve(spec, status, control, uid, gid, userns, lib) -> None:
    """Steps 4 (the second user namespace) to 8, in Python; exits."""
    if userns and uid == 0:
        # uid 0 has every capability in the user namespace made above, over these mounts
        # too: it could unmount the new /proc and find the host's, locked, below it. In one
        # more user namespace the mounts come as a locked unit, the new /proc included.
        # (uid 0 of a user namespace corral did not make keeps it: the command's user
        # namespace is its caller's; a locked copy below stays listable, see the docstring.)
        if lib.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
            raise errno_error("unshare")
        map_self(uid, gid)
    _shed_descriptors(keep={status, control})
    _say(status, "ready")
    main = _start(spec, status, control, lib)
    if main is None:
        os._exit(0)
    while True:
        try:
            pid, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(0)  # no child left: every process of the namespace is gone
        if pid == main:
            _say(status, f"exit {wait_status}")


def _shed_descriptors(keep: set[int]) -> None:
    """Point every descriptor of corral's but ``keep`` at /dev/null, stdio
    included; leave those corral was given to pass on (see the module's
    docstring). Replaced, not closed: their numbers stay taken, so an object
    of corral's still naming one never closes a descriptor of the init's own."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            passed_on = fd > 2 and os.get_inheritable(fd)
        except OSError:
            continue  # the listing's own descriptor, closed again
        if not passed_on and fd not in keep and fd != null:
            os.dup2(null, fd, inheritable=False)
    os.close(null)


def _start(spec, status, control, lib) -> int | None:
    """The command, forked from the start message; its pid, or None (corral sent none)."""
    sock = _socket.socket(fileno=control)
    head, fds = _receive_fds(sock, 3)
    if not head:
        return None
    set_dumpable(lib, False)  # before the command exists (see the module's docstring)
    size = int.from_bytes(_exactly(sock, 8), "big")
    message = parse_start(_exactly(sock, size))
    seal = None
    if spec.sealed:
        from ..kernel.handoff import Mask
        from ..kernel.seal import Seal

        seal = Seal([Mask(path, how) for path, how in message.masks], network=spec.network == "none")
    child = fork_command(
        message.argv,
        stdin=fds[0],
        stdout=fds[1],
        stderr=fds[2],
        env=message.env,
        cwd=message.cwd,
        gated=True,
        seal=seal,
        controlling_tty=message.pty,
        umask=message.umask,
    )
    for fd in set(fds):
        os.close(fd)
    _say(status, f"fork {child.pid}")
    # The gate opens on corral's byte: it has found the child in its own /proc and holds
    # a pidfd for it (or corral is gone: end of file, and this process with it).
    if sock.recv(1) != b"k":
        child.abandon()
        os._exit(0)
    sock.close()
    try:
        child.release()
    except ExecError as exc:
        _say(status, f"exec {exc.errno}")
        os._exit(0)
    except Exception as exc:  # noqa: BLE001 -- a failed seal (SetupError): said, the command never ran
        _say(status, f"setup {exc}")
        os._exit(0)
    _say(status, "run")
    os.close(child.pidfd)
    return child.pid


def _receive_fds(sock, most: int) -> tuple[bytes, list[int]]:
    """A byte and up to ``most`` descriptors, close-on-exec as they arrive
    (``MSG_CMSG_CLOEXEC``): the command gets copies of them only as its
    stdio (dup2), none besides. Not ``socket.recv_fds``, which drops its
    ``flags`` before Python 3.13."""
    from ..kernel.fdpass import received

    head, ancillary, _flags, _addr = sock.recvmsg(1, _socket.CMSG_LEN(most * 4), _socket.MSG_CMSG_CLOEXEC)
    return head, received(ancillary)


def _exactly(sock, size: int) -> bytes:
    """``size`` bytes from ``sock`` (fewer: corral is gone)."""
    data = bytearray()
    while len(data) < size and (chunk := sock.recv(min(1 << 16, size - len(data)))):
        data += chunk
    return bytes(data)


def _say(fd: int, line: str) -> None:
    """One line to corral; corral gone (EPIPE) is nobody to tell."""
    try:
        os.write(fd, line.replace("\n", " ").encode() + b"\n")
    except OSError:
        pass
