"""A session's holder: the process that holds the session, decides its end and ends it.

Started by ``corralctl session start`` in one of two ways (``state.sessions``:
the entry's ``engine``):

- **systemd**: as the manager's unit ``corral-session_<id>.service``
  (``engines/systemd/session_slice.py``), beside the session's slice. No
  process of the caller's holds the session: it outlives every corral and
  the caller's login session; killed (SIGKILL included), the manager starts
  it again and it takes the session up where it was (``resume``), its runs
  untouched in their slice.
- **fallback** (no manager): forked away by ``session start`` (its own session,
  /dev/null for stdio, none of the caller's descriptors). Each run's corral
  watches it through a pidfd: its death ends the session's runs.

Either way the holder

- is bound to the session's abstract address (``state.sessions.holder_address``):
  the kernel names it to whoever connects, and serves ``Join`` (a run's corral
  asks to be admitted: the holder alone decides, one call at a time, so
  ``--max-runs`` holds), ``Spawn`` (a background run's corral started as its
  child, ``session_spawner.py``), ``Front`` (a compiled client's ``--background``
  command line: its front forked here, made the client's context, so no
  interpreter starts for it) and ``End`` (``session end``: answered, after
  the end, with what is not proven). A caller in another user namespace than
  the holder's is refused: every sealed run's command is in one of its own
  (``kernel/seal.py``), so no sealed run reaches a holder, present or future;
- holds the session's sealed token (``state.sessions.HolderToken``: open or
  ending, the runs it admitted);
- waits blocked (``poll``) on its address, its owner's pidfd, each member's
  corral's pidfd and a signal pipe: a member is busy exactly while its corral
  lives, as the kernel says; no file is read to decide who joined or who is busy;
- ends the session when its owner exits, when idle for its idle timeout, or when
  asked (``End``, or SIGTERM); stopped (SIGSTOP, which a run's command of its uid
  may send), it is continued within ``CONTINUE_EVERY`` by a timer of its own
  (``kernel.selfcontinue``; a holder unit by the manager's watchdog), and acts on
  what passed meanwhile;
- ends it: "ending" first (no run joins from then), every member stopped with
  its own stop sequence, in parallel, then the slice stopped (every unit still
  in it), then every process still below it killed until ``waitpid`` reports
  no child left -- the kernel's proof, as a child subreaper, that nothing it
  held lives. What is not proven is written in the entry's ``not_proven`` and
  said to the ``End`` caller; a fallback holder seals that verdict with the
  secret committed to in the session's id (``common.verdict``), so neither a
  rewritten entry nor a process bound to its address after its death can
  say "proven" in its name.
"""

import os
import select
import signal
import socket
import sys
import time

from ..common import jsoncodec
from ..kernel.pidfd import exited, pid_of
from ..state import registry as REG
from ..state import sessions as S
from ..varlink.wire import Channel, ProtocolError, close_fds, peer_credentials
from .session_spawner import Refused, Spawner

#: How long the session's end waits for its background runs' corrals to finish their records.
SWEEP_GRACE = 10.0
#: How long after a change to the sessions directory the holder writes its entry again.
REWRITE_DELAY = 0.2
#: How long a connection may take to send its call (the holder serves one at a time).
CALL_TIMEOUT = 2.0
#: How soon a fallback holder that was SIGSTOPped is continued by its own timer (``kernel.selfcontinue``).
CONTINUE_EVERY = 2.0


class Holder:
    def __init__(self, directory: str, config: dict, owner_fd: int | None = None, verdicts=None):
        self.directory = directory
        #: A fallback session's secrets (``common.verdict``): its end, said in its own words.
        self.verdicts = verdicts
        if verdicts is not None:
            verdicts.keep_from_forks()  # its background runs' corrals are its forks: none holds them
        #: What ``session start`` decided (``state.sessions.holder_config``); never re-read from the entry.
        self.config = config
        self.session_id: str = config["session"]
        self.owner_fd = owner_fd
        self.token = S.HolderToken(config)
        #: Every run admitted, in order; and those whose corral lives: pidfd -> (run id, background?).
        self.members: list[str] = []
        self.live: dict[int, tuple[str, bool]] = {}
        #: Runs admitted from inside another member's pid namespace (``_within``): run id -> that member's id.
        self.within: dict[str, str] = {}
        self.entry: dict = {}
        self.state = "open"
        self._end_callers: list[Channel] = []
        self._user_ns = user_namespace_view(os.getpid())
        self.sock = self._bind()

    def _bind(self) -> socket.socket:
        """Bind the session's address before anything can join (EADDRINUSE: another
        process holds it -- a holder of this session already runs)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(S.holder_address(self.session_id))
            sock.listen(64)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    # -- its life ---------------------------------------------------------------------------
    def run(self, ready_w: int | None = None) -> int:
        from ..kernel.prctl import set_dumpable

        set_dumpable(False)  # the runs' commands are of its uid: none may ptrace it or open its descriptors
        _off_the_callers_directory()
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)  # a signal (a stop, a child's end) wakes the wait
        asked: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda signum, frame: asked.append(signum))
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        previous = S.read_entry(self.directory, self.session_id)
        if previous is not None and previous.get("state") == "ended":
            return 0  # a restart after the session ended (the unit's): nothing to hold
        REG.ensure_private_dir(S.sessions_dir(REG.ensure_state_dir(self.directory)))  # a restart after it was removed
        self.spawner = Spawner(self.directory, self.session_id, systemd=self.config.get("engine") == "systemd")
        self.token.update()
        self.entry = {
            **S.public_config(self.config),
            "holder": {"pid": os.getpid(), "starttime": REG.own_starttime(), "boot_id": REG.boot_id()},
            "state": "open",
        }
        if previous is not None:
            self.entry["restarted_at"] = time.time()
            self._resume_members()
        S.write_entry(self.directory, self.entry)
        if ready_w is not None:
            os.write(ready_w, b"1")
            os.close(ready_w)
        # A holder unit started again in the middle of the session's end ends it.
        why = previous.get("why") if previous is not None and previous.get("state") == "ending" else None
        why = why or self._owner_gone_at_start()
        last_activity = time.monotonic()
        idle_timeout = float(self.config["idle_timeout"])
        self._watch_entry()
        poller = select.poll()
        for fd in (wake_r, self.sock.fileno(), *([self.owner_fd] if self.owner_fd is not None else []), *self.live):
            poller.register(fd, select.POLLIN)
        poller.register(self.token.fd, select.POLLIN)  # its token's readers, answered here
        if self._entry_watch is not None:
            poller.register(self._entry_watch.fileno(), select.POLLIN)
        rewrite_at: float | None = None
        watchdog = _Watchdog.from_environment()
        if watchdog is None:
            # No manager starts it again: a process of its uid that stopped it (its runs'
            # commands share the uid) is undone by the kernel within CONTINUE_EVERY.
            from ..kernel.selfcontinue import continue_every

            try:
                continue_every(CONTINUE_EVERY)
            except OSError:
                pass  # no timer to be had (RLIMIT_SIGPENDING): the holder as before, unguarded
        while why is None:
            busy = any(not background for _, background in self.live.values())
            timeout = None if busy else max(0.0, last_activity + idle_timeout - time.monotonic())
            if watchdog is not None:
                timeout = watchdog.ping(timeout)
            if rewrite_at is not None:
                timeout = max(
                    0.0, min(timeout if timeout is not None else REWRITE_DELAY, rewrite_at - time.monotonic())
                )
            ready = {fd for fd, _ in poller.poll(None if timeout is None else timeout * 1000 + 1)}
            if wake_r in ready:
                _drain(wake_r)
            if self.token.fd in ready:
                self.token.serve()
            self.spawner.reap()
            if self.owner_fd is not None and self.owner_fd in ready:
                why = f"its owner (pid {self.config['owner']['pid']}) exited"
                break
            if asked:
                why = "ended by corralctl session end"
                break
            for fd in ready & self.live.keys():  # a member's corral exited
                poller.unregister(fd)
                os.close(fd)
                del self.live[fd]
                last_activity = time.monotonic()
            if self.sock.fileno() in ready:
                admitted = self._serve()
                if admitted is not None:
                    poller.register(admitted, select.POLLIN)
                    last_activity = time.monotonic()
                if self._end_callers:
                    why = "ended by corralctl session end"
                    break
            if self._entry_watch is not None and self._entry_watch.fileno() in ready and self._entry_watch.read():
                # Written again a moment later: a whole state directory being removed is gone first.
                rewrite_at = rewrite_at or time.monotonic() + REWRITE_DELAY
            if rewrite_at is not None and time.monotonic() >= rewrite_at:
                rewrite_at = None
                self._keep_entry()
                self._rewatch()
            busy = any(not background for _, background in self.live.values())
            if not busy and time.monotonic() - last_activity >= idle_timeout:
                why = f"idle for {idle_timeout:g}s"
        self.end(why)
        return 0

    def _resume_members(self) -> None:
        """A holder started again (its unit's restart): the runs a former holder
        admitted are those whose own live corral's token names this session; each is
        admitted again (its corral's pidfd), so the end stops it with its own stop
        sequence. Read once, at the start, never to decide anything later."""
        for entry in REG.list_entries(self.directory):
            token = REG.owner_token(entry)
            run_id = entry.get("run_id")
            if token is None or token.get("session") != self.session_id or not isinstance(run_id, str):
                continue
            try:
                pidfd = os.pidfd_open(token["pid"])
            except (OSError, KeyError, TypeError):
                continue
            if REG.owner_token(entry) is None:  # gone (and its pid reused) meanwhile
                os.close(pidfd)
                continue
            self.live[pidfd] = (run_id, bool(entry.get("background")))
            self.members.append(run_id)
        self.token.update(members=self.members)

    def _owner_gone_at_start(self) -> str | None:
        """The owner's pidfd, opened here when not inherited (the unit, or its
        restart): the pid must still name the process ``session start`` saw."""
        owner = self.config.get("owner")
        if owner is None or self.owner_fd is not None:
            return None
        try:
            fd = os.pidfd_open(owner["pid"])
        except OSError:
            return f"its owner (pid {owner['pid']}) exited"
        st = REG.proc_stat(owner["pid"])
        if st is None or st[4] != owner["starttime"] or st[3] in ("Z", "X"):
            os.close(fd)
            return f"its owner (pid {owner['pid']}) exited"
        self.owner_fd = fd
        return None

    _entry_watch = None

    def _watch_entry(self) -> None:
        """Wake when the sessions directory changes (the entry rewritten or removed,
        the directory itself removed): no look at it otherwise."""
        from ..kernel.inotify import Inotify

        try:
            self._entry_watch = Inotify()
        except OSError:
            return  # none to be had: the entry is written again at the holder's next wake
        self._rewatch()

    def _rewatch(self) -> None:
        from ..kernel import inotify as I

        if self._entry_watch is None:
            return
        try:
            self._entry_watch.watch(
                S.sessions_dir(self.directory),
                I.IN_ONLYDIR
                | I.IN_CLOSE_WRITE
                | I.IN_MOVED_FROM
                | I.IN_MOVED_TO
                | I.IN_DELETE
                | I.IN_DELETE_SELF
                | I.IN_MOVE_SELF,
            )
        except OSError:
            pass  # removed again meanwhile: the next event, or wake, writes it again

    def _keep_entry(self) -> None:
        """The session's entry as the holder wrote it: a removed or rewritten one is
        written again, in a state directory made again if it was removed too. (An
        index for names and the session's history: nothing the holder decides reads it.)"""
        if S.read_entry(self.directory, self.session_id) != self.entry:
            try:
                REG.ensure_state_dir(self.directory)
                S.write_entry(self.directory, self.entry)
            except OSError:
                pass  # not to be had (a file in its way): the address and the token still hold the session

    # -- a call ----------------------------------------------------------------------------
    def _serve(self) -> int | None:
        """Serve one waiting connection; the pidfd of a run it admitted, if any."""
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return None
        conn.settimeout(CALL_TIMEOUT)
        channel = Channel(conn)
        fds: list[int] = []
        keep = False
        pinned = -1
        try:
            pid, uid, _gid = peer_credentials(conn)
            pinned = _peer_pidfd(conn, pid)  # before anything is read of it: the process that connected
            got = channel.receive()
            if got is None:
                return None  # a look at who holds the address (``state.sessions.holder_token``)
            call, fds = got
            self._check_caller(pid, uid)
            method, params = call.get("method"), call.get("parameters") or {}
            if not isinstance(params, dict):
                raise Refused("InvalidParameter", "parameters: not an object")
            if method == S.JOIN_METHOD:
                pidfd, reply = self._join(pid, params)
                channel.send({"parameters": reply})
                return pidfd
            if method == S.SPAWN_METHOD:
                if self.state != "open":
                    raise Refused("SessionEnding", f"session {self.session_id} is ending")
                keep = self.spawner.spawn(channel, params, fds)
                return None
            if method == S.FRONT_METHOD:
                if self.state != "open":  # the client's own corral says so, as for any run
                    raise Refused("NotServed", f"session {self.session_id} is ending")
                keep = self.spawner.front(channel, pid, pinned, params, fds)
                return None
            if method == S.END_METHOD:
                self._end_callers.append(channel)
                keep = True
                return None
            raise Refused("MethodNotFound", f"no method {method!r}")
        except Refused as exc:
            _reply_error(channel, exc.args[0], exc.args[1])
        except (OSError, ProtocolError, ValueError, KeyError, TypeError) as exc:
            _reply_error(channel, "InvalidParameter", str(exc))
        except Exception as exc:  # noqa: BLE001  a caller's input never ends the session: said, and served on
            _reply_error(channel, "InternalError", f"{type(exc).__name__}: {exc}")
        finally:
            close_fds(fds)
            if pinned >= 0:
                os.close(pinned)
            if not keep:
                conn.close()
        return None

    def _check_caller(self, pid: int, uid: int) -> None:
        """Only this uid, and only from the holder's own user namespace: a sealed
        run's command is in one of its own (and so is all it starts), so it can
        ask nothing of a holder, whatever path it found to the address. Told by
        what any process may read of another (``user_namespace_view``: corral's
        own processes are not dumpable, so their /proc/PID/ns is not readable)."""
        if uid != os.geteuid():
            raise Refused("PermissionDenied", f"uid {uid} is not the session's")
        if user_namespace_view(pid) != self._user_ns:
            raise Refused("PermissionDenied", "a caller in another user namespace (a sealed run) is refused")

    def _join(self, pid: int, params: dict) -> tuple[int, dict]:
        """Admit run ``params['run_id']`` whose corral is ``pid`` (the kernel's word):
        its registry token must name that run, this session and ``pid``. (a pidfd
        of its corral, the reply). Refused while ending, or past ``--max-runs``."""
        run_id = params.get("run_id")
        if not isinstance(run_id, str) or not REG.valid_run_id(run_id):
            raise Refused("InvalidParameter", "run_id")
        if self.state != "open":
            raise Refused("SessionEnding", f"session {self.session_id} is ending")
        pidfd = os.pidfd_open(pid)
        try:
            # The caller is the process bound to run_id's token address (the kernel's word;
            # it waits for this answer, so it is asked nothing): that run's corral.
            if REG.token_holder(REG.TOKEN_PREFIX + run_id) != pid:
                raise Refused("NotTheRun", f"the caller is not the corral of run {run_id}")
            within = self._within(pid) if params.get("within") is True else None
            if params.get("within") is True and within is None:
                raise Refused(
                    "NotWithin",
                    f"session {self.session_id}'s holder is outside this run's pid namespace: "
                    "from there only a corral inside one of the session's runs may join",
                )
            max_runs = self.config.get("max_runs")
            running = [rid for fd, (rid, _) in self.live.items() if not exited(fd)]
            if isinstance(max_runs, int) and len(running) >= max_runs:
                raise Refused(
                    "TooManyRuns", f"session {self.session_id} has {len(running)} runs, its --max-runs {max_runs}"
                )
        except BaseException:
            os.close(pidfd)
            raise
        self.live[pidfd] = (run_id, self.spawner.keeps(pid))
        if run_id not in self.members:
            self.members.append(run_id)
        if within is not None:
            self.within[run_id] = within
        self.token.update(members=self.members)
        return pidfd, {
            **({"within": within} if within is not None else {}),
            "holder": os.getpid(),
            "owner": self.config.get("owner"),
            "limits": self.config.get("limits") or {},
            "slice": self.config.get("slice"),
            "manager": self.config.get("manager"),
        }

    def _within(self, pid: int) -> str | None:
        """The member whose corral ``pid`` descends from (its parents, as the kernel
        says: a corral nested in a member's ``pidns`` run, whose namespace hides
        this holder), or None. Such a run is stopped by that member's stop: its
        init's death ends every process of the namespace."""
        corrals = {pid_of(fd): run_id for fd, (run_id, _) in self.live.items() if not exited(fd)}
        corrals.pop(None, None)
        seen = 0
        while pid > 1 and seen < 4096:
            st = REG.proc_stat(pid)
            if st is None:
                return None
            pid, seen = st[0], seen + 1
            if pid in corrals:
                return corrals[pid]
        return None

    # -- its end ----------------------------------------------------------------------------
    def end(self, why: str) -> None:
        self.state = "ending"
        self.token.update(state="ending")
        self.entry.update(state="ending", why=why)
        self._keep_entry()
        self._serve_pending()  # whoever asked before "ending" was said is answered now
        # A run admitted inside another is stopped by that one's stop, and proven with it.
        left = stop_members(self.directory, [m for m in self.members if m not in self.within])
        for run_id in self.within:
            outer = run_id
            while outer in self.within:
                outer = self.within[outer]
            if outer in left:
                left.append(run_id)
        if self.config.get("slice") is not None:
            left += stop_slice(self.session_id)
        # What is still below the holder: a background run's corral finishing its
        # record, an orphan of one whose corral was killed (stopped by its tether, or not).
        stray = self.spawner.sweep([fd for fd, (_, background) in self.live.items() if background], grace=SWEEP_GRACE)
        if self.config.get("engine") == "systemd":  # a former holder's children, left in the unit (KillMode=process)
            stray += _sweep_own_unit(self.config["holder_unit"])
        if stray:
            left.append(f"processes below the session's holder ({' '.join(map(str, stray))})")
        for fd in self.live:
            os.close(fd)
        self.live.clear()
        self.entry.update(state="ended", ended_at=time.time(), why=why, members=self.members, not_proven=left)
        verdict = self.verdicts.reveal(proven=not left) if self.verdicts is not None else None
        if verdict is not None:
            self.entry["verdict"] = verdict
        try:
            S.write_entry(self.directory, self.entry)
        except OSError:
            pass
        self._serve_pending()  # an End that came during the end is answered too
        for channel in self._end_callers:  # the verdict, from the holder the kernel named to them
            try:
                said = {"members": self.members, "not_proven": left, "why": why}
                channel.send({"parameters": {**said, **({"verdict": verdict} if verdict else {})}})
            except OSError:
                pass
            channel.sock.close()
        self.sock.close()
        self.spawner.close()
        if self._entry_watch is not None:
            self._entry_watch.close()
        self.token.close()

    def _serve_pending(self) -> None:
        """Answer the connections already waiting (a Join now is refused: ending)."""
        for _ in range(256):  # those waiting now, not a stream that keeps coming
            try:
                if not select.select([self.sock], [], [], 0)[0]:
                    return
            except OSError:
                return
            pidfd = self._serve()
            if pidfd is not None:  # cannot be: ending refuses a Join
                os.close(pidfd)


class _Watchdog:
    """The holder unit's watchdog (``WatchdogUSec=``, systemd mode): ``WATCHDOG=1``
    to ``$NOTIFY_SOCKET`` every half period. A holder the run stopped stops pinging,
    and the manager kills it and starts it again (the session taken up again)."""

    def __init__(self, address: str, period: float):
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.every = period / 2
        self.next = 0.0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @classmethod
    def from_environment(cls) -> "_Watchdog | None":
        address, usec = os.environ.get("NOTIFY_SOCKET"), os.environ.get("WATCHDOG_USEC", "")
        if not address or not usec.isdigit() or int(usec) <= 0:
            return None
        if os.environ.get("WATCHDOG_PID", str(os.getpid())) != str(os.getpid()):
            return None
        return cls(address, int(usec) / 1e6)

    def ping(self, timeout: float | None) -> float:
        """Ping if due; the wait's timeout, shortened to the next ping."""
        now = time.monotonic()
        if now >= self.next:
            try:
                self.sock.sendto(b"WATCHDOG=1", self.address)
            except OSError:
                pass  # the manager is going (daemon-reexec): the next ping tries again
            self.next = now + self.every
        left = self.next - now
        return left if timeout is None else min(timeout, left)


def user_namespace_view(pid: int) -> tuple[str, str, str] | None:
    """Process ``pid``'s user namespace as seen from here: its uid_map, gid_map
    and setgroups (readable for any process, dumpable or not; a map is shown
    relative to the reader's namespace, so another namespace's differs from
    this one's: a sealed run's maps only its own uid and gid, setgroups
    denied). None if it cannot be read."""
    try:
        return tuple(  # type: ignore[return-value]
            open(f"/proc/{pid}/{name}").read() for name in ("uid_map", "gid_map", "setgroups")
        )
    except OSError:
        return None


def _peer_pidfd(sock: socket.socket, pid: int) -> int:
    """A pidfd of the process that connected ``sock``: the kernel's (``SO_PEERPIDFD``,
    Linux 6.5), else, where the kernel has no such option, one opened by ``pid`` (what
    ``SO_PEERCRED`` said at connect). OSError if the peer has ended (its pid is not
    looked up again then: it could be another process's by now)."""
    import errno

    try:
        return sock.getsockopt(socket.SOL_SOCKET, getattr(socket, "SO_PEERPIDFD", _SO_PEERPIDFD))
    except OSError as exc:
        if exc.errno != errno.ENOPROTOOPT:
            raise
    return os.pidfd_open(pid)


#: getsockopt(2)'s SO_PEERPIDFD where Python's socket module does not name it (the
#: generic value: x86, arm, riscv, s390, ppc; parisc, sparc and alpha differ).
_SO_PEERPIDFD = 77


def _off_the_callers_directory() -> None:
    """As ``python -P`` would: the directory a fallback holder's starter ran in (the
    first entry of its module path, for ``python -m`` or ``-c``) is not where the
    holder, or the runs' corrals it forks, import from -- unless corral itself is there."""
    if sys.flags.safe_path or not sys.path:
        return
    first = os.path.abspath(sys.path[0] or os.curdir)
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if first != package_parent:
        del sys.path[0]


def _reply_error(channel: Channel, name: str, why: str) -> None:
    try:
        channel.send({"error": f"{S.INTERFACE}.{name}", "parameters": {"why": why}})
    except OSError:
        pass


def stop_members(directory: str, run_ids: list[str]) -> list[str]:
    """Stop each run (in parallel, each with its own stop sequence); the ids not proven gone."""
    from concurrent.futures import ThreadPoolExecutor

    from .logs import proven_gone
    from .stop import stop

    def one(run_id: str) -> str | None:
        entry = REG.read_entry(directory, run_id)
        if entry is None:  # removed (the state directory damaged): what carries the run's mark is stopped
            return None if _stop_marked(run_id) else run_id
        if not proven_gone(directory, entry):
            stop(run_id, directory=directory)
        again = REG.read_entry(directory, run_id) or entry
        return None if proven_gone(directory, again) else run_id

    if not run_ids:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(run_ids))) as pool:
        return [r for r in pool.map(one, run_ids) if r is not None]


def stop_slice(session_id: str) -> list[str]:
    """Stop the session's slice (what is still in it) and prove its cgroup empty;
    [] when proven, else what is not. The slice is the one the session's id names,
    whatever an entry says; no manager (a fallback session): nothing to stop."""
    from ..common.errors import SetupError
    from ..engines.systemd.session_slice import SessionSlice

    try:
        session_slice = SessionSlice(session_id)
    except SetupError:
        return []
    try:
        left = session_slice.stop()
    finally:
        session_slice.close()
    if not left:
        return []
    pids = " ".join(str(p) for p in left if p > 0) or "its cgroup still populated"
    return [f"{session_slice.slice} ({pids})"]


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _sweep_own_unit(unit: str) -> list[int]:
    """systemd mode: SIGKILL every process of the holder's own unit but itself
    (its cgroup, as /proc/self/cgroup names it); the pids still there after."""
    from ..engines.unitcgroup import UnitCgroup, cgroup_of
    from ..kernel import cgroupfs, procfs
    from ..kernel.pidfd import signal_process

    path = cgroup_of(os.getpid(), unit)
    if not path:
        return []  # not in a unit of its own: nothing here is the session's
    group = UnitCgroup(path, cgroupfs.Mounts())
    others: list[int] = []
    for _ in range(50):
        others = [pid for pid in group.pids() if pid != os.getpid()]
        if not others:
            return []
        for pid in others:
            info = procfs.read_stat(pid)
            if info is not None:
                signal_process(info, signal.SIGKILL, lambda _current: True)
        time.sleep(0.05)
    return others


def _stop_marked(run_id: str) -> bool:
    """A run whose entry is gone: stop every process carrying its mark
    (``CORRAL_RUN_ID`` in its environment, inherited by all it started) with
    the stop sequence; proven gone?"""
    from ..common.stopping import stop_and_verify
    from ..engines.fallback_tether import MarkedProcesses

    def wait(seconds: float) -> bool:
        time.sleep(seconds)
        return False

    return stop_and_verify(MarkedProcesses(run_id), grace=2.0, verify_timeout=3.0, wait=wait).verified


def main(argv: list[str]) -> int:
    """The holder unit's main process: ``python -m corral_systemd.ctl.session_holder CONFIG``."""
    if len(argv) != 1:
        print("usage: python -m corral_systemd.ctl.session_holder CONFIG_JSON", file=sys.stderr)
        return 2
    config = jsoncodec.loads(argv[0])
    return Holder(REG.state_dir(), config).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
