"""Issue 13, item 16: Ctrl-C at a terminal, as corral(1) describes it.

corral stays in the terminal's foreground process group; the command runs
in a session of its own. So Ctrl-C reaches corral, not the command: corral
stops the run (SIGTERM to the command, the grace period, SIGKILL) and exits
130. The command's INT trap never runs; its TERM trap does.

Driven through a real terminal: an interactive bash (job control, as a
user's shell) in a tmux pane on a tmux server of its own, sent C-c.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from conftest import ROOT
from modes import mode_flags

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

SCRIPT = """\
trap 'echo INT-trap >>"$LOG"; exit 7' INT
trap 'echo TERM-trap >>"$LOG"; exit 8' TERM
echo ready >>"$LOG"
while :; do sleep 0.1; done
"""


def _wait_for(path, text, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    "mode",
    ["fallback", pytest.param("scope", marks=pytest.mark.systemd), pytest.param("service", marks=pytest.mark.systemd)],
)
def test_ctrl_c_stops_the_run_through_corral(tmp_path, mode):
    flags = mode_flags(mode)
    log, record, script = tmp_path / "log", tmp_path / "record.json", tmp_path / "command.sh"
    script.write_text(SCRIPT)
    corral = [
        sys.executable,
        "-m",
        "corral_systemd",
        *flags,
        "--grace",
        "5s",
        "--json",
        str(record),
        "--",
        "sh",
        str(script),
    ]
    line = (
        f"cd {shlex.quote(str(ROOT))} && LOG={shlex.quote(str(log))} {shlex.join(corral)}; "
        f"echo exit=$? >>{shlex.quote(str(log))}"
    )
    socket = f"corral-test-{uuid.uuid4().hex[:12]}"
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "t", "-x", "200", "-y", "50", "env PS1='$ ' bash --norc --noprofile -i"],
        check=True,
        env=env,
        timeout=30,
    )
    try:
        subprocess.run([*tmux, "send-keys", "-t", "t", "-l", line], check=True, timeout=30)
        subprocess.run([*tmux, "send-keys", "-t", "t", "Enter"], check=True, timeout=30)
        assert _wait_for(log, "ready", 30), "the command did not start"
        sent = time.monotonic()
        subprocess.run([*tmux, "send-keys", "-t", "t", "C-c"], check=True, timeout=30)
        assert _wait_for(log, "exit=", 30), log.read_text()
        elapsed = time.monotonic() - sent
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=30)
    lines = log.read_text().split()
    assert lines == ["ready", "TERM-trap", "exit=130"], lines  # no INT-trap: the command never got SIGINT
    assert elapsed < 5.0  # the TERM trap ended it: no wait for the 5 s grace period
    data = json.loads(record.read_text())
    assert data["outcome"] == "interrupted" and data["corral_signal"] == 2 and data["exit_code"] == 130
    assert data["verified"] is True and data["steps"]["kill_sent"] is None
