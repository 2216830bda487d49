"""corral's own processes cannot be traced or opened by the command they supervise.

The command runs as corral's uid. Were corral dumpable, the command could
PTRACE_ATTACH it (and rewrite any verdict), read its environment, and write
through its descriptors (``/proc/$PPID/fd/1``). corral's processes -- the
run's corral, the session's holder, the service, the pid namespace's init --
are not dumpable (``PR_SET_DUMPABLE`` 0); the command is, again, after its
execve. What readers of a run's token need no longer comes from /proc/PID/fd:
the token is answered at an abstract address only its owner holds
(``state/registry/identity.py``), so a session and corralctl work all the same.

As another user (root has CAP_SYS_PTRACE, over which dumpability means nothing).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import CORRAL, TIME_SCALE

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="root, to be another user")

CTL = [sys.executable, "-m", "corral_systemd.ctl"]
#: The command's interpreter: the test's own may be below a directory the other user cannot search.
SYSTEM_PYTHON = "/usr/bin/python3"

#: What the command tries on its corral ($PPID, or the pid given) and says.
PROBE = r"""
import ctypes, json, os, sys
target = int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid()
libc = ctypes.CDLL(None, use_errno=True)
said = {"dumpable_self": libc.prctl(3, 0, 0, 0, 0)}  # PR_GET_DUMPABLE
def attempt(name, fn):
    try:
        fn()
        said[name] = "done"
    except OSError as exc:
        said[name] = exc.errno
attempt("fd", lambda: os.listdir(f"/proc/{target}/fd"))
attempt("environ", lambda: open(f"/proc/{target}/environ", "rb").read())
attempt("write_fd1", lambda: open(f"/proc/{target}/fd/1", "wb").write(b"forged\n"))
libc.ptrace.restype = ctypes.c_long
if libc.ptrace(16, target, 0, 0) == 0:  # PTRACE_ATTACH
    said["ptrace"] = "done"
    libc.ptrace(17, target, 0, 0)  # PTRACE_DETACH
else:
    said["ptrace"] = ctypes.get_errno()
print(json.dumps(said))
"""


@pytest.fixture
def user(tmp_path):
    uid = 56000 + os.getpid() % 1000
    home = tempfile.mkdtemp(prefix="corral-test-dumpable-", dir="/tmp")
    os.chmod(home, 0o700)
    os.chown(home, uid, uid)
    env = dict(os.environ, HOME=home, CORRAL_STATE_DIR=os.path.join(home, "state"), XDG_RUNTIME_DIR=home)
    env.pop("CORRAL_TEST_MARKER", None)

    def run(argv, background=False):
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
        if background:
            return subprocess.Popen(argv, env=env, cwd=home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return subprocess.run(argv, env=env, cwd=home, capture_output=True, text=True, timeout=120 * TIME_SCALE)

    run.home = home  # type: ignore[attr-defined]
    yield run
    shutil.rmtree(home, ignore_errors=True)


def _refused(said: dict) -> list[str]:
    return [k for k in ("fd", "environ", "write_fd1", "ptrace") if said[k] == "done"]


@pytest.mark.parametrize("tier", ["subreaper", pytest.param("pidns", marks=pytest.mark.pidns)])
def test_the_command_cannot_trace_or_open_its_corral(user, tier):
    r = user([*CORRAL, "--guarantee", tier, "--quiet", "--", SYSTEM_PYTHON, "-c", PROBE])
    assert r.returncode == 0, r.stderr
    said = json.loads(r.stdout.strip().splitlines()[-1])
    assert said["dumpable_self"] == 1, said  # the command itself is dumpable again after its exec
    # In the pidns tier $PPID is the namespace's init (pid 1 there): not dumpable either.
    assert _refused(said) == [], said


def test_a_sessions_holder_and_runs_work_undumpable(user, tmp_path):
    """A session of another user with its holder and corrals not dumpable: a run
    joins (the holder checks who it is without reading its /proc), status and ps
    read its token, its command cannot open its holder, and the session ends,
    proven."""
    sid = user([*CTL, "session", "start", "--cgroup-mode", "fallback"]).stdout.strip()
    assert len(sid) == 24, sid  # a fallback session: its id is its holder's commitment
    try:
        entry = json.loads(user(["cat", f"state/sessions/{sid}.json"]).stdout)
        holder = entry["holder"]["pid"]
        probe = user([*CORRAL, "--session", sid, "--quiet", "--", SYSTEM_PYTHON, "-c", PROBE, str(holder)])
        assert probe.returncode == 0, probe.stderr
        assert _refused(json.loads(probe.stdout.strip().splitlines()[-1])) == [], probe.stdout
        up = os.path.join(user.home, "up")
        waiting = user([*CORRAL, "--session", sid, "--", "sh", "-c", f"touch {up}; exec sleep 1000"], background=True)
        deadline = time.monotonic() + 30 * TIME_SCALE
        while not os.path.exists(up):
            assert time.monotonic() < deadline and waiting.poll() is None, "the run never started"
            time.sleep(0.05)
        ps = json.loads(user([*CTL, "ps", "--session", sid, "--json"]).stdout)
        assert len(ps) == 1, ps
        status = user([*CTL, "status", ps[0]["run_id"]])
        assert status.returncode == 0 and status.stdout.startswith("active"), status.stdout + status.stderr
    finally:
        end = user([*CTL, "session", "end", sid])
        if "waiting" in locals():
            waiting.wait(timeout=60)
    assert end.returncode == 0 and "2 runs" in end.stdout, end.stdout + end.stderr
