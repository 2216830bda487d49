"""A session's holder with capabilities its caller lacks, or lacking some it has.

systemd 257's user manager gives its services an inheritable CAP_WAKE_ALARM
(Debian 13's user@.service: AmbientCapabilities=CAP_WAKE_ALARM for the manager)
that a login shell lacks: the session's holder unit then has a CapInh its
caller has not. Exec passes the inheritable and ambient sets on, so the
holder's child lowers both to the caller's before it execs the run's corral
(``kernel/context.py``, ``kernel/capabilities.py``); where the caller has one
the holder lacks, nothing is raised: the caller's corral starts the run.

Here the holder is given the extra sets by ``setpriv`` (root: the fallback
session's holder is corralctl's descendant and keeps them across exec), so
this runs wherever the suite runs as root, not only on 257. The command's
/proc/self/status is compared with what the caller's own command gets.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
from test_background_context import CTL, HERE, PROBE, capabilities_differ

from conftest import CORRAL
from modes import mode_flags
from procscan import MARKER_ENV, kill_marked, new_marker

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="an inheritable capability raised needs root, setpriv"
)
#: CAP_WAKE_ALARM, as systemd 257's user manager gives its services.
EXTRA = ["setpriv", "--inh-caps", "+wake_alarm", "--ambient-caps", "+wake_alarm"]


def _run(tmp_path, holder: list[str], caller: list[str]):
    """(the bare command's status, the background command's, the start record, the front's stderr):
    the session's holder started under ``holder``, the caller under ``caller``."""
    marker = new_marker()
    env = dict(os.environ, CORRAL_STATE_DIR=str(tmp_path / "state"), CTX_CWD=str(tmp_path), CTX_MOUNT_DIR=str(tmp_path))
    start = subprocess.run(
        [*holder, *CTL, "session", "start", "--cgroup-mode", "fallback"], env=env, capture_output=True, text=True
    )
    assert start.returncode == 0, start.stderr
    sid = start.stdout.strip()
    env.update({"CORRAL_SESSION": sid, MARKER_ENV: marker})
    outs = {}
    try:
        for name, argv in (
            ("bare", PROBE),
            ("bg", [*CORRAL, *mode_flags("fallback"), "--background", "--json", "-", "--", *PROBE]),
        ):
            (tmp_path / name).mkdir()
            out = tmp_path / name / "probe.json"
            wrap = [sys.executable, str(HERE / "context_probe.py"), "wrap", str(out), "", "--", *argv, str(out)]
            proc = subprocess.run([*caller, *wrap], env=env, capture_output=True, text=True, timeout=300, cwd="/")
            assert proc.returncode == 0, proc.stderr
            outs[name] = (out, proc)
        started = json.loads(outs["bg"][1].stdout)
        wait = subprocess.run([*CTL, "wait", started["run_id"]], env=env, capture_output=True, text=True)
        assert wait.returncode == 0, wait.stderr
        bare, got = (json.loads(outs[n][0].read_text())["status"] for n in ("bare", "bg"))
        return bare, got, started, outs["bg"][1].stderr
    finally:
        subprocess.run([*CTL, "session", "end", sid], env=env, capture_output=True)
        kill_marked(marker)


def test_a_holder_with_more_capabilities_lowers_them_to_the_callers(tmp_path):
    """The holder's CapInh and CapAmb hold CAP_WAKE_ALARM, the caller's do not: the
    holder still starts the run, and the command has the caller's sets exactly."""
    bare, got, started, stderr = _run(tmp_path, EXTRA, [])
    assert int(bare["CapInh"], 16) == 0 and int(bare["CapAmb"], 16) == 0, bare  # the caller has none
    assert started["started_by"] == "holder" and started["warnings"] == [], stderr
    wrong = capabilities_differ(got, bare)
    assert not wrong, "\n".join(wrong)


def test_a_caller_with_a_capability_the_holder_lacks_starts_the_run_itself(tmp_path):
    """Never raised in the holder's child: the caller's corral starts the run, says
    why in one warning, and the command has the caller's sets."""
    bare, got, started, stderr = _run(tmp_path, [], EXTRA)
    assert int(bare["CapInh"], 16) == 1 << 35, bare  # the caller's CAP_WAKE_ALARM
    assert started["started_by"] == "front", started
    assert len(started["warnings"]) == 1 and "CapInh" in started["warnings"][0], started["warnings"]
    wrong = capabilities_differ(got, bare)
    assert not wrong, "\n".join(wrong)


def test_a_peers_capability_sets_are_checked():
    """The context a front sends is validated: a capability set is a 64-bit number or absent."""
    from corral_systemd.kernel.context import ProcessContext

    ctx = ProcessContext.here(dict(os.environ)).to_json()
    assert ProcessContext.from_json(ctx).cap_inheritable == ctx["cap_inheritable"]
    for bad in (-1, 1 << 64, "0", 1.0):
        with pytest.raises(ValueError):
            ProcessContext.from_json({**ctx, "cap_inheritable": bad})
