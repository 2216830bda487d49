"""Issue 28: the container lane's check of each cell's guarantee.

tests/containers/run-lane runs this inside every container it starts (with
the fault matrix, tests/test_faults.py, and where a cgroup is writable
tests/test_escape.py), naming the cell in CORRAL_TEST_CONTAINER_CELL;
elsewhere it is skipped. Run as a script (``python3 test_container_cell.py
CELL RECORD``), it checks a record written outside pytest: the lane's
corral-as-PID-1 cell, where corral is the container's init.

EXPECTED is the table of what each cell must give. Until the record has a
``guarantee`` field (issue 28's tiers), a cell is held to the ``mode`` that
corral gives there today; once it has one, the check reads it and holds the
cell to the tier of the table (no switch to flip: the record says which).
"""

import json
import os
import sys

#: cell: (the record's ``mode`` before the tiers, the ``guarantee`` once they land).
#: Host cells: this machine's hybrid layout (cgroup v1 controllers, no
#: writable cgroup2 in a container); v2 cells: the VM lane's guest (pure v2).
EXPECTED = {
    # rootful, default: /proc masked (no /proc of its own for a pid namespace), no cgroup v2
    "default": ("fallback", "subreaper"),
    # /proc unmasked: a user + pid namespace with its own /proc
    "unmask-proc": ("fallback", "pidns"),
    # every capability, /proc unmasked; the cgroups are v1 (not a tier)
    "privileged": ("fallback", "pidns"),
    # a seccomp profile that forbids new user and pid namespaces (like Docker's default)
    "seccomp-no-userns": ("fallback", "subreaper"),
    # corral as the container's PID 1, default options
    "pid1": ("fallback", "subreaper"),
    # pure cgroup v2 (the guest): a writable cgroup namespace root
    "v2-writable-cgroup": ("fallback", "cgroup"),
    "v2-privileged": ("fallback", "cgroup"),
    "v2-pid1-writable-cgroup": ("fallback", "cgroup"),
    # rootless podman as uid 1000: /proc masked, the cgroup not delegated to the container
    "v2-rootless": ("fallback", "subreaper"),
}

CELL = os.environ.get("CORRAL_TEST_CONTAINER_CELL")


def check(cell: str, record: dict) -> str | None:
    """Why ``record`` is not what ``cell`` must give (None: it is)."""
    today, tier = EXPECTED[cell]
    if "guarantee" in record:
        got, want, what = record["guarantee"], tier, "guarantee"
    else:
        got, want, what = record.get("mode"), today, "mode (no guarantee in the record yet)"
    if got != want:
        reason = (record.get("engine") or {}).get("auto_fallback_reason")
        return f"cell {cell}: {what} {got!r}, expected {want!r} (auto fallback reason: {reason})"
    return None


if CELL is not None or __name__ != "__main__":
    import pytest

    pytestmark = pytest.mark.skipif(CELL is None, reason="a container lane cell only (tests/containers/run-lane)")

    def test_auto_gives_the_cells_guarantee_and_leaves_nothing(corral):
        """Auto mode, a command that leaves daemons (setsid, nohup, a double fork)
        and exits 0: nothing carrying its marker is left, the record is verified
        and names the cell's guarantee."""
        cmd = "setsid sleep 600 & nohup sleep 600 >/dev/null 2>&1 & sh -c 'sleep 600 &'; echo started"
        run = corral(["--", "sh", "-c", cmd])
        detail = run.stderr.decode(errors="replace")
        assert run.survivors == [], f"{run.survivors}; {detail}"
        assert run.returncode == 0, detail
        assert run.record is not None and run.record["verified"] is True, detail
        assert run.record["remaining_pids"] == []
        problem = check(CELL, run.record)
        assert problem is None, f"{problem}; {detail}"


if __name__ == "__main__" and sys.argv[1:2] == ["--tier-is-cgroup"]:
    sys.exit(0 if EXPECTED[sys.argv[2]][1] == "cgroup" else 1)
if __name__ == "__main__" and len(sys.argv) == 3:
    with open(sys.argv[2]) as f:
        problem = check(sys.argv[1], json.load(f))
    print(problem or f"cell {sys.argv[1]}: as expected")
    sys.exit(1 if problem else 0)
