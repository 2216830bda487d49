"""The tether's two programs (engines/tether.py, fallback_tether.py): the compiled
``corral-tether`` where it was built, the Python fork of corral otherwise.

Proven through what the kernel shows of the waiting run (/proc/PID/exe, fd,
status, stat), never by names: a waiting run is one Python process with the
compiled tether; the tether, whichever program, is in a session of its own,
ignores terminal signals and holds no descriptor but the done pipe (3) and
corral's pidfd (4); the record says which served; a bad ``CORRAL_TETHER`` is
125 in one line. What each tether does when corral dies or stops is proven by
the tests that kill or stop corral (test_rough_edges, test_signals, test_tiers,
test_registry, test_waiting, test_systemd), each with both programs.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from test_registry import wait_for
from tethers import TETHER_PROGRAM, TETHER_SOURCE, build_program, tether_kind  # noqa: F401  (the fixture)

from conftest import CORRAL, TIME_SCALE
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

SUBREAPER = ["--guarantee", "subreaper", "--no-registry"]
#: What every tether ignores (``kernel.detach.TERMINAL_SIGNALS``, tether.c's ``ignored``).
IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP, signal.SIGPIPE)


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return found


def _environ(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return None  # gone


def _corral_and_tether(marker: str, command: int) -> tuple[int, int]:
    """corral (the command's parent) and its tether: its other child, the one
    without the run's mark (``CORRAL_RUN_ID``) in its environment."""
    with open(f"/proc/{command}/stat") as f:
        corral = int(f.read().rsplit(")", 1)[1].split()[1])

    def unmarked() -> list[int]:
        envs = {p: _environ(p) for p in _children(corral)}
        found = [
            p for p, env in envs.items() if env is not None and not any(v.startswith(b"CORRAL_RUN_ID=") for v in env)
        ]
        return found if len(found) == 1 else []

    return corral, wait_for(unmarked, timeout=30)[0]


def _start(marker: str, extra_env: dict, *flags: str, pass_fds=()) -> tuple[subprocess.Popen, int]:
    """corral running ``sh -c 'echo $$; read x'`` (fallback); the Popen and the command's pid."""
    argv = [*CORRAL, *SUBREAPER, *flags, "--stdin", "inherit", "--wall", "600s", "--", "sh", "-c", "echo $$; read x"]
    proc = subprocess.Popen(
        argv,
        env={**os.environ, MARKER_ENV: marker, "CORRAL_SERVICE": "0", **extra_env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=pass_fds,
    )
    return proc, int(proc.stdout.readline())


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)


def test_the_tether_is_detached_and_holds_only_its_own_descriptors(tether_kind, tmp_path):
    """Either program: the tether's session is its own, the terminal signals are
    ignored, its stdio is /dev/null and it holds the done pipe and corral's
    pidfd only (the compiled one at 3 and 4, where its exec'd stop finds them),
    not a descriptor the caller gave corral for the command; the record names
    the program."""
    marker = new_marker()
    record = tmp_path / "record.json"
    given_r, given_w = os.pipe()
    try:
        proc, command = _start(marker, {}, "--json", str(record), pass_fds=(given_w,))
        corral, tether = _corral_and_tether(marker, command)

        def settled() -> dict | None:
            # The Python tether, a fork of corral, may still be detaching (its
            # session, signals, what it inherited) and opening corral's pidfd
            # when the command has started: looked at once it holds that pidfd.
            fds = {int(n): os.readlink(f"/proc/{tether}/fd/{n}") for n in os.listdir(f"/proc/{tether}/fd")}
            return fds if "anon_inode:[pidfd]" in fds.values() and len(fds) == 5 else None

        try:
            fds = wait_for(settled, timeout=10)
        except AssertionError:
            fds = {int(n): os.readlink(f"/proc/{tether}/fd/{n}") for n in os.listdir(f"/proc/{tether}/fd")}
        with open(f"/proc/{tether}/stat") as f:
            session = int(f.read().rsplit(")", 1)[1].split()[3])
        assert session == tether, "the tether is not in a session of its own"
        ignored = int(_status(tether)["SigIgn"], 16)
        assert all(ignored & (1 << (sig - 1)) for sig in IGNORED), hex(ignored)
        assert {fds.pop(0), fds.pop(1), fds.pop(2)} == {"/dev/null"}, fds
        (pipe,) = [n for n, link in fds.items() if link.startswith("pipe:")]
        (pidfd,) = [n for n, link in fds.items() if link == "anon_inode:[pidfd]"]
        assert sorted(fds) == sorted([pipe, pidfd]), fds  # the given descriptor is not among them
        if tether_kind == "c":
            assert (pipe, pidfd) == (3, 4), fds  # where the exec'd stop finds them ...
            for fd in (3, 4):  # ... and still open in it: not close-on-exec
                with open(f"/proc/{tether}/fdinfo/{fd}") as f:
                    flags = int(next(line for line in f if line.startswith("flags:")).split()[1], 8)
                assert not flags & 0o2000000, f"fd {fd} is close-on-exec"
        with open(f"/proc/{tether}/fdinfo/{pidfd}") as f:
            assert f"Pid:\t{corral}" in f.read()
        exe = os.readlink(f"/proc/{tether}/exe")
        assert exe == (str(TETHER_PROGRAM) if tether_kind == "c" else os.path.realpath(sys.executable)), exe
        proc.communicate(b"\n", timeout=60 * TIME_SCALE)
        assert proc.returncode == 0
        expected = str(TETHER_PROGRAM) if tether_kind == "c" else "python"
        assert json.loads(record.read_text())["engine"]["tether_program"] == expected
        wait_for(lambda: not marked_pids(marker), timeout=30)
    finally:
        os.close(given_r)
        os.close(given_w)
        kill_marked(marker)


def test_a_waiting_run_is_one_python_process_and_the_compiled_tether(tether_kind):
    """Where the compiled tether is built and nothing asks for the Python one:
    corral is the waiting run's only Python process (by /proc/PID/exe, not by
    name); its tether is the compiled program."""
    if tether_kind != "c":
        pytest.skip("the default, with the compiled tether built")
    marker = new_marker()
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_TETHER"}
    proc = subprocess.Popen(
        [*CORRAL, *SUBREAPER, "--wall", "600s", "--", "sh", "-c", "echo $$; exec sleep 600"],
        env={**env, MARKER_ENV: marker, "CORRAL_SERVICE": "0"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        command = int(proc.stdout.readline())
        corral, tether = _corral_and_tether(marker, command)
        python = os.path.realpath(sys.executable)
        exes = sorted(os.readlink(f"/proc/{pid}/exe") for pid in (corral, tether))
        assert exes == sorted([python, str(TETHER_PROGRAM)]), exes
    finally:
        proc.kill()
        proc.wait()
        kill_marked(marker)


#: As corral spawns it: from a process that is not dumpable, posix_spawn, the done pipe at 3.
SPAWN_AS_CORRAL = r"""
import ctypes, os, sys, time
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0, as corral is
done_r, _done_w = os.pipe()
program = sys.argv[1]
pid = os.posix_spawn(program, [program, str(os.getpid()), "-", "-", "/bin/true"], os.environ,
                     file_actions=[(os.POSIX_SPAWN_DUP2, done_r, 3)], setsid=True)
print(pid, flush=True)
sys.stdin.read()  # until the test has looked
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="root, to be another user")
def test_the_compiled_tether_is_not_dumpable():
    """Its exec made it dumpable again, and the run's commands are of its uid: did it
    not say otherwise, one could ptrace it or open its descriptors (corral's pidfd
    among them) and so undo the backstop. The kernel shows a process that is not
    dumpable with /proc files of root's, whoever runs it."""
    build_program(TETHER_PROGRAM, TETHER_SOURCE / "tether.c")
    uid = 57000 + os.getpid() % 1000
    spawner = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3", "-c", SPAWN_AS_CORRAL]
        + [str(TETHER_PROGRAM)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        tether = int(spawner.stdout.readline())
        with open(f"/proc/{tether}/status") as f:
            assert f"Uid:\t{uid}\t" in f.read()  # the tether, running as the other user
        # Once its stdio is /dev/null, which it sets after it has said it is not dumpable.
        wait_for(lambda: os.readlink(f"/proc/{tether}/fd/0") == os.devnull)
        assert os.stat(f"/proc/{tether}/environ").st_uid == 0, "the compiled tether is dumpable"
    finally:
        spawner.communicate("", timeout=30)


@pytest.mark.parametrize(
    "how",
    ["perl", "c-not-built"],
)
def test_a_bad_tether_choice_is_125_in_one_line(how):
    """``CORRAL_TETHER`` naming no program, or insisting on the compiled one
    where it was not built: 125, one line naming the knob, nothing run."""
    marker = new_marker()
    env = {**os.environ, MARKER_ENV: marker, "CORRAL_SERVICE": "0", "CORRAL_TETHER": "perl" if how == "perl" else "c"}
    argv = [*CORRAL, *SUBREAPER, "--", "sh", "-c", "echo ran"]
    if how == "c-not-built":
        missing = "from corral_systemd.engines import tether; tether.TETHER_PROGRAM = '/nonexistent/tether'; "
        argv = [
            sys.executable,
            "-c",
            missing + "from corral_systemd.client import entry; entry()",
            *argv[len(CORRAL) :],
        ]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60 * TIME_SCALE)
    assert proc.returncode == 125, proc.stderr
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "CORRAL_TETHER" in proc.stderr, proc.stderr
    assert not marked_pids(marker)


@pytest.mark.systemd
def test_a_units_tether_is_moved_into_its_scope_and_ends_the_run_with_corral(tether_kind, tmp_path):
    """A unit run (in-process): its tether, whichever program, is corral's child
    in the tether scope its unit is bound to, and the record names the program;
    corral SIGKILLed, the tether ends and the manager stops the run."""
    from modes import mode_flags

    marker = new_marker()
    record = tmp_path / "record.json"
    done = subprocess.run(
        [*CORRAL, *mode_flags("scope"), "--json", str(record), "--", "true"],
        env={**os.environ, "CORRAL_SERVICE": "0"},
        capture_output=True,
        timeout=60 * TIME_SCALE,
    )
    assert done.returncode == 0, done.stderr
    expected = str(TETHER_PROGRAM) if tether_kind == "c" else "python"
    assert json.loads(record.read_text())["engine"]["tether_program"] == expected
    proc = subprocess.Popen(
        [*CORRAL, *mode_flags("scope"), "--grace", "1s", "--", "sh", "-c", "echo $$; exec sleep 600"],
        env={**os.environ, MARKER_ENV: marker, "CORRAL_SERVICE": "0"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        corral, tether = _corral_and_tether(marker, int(proc.stdout.readline()))
        with open(f"/proc/{tether}/cgroup") as f:
            assert any(line.endswith("-tether.scope") for line in f.read().splitlines()), "not in its scope"
        exe = os.readlink(f"/proc/{tether}/exe")
        assert exe == (str(TETHER_PROGRAM) if tether_kind == "c" else os.path.realpath(sys.executable)), exe
        proc.kill()
        proc.wait()
        wait_for(lambda: not marked_pids(marker), timeout=30)  # the manager stopped it
    finally:
        proc.kill()
        proc.wait()
        kill_marked(marker)
