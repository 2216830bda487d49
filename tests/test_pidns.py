"""Issue 28, part B: the pid namespace tier, and corral as a container's pid 1.

The fault matrix and the other mode-parametrized tests run the tier as mode
``pidns`` (``modes.all_modes``); here is what only it promises:

- corral SIGKILLed: the namespace's init dies with it (``PR_SET_PDEATHSIG``)
  and the kernel kills every process of the namespace -- one that dropped
  the run's mark from its environment (beyond the fallback's tether) too;
  shown by the init's pidfd (readable once it has exited, which the kernel
  reports only after every process of its namespace is gone) and by no
  marked process left;
- as a user who is not root: the command keeps the caller's uid and gid,
  the run is stopped and proven;
- forced where no pid namespace can be had: 125 and one line, the command
  never ran (a user namespace limit of 0, set in a user namespace of the
  test's own: ``userns_limited.py``; a /proc with a locked mask on it, as a
  container's);
- corral as pid 1 (``unshare -fp --mount-proc corral``, what ``podman run
  IMAGE corral`` makes): a signal sent to it stops the run (128+N), from
  outside the namespace or inside it; the exit code reaches the runtime;
  an orphan it adopts from outside the run is reaped, and the run's own
  exit status is still the run's.

Issue 37, what the command can reach (as root; as root without
CAP_SYS_ADMIN, whose init makes a user namespace in which the command is
uid 0; as another user):

- its /proc unmounted, no process outside the namespace is listed where it
  was: root finds an empty directory, the others cannot unmount it;
- a status line written into every descriptor of the init's it can open
  (/proc/1/fd/N) is not its exit status and reaches neither corral's output
  nor its signal pipe; in a user namespace of the init's it can open none;
  the command is dumpable (the init is not).
"""

import json
import os
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from tethers import build_program

from conftest import CORRAL, TIME_SCALE
from modes import PIDNS_FLAGS, pidns_unavailable
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

pytestmark = pytest.mark.pidns
HERE = Path(__file__).resolve().parent
ROOT = os.geteuid() == 0


@pytest.fixture(autouse=True)
def _pidns_here():
    if (why := pidns_unavailable()) is not None:
        pytest.skip(f"no pid namespace here: {why}")


#: The compiled init, where the package finds it (``engines.pidns.INIT_PROGRAM``).
INIT_PROGRAM = Path(__file__).resolve().parents[1] / "corral_systemd" / "libexec" / "corral-pidns-init"
INIT_SOURCE = Path(__file__).resolve().parents[1] / "packaging" / "pidns-init"


def _build_init() -> None:
    """packaging/pidns-init/build into the package (as setup.py does for an
    install; an editable one's tree has none until then), rebuilt when stale."""
    build_program(INIT_PROGRAM, INIT_SOURCE / "init.c")


@pytest.fixture(autouse=True, params=["c", "python"])
def init_kind(request, monkeypatch):
    """Every case here with either init (``CORRAL_PIDNS_INIT``): the compiled
    one (packaging/pidns-init/init.c) and the Python one, the fallback where
    it was not built."""
    if request.param == "c":
        _build_init()
    monkeypatch.setenv("CORRAL_PIDNS_INIT", request.param)
    return request.param


def _env(marker: str, **extra) -> dict:
    return {**os.environ, MARKER_ENV: marker, "CORRAL_SERVICE": "0", **extra}


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _ppid(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def _wait_for(condition, what: str, seconds: float = 30):
    """Poll ``condition()`` until it holds (its value) or fail naming ``what`` (a bound, not a timing)."""
    end = time.monotonic() + seconds * TIME_SCALE
    while time.monotonic() < end:
        if value := condition():
            return value
        time.sleep(0.02)
    pytest.fail(f"never happened: {what}")


def _exited(pidfd: int, seconds: float) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(seconds * 1000 * TIME_SCALE))


def _user_home(uid: int) -> str:
    top = tempfile.mkdtemp(prefix="corral-test-pidns-", dir="/tmp")
    os.chmod(top, 0o777)
    os.chown(top, uid, uid)
    return top


def _as_user(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


USERS = ["root", pytest.param("user", marks=pytest.mark.skipif(not ROOT or not shutil.which("setpriv"), reason="root"))]


# -- corral SIGKILLed ------------------------------------------------------------------------------


@pytest.mark.parametrize("who", USERS)
def test_a_sigkilled_corral_leaves_nothing_of_its_run(who):
    """TERM-ignoring processes, one without the run's mark, and corral
    SIGKILLed: the init is gone (its pidfd readable: the kernel reported its
    exit, which it does only once the namespace is empty) and nothing carrying
    the test's marker is left."""
    if who == "user" and not ROOT:
        pytest.skip("needs root to act as another user")
    marker = new_marker()
    uid = 55000 + os.getpid() % 1000
    prefix, cwd = ([], None) if who == "root" else (_as_user(uid), _user_home(uid))
    script = "trap '' TERM; env -u CORRAL_RUN_ID setsid sh -c \"trap '' TERM; exec sleep 600\" & sleep 600"
    argv = [*prefix, *CORRAL, "--no-registry", *PIDNS_FLAGS, "--grace", "30s", "--", "sh", "-c", script]
    proc = subprocess.Popen(argv, env=_env(marker), cwd=cwd, stderr=subprocess.DEVNULL)
    try:
        # corral, its init, sh, the detached sleep, the main sleep
        _wait_for(lambda: len(marked_pids(marker)) >= 5, "the run's processes started")
        init = _wait_for(lambda: [p for p in marked_pids(marker) if _ppid(p) == proc.pid], "the init")[0]
        pidfd = os.pidfd_open(init)
        proc.kill()
        proc.wait()
        try:
            assert _exited(pidfd, 30), "the namespace's init outlived its corral"
        finally:
            os.close(pidfd)
        assert marked_pids(marker) == [], "processes of the run outlived their corral"
    finally:
        kill_marked(marker)
        if cwd:
            shutil.rmtree(cwd, ignore_errors=True)


def test_a_command_that_ends_at_once_leaving_a_child_is_seen_ending():
    """The init's "run" and "exit STATUS" can come in one read when the command ends at
    once: the exit waited in corral's buffer, where no poll of the channel woke, and
    corral waited for the child it left (here 2 s) instead of stopping it; then the
    namespace's end read as a SIGKILL (137). Raced 15 times: each run is the command's
    own 3, its child stopped, nothing left."""
    for _ in range(15):
        marker = new_marker()
        try:
            r = subprocess.run(
                [*CORRAL, "--no-registry", *PIDNS_FLAGS, "--", "sh", "-c", "sleep 2 & exit 3"],
                env=_env(marker),
                capture_output=True,
                text=True,
                timeout=60 * TIME_SCALE,
            )
            assert r.returncode == 3, r.stderr
            assert "1 process stopped" in r.stderr and "init ended" not in r.stderr, r.stderr
            assert marked_pids(marker) == []
        finally:
            kill_marked(marker)


# -- another user -------------------------------------------------------------------------------


@pytest.mark.skipif(not ROOT or not shutil.which("setpriv"), reason="needs root and setpriv to act as another user")
def test_as_another_user_the_command_keeps_its_ids_and_the_run_is_stopped_and_proven():
    uid = 55000 + os.getpid() % 1000
    home = _user_home(uid)
    marker = new_marker()
    record = os.path.join(home, "r.json")
    script = "id -u; id -g; setsid sleep 600 & trap '' TERM; sleep 600"
    try:
        proc = subprocess.run(
            [*_as_user(uid), *CORRAL, "--no-registry", *PIDNS_FLAGS, "--json", record, "--wall", "1s"]
            + ["--grace", "0.5s", "--", "sh", "-c", script],
            env=_env(marker, HOME=home),
            cwd=home,
            capture_output=True,
            timeout=60,
        )
        survivors = marked_pids(marker)
        assert proc.returncode == 124, proc.stderr
        assert proc.stdout.split() == [str(uid).encode()] * 2
        assert survivors == []
        with open(record) as f:
            data = json.load(f)
        assert data["mode"] == "pidns" and data["verified"] is True
        facts = data["engine"]["pid_namespace"]
        assert facts["user_namespace"].startswith("own") and "init reaped" in facts["proof"]
        assert data["processes_stopped"] >= 2
    finally:
        kill_marked(marker)
        shutil.rmtree(home, ignore_errors=True)


# -- not to be had -----------------------------------------------------------------------------


def _forbidden(how: str, witness: str) -> list[str]:
    corral = [*CORRAL, "--no-registry", *PIDNS_FLAGS, "--", "touch", witness]
    if how == "userns-limit":
        # The system's python, with the checkout on PYTHONPATH: this test's interpreter may live
        # below a directory only root may search (a user namespace's uid may not).
        python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
        corral = ["env", f"PYTHONPATH={HERE.parent}", python, *corral[1:]]
        return [sys.executable, str(HERE / "userns_limited.py"), str(55000 + os.getpid() % 1000), "--", *corral]
    # A /proc with a mask its user namespace may not remove (a locked mount), as a container's:
    # no /proc of the namespace's own may be mounted there.
    inner = " ".join(["exec", "unshare", "--user", "--map-root-user", "--mount", *map(_quote, corral)])
    return ["unshare", "--mount", "sh", "-c", f"mount --bind /dev/null /proc/timer_list && {inner}"]


def _quote(word: str) -> str:
    return shlex.quote(word)


@pytest.mark.skipif(not ROOT, reason="needs root to set up the forbidding namespaces")
@pytest.mark.parametrize("how", ["userns-limit", "masked-proc"])
def test_forced_where_none_can_be_had_is_125_in_one_line_and_nothing_runs(how):
    if how == "masked-proc" and not os.path.exists("/proc/timer_list"):
        pytest.skip("no /proc/timer_list to mask")
    top = _user_home(55000 + os.getpid() % 1000)
    witness = os.path.join(top, "ran")
    marker = new_marker()
    try:
        proc = subprocess.run(
            _forbidden(how, witness), env=_env(marker), cwd=top, capture_output=True, text=True, timeout=60
        )
        lines = [line for line in proc.stderr.splitlines() if "not registered" not in line]
        assert proc.returncode == 125, proc.stderr
        assert len(lines) == 1 and lines[0].startswith("corral: --guarantee pidns: "), proc.stderr
        assert "Traceback" not in proc.stderr
        assert not os.path.exists(witness)
    finally:
        kill_marked(marker)
        shutil.rmtree(top, ignore_errors=True)


# -- corral as pid 1 -------------------------------------------------------------------------------

TIERS = {"pidns": PIDNS_FLAGS, "subreaper": ["--guarantee", "subreaper"], "auto": []}
as_pid_one = pytest.mark.skipif(not ROOT or not shutil.which("unshare"), reason="needs root and unshare")


def _pid_one(tier: str, command: list[str], record: str | None = None) -> list[str]:
    extra = ["--json", record] if record else []
    return ["unshare", "--pid", "--fork", "--mount-proc", *CORRAL, "--no-registry", *extra] + [
        *TIERS[tier],
        "--",
        *command,
    ]


@as_pid_one
@pytest.mark.parametrize("tier", list(TIERS))
def test_as_pid_one_the_exit_code_reaches_the_runtime(tier):
    marker = new_marker()
    try:
        proc = subprocess.run(_pid_one(tier, ["sh", "-c", "exit 7"]), env=_env(marker), capture_output=True, timeout=60)
        assert proc.returncode == 7, proc.stderr
        assert marked_pids(marker) == []
    finally:
        kill_marked(marker)


def _corral_as_pid_one(proc, marker) -> int:
    """corral's pid (as this /proc numbers it): unshare's child, carrying the marker."""
    return _wait_for(lambda: [p for p in marked_pids(marker) if _ppid(p) == proc.pid], "corral as pid 1")[0]


@as_pid_one
@pytest.mark.parametrize("tier", list(TIERS))
@pytest.mark.parametrize("sig,sender", [(15, "outside"), (2, "outside"), (1, "outside"), (15, "inside")])
def test_as_pid_one_a_signal_stops_the_run(tmp_path, tier, sig, sender):
    """A pid 1 has no default actions (the kernel drops a signal it does not
    handle): corral handles each stop signal, stops the run, exits 128+N."""
    marker = new_marker()
    record = str(tmp_path / "r.json")
    command = ["sh", "-c", "setsid sleep 600 & sleep 600"]
    proc = subprocess.Popen(_pid_one(tier, command, record), env=_env(marker), stderr=subprocess.PIPE)
    try:
        corral = _corral_as_pid_one(proc, marker)
        _wait_for(lambda: len(marked_pids(marker)) >= 4, "the run's processes started")
        if sender == "outside":
            os.kill(corral, sig)
        else:
            subprocess.run(
                ["nsenter", "-t", str(corral), "--pid", "--", "kill", f"-{sig}", "1"], check=True, timeout=30
            )
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig, err
        assert marked_pids(marker) == []
        with open(record) as f:
            data = json.load(f)
        assert data["verified"] is True and data["corral_signal"] == sig
    finally:
        proc.kill()
        proc.wait()
        kill_marked(marker)


@as_pid_one
def test_as_pid_one_an_adopted_orphan_is_reaped_and_the_runs_status_kept(tmp_path):
    """An orphan from outside the run (what `podman exec` leaves when its shell
    exits first) becomes corral's child: once it exits corral reaps it (no
    zombie stays), and the run's own exit status is still 5."""
    marker = new_marker()
    flag = tmp_path / "go"
    command = ["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; exit 5"]
    proc = subprocess.Popen(_pid_one("pidns", command), env=_env(marker), stderr=subprocess.PIPE)
    try:
        corral = _corral_as_pid_one(proc, marker)
        _wait_for(lambda: len(marked_pids(marker)) >= 3, "the run started")
        orphan_env = {**_env(marker), "CORRAL_TEST_ORPHAN": "1"}
        # The shell exits at once; its sleep, alive, re-parents to the namespace's pid 1: corral.
        subprocess.run(
            ["nsenter", "-t", str(corral), "--pid", "--mount", "--", "sh", "-c", "sleep 1 & exit 0"],
            env=orphan_env,
            check=True,
            timeout=30,
        )

        def adopted():
            return [p for p in marked_pids(marker) if _ppid(p) == corral and _orphan(p)]

        orphan = _wait_for(adopted, "the orphan adopted by corral")[0]
        pidfd = os.pidfd_open(orphan)
        try:
            assert _exited(pidfd, 30)
        finally:
            os.close(pidfd)
        _wait_for(lambda: _stat(orphan) is None, f"the adopted orphan {orphan} reaped (still {_stat(orphan)})")
        flag.touch()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 5, err
        assert marked_pids(marker) == []
    finally:
        proc.kill()
        proc.wait()
        kill_marked(marker)


def _orphan(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return b"CORRAL_TEST_ORPHAN=1" in f.read().split(b"\0")
    except OSError:
        return False


# -- what the command can reach ------------------------------------------------------------------

REACH = [
    "root",
    pytest.param(
        "root-without-cap-sys-admin",
        marks=pytest.mark.skipif(not ROOT or not shutil.which("setpriv"), reason="needs root and setpriv"),
    ),
    pytest.param("user", marks=pytest.mark.skipif(not ROOT or not shutil.which("setpriv"), reason="needs root")),
    # uid 0 of a user namespace corral did not make, with CAP_SYS_ADMIN over its mounts: the host's
    # /proc copied in locked below (unshare -r), or also a /proc of its own, unlocked, above it (a
    # container's, as a rootless runtime mounts it); its user namespace stays the caller's.
    pytest.param("root-of-a-user-namespace", marks=pytest.mark.skipif(not ROOT, reason="needs root")),
    pytest.param("root-of-a-container", marks=pytest.mark.skipif(not ROOT, reason="needs root")),
]

_USERNS_ROOTS = ("root-of-a-user-namespace", "root-of-a-container")
#: How each of ``REACH`` that is not plain root is made.
_USERNS_ROOT = ["unshare", "--user", "--map-root-user", "--mount"]
_REACH_PREFIX = {
    "root-without-cap-sys-admin": ["setpriv", "--bounding-set=-sys_admin"],
    "root-of-a-user-namespace": _USERNS_ROOT,
    "root-of-a-container": [*_USERNS_ROOT, "--pid", "--fork", "--mount-proc"],
}


def _admin_in_initial_user_namespace() -> tuple[bool, bool]:
    """(CAP_SYS_ADMIN in effect, the initial user namespace) for this process."""
    with open("/proc/self/status") as f:
        effective = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    return bool(effective >> 21 & 1), os.stat("/proc/self/ns/user").st_ino == 0xEFFFFFFD


def _run_as(who: str, script: str) -> tuple[subprocess.Popen, str, str]:
    """corral (pidns tier, 5 s wall) running ``sh -c script`` as ``who``: the
    process (its pid is corral's), its stdout and stderr."""
    uid = 55000 + os.getpid() % 1000
    prefix, cwd = (_as_user(uid), _user_home(uid)) if who == "user" else (_REACH_PREFIX.get(who, []), None)
    argv = [*prefix, *CORRAL, "--no-registry", *PIDNS_FLAGS, "--wall", "5s", "--", "sh", "-c", script]
    marker = new_marker()
    try:
        proc = subprocess.Popen(
            argv, env=_env(marker), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
            proc.wait()
    finally:
        kill_marked(marker)
        if cwd:
            shutil.rmtree(cwd, ignore_errors=True)
    return proc, out, err


@pytest.mark.parametrize("who", REACH)
def test_unmounting_its_proc_shows_no_process_outside_the_namespace(who):
    """The command unmounts its /proc (``umount -l``) and lists what is there
    then: neither this test's pid nor corral's. Root may unmount it and finds
    an empty directory (the init detached the host's /proc before it mounted
    the namespace's); in a user namespace the command cannot (no capability
    over the mounts, or, uid 0 there, one more user namespace that locks
    them), and still lists the namespace's /proc (its init, pid 1). uid 0 of
    a user namespace corral did not make keeps it and may find a locked copy
    of its parent's /proc below: listed, and none of its processes signalled
    (``kill -0`` of this test's pid fails in every case)."""
    admin, initial = _admin_in_initial_user_namespace()
    script = f"umount -l /proc 2>/dev/null; echo $?; kill -0 {os.getpid()} 2>/dev/null; echo $?; ls -A /proc"
    proc, out, err = _run_as(who, script)
    assert proc.returncode == 0, err
    unmounted, signalled, *names = out.split()
    assert signalled != "0", "the command signalled a process outside its pid namespace"
    if who in _USERNS_ROOTS or (who == "root" and admin and not initial):
        # uid 0 of a user namespace corral did not make keeps it (its caller's context): a copy of
        # its parent's /proc locked below the namespace's may be listed (documented), never reached.
        return
    assert str(os.getpid()) not in names and str(proc.pid) not in names, (unmounted, names)
    if who == "root" and admin:
        assert (unmounted, names) == ("0", [])
    else:
        assert unmounted != "0" and "1" in names, (unmounted, names)


@pytest.mark.parametrize("who", REACH)
def test_a_status_line_forged_into_the_inits_descriptors_is_not_the_exit_status(who):
    """``exit 0`` (and, as bytes, stop signals' numbers: a newline is SIGUSR1)
    written into every descriptor of the init's the command can open for
    writing (/proc/1/fd/N; root may open all but the sockets): corral reports the
    command's own exit (3) -- not the forged status, nor 128+N from a forged
    byte on corral's signal pipe -- and its output holds only the command's
    own. In a user namespace of the init's (not root, or root without
    CAP_SYS_ADMIN) the command can open none: the init is not dumpable. The
    command itself is dumpable (PR_GET_DUMPABLE)."""
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    dumpable = f"{python} -c 'import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))'"
    script = (
        # At once: no line written once the command exists is taken for the init's answer
        # (test_lines_forged_into_the_inits_channels_from_the_start_never_hang_corral_nor_lie).
        # SIGPIPE ignored: an instant after it opened, the init's gate (a pipe) has no reader left.
        "trap '' PIPE; n=0; for fd in /proc/1/fd/*; do printf 'exit 0\\n' 2>/dev/null >>\"$fd\" && n=$((n + 1)); done; "
        # A forged line is read at once; until the command's own end nothing else is said.
        f"echo $n; {dumpable}; sleep {TIME_SCALE}; exit 3"
    )
    proc, out, err = _run_as(who, script)
    assert proc.returncode == 3, err
    assert "exit" not in out, out  # nothing reached corral's stdout but the command's own
    opened, dumpable_now = out.split()
    assert dumpable_now == "1", out
    if who != "root" and who not in _USERNS_ROOTS:  # root of the init's user namespace may open them
        assert opened == "0", out


# -- the init's protocol, forged -------------------------------------------------------------------

#: Lines as the init's, forged.
FORGED = b"exec 2\nsetup forged\nfork 1\nrun 1\nexit 0\n"
FORGED_SH = FORGED.decode().replace("\n", "\\n")  # as printf's format


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _forge_into(pidfd: int, pid: int, corral: int) -> None:
    """``FORGED`` into every socket of ``pid``'s and every pipe it shares with
    ``corral``, each taken with pidfd_getfd(2) -- what a command running as
    root (CAP_SYS_PTRACE) can do to its init's channels with corral, sockets
    included, where /proc/1/fd/N opens pipes only. Not into a pipe of the
    init's own (its gate, which the command cannot reach: it does not exist
    until the gate is open)."""
    import ctypes
    import stat

    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fds = [int(n) for n in os.listdir(f"/proc/{pid}/fd")]
        shared = set()
        for n in os.listdir(f"/proc/{corral}/fd"):
            try:
                info = os.stat(f"/proc/{corral}/fd/{n}")
                shared.add((info.st_dev, info.st_ino))
            except OSError:
                pass
    except OSError:
        return
    for n in fds:
        got = libc.syscall(438, pidfd, n, 0)  # SYS_pidfd_getfd, the same number everywhere
        if got < 0:
            continue
        try:
            info = os.fstat(got)
            if stat.S_ISSOCK(info.st_mode) or (stat.S_ISFIFO(info.st_mode) and (info.st_dev, info.st_ino) in shared):
                os.write(got, FORGED)
        except OSError:
            pass
        finally:
            os.close(got)


@pytest.mark.skipif(not ROOT, reason="needs root to take the init's descriptors")
def test_lines_forged_into_the_inits_channels_from_the_start_never_hang_corral_nor_lie(tmp_path):
    """Lines as the init's (``exec 2``, ``run 1``, ``exit 0`` ...) written into
    every channel of the init's as soon as it has forked the command -- the
    race a root command wins when it is scheduled before its init -- and by
    the command itself into every /proc/1/fd/N, repeated: corral returns, with
    the truth: the command's own exit (3) having run, or 125 having never run
    (corral gave up on an init whose answer it could not trust). Never a hang
    (a corral waiting for its init, which waits for corral), never an exec
    error for a command that ran."""
    witness, go = tmp_path / "ran", tmp_path / "go"
    forge = "; ".join(
        [
            f"touch {witness}",
            # Until the test has seen its init (a quick run would end before it looks).
            f"until [ -e {go} ]; do sleep 0.01; done",
            "trap '' PIPE",  # the init's gate, an instant after it opened, has no reader left
            "i=0",
            "while [ $i -lt 100 ]; do "
            f"for fd in /proc/1/fd/*; do printf '{FORGED_SH}' 2>/dev/null >>\"$fd\"; done; i=$((i + 1)); "
            "done",
            "exit 3",
        ]
    )
    for _ in range(5):
        witness.unlink(missing_ok=True)
        go.unlink(missing_ok=True)
        marker = new_marker()
        argv = [*CORRAL, "--no-registry", *PIDNS_FLAGS, "--grace", "1s", "--", "sh", "-c", forge]
        proc = subprocess.Popen(argv, env=_env(marker), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            init = _wait_for(lambda pid=proc.pid: _children(pid), "the init")[0]
            pidfd = os.pidfd_open(init)
            try:
                while proc.poll() is None and not _children(init):
                    pass  # as soon as the command's process exists
                for _ in range(30):  # bounded: a corral that reads nothing more leaves a pipe full
                    _forge_into(pidfd, init, proc.pid)
            finally:
                os.close(pidfd)
                go.touch()
            try:
                out, err = proc.communicate(timeout=20 * TIME_SCALE)
            except subprocess.TimeoutExpired:
                pytest.fail("corral hung on lines forged into its init's channels")
        finally:
            proc.kill()
            proc.wait()
            kill_marked(marker)
        assert b"Traceback" not in err, err
        if proc.returncode == 125:
            assert not witness.exists(), err  # 125 says the command never ran
        else:
            assert proc.returncode == 3 and witness.exists(), err


def test_an_exec_report_written_by_the_command_is_not_believed(tmp_path):
    """A command that reopens its parent's exec-report channel
    (/proc/PPID/fd/N, as root) and writes an errno into it: its parent
    (corral, or a pid namespace's init) does not take it for an exec failure
    -- the command ran. Checked on ``fork_command`` itself, in a process of
    the test's with nothing else to write into."""
    flag = tmp_path / "wrote"
    helper = "\n".join(
        [
            "import os, sys, time",
            "from corral_systemd.kernel.spawn import ExecError, fork_command",
            'script = \'for fd in /proc/$PPID/fd/*; do printf 2 2>/dev/null >>"$fd"; done; : >"$0"; exit 0\'',
            "child = fork_command(['sh', '-c', script, sys.argv[1]], stdin=0, stdout=1, stderr=2,"
            " env=None, cwd=None, gated=False)",
            "while not os.path.exists(sys.argv[1]):",
            "    time.sleep(0.01)",
            "try:",
            "    child.release()",
            "except ExecError:",
            "    sys.exit(1)",
            "sys.exit(0)",
        ]
    )
    proc = subprocess.run(
        [sys.executable, "-c", helper, str(flag)],
        env={**os.environ, "PYTHONPATH": str(HERE.parent)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=60,
    )
    assert proc.returncode == 0, f"a forged exec report was believed (exit {proc.returncode}) {proc.stderr!r}"


def test_the_command_has_the_descriptors_it_has_in_the_other_tiers():
    """No copy of its stdio, received by the init over the control socket,
    reaches the command: it lists the same descriptors as in the subreaper tier."""
    lists = {}
    for tier in ("subreaper", "pidns"):
        proc = subprocess.run(
            [*CORRAL, "--no-registry", "--quiet", "--guarantee", tier, "--", "ls", "/proc/self/fd"],
            env=_env(new_marker()),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        lists[tier] = proc.stdout.split()
    assert lists["pidns"] == lists["subreaper"]


# -- issue 38: one Python process per run -----------------------------------------------------


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _run_exes(marker: str, env: dict, argv: list[str] | None = None) -> dict[int, str | None]:
    """The executables (/proc/PID/exe) of a pidns run of ``sleep 600``, by pid:
    corral, its init and the command, each found by the run's marker."""
    argv = argv or [*CORRAL, "--no-registry", *PIDNS_FLAGS]
    proc = subprocess.Popen([*argv, "--", "sleep", "600"], env=env, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: any(_exe(p) == shutil.which("sleep") for p in marked_pids(marker)), "the command")
        return {pid: _exe(pid) for pid in marked_pids(marker)}
    finally:
        proc.kill()
        proc.wait()
        kill_marked(marker)


def test_a_run_is_one_python_process_and_the_compiled_init(init_kind):
    """Where the compiled init is built and nothing asks for the Python one:
    corral is the run's only Python process (by /proc/PID/exe, not by name),
    and the namespace's init is the compiled program, corral's child."""
    if init_kind != "c":
        pytest.skip("the default, with the compiled init built")
    marker = new_marker()
    env = _env(marker)
    del env["CORRAL_PIDNS_INIT"]
    exes = _run_exes(marker, env)
    python = os.path.realpath(sys.executable)
    assert sorted(exes.values()) == sorted([python, str(INIT_PROGRAM), shutil.which("sleep")]), exes
    assert [os.path.realpath(e) for e in exes.values() if e].count(python) == 1, exes


def test_where_the_init_was_not_built_the_python_init_serves(init_kind):
    """No compiled init where the package looks (no C compiler at install):
    the run is served by the Python init, a clone of corral, and goes on as
    ever."""
    if init_kind != "python":
        pytest.skip("once")
    marker = new_marker()
    env = _env(marker)
    del env["CORRAL_PIDNS_INIT"]
    missing = "import sys; from corral_systemd.engines import pidns; pidns.INIT_PROGRAM = '/nonexistent/init'; "
    entry = "from corral_systemd.client import entry; entry()"
    exes = _run_exes(marker, env, [sys.executable, "-c", missing + entry, "--no-registry", *PIDNS_FLAGS])
    python = os.path.realpath(sys.executable)
    assert [os.path.realpath(e) for e in exes.values() if e].count(python) == 2, exes
    assert str(INIT_PROGRAM) not in exes.values()


def test_a_bad_init_choice_is_125_in_one_line(init_kind):
    if init_kind != "python":
        pytest.skip("once")
    proc = subprocess.run(
        [*CORRAL, "--no-registry", *PIDNS_FLAGS, "--", "true"],
        env=_env(new_marker(), CORRAL_PIDNS_INIT="perl"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 125
    assert len(proc.stderr.strip().splitlines()) == 1 and "CORRAL_PIDNS_INIT" in proc.stderr, proc.stderr
