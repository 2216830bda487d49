"""--max-output: the cap is an outcome, every byte arrives, a slow caller delays nothing (issue 13, item 3)."""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import CORRAL
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

FB = ["--cgroup-mode", "fallback"]


@pytest.mark.parametrize("script", ["head -c 3000 /dev/zero", "head -c 600 /dev/zero; head -c 600 /dev/zero >&2"])
def test_output_past_the_cap_when_the_command_exits_is_122(corral, script):
    """The command writes past the cap and exits at once: corral may see the exit
    before the bytes, but the cap was exceeded all the same."""
    for _ in range(3):
        run = corral(FB + ["--max-output", "1000", "--", "sh", "-c", script])
        detail = run.stderr.decode(errors="replace")
        assert run.returncode == 122, detail
        assert run.record["outcome"] == "output"
        assert run.record["output_bytes"] > 1000
        assert len(run.stdout) + len(run.stderr.split(b"corral: ")[0]) == 1000
        assert run.survivors == []


def _wait_for(predicate, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


#: Writes SIZE bytes into its stdout pipe, enlarged to 1 MiB (F_SETPIPE_SZ), and exits at once.
BIG_PIPE = (
    "import fcntl, os, sys\n"
    "fcntl.fcntl(1, 1031, 1 << 20)\n"
    "data = memoryview(b'x' * int(sys.argv[1]))\n"
    "while data: data = data[os.write(1, data):]\n"
)


def test_every_byte_arrives_at_a_slow_reader(tmp_path):
    """The command leaves 600 kB in its pipe and exits; corral's reader takes
    4 KiB every 10 ms. Every byte arrives, however long that takes."""
    size = 600_000
    record = tmp_path / "record.json"
    proc = subprocess.Popen(
        [
            *CORRAL,
            *FB,
            "--quiet",
            "--json",
            str(record),
            "--max-output",
            "10M",
            "--",
            sys.executable,
            "-c",
            BIG_PIPE,
            str(size),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    got = 0
    try:
        while chunk := proc.stdout.read1(4096):
            got += len(chunk)
            time.sleep(0.01)
    finally:
        proc.stdout.close()
        proc.wait(timeout=60)
    assert got == size
    assert proc.returncode == 0
    assert json.loads(record.read_text())["output_bytes"] == size


def test_a_caller_that_does_not_read_does_not_delay_the_deadline(tmp_path):
    """corral's stdout is a pipe nobody reads while the command writes 1 MB and
    sleeps: the wall limit is enforced on time; the output arrives afterwards."""
    marker = new_marker()
    record = tmp_path / "record.json"
    size = 1_000_000
    proc = subprocess.Popen(
        [
            *CORRAL,
            *FB,
            "--json",
            str(record),
            "--wall",
            "1s",
            "--grace",
            "1s",
            "--max-output",
            "10M",
            "--",
            # The mark is the command's alone: corral and its helpers (the
            # tether) live on until the output is read, and they are not the run.
            "env",
            f"{MARKER_ENV}={marker}",
            "sh",
            "-c",
            f"head -c {size} /dev/zero; sleep 600",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:

        def run_pids():
            return marked_pids(marker)

        assert _wait_for(run_pids, 20), "the command did not start"
        # Nobody reads corral's stdout yet: the run must end on its own.
        stopped = _wait_for(lambda: not run_pids(), 20)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
        kill_marked(marker)
    assert stopped, "the run outlived its wall limit while corral's reader was idle"
    assert proc.returncode == 124, err
    assert len(out) == size
    steps = json.loads(record.read_text())["steps"]
    assert steps["deadline"] <= 1.0 + 1.0
    assert steps["verified"] - steps["deadline"] <= 1.0 + 1.0


def test_a_reader_that_goes_away_does_not_stop_the_run(tmp_path):
    """EPIPE on corral's stdout: output is dropped, the run goes on to its end."""
    record = tmp_path / "record.json"
    proc = subprocess.Popen(
        [
            *CORRAL,
            *FB,
            "--quiet",
            "--json",
            str(record),
            "--max-output",
            "10M",
            "--",
            "sh",
            "-c",
            "head -c 200000 /dev/zero; sleep 0.5; exit 3",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    proc.stdout.read(10)
    proc.stdout.close()
    assert proc.wait(timeout=60) == 3
    assert json.loads(record.read_text())["outcome"] == "exited"
