"""Issue 13, item 21: tests/harness/with-user-manager tells what is worth telling.

The manager_kill tests SIGKILL the harness's manager on purpose; bash used to
report that job ("with-user-manager: line N: <pid> Killed ( for h in ...
<the whole subshell> )") on every such step. The harness now keeps quiet
about that one, and still reports, in one line, what nobody asked for: CMD
killed by a signal, the manager crashing.
"""

import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: CORRAL_TEST_HARNESS: another copy of the harness to test (e.g. an older one).
HARNESS = os.environ.get("CORRAL_TEST_HARNESS", str(ROOT / "tests" / "harness" / "with-user-manager"))

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the harness needs root"),
    pytest.mark.skipif(bool(os.environ.get("CORRAL_HARNESS_MANAGER_PID")), reason="already inside a harness"),
    pytest.mark.skipif(
        not os.path.exists("/lib/systemd/systemd") or not shutil.which("dbus-daemon") or not shutil.which("unshare"),
        reason="systemd, dbus-daemon, unshare needed",
    ),
]


def _no_core():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def harness(script: str, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HARNESS, *options, "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        preexec_fn=_no_core,
    )


def test_the_manager_sigkilled_on_purpose_is_not_reported():
    run = harness('kill -KILL "$CORRAL_HARNESS_MANAGER_PID"; sleep 1; echo cmd-done')
    assert run.returncode == 0, run.stderr
    assert run.stdout == "cmd-done\n"
    assert run.stderr == ""


def test_verbose_says_it_quietly():
    run = harness('kill -KILL "$CORRAL_HARNESS_MANAGER_PID"; sleep 1', "--verbose")
    assert run.returncode == 0, run.stderr
    assert "systemd --user (pid " in run.stderr and ") was SIGKILLed while CMD ran" in run.stderr
    assert " Killed " not in run.stderr and "for h in" not in run.stderr


def test_cmd_killed_by_a_signal_is_still_reported_in_one_line():
    run = harness("kill -USR1 $$")
    assert run.returncode == 128 + 10
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("with-user-manager: CMD (pid "), run.stderr
    assert lines[0].endswith(" ended: User defined signal 1")


def test_a_crashing_manager_is_still_reported():
    run = harness('kill -SEGV "$CORRAL_HARNESS_MANAGER_PID"; sleep 1')
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("with-user-manager: systemd --user (pid "), run.stderr
    assert lines[0].endswith(" ended: Segmentation fault")


def test_what_cmd_writes_to_stderr_is_untouched():
    run = harness("echo to-stderr >&2; exit 3")
    assert run.returncode == 3 and run.stderr == "to-stderr\n"
