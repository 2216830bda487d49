"""How the kernel holds a run's limits in a cgroup, declared once per limit.

Each ``CgroupLimit`` says, for one limit of ``common/limits.py``: the
controller, what the cgroup engine writes in its own group (v2), the unit
properties the systemd engine asks the manager for, and how either engine
reads the kernel's value back (v2 or v1) to say whether the kernel holds the
limit ("kernel") or not (``otherwise``: memory is then watched by corral,
the others are not enforced). Nothing here touches the machine; the
engines' ``enforce``/``read back`` loops (cgroupv2.py, unitcgroup.py,
systemd/properties.py) iterate this table and know no limit by name.

``--wall``, ``--cpu-time`` and ``--max-output`` are no cgroup's: corral
watches them (RuntimeMaxSec is only a backstop, properties.py).
"""

import os
from collections.abc import Callable

from ..common.limits import BY_FIELD
from ..common.plainclass import plainclass

_USEC = 1_000_000
#: The kernel's default CFS period for cpu.max (µs); its smallest quota is 1 ms.
CPU_PERIOD_USEC = 100_000


def cpu_quota_per_sec_usec(cpus: float) -> int:
    """CPUQuota= as the manager takes it over D-Bus: microseconds of CPU per second."""
    return max(1, round(cpus * _USEC))


@plainclass(frozen=True)
class CgroupLimit:
    #: The ``Limit.field`` (RunSpec field, ``limits_enforced`` key).
    field: str
    controller: str
    #: The v2 file and what is written there for a value.
    v2_file: str
    v2_value: Callable
    #: The v1 file that reads the limit back (under the controller's hierarchy).
    v1_file: str
    #: (property, D-Bus signature, value of the limit) for a unit.
    unit_properties: Callable
    #: ``limits_enforced`` when the kernel does not hold it, and what the warning says then.
    otherwise: str
    otherwise_words: str
    #: Further v2 files written where they exist (name, value).
    v2_also: tuple[tuple[str, str], ...] = ()
    #: "exact": the file reads back the value (rounded down to whole pages
    #: where ``in_pages``, as the kernel stores it); "set": it reads as any
    #: limit ("max" or -1: none).
    read_back: str = "exact"
    in_pages: bool = False

    @property
    def option(self) -> str:
        """Its CLI option, for the warnings (``common/limits.py``)."""
        return BY_FIELD[self.field].option

    def expected(self, value) -> int:
        """What an "exact" file reads once the kernel holds ``value``."""
        granule = os.sysconf("SC_PAGE_SIZE") if self.in_pages else 1
        return value - value % granule


CGROUP_LIMITS: tuple[CgroupLimit, ...] = (
    # memory.max (v2) and memory.limit_in_bytes (v1) keep whole pages:
    # --mem 100000000 reads back as 99999744 and is enforced there. No swap:
    # a run's memory is its RAM.
    CgroupLimit(
        "mem",
        "memory",
        "memory.max",
        str,
        "memory.limit_in_bytes",
        lambda mem: [("MemoryMax", "t", mem), ("MemorySwapMax", "t", 0)],
        "watch",
        "memory is watched by corral instead",
        v2_also=(("memory.swap.max", "0"),),
        in_pages=True,
    ),
    CgroupLimit(
        "pids",
        "pids",
        "pids.max",
        str,
        "pids.max",
        lambda pids: [("TasksMax", "t", pids)],
        "none",
        "the limit is not enforced",
    ),
    # The manager sets its own period; whether a quota is in force is what counts.
    CgroupLimit(
        "cpus",
        "cpu",
        "cpu.max",
        lambda cpus: f"{max(1000, round(cpus * CPU_PERIOD_USEC))} {CPU_PERIOD_USEC}",
        "cpu.cfs_quota_us",
        lambda cpus: [("CPUQuotaPerSecUSec", "t", cpu_quota_per_sec_usec(cpus))],
        "none",
        "the quota is not enforced",
        read_back="set",
    ),
)


def asked(spec) -> list[tuple[CgroupLimit, object]]:
    """The cgroup limits ``spec`` asks for, with their values, in table order."""
    return [(limit, value) for limit in CGROUP_LIMITS if (value := getattr(spec, limit.field)) is not None]
