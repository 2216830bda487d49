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
