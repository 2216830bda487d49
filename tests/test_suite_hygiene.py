"""The suite cleans up after itself (issue 13, item 10)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_the_suite_removes_its_state_directory(tmp_path, workers):
    """A pytest session (alone or with xdist workers) leaves no corral-test-state-* behind."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("CORRAL_STATE_DIR", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")
    }
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, "tests/test_units.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.glob("corral-test-state-*")) == []


def test_every_test_the_vm_lane_names_exists():
    """tests/vm/guest-lane names some tests by node id; one renamed (a new parameter)
    would make its step collect nothing (pytest exit 4 or 5) only in the guest."""
    import re

    named = sorted(set(re.findall(r"tests/test_\w+\.py::[^\s\"]+", (ROOT / "tests/vm/guest-lane").read_text())))
    assert named, "no node ids found in tests/vm/guest-lane"
    r = subprocess.run(  # a node id that names nothing: "ERROR: not found", exit 4
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *named],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
