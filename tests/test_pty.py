"""--pty: the command on a terminal of its own, relayed; corral's terminal
in raw mode while it runs and restored after, whatever ends the run.

corral itself runs on a pseudo-terminal the test holds (as under tmux or an
ssh session): the test types into it and reads what corral shows there.
"""

import fcntl
import json
import os
import select
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

from conftest import CORRAL, TIME_SCALE, marker_env
from modes import all_modes, mode_flags
from procscan import MARKER_ENV, marked_pids


class Terminal:
    """A pseudo-terminal with corral running on it as its controlling terminal."""

    def __init__(self, argv, marker, rows=40, cols=100):
        self.master, self.slave = os.openpty()
        self.set_size(rows, cols)
        self.before = termios.tcgetattr(self.slave)
        self.proc = subprocess.Popen(
            argv,
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            env=marker_env(marker),
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        self.seen = b""

    def set_size(self, rows, cols):
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def read_until(self, needle: bytes, timeout=30.0) -> bytes:
        end = time.monotonic() + timeout * TIME_SCALE
        while needle not in self.seen:
            left = end - time.monotonic()
            assert left > 0, f"{needle!r} not shown: {self.seen!r}"
            if select.select([self.master], [], [], left)[0]:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:
                    break
        return self.seen

    def type(self, data: bytes):
        os.write(self.master, data)

    def finish(self, timeout=30.0) -> int:
        end = time.monotonic() + timeout * TIME_SCALE
        while self.proc.poll() is None and time.monotonic() < end:
            if select.select([self.master], [], [], 0.05)[0]:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:
                    pass
        return self.proc.wait(timeout=1)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def terminal(marker):
    made = []

    def make(argv, **kw):
        made.append(Terminal(argv, marker, **kw))
        return made[-1]

    yield make
    for t in made:
        t.close()


WAIT = "echo ready; while :; do sleep 0.05; done"


@pytest.mark.parametrize("mode", all_modes())
def test_size_follows_corrals_terminal(terminal, marker, mode):
    script = f'stty size; trap "stty size; exit 3" WINCH; {WAIT}'
    t = terminal([*CORRAL, "--quiet", *mode_flags(mode), "--pty", "--", "sh", "-c", script])
    t.read_until(b"ready")
    assert b"40 100" in t.seen
    t.set_size(50, 120)  # the kernel tells corral (SIGWINCH); corral tells the command's terminal
    assert t.finish() == 3, t.seen
    assert b"50 120" in t.seen
    assert termios.tcgetattr(t.slave) == t.before
    assert marked_pids(marker) == []


@pytest.mark.parametrize("mode", all_modes())
def test_ctrl_c_goes_to_the_command_not_to_corral(terminal, marker, mode):
    """^C typed on corral's terminal (raw: a byte, no signal to corral) is
    the command's terminal's ^C: a SIGINT to its foreground process group.
    The command's exit status is the run's; the terminal is as it was."""
    script = f'trap "echo got-int; exit 7" INT; {WAIT}'
    t = terminal([*CORRAL, "--quiet", *mode_flags(mode), "--pty", "--", "sh", "-c", script])
    t.read_until(b"ready")
    assert termios.tcgetattr(t.slave) != t.before  # raw while the run goes on
    t.type(b"\x03")
    assert t.finish() == 7, t.seen
    assert b"got-int" in t.seen
    assert termios.tcgetattr(t.slave) == t.before
    assert marked_pids(marker) == []


def test_terminal_restored_when_corral_is_stopped(terminal, marker):
    t = terminal([*CORRAL, "--quiet", "--cgroup-mode", "fallback", "--pty", "--", "sh", "-c", WAIT])
    t.read_until(b"ready")
    t.proc.send_signal(signal.SIGTERM)
    assert t.finish() == 128 + signal.SIGTERM, t.seen
    assert termios.tcgetattr(t.slave) == t.before
    assert marked_pids(marker) == []


@pytest.mark.parametrize("mode", all_modes())
def test_dev_tty_and_input_reach_the_command_on_its_pty(corral, mode):
    """No terminal on corral's side (a pipe): the command still has one, and
    what corral's stdin carries is typed into it."""
    probe = (
        "import os, sys\n"
        "fd = os.open('/dev/tty', os.O_RDWR)\n"
        "print('tty', os.isatty(0), os.isatty(1), os.isatty(2), flush=True)\n"
        "print('read', sys.stdin.readline().strip(), flush=True)\n"
    )
    run = corral(mode_flags(mode) + ["--pty", "--", "python3", "-c", probe], input=b"hello\n")
    assert run.returncode == 0, run.stderr
    out = run.stdout.replace(b"\r\n", b"\n")
    assert b"tty True True True\n" in out and b"read hello\n" in out, out
    assert run.record["pty"] is True


PROBE_TTY = (
    "import os, sys\n"
    "os.close(os.open('/dev/tty', os.O_RDWR))\n"
    "print('tty', os.isatty(0), os.isatty(1), os.isatty(2), flush=True)\n"
    "print('read', sys.stdin.readline().strip(), flush=True)\n"
)


@pytest.mark.parametrize("mode", ["fallback", pytest.param("enforced", marks=pytest.mark.systemd)])
def test_library_pty_types_stdin_bytes_and_a_started_runs_sends(tmp_path, mode):
    """``pty=True``: ``stdin=bytes`` is typed into the terminal, and so is
    what ``send`` writes to a started run (its output: one stream)."""
    code = (
        "import asyncio, json, sys\n"
        "import corral_systemd as corral\n"
        f"probe = {PROBE_TTY!r}\n"
        f"r = corral.run([sys.executable, '-c', probe], mode={mode!r}, pty=True, stdin=b'hello\\n')\n"
        "async def main():\n"
        f"    async with corral.start([sys.executable, '-c', probe], mode={mode!r}, pty=True, stdin='pipe') as run:\n"
        "        await run.send(b'there\\n')\n"
        "        return await run.wait()\n"
        "s = asyncio.run(main())\n"
        "print(json.dumps([r.exit_code, r.stdout.decode(), s.exit_code, s.stdout.decode(), r.pty]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    r_code, r_out, s_code, s_out, pty = json.loads(out.stdout)
    assert (r_code, s_code, pty) == (0, 0, True)
    for text, word in ((r_out, "hello"), (s_out, "there")):
        text = text.replace("\r\n", "\n")
        assert "tty True True True\n" in text and f"read {word}\n" in text, text


@pytest.mark.parametrize("mode", all_modes())
def test_ctrl_c_under_tmux(tmp_path, marker, mode):
    """corral --pty in a tmux pane (its own tmux server, on a socket of the
    test's): C-c sent to the pane is the command's SIGINT; corral's exit is
    the command's, and the pane's terminal is left as it was."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    sock, done = tmp_path / "tmux.sock", tmp_path / "exit"
    script = f'trap "echo got-int; exit 7" INT; {WAIT}'
    inner = shlex.join([*CORRAL, "--quiet", *mode_flags(mode), "--pty", "--", "sh", "-c", script])
    # Only corral and its command carry the marker (not the pane's shell).
    pane = (
        f"stty -g > {tmp_path}/before; env {MARKER_ENV}={marker} {inner}; echo $? > {done}; "
        f"stty -g > {tmp_path}/after; sleep 30"
    )
    tmux = ["tmux", "-S", str(sock), "-f", "/dev/null"]
    env = dict(os.environ, TERM="xterm")
    subprocess.run([*tmux, "new-session", "-d", "-x", "100", "-y", "40", pane], env=env, check=True, timeout=30)
    try:
        end = time.monotonic() + 30 * TIME_SCALE
        screen = ""
        while "ready" not in screen and time.monotonic() < end:
            time.sleep(0.1)
            screen = subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True).stdout
        assert "ready" in screen, screen
        subprocess.run([*tmux, "send-keys", "C-c"], check=True, timeout=30)
        while not done.exists() and time.monotonic() < end:
            time.sleep(0.1)
        assert done.exists(), subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True).stdout
        time.sleep(0.3)
        assert done.read_text().strip() == "7"
        assert (tmp_path / "before").read_text() == (tmp_path / "after").read_text()
        assert marked_pids(marker) == []
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=30)  # the test's own server only
