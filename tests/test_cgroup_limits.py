"""engines/cgroup_limits.py: each cgroup limit declared once, written by the
cgroup engine and read back by both engines from that one declaration.

On fake cgroup trees (files as the kernel shows them): the harness here
delegates no controller to a cgroup v2 parent, so --cgroup-parent's writes
are checked on files; the kernel's side is the VM lane's and the systemd
tests' (test_pids_limit_contains_fork_storm, the --mem tests)."""

import types

import pytest

from corral_systemd.core.spec import RunSpec
from corral_systemd.engines.cgroup_limits import CGROUP_LIMITS, asked
from corral_systemd.engines.cgroupv2 import write_limits
from corral_systemd.engines.systemd.properties import limit_properties
from corral_systemd.engines.unitcgroup import UnitCgroup

SPEC = RunSpec(argv=["x"], mem=100_000_000, pids=50, cpus=0.5, unit_type="scope")


def _group(tmp_path, controllers: str, *files: str):
    cg = "/corral.slice/corral-limits.scope"
    group = tmp_path / "unified" / cg.lstrip("/")
    group.mkdir(parents=True)
    (group / "cgroup.controllers").write_text(controllers + "\n")
    for name in files:
        (group / name).write_text("max\n")
    mounts = types.SimpleNamespace(unified=str(tmp_path / "unified"), v1={})
    return group, UnitCgroup(cg, mounts)


def test_every_limit_a_cgroup_can_hold_is_declared_once_and_asked_in_order():
    assert [limit.field for limit in CGROUP_LIMITS] == ["mem", "pids", "cpus"]
    assert [limit.field for limit, _ in asked(SPEC)] == ["mem", "pids", "cpus"]
    assert asked(RunSpec(argv=["x"], pids=3)) == [(CGROUP_LIMITS[1], 3)]


def test_the_cgroup_engine_writes_what_is_delegated_and_says_what_is_not(tmp_path):
    group, _ = _group(tmp_path, "memory pids", "memory.max", "memory.swap.max", "pids.max")
    enforced, warnings = write_limits(str(group), SPEC, "/parent")
    assert (group / "memory.max").read_text() == "100000000"
    assert (group / "memory.swap.max").read_text() == "0"
    assert (group / "pids.max").read_text() == "50"
    assert not (group / "cpu.max").exists()
    assert enforced == {"mem": "kernel", "pids": "kernel", "cpus": "none"}
    assert warnings == ["--cpus: /parent does not delegate the cpu controller; the quota is not enforced"]


def test_without_memory_delegated_memory_is_watched(tmp_path):
    group, _ = _group(tmp_path, "pids")
    enforced, warnings = write_limits(str(group), RunSpec(argv=["x"], mem=1 << 20), "/p")
    assert enforced == {"mem": "watch"} and not (group / "memory.max").exists()
    assert warnings == ["--mem: /p does not delegate the memory controller; memory is watched by corral instead"]


def test_what_the_cgroup_engine_writes_reads_back_as_held(tmp_path):
    """The write side and the read-back side agree for every declared limit
    (memory rounded down to whole pages, as the kernel stores it)."""
    group, cgroup = _group(tmp_path, "memory pids cpu", "memory.max", "pids.max", "cpu.max")
    write_limits(str(group), SPEC, "/parent")
    assert (group / "cpu.max").read_text() == "50000 100000"
    page = __import__("os").sysconf("SC_PAGE_SIZE")
    (group / "memory.max").write_text(str(100_000_000 - 100_000_000 % page))  # the kernel's rounding
    assert cgroup.limits_set(SPEC) == ({"mem": "kernel", "pids": "kernel", "cpus": "kernel"}, [])


@pytest.mark.parametrize("limit", CGROUP_LIMITS, ids=lambda limit: limit.field)
def test_a_limit_not_in_force_reads_back_as_not_held(tmp_path, limit):
    group, cgroup = _group(tmp_path, "memory pids cpu", "memory.max", "pids.max", "cpu.max")
    enforced, warnings = cgroup.limits_set(SPEC)  # every file reads "max"
    assert enforced[limit.field] == limit.otherwise
    assert any(w.startswith(f"--{limit.field}: no {limit.controller} controller") for w in warnings)


def test_a_units_limits_are_the_declared_properties():
    names = [name for name, _ in limit_properties(SPEC)]
    assert names == ["MemoryMax", "MemorySwapMax", "TasksMax", "CPUQuotaPerSecUSec"]
    values = dict(limit_properties(SPEC))
    assert values["CPUQuotaPerSecUSec"].value == 500_000 and values["TasksMax"].value == 50
