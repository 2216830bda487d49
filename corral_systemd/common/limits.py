"""The limits a run can be given, each declared once.

A ``Limit`` names everything about one limit that more than one layer
needs: the ``RunSpec`` field (also its key in the record's ``limits`` and
``limits_enforced``), the CLI option, how its text is parsed, its bounds,
and what reaching it means: the run's outcome (``RunOutcome.reason``),
corral's exit code and the summary line's words. The CLI, the library's
``make_spec``, ``RunSpec`` validation, the supervisor, the exit-code map
and the man-page test all read this table; how each engine enforces a
limit stays with the engine (``limits_enforced``: "kernel", "watch" or
"none").

Light on purpose: the CLI imports it on every start.
"""

from .plainclass import plainclass

MAX_DURATION = 100 * 365 * 24 * 3600.0  # seconds: their sum, in µs, fits systemd's uint64 timeouts
MAX_SIZE = 2**63 - 1  # bytes: what the kernel and systemd take as a count (UINT64_MAX means infinity)
MAX_PIDS = 4194304  # the kernel's PID_MAX_LIMIT: pids.max refuses more
MAX_CPUS = 4096.0  # CPUs' worth of quota: CONFIG_NR_CPUS' largest common value
#: How often the engines read the run's CPU time for --cpu-time (seconds).
CPU_TIME_INTERVAL = 0.1
#: The stop sequence's timings (seconds, always set), recorded beside the limits.
TIMINGS = ("grace", "verify_timeout")


@plainclass(frozen=True)
class Limit:
    """A limit a run may be given (``LIMITS``)."""

    #: RunSpec field; key in the record's ``limits`` and ``limits_enforced``.
    field: str
    #: The CLI option (the library's keyword is ``field``).
    option: str
    #: "duration" (seconds), "size" (bytes), "count" or "cpus" (a fraction of CPUs).
    kind: str
    help: str

    @property
    def metavar(self) -> str:
        return {"duration": "DURATION", "size": "SIZE", "count": "COUNT", "cpus": "CPUS"}[self.kind]

    @property
    def maximum(self) -> float:
        return {"duration": MAX_DURATION, "size": MAX_SIZE, "count": MAX_PIDS, "cpus": MAX_CPUS}[self.kind]

    def parse(self, text: str):
        """The option's text as the RunSpec value (ValueError, naming the option, if malformed)."""
        return coerce(self.kind, text, self.option)

    def coerce(self, value, what: str | None = None):
        """The RunSpec value of ``value`` as given (``coerce``), named ``what`` (default: the option)."""
        return coerce(self.kind, value, what or self.option)

    def show(self, value) -> str:
        """``value`` as the option would take it (``--mem 100M``: "100M")."""
        if self.kind == "duration":
            return f"{value:g}s"
        if self.kind == "size":
            for unit, size in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
                if value >= size and value % size == 0:
                    return f"{value // size}{unit}"
            return str(value)
        return f"{value:g}" if self.kind == "cpus" else str(value)


def coerce(kind: str, value, what: str):
    """A value of ``kind`` ("duration", "size", "count", "cpus") as it was
    given, normalized once: None stays None; text is parsed as the CLI
    parses it (ValueError naming ``what`` if malformed); a number is taken as
    it is (seconds, bytes, a count, CPUs; a duration as float). Anything else
    is passed on for ``RunSpec`` to refuse, with the range checks."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        from . import units

        parse = {
            "duration": units.parse_duration,
            "size": units.parse_size,
            "count": units.parse_count,
            "cpus": units.parse_cpus,
        }[kind]
        return parse(value, what=what)
    if kind in ("duration", "cpus") and isinstance(value, int):
        return float(value)
    return value


def coerce_duration(value, what: str):
    """A stop timing (--grace, --verify-timeout) as given: ``coerce``."""
    return coerce("duration", value, what)


def coerce_size(value, what: str):
    """A size that is not a limit (--output-limit) as given: ``coerce``."""
    return coerce("size", value, what)


@plainclass(frozen=True)
class RunEndingLimit(Limit):
    """A limit whose reaching ends the run (``--pids`` does not: the
    command's forks fail and it goes on)."""

    #: The run's outcome (``RunOutcome.reason``) when the limit ends it.
    reason: str
    exit_code: int
    #: The summary line's words for that outcome.
    reached: str


WALL = RunEndingLimit(
    "wall",
    "--wall",
    "duration",
    "Wall-clock limit (e.g. 30s, 5m); reaching it exits 124. Default: none.",
    reason="timeout",
    exit_code=124,
    reached="wall limit reached",
)
MEM = RunEndingLimit(
    "mem",
    "--mem",
    "size",
    "Memory limit (bytes, K/M/G); exceeding it exits 121.",
    reason="memory",
    exit_code=121,
    reached="memory limit exceeded",
)
PIDS = Limit("pids", "--pids", "count", "Process/thread count limit (kernel-enforced modes only).")
MAX_OUTPUT = RunEndingLimit(
    "max_output",
    "--max-output",
    "size",
    "Cap on stdout+stderr bytes together; exceeding it exits 122.",
    reason="output",
    exit_code=122,
    reached="output limit exceeded",
)

CPU_TIME = RunEndingLimit(
    "cpu_time",
    "--cpu-time",
    "duration",
    "CPU time of the whole run (every process, reaped ones included); reaching it exits 123. Default: none.",
    reason="cpu_time",
    exit_code=123,
    reached="CPU time limit reached",
)
CPUS = Limit(
    "cpus",
    "--cpus",
    "cpus",
    "CPU quota in CPUs, fractional (e.g. 0.5); kernel-enforced modes only. Default: none.",
)

#: Every limit, in the order options and record fields are shown.
LIMITS: tuple[Limit, ...] = (WALL, MEM, PIDS, MAX_OUTPUT, CPU_TIME, CPUS)
BY_FIELD: dict[str, Limit] = {limit.field: limit for limit in LIMITS}
#: The limits that end a run, by field and by the outcome they give it.
ENDS_RUN: dict[str, RunEndingLimit] = {lim.field: lim for lim in LIMITS if isinstance(lim, RunEndingLimit)}
BY_REASON: dict[str, RunEndingLimit] = {lim.reason: lim for lim in ENDS_RUN.values()}
