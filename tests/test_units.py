import pytest

from corral_systemd.units import parse_count, parse_duration, parse_size


@pytest.mark.parametrize("text,seconds", [("500ms", 0.5), ("2s", 2.0), ("1.5s", 1.5), ("3m", 180.0), ("1h", 3600.0), ("0s", 0.0), (".5s", 0.5)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2", "s", "-1s", "1x", "1 s s", "1e3s", "nans", "infs", "2S", "1.s", "9" * 400 + "h"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("text,value", [("1", 1), ("1K", 1024), ("64M", 64 << 20), ("2G", 2 << 30)])
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "0", "-1", "1k", "1MB", "1.5M", "M", "1T"])
def test_bad_sizes(text):
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize("text", ["0", "-3", "x", "1.5", ""])
def test_bad_counts(text):
    with pytest.raises(ValueError):
        parse_count(text)


def test_cached_mount_table_follows_mounts(tmp_path):
    """Mounts.current() (a Runner reads the table for every run) must be
    parsed again after any mount or unmount, never served stale."""
    import os
    import subprocess
    import sys

    point = tmp_path / "point"
    point.mkdir()
    script = f"""
import subprocess
from corral_systemd.kernel.cgroupfs import Mounts
a = Mounts.current(); assert Mounts.current() is a, "not cached"
subprocess.run(["mount", "-t", "cgroup2", "none", "{point}"], check=True)
b = Mounts.current(); assert b is not a and b.unified == "{point}", ("stale after mount", b.unified)
assert Mounts.current() is b, "not cached after the change"
subprocess.run(["umount", "{point}"], check=True)
c = Mounts.current(); assert c is not b and c.unified != "{point}", "stale after umount"
"""
    if os.geteuid() != 0:
        pytest.skip("needs root (a private mount namespace)")
    run = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", script],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
