"""A corral inside a corral run stays inside it: auto mode runs its command
with the fallback engine where the inner corral already is (the outer
run's cgroup), so the outer limits and the outer stop still cover it;
enforced mode, which would leave, is refused; the record names the outer run."""

import json

import pytest

from conftest import CORRAL
from modes import mode_flags

#: Allocates and touches SIZE MiB, then sleeps.
HOG = "import sys, time; b = bytearray(int(sys.argv[1]) << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)"


@pytest.mark.parametrize(
    "mode",
    ["fallback", pytest.param("scope", marks=pytest.mark.systemd), pytest.param("service", marks=pytest.mark.systemd)],
)
def test_the_inner_run_is_stopped_by_the_outer_wall(corral, tmp_path, mode):
    inner_record = tmp_path / "inner.json"
    inner = [*CORRAL, "--json", str(inner_record), "--", "sh", "-c", "setsid sleep 300 & sleep 300"]
    run = corral(mode_flags(mode) + ["--wall", "2s", "--", *inner])
    assert run.returncode == 124, run.stderr
    assert run.survivors == [] and run.record["verified"]
    if inner_record.exists():  # the inner corral was stopped too: it may have written its record
        # Inside a fallback run no cgroup shows the outer run: the inner corral is not nested (and
        # needs not be: the outer one finds its processes by descent, as this test's survivors show).
        expected = None if mode == "fallback" else run.record["run_id"]
        assert json.loads(inner_record.read_text())["nested_in"] == expected


@pytest.mark.systemd
@pytest.mark.parametrize("mode", ["scope", "service"])
def test_an_inner_memory_hog_is_stopped_by_the_outer_memory_limit(corral, tmp_path, mode):
    """Outer --mem 64M; the inner corral (auto mode, no limit of its own)
    runs a 300 MiB hog. Kept in the outer unit's cgroup, the hog meets the
    outer limit: 121, nothing left. (An inner unit of its own would have let
    it have the memory: exit 0.)"""
    inner_record = tmp_path / "inner.json"
    inner = [*CORRAL, "--json", str(inner_record), "--", "python3", "-c", HOG, "300"]
    run = corral(mode_flags(mode) + ["--mem", "64M", "--wall", "60s", "--", *inner])
    assert run.returncode == 121, run.stderr
    assert run.survivors == [] and run.record["verified"]
    # The inner corral may itself be the OOM killer's pick, or stopped by the
    # outer stop before it writes its record; when it wrote one, it says why.
    if inner_record.exists():
        record = json.loads(inner_record.read_text())
        # below the unit and the outer run's group: a pid namespace where one can be had, or the subreaper
        assert record["nested_in"] == run.record["run_id"] and record["guarantee"] in ("pidns", "subreaper")
        assert "nested in corral run" in record["engine"]["auto_fallback_reason"]


@pytest.mark.systemd
def test_enforced_mode_inside_a_run_is_refused_one_line(corral, tmp_path):
    witness = tmp_path / "ran"
    inner = [*CORRAL, "--cgroup-mode", "enforced", "--", "touch", str(witness)]
    run = corral(mode_flags("scope") + ["--quiet", "--", *inner])
    assert run.returncode == 125, run.stderr
    lines = run.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "inside corral run " + run.record["run_id"] in lines[0], lines
    assert not witness.exists()


def test_only_a_run_id_shaped_value_is_an_outer_run():
    from corral_systemd.common.nesting import outer_run

    inside = "0::/corral.slice/corral-0123456789ab.scope\n"
    assert outer_run({}, inside) is None
    assert outer_run({"CORRAL_RUN_ID": "../../etc"}, inside) is None
    assert outer_run({"CORRAL_RUN_ID": "0123456789ab"}, inside) == "0123456789ab"


def test_a_stale_run_id_is_not_believed():
    """A shell that outlived its run still exports CORRAL_RUN_ID: the kernel
    does not place this process in that run, so it is not nested (before:
    auto mode fell back, --pids unenforced, --mem only watched, the record
    named a run that was not there)."""
    from corral_systemd.common.nesting import outer_run

    assert outer_run({"CORRAL_RUN_ID": "0123456789ab"}, "0::/user.slice/session-1.scope\n") is None
    assert outer_run({"CORRAL_RUN_ID": "0123456789ab"}, "1:name=systemd:/corral-0123456789abc.scope\n") is None
    assert outer_run({"CORRAL_RUN_ID": "0123456789ab"}, "0::/parent/corral-0123456789ab\n") == "0123456789ab"
    # End to end: an enforced corral with a stale id runs (not 125), and its record names no outer run.
    import subprocess

    proc = subprocess.run(
        [*CORRAL, "--cgroup-mode", "fallback", "--quiet", "--json", "-", "--", "true"],
        env={**__import__("os").environ, "CORRAL_RUN_ID": "0123456789ab", "CORRAL_SERVICE": "0"},
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["nested_in"] is None
