"""The outcome of a run, and how it maps to corral's exit code.

``RunOutcome`` is a plain object filled in by the supervisor; the pydantic
record (``record.py``) is built from it only when someone asks for JSON.
"""

from ..common.limits import BY_REASON, ENDS_RUN, MAX_OUTPUT, MEM, WALL
from ..common.plainclass import field, plainclass

# Why the run ended, in the order the supervisor may decide it.
EXITED = "exited"  # the command's main process exited (or died of a signal) on its own
# A limit ended it (see limits.py): --wall, --mem, --max-output.
TIMEOUT = WALL.reason
MEMORY = MEM.reason
OUTPUT = MAX_OUTPUT.reason
INTERRUPTED = "interrupted"  # corral received SIGINT/SIGTERM/SIGHUP
SPAWN_FAILED = "spawn_failed"  # the command could not be executed (126/127)
SETUP_FAILED = "setup_failed"  # corral could not set the run up (125)
INTERNAL_ERROR = "internal_error"  # corral failed mid-run; never verified, so 120
#: The command never ran: its one line is printed even with --quiet (which drops a run's summary).
NEVER_RAN = (SPAWN_FAILED, SETUP_FAILED)


@plainclass
class RunOutcome:
    """What became of a run: the record's facts (``record_json``), its exit code and summary."""

    run_id: str
    mode: str
    #: The guarantee tier the run had (``engines.kinds.GUARANTEES``).
    guarantee: str
    argv: list[str]
    cwd: str
    limits: dict
    limits_enforced: dict = field(default_factory=dict)
    started_at: float = 0.0  # wall clock, seconds since the epoch
    started_monotonic: float = 0.0
    ended_at: float = 0.0
    ended_monotonic: float = 0.0
    reason: str = EXITED
    detail: str = ""  # human explanation (e.g. the setup error)
    exit_code: int = 0
    command_exit_status: int | None = None
    command_signal: int | None = None
    corral_signal: int | None = None  # signal corral itself received
    steps: dict = field(default_factory=dict)  # step -> seconds since start
    processes_seen: int = 0
    processes_stopped: int = 0
    remaining_pids: list[int] = field(default_factory=list)
    verified: bool = False
    output_bytes: int | None = None  # counted only when output passes through corral
    #: --output-limit (bytes shown at most: head and tail) and what it left
    #: out of the middle (None: no --output-limit); --output-file's path.
    output_limit: int | None = None
    output_omitted_bytes: int | None = None
    output_file: str | None = None
    #: The corral run this one ran inside (``common.nesting``), or None.
    nested_in: str | None = None
    #: --pty: the command ran on a pseudo-terminal of its own.
    pty: bool = False
    #: Which path ran it: "cli" (the corral process itself), "service" (the
    #: corral service, for a client), "library" (a Runner or run()).
    via: str = "cli"
    engine: dict = field(default_factory=dict)  # unit, cgroup, resources...
    warnings: list[str] = field(default_factory=list)
    observer_error: str | None = None  # the observer (the registry) failed: see supervisor.RunObserver
    #: "registered", "off" (--no-registry) or "unavailable" (no private state location: a warning says why).
    registry: str = "registered"
    environment: dict | None = None  # --env-*: names kept and dropped, never values
    credentials: list[str] = field(default_factory=list)  # --credential names, never contents
    credentials_delivery: str | None = None  # who made $CREDENTIALS_DIRECTORY: "systemd" or "corral"
    #: The hand-off channels the command could reach (``kernel.handoff``: names)
    #: or "denied" (a sealed run); None: the command never started.
    handoff: list[str] | str | None = None
    #: Hand-offs corral saw happen: the units its processes were moved into.
    handed_off: list[str] = field(default_factory=list)

    @property
    def wall_time(self) -> float:
        return self.ended_monotonic - self.started_monotonic


#: ``--yield``: the run outlived the yield and was handed back, still running (``core.handback``).
HANDED_BACK = 119


def exit_codes() -> list[tuple[str, str]]:
    """corral's exit codes and what each means, as ``exit_code_for`` gives them
    (``--help``'s list; README and the man page say the same)."""
    limits = sorted(ENDS_RUN.values(), key=lambda lim: lim.exit_code)
    return [
        ("N", "the command's own exit status (it ended on its own; leftovers were still stopped)"),
        ("128+N", "signal N ended the command, or corral got signal N and stopped the run"),
        *((str(lim.exit_code), f"{lim.option} reached") for lim in limits),
        ("125", "bad option or setup failure: the command was not started"),
        ("126/127", "the command cannot be executed / was not found"),
        (str(HANDED_BACK), "--yield: the run outlived the yield and was handed back, still running"),
        ("120", "corral could not prove every process stopped (overrides every other code)"),
    ]


def exit_code_for(result: RunOutcome, spawn_exit: int | None = None) -> int:
    """corral's exit code. 120 (unproven stop) overrides everything."""
    if (
        result.remaining_pids
        or result.reason == INTERNAL_ERROR
        or (not result.verified and result.reason not in (SETUP_FAILED, SPAWN_FAILED))
    ):
        return 120
    if result.reason == SETUP_FAILED:
        return 125
    if result.reason == SPAWN_FAILED:
        return spawn_exit if spawn_exit is not None else 127
    if result.reason == INTERRUPTED:
        return 128 + (result.corral_signal or 0)
    if (limit := BY_REASON.get(result.reason)) is not None:
        return limit.exit_code
    if result.command_signal is not None:
        return 128 + result.command_signal
    return result.command_exit_status or 0


def usage_summary(result: RunOutcome) -> str:
    """The run's resource use for the summary line ("peak 65.0 MiB, cpu 0.41 s");
    "" if none is known or the command never ran."""
    engine = result.engine
    if result.reason in (SPAWN_FAILED, SETUP_FAILED):
        return ""
    # A group removed before its final reading left lower bounds ("at
    # least"), except a CPU total the manager kept.
    sampled = engine.get("accounting_final") is False
    source = engine.get("accounting_source") or ""
    cpu_sampled = sampled and "manager" not in source and "rusage" not in source
    parts = []
    if engine.get("memory_peak") is not None:
        parts.append(f"peak {'>=' if sampled else ''}{engine['memory_peak'] / 2**20:.1f} MiB")
    if engine.get("cpu_usage_nsec") is not None:
        parts.append(f"cpu {'>=' if cpu_sampled else ''}{engine['cpu_usage_nsec'] / 1e9:.2f} s")
    return ", ".join(parts)


def reason_line(result: RunOutcome) -> str | None:
    """Why the command could not be executed (126, 127), on a line of its own
    that comes first, before the warnings and the summary line (which says it
    too, among everything else); None for a command that ran."""
    if result.reason != SPAWN_FAILED:
        return None
    return f"corral: cannot run {result.detail}"


def summary_line(result: RunOutcome) -> str:
    """The one line corral prints on stderr after a run (the service's reply carries it too)."""
    from ..common.units import format_duration

    mode = result.mode
    unit = result.engine.get("unit")
    if unit:
        mode = f"{mode} {unit}"
    if result.reason == EXITED:
        if result.command_signal is not None:
            what = f"command killed by signal {result.command_signal}"
        else:
            what = f"command exited {result.command_exit_status}"
    elif (limit := BY_REASON.get(result.reason)) is not None:
        what = limit.reached
    else:
        what = {
            INTERRUPTED: f"interrupted by signal {result.corral_signal}",
            SPAWN_FAILED: result.detail,
            SETUP_FAILED: result.detail,
            # 120 without its reason tells the user nothing to act on.
            INTERNAL_ERROR: f"corral lost track of the run: {result.detail}",
        }.get(result.reason, result.reason)
    line = (
        f"corral: {mode}: {what}; exit {result.exit_code}; {format_duration(result.wall_time)}; "
        f"{result.processes_stopped} process{'es' if result.processes_stopped != 1 else ''} stopped"
    )
    if usage := usage_summary(result):
        line += f"; {usage}"
    if result.output_omitted_bytes:
        line += f"; {result.output_omitted_bytes} bytes of output left out"
        if result.output_file:
            line += f" (all in {result.output_file})"
    if reason := result.engine.get("auto_fallback_reason"):
        # --cgroup-mode auto found no manager to use: say why, once (the record
        # has it too), so a run without systemd is never silently unconfined by one.
        line += f"; auto mode fell back: {reason}"
    if isinstance(result.handoff, list) and result.handoff:
        # The proof covers the process tree: what it asked others to start is
        # not in it (the record's ``handoff`` lists whom it could have asked).
        line += "; tree-only"
    if result.remaining_pids:
        line += f"; NOT VERIFIED, still present: {' '.join(map(str, result.remaining_pids))}"
    return f"{line}; guarantee {result.guarantee}"
