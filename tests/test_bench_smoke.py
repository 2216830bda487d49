"""Smoke test for bench/compare.py: the JSON shape, and corral leaves nothing.

One repetition on two faults (F3 background job, F4 daemon) into a temp
directory. No timings are checked. With a reachable user manager (inside
tests/harness/with-user-manager) corral's enforced modes must also show zero
survivors; without one they must show up as "n/a", not be dropped.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modes import user_manager_reachable

ROOT = Path(__file__).resolve().parent.parent
RUNNERS = ["corral-scope", "corral-service", "corral-fallback", "timeout", "naive", "systemd-run"]


def test_compare_smoke(tmp_path):
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "compare.py"),
            "--reps",
            "1",
            "--faults",
            "F3,F4",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.monotonic() - start < 30

    data = json.loads((tmp_path / "compare.json").read_text())
    assert (tmp_path / "compare.md").read_text().startswith("# Fault matrix")
    assert data["reps"] == 1
    assert data["runners"] == RUNNERS
    assert [f["id"] for f in data["faults"]] == ["F3", "F4"]
    manager = user_manager_reachable()
    for fid in ("F3", "F4"):
        row = data["cells"][fid]
        assert set(row) == set(RUNNERS)
        for cell in row.values():
            assert isinstance(cell["cell"], str)
            if cell.get("na"):
                assert cell["cell"] == "n/a" and cell["why"]
            else:
                assert len(cell["exits"]) == len(cell["survivors"]) == len(cell["elapsed"]) == 1
        assert row["corral-fallback"]["survivors"] == [0], row["corral-fallback"]
        assert row["corral-fallback"]["exits"] == [0]
        # timeout(1) leaves F3's sleep and F4's daemon behind: the matrix must
        # see that -- when the fault got that far within its 2 s wall (a
        # loaded machine can take that long to start Python: then 124, 0).
        if row["timeout"]["exits"] == [0]:
            assert row["timeout"]["survivors"][0] >= 1, row["timeout"]
        for runner in ("corral-scope", "corral-service"):
            if manager:
                assert not row[runner].get("na"), row[runner]
                assert row[runner]["survivors"] == [0], row[runner]
                assert row[runner]["exits"] == [0]
            else:
                assert row[runner]["cell"] == "n/a"
    # F3 is a shell script, quick to start anywhere: its leftover always shows.
    assert data["cells"]["F3"]["timeout"]["survivors"] == [1], data["cells"]["F3"]["timeout"]


@pytest.mark.systemd
def test_runner_bench_smoke(tmp_path):
    """bench/runner_bench.py runs and writes its figures (not judged here)."""
    if not user_manager_reachable():
        pytest.skip("no user manager reachable")
    out = tmp_path / "runner.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "runner_bench.py"),
            "--rounds",
            "2",
            "--runs",
            "16",
            "--throughput-rounds",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert set(data["per_run"]) == {"systemd-run", "runner-scope", "runner-service"}
    assert all(row["p50_ms"] > 0 for row in data["per_run"].values())
    assert set(data["throughput"]) == {"systemd-run xargs -P8", "runner-scope x8", "runner-service x8"}
    for name in ("runner-scope x8", "runner-service x8"):
        row = data["throughput"][name]
        assert len(row["ratio_to_xargs_per_round"]) == 2 and row["cpu_ms_per_run"] > 0


def test_session_bench_smoke(tmp_path):
    """bench/session_bench.py runs, and its session end leaves nothing (the figures are not judged here)."""
    out = tmp_path / "session.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "session_bench.py"), "--rounds", "1", "--runs", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode == 2 and "needs nc" in proc.stderr:
        pytest.fail(proc.stderr)  # tests/run installs netcat-openbsd
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["session_end"]["survivors_after_session_end"] == 0
    for server in ("start_to_ready", "start_to_ready_silent"):  # it says it listens / says nothing
        ratios = data[server]["ratio_to_nohup_nc"]
        assert set(ratios) == {"corral --background", "corral --background, in a session"}
        assert all(r > 0 for r in ratios.values())
    assert data["mode"] in ("fallback", "systemd")
