"""--output-limit (head and tail, one marker line between, the run goes on)
and --output-file (the whole stream, 0600), in every engine and the library.

What is asserted is the exact bytes corral passed on, against the bytes the
command wrote (random binary data, a stream that never ends in a newline).
"""

import os
import stat
import subprocess
import sys

import pytest

from conftest import CORRAL
from corral_systemd.core.output import omission_marker
from modes import all_modes, mode_flags

#: Writes SIZE pseudo-random bytes (seeded: the test computes the same) to stdout, no newline at the end.
WRITE = (
    "import random, sys\n"
    "r = random.Random(int(sys.argv[2]))\n"
    "data = r.randbytes(int(sys.argv[1]))\n"
    "data = data.rstrip(b'\\n') + b'!'\n"
    "sys.stdout.buffer.write(data)\n"
)


def _data(size: int, seed: int) -> bytes:
    import random

    return random.Random(seed).randbytes(size).rstrip(b"\n") + b"!"


def _expected(data: bytes, limit: int) -> bytes:
    if len(data) <= limit:
        return data
    head, tail = data[: limit - limit // 2], data[len(data) - limit // 2 :]
    omitted = len(data) - len(head) - len(tail)
    return head + omission_marker(omitted, head.endswith(b"\n")) + tail


@pytest.mark.parametrize("mode", all_modes())
def test_binary_output_keeps_head_and_tail_byte_exact(corral, tmp_path, mode):
    """10 MiB of random bytes under --output-limit 64K: the first 32 KiB, the
    marker, the last 32 KiB, exactly; the whole stream in --output-file."""
    size, limit = 10 << 20, 64 * 1024
    data = _data(size, 7)
    whole = tmp_path / "whole.bin"
    run = corral(
        mode_flags(mode)
        + ["--output-limit", "64K", "--output-file", str(whole), "--", "python3", "-c", WRITE, str(size), "7"]
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == _expected(data, limit)
    assert whole.read_bytes() == data
    assert stat.S_IMODE(whole.stat().st_mode) == 0o600
    record = run.record
    assert record["output_bytes"] == len(data) and record["output_limit"] == limit
    assert record["output_omitted_bytes"] == len(data) - limit
    assert record["output_file"] == str(whole)
    assert f"{len(data) - limit} bytes of output left out" in run.stderr.decode()


@pytest.mark.parametrize("mode", all_modes())
def test_output_within_the_limit_is_unchanged(corral, mode):
    data = _data(5000, 3)
    run = corral(mode_flags(mode) + ["--output-limit", str(len(data)), "--", "python3", "-c", WRITE, "5000", "3"])
    assert run.returncode == 0, run.stderr
    assert run.stdout == data and not data.endswith(b"\n")
    assert run.record["output_omitted_bytes"] == 0
    assert "left out" not in run.stderr.decode()


def test_head_on_stdout_tail_on_stderr_marker_where_the_cut_is(corral):
    """100 bytes on stdout, then 100 on stderr, limit 100: stdout keeps the
    first 50 and gets the marker (the first byte left out was its), stderr
    the last 50."""
    script = (
        "import sys, time; sys.stdout.write('A'*100); sys.stdout.flush(); time.sleep(0.3); sys.stderr.write('B'*100)"
    )
    run = corral(mode_flags("fallback") + ["--quiet", "--output-limit", "100", "--", "python3", "-c", script])
    assert run.returncode == 0
    assert run.stdout == b"A" * 50 + omission_marker(100, False)
    assert run.stderr == b"B" * 50


def test_output_limit_does_not_stop_the_run_max_output_does(corral):
    script = "import sys; sys.stdout.write('x' * 5000); sys.stdout.flush(); print('done', file=sys.stderr)"
    kept = corral(mode_flags("fallback") + ["--output-limit", "100", "--", "python3", "-c", script])
    assert kept.returncode == 0 and kept.stderr.startswith(b"done\n")
    both = corral(
        mode_flags("fallback")
        + ["--output-limit", "100", "--max-output", "1000", "--", "sh", "-c", "yes x | head -c 100000; sleep 30"]
    )
    assert both.returncode == 122, both.stderr
    assert both.stdout == b"x\n" * 25 + omission_marker(1000 - 100, True) + b"x\n" * 25


@pytest.mark.parametrize(
    "args, words",
    [
        (["--output-limit", "1"], "at least 2 bytes"),
        (["--output-limit", "lots"], "--output-limit"),
        (["--output-file", "/"], "not a regular file"),
        (["--output-file", "/nonexistent-dir/x"], "does not exist"),
    ],
)
def test_bad_output_options_are_125_one_line_nothing_runs(corral, tmp_path, args, words):
    witness = tmp_path / "ran"
    run = corral(mode_flags("fallback") + args + ["--", "touch", str(witness)], record=False)
    assert run.returncode == 125
    lines = run.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines
    assert not witness.exists()


def test_output_file_never_follows_a_symlink(corral, tmp_path):
    """A symlink at the path (say, to a file of the user's) is refused, and
    its target is left as it was."""
    target = tmp_path / "precious"
    target.write_bytes(b"keep me")
    link = tmp_path / "out"
    link.symlink_to(target)
    run = corral(mode_flags("fallback") + ["--output-file", str(link), "--", "echo", "hi"], record=False)
    assert run.returncode == 125 and b"not a regular file" in run.stderr
    assert target.read_bytes() == b"keep me"


def test_library_result_says_what_was_cut(tmp_path):
    script = "import sys; sys.stdout.write('a' * 300); sys.stdout.flush(); sys.stderr.write('z' * 10)"
    code = (
        "import corral_systemd as corral, json, sys\n"
        f"r = corral.run([sys.executable, '-c', {script!r}], mode='fallback', output_limit=100,"
        f" output_file={str(tmp_path / 'all.txt')!r})\n"
        "print(json.dumps([r.stdout.decode(), r.stderr.decode(), r.output_omitted_bytes, r.output_limit]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    import json

    stdout, stderr, omitted, limit = json.loads(out.stdout)
    assert (omitted, limit) == (210, 100)
    assert stdout == "a" * 50 + omission_marker(210, False).decode() + "a" * 40
    assert stderr == "z" * 10
    assert (tmp_path / "all.txt").read_text() == "a" * 300 + "z" * 10
