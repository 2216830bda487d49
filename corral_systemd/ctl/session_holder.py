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

- holds the session's sealed token (``state.sessions.HolderToken``: open or
  ending, the runs it saw join, each proven by that run's own corral's token),
- ends the session when its owner exits (a pidfd: inherited from ``session
  start``, or opened again and checked against the owner's start time), when
  idle for its idle timeout, or when asked (SIGTERM: ``session end``);
- ends it: "ending" first (no run joins from then), every member stopped with
  its own stop sequence, in parallel, then the slice stopped (every unit still
  in it), and each member, and the slice's cgroup, proven gone from what the
  kernel shows. What is not proven is written in the entry's ``not_proven``.
"""

import json
import os
import select
import signal
import sys
import time

from ..state import registry as REG
from ..state import sessions as S

#: How often the holder looks at the registry (new members, foreground runs).
SCAN = 0.2
#: How long the session's end waits for its background runs' corrals to finish their records.
SWEEP_GRACE = 10.0


class Holder:
    def __init__(self, directory: str, config: dict, owner_fd: int | None = None):
        self.directory = directory
        #: What ``session start`` decided (``state.sessions.holder_config``); never re-read from the entry.
        self.config = config
        self.session_id: str = config["session"]
        self.owner_fd = owner_fd
        self.token = S.HolderToken(config)
        self.members: list[str] = []
        self._seen: dict[str, int] = {}
        self.entry: dict = {}

    # -- its life ---------------------------------------------------------------------------
    def run(self, ready_w: int | None = None) -> int:
        from .session_spawner import Spawner

        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)  # a signal (a stop, a child's end) wakes the loop
        asked: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda signum, frame: asked.append(signum))
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        previous = S.read_entry(self.directory, self.session_id)
        if previous is not None and previous.get("state") == "ended":
            return 0  # a restart after the session ended (the unit's): nothing to hold
        REG.ensure_private_dir(S.sessions_dir(REG.ensure_state_dir(self.directory)))  # a restart after it was removed
        self.spawner = Spawner(self.directory, self.session_id)
        self.token.update()
        self.entry = {
            **S.public_config(self.config),
            "holder": {"pid": os.getpid(), "starttime": REG.own_starttime(), "boot_id": REG.boot_id()},
            "state": "open",
        }
        if previous is not None:
            self.entry["restarted_at"] = time.time()
        S.write_entry(self.directory, self.entry)
        if ready_w is not None:
            os.write(ready_w, b"1")
            os.close(ready_w)
        # A holder unit started again in the middle of the session's end ends it.
        why = previous.get("why") if previous is not None and previous.get("state") == "ending" else None
        why = why or self._owner_gone_at_start()
        last_activity = time.monotonic()
        idle_timeout = float(self.config["idle_timeout"])
        while why is None:
            fds = [wake_r, self.spawner.fileno()] + ([self.owner_fd] if self.owner_fd is not None else [])
            ready, _, _ = select.select(fds, [], [], SCAN)
            if wake_r in ready:
                _drain(wake_r)
            self.spawner.reap()
            if self.owner_fd is not None and self.owner_fd in ready:
                why = f"its owner (pid {self.config['owner']['pid']}) exited"
                break
            if asked:
                why = "ended by corralctl session end"
                break
            if self.spawner.fileno() in ready:
                self.spawner.accept(open_=True)
                last_activity = time.monotonic()
            self._keep_entry()
            self.spawner.keep_listening()
            joined, foreground = self._scan()
            if joined:
                self.members.extend(joined)
                self.token.update(members=self.members)
            if joined or foreground:
                last_activity = time.monotonic()
            elif time.monotonic() - last_activity >= idle_timeout:
                why = f"idle for {idle_timeout:g}s"
        self.end(why)
        return 0

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

    def _keep_entry(self) -> None:
        """The session's entry as the holder wrote it: a removed or rewritten one is
        written again, in a state directory made again if it was removed too."""
        if S.read_entry(self.directory, self.session_id) != self.entry:
            try:
                REG.ensure_state_dir(self.directory)
                S.write_entry(self.directory, self.entry)
            except OSError:
                pass  # not to be had (a file in its way): the token still holds the session

    # -- its end ----------------------------------------------------------------------------
    def end(self, why: str) -> None:
        self.token.update(state="ending")
        self.spawner.stop_listening()  # a front that comes now is told the session is ending
        self.entry.update(state="ending", why=why)
        self._keep_entry()
        joined, _ = self._scan()  # whoever joined before "ending" was read
        self.members.extend(joined)
        self.token.update(members=self.members)
        left = stop_members(self.directory, self.members)
        if self.config.get("slice") is not None:
            left += stop_slice(self.session_id)
        # What is still below the holder: a background run's corral finishing its
        # record, an orphan of one whose corral was killed (stopped by its tether, or not).
        stray = self.spawner.sweep(grace=SWEEP_GRACE)
        if self.config.get("engine") == "systemd":  # a former holder's children, left in the unit (KillMode=process)
            stray += _sweep_own_unit(self.config["holder_unit"])
        if stray:
            left.append(f"processes below the session's holder ({' '.join(map(str, stray))})")
        self.spawner.close()
        self.entry.update(state="ended", ended_at=time.time(), why=why, members=self.members, not_proven=left)
        try:
            S.write_entry(self.directory, self.entry)
        except OSError:
            pass
        self.token.close()

    # -- who joined -------------------------------------------------------------------------
    def _scan(self) -> tuple[list[str], bool]:
        """(runs newly proven to have joined, whether a member runs in the foreground now).

        Reads only entries changed since the last look."""
        joined: list[str] = []
        foreground = False
        try:
            names = os.scandir(self.directory)
        except OSError:
            return joined, foreground
        with names:
            for item in names:
                if not item.name.endswith(".json"):
                    continue
                run_id = item.name[:-5]
                if not REG.valid_run_id(run_id):
                    continue
                try:
                    mtime = item.stat(follow_symlinks=False).st_mtime_ns
                except OSError:
                    continue
                is_member = run_id in self.members or run_id in joined
                if not is_member and self._seen.get(run_id) == mtime:
                    continue
                self._seen[run_id] = mtime
                entry = REG.read_entry(self.directory, run_id)
                if entry is None or entry.get("run_id") != run_id:
                    continue
                if not is_member and entry.get("session") == self.session_id:
                    if S.member_of(entry, self.session_id):
                        joined.append(run_id)
                        is_member = True
                    else:
                        # A run that came and went between two looks: it kept the
                        # session busy (all an entry alone may do here).
                        foreground = True
                if is_member and not entry.get("background") and REG.effective_state(entry)[0] == "active":
                    foreground = True
        return joined, foreground


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
    config = json.loads(argv[0])
    return Holder(REG.state_dir(), config).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
