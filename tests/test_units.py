import pytest

from corral_systemd.common.units import finite, parse_count, parse_cpus, parse_duration, parse_size


@pytest.mark.parametrize(
    "text,seconds",
    [("500ms", 0.5), ("2s", 2.0), ("1.5s", 1.5), ("3m", 180.0), ("1h", 3600.0), ("0s", 0.0), (".5s", 0.5)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "",
        "2",
        "s",
        "-1s",
        "1x",
        "1 s s",
        "1e3s",
        "nans",
        "infs",
        "2S",
        "1.s",
        "1.2.3s",
        "..5s",
        "\u0663s",
        "9" * 400 + "h",
    ],
)
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("text,value", [("1", 1), ("1K", 1024), ("64M", 64 << 20), ("2G", 2 << 30)])
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "0", "-1", "1k", "1MB", "1.5M", "M", "1T", "1KK", "\u0663"])
def test_bad_sizes(text):
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize(
    "value,expected",
    [
        (0, True),
        (-2.5, True),
        (10**400, True),
        (1e308, True),
        (float("inf"), False),
        (-float("inf"), False),
        (float("nan"), False),
    ],
)
def test_finite_is_maths(value, expected):
    assert finite(value) is expected


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e999", "infinity%", "0", "-1"])
def test_bad_cpus(text):
    with pytest.raises(ValueError):
        parse_cpus(text)


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
    run = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", script], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr


def test_run_ids_and_run_names_are_read_as_declared():
    """common.unit_names reads ids by hand (no ``re`` on the start-up path):
    the same forms its patterns declare."""
    from corral_systemd.common.unit_names import is_run_id, looks_like_run, run_of_cgroup, run_of_unit

    assert is_run_id("0123456789ab") and is_run_id("f") and is_run_id("a" * 64)
    for bad in ("", "a" * 65, "ABC", "12 34", "g1", "\u0663", None, 12):
        assert not is_run_id(bad), bad
    assert looks_like_run("0123456789ab") and looks_like_run("ab" * 12) and looks_like_run("corral-web")
    for name in ("web", "0123456789a", "0123456789abc", "0123456789AB"):
        assert not looks_like_run(name), name
    assert run_of_unit("corral-0123456789ab.scope") == "0123456789ab"
    assert run_of_unit("corral-0123456789ab.socket") is None
    assert run_of_cgroup("/sys/fs/cgroup/x/corral-0123456789ab/sub") == "0123456789ab"


@pytest.mark.parametrize(
    "field",
    [b"/proc", b"/a\\040b", b"/x\\134y", b"/tab\\011end", b"\\040\\040", b"/short\\12", b"/not\\9999", b"/end\\"],
)
def test_mountinfo_escapes_are_undone_as_the_kernel_writes_them(field):
    """kernel/namespaces.py reads /proc/self/mountinfo's octal escapes by hand
    (no ``re`` on a pid namespace's start): as the pattern it replaced."""
    import re

    from corral_systemd.kernel.namespaces import _unescaped

    assert _unescaped(field) == re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), field)
