"""The versioned run record: its schema, as pydantic models.

``record_json.py`` builds the record's data from a run's outcome without
pydantic (the CLI's ``--json``: pydantic costs more to import than the rest
of a run's start-up); ``from_result`` validates that same data into these
models for the library (``RunResult``) and for tests. Environment values are
never part of a record; only names may appear. ``argv`` is redacted as the
run registry redacts it; the exact argv is kept out of the JSON
(``RunRecord.exact_argv``, for the library's caller).
"""

from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, PrivateAttr, model_validator

from ..engines.kinds import GUARANTEES, MODES
from ..kernel.handoff import NAMES
from .record_json import RECORD_VERSION, record_data

HandoffChannel = Literal[NAMES]  # type: ignore[valid-type]  # the channels, declared once (kernel/handoff.py)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Limits(_Strict):
    wall: float | None = None
    grace: float
    verify_timeout: float
    mem: int | None = None
    pids: int | None = None
    max_output: int | None = None
    cpu_time: float | None = None
    cpus: float | None = None


class Steps(_Strict):
    """Seconds since the run started (monotonic clock)."""

    spawned: float | None = None
    command_exited: float | None = None
    deadline: float | None = None
    limit_exceeded: float | None = None
    signal_received: float | None = None
    term_sent: float | None = None
    kill_sent: float | None = None
    verified: float | None = None
    unverified: float | None = None
    finished: float | None = None

    @model_validator(mode="after")
    def _ordered(self):
        # spawned comes first; TERM precedes KILL precedes verification;
        # whatever ended the watch precedes the stop.
        last = self.spawned or 0.0
        for name in ("term_sent", "kill_sent", "verified"):
            value = getattr(self, name)
            if value is not None:
                if value < last:
                    raise ValueError(f"step {name} ({value}) precedes an earlier step ({last})")
                last = value
        for name in ("command_exited", "deadline", "limit_exceeded", "signal_received"):
            value = getattr(self, name)
            if value is not None and self.spawned is not None and value < self.spawned:
                raise ValueError(f"step {name} precedes spawned")
            if value is not None and self.term_sent is not None and value > self.term_sent and name != "command_exited":
                raise ValueError(f"step {name} follows term_sent")
        return self


class EngineInfo(BaseModel):
    """What the engine knows: unit and cgroup facts, resource use."""

    model_config = ConfigDict(extra="allow")
    manager: Literal["user", "system"] | None = None
    unit: str | None = None
    unit_type: Literal["scope", "service"] | None = None
    #: How corral reached the manager: its private socket, or a bus.
    transport: Literal["private", "bus"] | None = None
    invocation_id: str | None = None
    control_group: str | None = None
    unit_result: str | None = None
    #: Resource use, from the run's cgroup (the kernel's own figures, read
    #: while the group exists) or, where it gave none, from the manager:
    #: peak memory (bytes), CPU time (ns), peak tasks, block I/O (bytes).
    memory_peak: int | None = None
    cpu_usage_nsec: int | None = None
    cpu_user_nsec: int | None = None
    cpu_system_nsec: int | None = None
    tasks_peak: int | None = None
    io_read_bytes: int | None = None
    io_write_bytes: int | None = None
    #: How many forks --pids refused (pids.events "max"); 0: no fork was refused.
    pids_limit_hits: int | None = None
    #: Whose figures those are; None when there are none ("procfs": a
    #: fallback run's, from /proc and the children corral reaped).
    #: Whose readings the figures are: the run's cgroup, its manager, the main
    #: process's own (its waiter's getrusage: a floor to the microsecond), or
    #: /proc (the fallback); joined by "+" when several gave the largest.
    accounting_source: (
        Literal[
            "cgroup",
            "manager",
            "rusage",
            "cgroup+manager",
            "cgroup+rusage",
            "manager+rusage",
            "cgroup+manager+rusage",
            "procfs",
        ]
        | None
    ) = None
    #: True: the group's figures were read after its last process ended, so
    #: they are totals. False: the group was removed first (its manager was
    #: quicker) and they are the last sample, lower bounds -- except a CPU
    #: figure the manager kept (``accounting_source`` names "manager").
    #: None: no group (the fallback).
    accounting_final: bool | None = None
    #: How --network none was put in place (None: the host's network):
    #: "userns+netns" (corral's child, a sealed run: ``kernel.seal``),
    #: "PrivateNetwork" (a service; the unit checked it before the command);
    #: "netns" in records of corral before issue 29 (root, no user namespace).
    network: str | None = None
    #: cgroup v2 memory.events counters as last read: max, oom, oom_kill.
    memory_events: dict[str, int] | None = None
    auto_fallback_reason: str | None = None
    #: How often corral connected to the manager again mid-run (a daemon-reexec
    #: closes every private connection); None: never needed.
    reconnected: int | None = None
    #: -p/--property NAME=VALUE as passed to the unit.
    properties: list[str] | None = None


class EnvironmentNames(_Strict):
    """--env-clear/--env-keep/--env-drop: the patterns and the variable names, never values."""

    cleared: bool
    keep: list[str]
    drop: list[str]
    kept: list[str]
    dropped: list[str]


class RunRecord(_Strict):
    version: Literal[1] = RECORD_VERSION
    run_id: str
    mode: Literal[MODES]  # type: ignore[valid-type]  # the engines, declared once (engines/kinds.py)
    #: The guarantee tier the run had, strongest first: "unit" (a systemd
    #: unit), "cgroup" (a child group of a delegated cgroup v2 subtree),
    #: "pidns" (a PID namespace of its own), "subreaper" (corral as child
    #: subreaper); declared once (``engines.kinds.GUARANTEES``).
    guarantee: Literal[GUARANTEES]  # type: ignore[valid-type]
    #: The command line, with secret-looking arguments replaced by "[redacted]"
    #: (as in the registry and ``corralctl ps``).
    argv: list[str]
    #: True when at least one argument of ``argv`` was redacted.
    argv_redacted: bool = False
    cwd: str
    limits: Limits
    limits_enforced: dict[str, Literal["kernel", "watch", "none"]]
    started_at: float
    started_monotonic: float
    ended_at: float
    ended_monotonic: float
    wall_time: float
    outcome: Literal[
        "exited",
        "timeout",
        "memory",
        "output",
        "cpu_time",
        "interrupted",
        "spawn_failed",
        "setup_failed",
        "internal_error",
    ]
    detail: str = ""
    exit_code: int
    command_exit_status: int | None = None
    command_signal: int | None = None
    corral_signal: int | None = None
    steps: Steps
    processes_seen: int
    processes_stopped: int
    remaining_pids: list[int]
    verified: bool
    #: What the proof that every process of the run is gone covers, in the
    #: run's tier: one sentence per tier, declared once
    #: (``engines.kinds.GUARANTEE_PROOFS``), in every record. ``verified``
    #: says whether it held (false: the proof failed, or was never reached).
    proof: str
    output_bytes: int | None = None
    #: --output-limit: at most this many bytes shown, the first and the last
    #: half; ``output_omitted_bytes`` were left out between them (0: none).
    output_limit: int | None = None
    output_omitted_bytes: int | None = None
    #: --output-file: the whole stream, as read.
    output_file: str | None = None
    #: The run this one ran inside (its command's CORRAL_RUN_ID): then auto
    #: mode kept it in that run's cgroup (the fallback engine).
    nested_in: str | None = None
    #: --pty: the command's stdio was a pseudo-terminal of its own.
    pty: bool = False
    #: Which path ran it: "cli" (the corral process), "service" (the corral
    #: service, for a corral client), "library" (a Runner, run()).
    via: str = "cli"
    #: The run registry (``corralctl``'s view of the run): "registered", "off"
    #: (--no-registry), or "unavailable": no private state location could be
    #: had (an arbitrary uid without a runtime directory or a HOME of its
    #: own), so the run ran unregistered and a warning says why.
    registry: Literal["registered", "off", "unavailable"] = "registered"
    engine: EngineInfo
    warnings: list[str] = []
    environment: EnvironmentNames | None = None
    credentials: list[str] = []
    #: Who made $CREDENTIALS_DIRECTORY: "systemd" (a service's LoadCredential=)
    #: or "corral" (its private tmpfs directory); None without --credential.
    credentials_delivery: Literal["systemd", "corral"] | None = None
    #: What the proof covers beyond the process tree. A list: the hand-off
    #: channels the command could reach (``kernel.handoff.NAMES``: "user-manager",
    #: "session-bus", "system-bus", "atd", "tmux", ...), whose work is outside the
    #: run (the summary line says "tree-only" when there is any); "denied": a
    #: sealed run (--handoff deny, --network none), none was reachable; None:
    #: the command never started.
    handoff: list[HandoffChannel] | Literal["denied"] | None = None
    #: Hand-offs corral saw happen (then the run is not verified, 120): the
    #: units a manager moved the run's processes into ("run-u12.scope").
    handed_off: list[str] = []
    _exact_argv: list[str] | None = PrivateAttr(default=None)

    @property
    def exact_argv(self) -> list[str] | None:
        """The command line as given, unredacted; never serialised (not in the
        ``--json`` file, not in ``model_dump``): there for the library's caller,
        who gave it. None for a record read back from JSON."""
        return None if self._exact_argv is None else list(self._exact_argv)


_Record = TypeVar("_Record", bound=RunRecord)


def from_result(result, cls: type[_Record] = RunRecord, **extra) -> _Record:  # type: ignore[assignment]
    """The record of a RunOutcome (``cls``/``extra``: the library's RunResult):
    the data ``--json`` writes, validated."""
    record = cls.model_validate({**extra, **record_data(result)})
    record._exact_argv = [str(arg) for arg in result.argv]
    return record
