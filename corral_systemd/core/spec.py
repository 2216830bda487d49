"""What to run and under which limits: the input every layer shares.

A plain class (``common.plainclass``), not a pydantic model: building one must cost nothing on
the CLI's hot path. User text is parsed in ``units`` (called by the CLI and
the library); every value is then range-checked here, once, when the
RunSpec is built (``__post_init__``): a RunSpec that exists is one every
engine can express. Out of range is a ``UsageError`` (exit 125, one line),
before anything starts.

Bounds:
- durations (wall, grace, verify_timeout): finite, 0 to ``MAX_DURATION``
  (100 years): their sum, in microseconds, fits systemd's uint64 timeouts;
- sizes (mem, max_output): 1 byte to ``MAX_SIZE`` (2^63-1, what the kernel
  and systemd take as a byte count; UINT64_MAX would mean "infinity");
- pids: 1 to ``MAX_PIDS`` (4194304, the kernel's PID_MAX_LIMIT: pids.max
  refuses more);
- argv, env, cwd: strings without NUL bytes (exec could not pass them).
"""

import os

from ..common.errors import UsageError
from ..common.limits import LIMITS, MAX_CPUS, MAX_DURATION, MAX_PIDS, MAX_SIZE, TIMINGS
from ..common.plainclass import field, plainclass
from ..common.unit_names import new_run_id
from ..common.units import finite
from ..engines.kinds import GUARANTEES

CGROUP_MODES = ("auto", "enforced", "fallback")
#: --guarantee: "auto" (the strongest tier that can be had here, per
#: --cgroup-mode: ``engines.open_engine``'s ladder) or one tier, forced
#: (``engines.kinds.GUARANTEES``; not to be had: 125, one line).
GUARANTEE_CHOICES = ("auto", *GUARANTEES)
STDIN_MODES = ("null", "inherit")
MANAGERS = ("auto", "user", "system")
UNIT_TYPES = ("scope", "service")
#: --network: "host" (the command shares corral's) or "none" (a namespace of
#: its own with only lo, verified before the command runs).
NETWORKS = ("host", "none")
#: --handoff: "allow" (the command may reach the service managers, buses, atd,
#: a terminal multiplexer's server outside the run: the record lists which) or
#: "deny" (a sealed run: ``kernel.seal``; --network none seals it too).
HANDOFFS = ("allow", "deny")

#: --output-limit keeps a head and a tail: at least one byte of each.
MIN_OUTPUT_LIMIT = 2
_BOUNDS = {"size": f"{MAX_SIZE} bytes (8 EiB)", "count": f"{MAX_PIDS} (the kernel's PID_MAX_LIMIT)"}


@plainclass
class RunSpec:
    """A run as asked for: the command and its limits, checked when made (``validate``)."""

    argv: list[str]
    wall: float | None = None  # seconds
    grace: float = 2.0
    verify_timeout: float = 2.0
    mem: int | None = None  # bytes
    pids: int | None = None
    max_output: int | None = None  # bytes, stdout + stderr together
    cpu_time: float | None = None  # CPU seconds of the whole run
    cpus: float | None = None  # CPU quota, in CPUs
    cgroup_mode: str = "auto"
    guarantee: str = "auto"
    cgroup_parent: str | None = None
    stdin: str | bytes = "null"  # "null", "inherit", "pipe" (library) or the bytes to send
    manager: str = "auto"
    unit_type: str = "scope"
    slice: str = "corral.slice"
    env: dict[str, str] | None = None  # None: corral's own environment
    cwd: str | None = None  # None: corral's own working directory
    #: The umask a command corral forks starts with (None: corral's own).
    #: The corral service sets its client's; a systemd service gets the
    #: manager's UMask= default either way, as without the service.
    umask: int | None = None
    #: --credential (NAME, absolute PATH) pairs the engine delivers itself: set
    #: by RunGuard for a systemd service (LoadCredential=). For every other
    #: mode it stays empty; RunGuard makes corral's private directory instead
    #: and sets $CREDENTIALS_DIRECTORY in ``env``.
    credentials: list = field(default_factory=list)
    #: The (NAME, absolute PATH) pairs asked for (--credential, the library's
    #: ``credentials=``); RunGuard decides who delivers them.
    credential_requests: list = field(default_factory=list)
    run_id: str = field(default_factory=new_run_id)
    #: -p/--property NAME=VALUE: unit properties passed through (see unitprops.py).
    properties: list = field(default_factory=list)
    #: --output-limit: show the first and last half of this many bytes of
    #: stdout+stderr, one marker line between; the run goes on (bytes).
    output_limit: int | None = None
    #: --output-file: the whole stream as well, in the order read (0600; an absolute path).
    output_file: str | None = None
    network: str = "host"
    handoff: str = "allow"
    #: --pty: the command on a pseudo-terminal of its own (core/pty.py).
    pty: bool = False
    #: --session / $CORRAL_SESSION / the library's ``session=``: the session the
    #: run joins, as asked (an id or a name; RunGuard checks it is open).
    session: str | None = None

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Range-check every field (see the module's bounds); UsageError names the first bad one."""
        for name in TIMINGS:
            _check_duration(name, getattr(self, name), optional=False)
        for limit in LIMITS:
            value = getattr(self, limit.field)
            if limit.kind == "duration":
                _check_duration(limit.field, value, optional=True)
            elif limit.kind == "cpus":
                _check_cpus(limit.field, value)
            else:
                _check_int(limit.field, value, int(limit.maximum), _BOUNDS[limit.kind])
        _check_choice("cgroup_mode", self.cgroup_mode, CGROUP_MODES)
        _check_choice("guarantee", self.guarantee, GUARANTEE_CHOICES)
        self.tiers()  # a combination that asks for two things at once
        _check_choice("manager", self.manager, MANAGERS)
        _check_choice("unit_type", self.unit_type, UNIT_TYPES)
        _check_choice("network", self.network, NETWORKS)
        _check_choice("handoff", self.handoff, HANDOFFS)
        if self.session is not None and (not _text(self.session) or not self.session):
            raise UsageError(f"invalid session {self.session!r}")
        if not isinstance(self.pty, bool):
            raise UsageError(f"invalid pty {self.pty!r}: expected True or False")
        if not isinstance(self.stdin, bytes):
            _check_choice("stdin", self.stdin, (*STDIN_MODES, "pipe"))
        if (
            not isinstance(self.slice, str)
            or not self.slice.endswith(".slice")
            or len(self.slice) <= 6
            or "/" in self.slice
            or "\0" in self.slice
        ):
            raise UsageError(f"invalid slice {self.slice!r}: must be a unit name ending in .slice")
        if not isinstance(self.argv, list) or not self.argv or not _text(self.argv[0]):
            raise UsageError("no command given")
        if not all(_text(arg) for arg in self.argv):
            raise UsageError("invalid command: arguments must be strings without NUL bytes")
        if self.env is not None and not all(_text(k) and k and "=" not in k and _text(v) for k, v in self.env.items()):
            raise UsageError(
                "invalid environment: names and values must be strings without NUL bytes (names non-empty, without '=')"
            )
        if self.properties:
            self._check_properties()
        _check_int("output_limit", self.output_limit, MAX_SIZE, _BOUNDS["size"])
        if self.output_limit is not None and self.output_limit < MIN_OUTPUT_LIMIT:
            raise UsageError(
                f"invalid output_limit {self.output_limit}: at least {MIN_OUTPUT_LIMIT} bytes (a head and a tail)"
            )
        if self.output_file is not None and (not _text(self.output_file) or not os.path.isabs(self.output_file)):
            raise UsageError(f"invalid output_file {self.output_file!r}: must be an absolute path without NUL bytes")
        if self.umask is not None and (type(self.umask) is not int or not 0 <= self.umask <= 0o777):
            raise UsageError(f"invalid umask {self.umask!r}: must be 0 to 0o777")
        for name in ("cwd", "cgroup_parent"):
            value = getattr(self, name)
            if value is not None and (not _text(value) or not value):
                raise UsageError(f"invalid {name} {value!r}: must be a path without NUL bytes")

    def _check_properties(self) -> None:
        from ..common.unitprops import parse_property

        if not isinstance(self.properties, list) or not all(_text(p) for p in self.properties):
            raise UsageError("invalid properties: expected NAME=VALUE strings")
        if not self.may_be_systemd:
            raise UsageError(
                "--property needs a systemd unit: not with --cgroup-mode fallback, --cgroup-parent "
                "or a --guarantee other than unit"
            )
        for text in self.properties:
            parse_property(text, self.unit_type)

    @property
    def sealed(self) -> bool:
        """Is no hand-off channel outside the run to be reachable (``kernel.seal``)?
        --handoff deny asks for it; --network none too: the managers' and
        buses' sockets are files, which a network namespace does not cut."""
        return self.handoff == "deny" or self.network == "none"

    @property
    def may_be_systemd(self) -> bool:
        """Can this run be a systemd unit? Never in fallback mode, with
        --cgroup-parent or a --guarantee weaker than "unit"; in auto mode
        only the opened engine knows if it is."""
        return self.cgroup_mode != "fallback" and self.cgroup_parent is None and self.guarantee in ("auto", "unit")

    def tiers(self) -> tuple[str, ...]:
        """The guarantee tiers this run may have, strongest first (``open_engine``
        tries them in order), per --guarantee and --cgroup-mode / --cgroup-parent:

        - --cgroup-parent: "cgroup" (the directory named);
        - --cgroup-mode enforced (``corral-enforced``): "unit", a manager's;
        - --cgroup-mode fallback: no manager; "subreaper" as ever, or the tier
          --guarantee names (cgroup, pidns, subreaper);
        - --cgroup-mode auto: every tier (--guarantee auto), else the one named.

        UsageError for --guarantee naming a tier the mode excludes."""
        guarantee = self.guarantee
        allowed: tuple[str, ...]
        if self.cgroup_parent is not None:
            allowed, mode = ("cgroup",), "--cgroup-parent"
        elif self.cgroup_mode == "enforced":
            allowed, mode = ("unit",), "--cgroup-mode enforced"
        elif self.cgroup_mode == "fallback":
            allowed, mode = GUARANTEES[1:], "--cgroup-mode fallback"
            if guarantee == "auto":
                return ("subreaper",)
        else:
            return GUARANTEES if guarantee == "auto" else (guarantee,)
        if guarantee == "auto":
            return allowed
        if guarantee not in allowed:
            raise UsageError(f"--guarantee {guarantee} cannot be had with {mode} ({', '.join(allowed)} only)")
        return (guarantee,)

    def limits(self) -> dict:
        """The record's ``limits``: every limit (None: not set) and the stop timings."""
        out = {limit.field: getattr(self, limit.field) for limit in LIMITS}
        out.update((name, getattr(self, name)) for name in TIMINGS)
        return out


def _text(value) -> bool:
    return isinstance(value, str) and "\0" not in value


def _check_duration(name: str, value, *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"invalid {name} {value!r}: expected seconds")
    if not finite(value) or value < 0:
        raise UsageError(f"invalid {name} {value!r}: must be a finite number of seconds, not negative")
    if value > MAX_DURATION:
        raise UsageError(f"invalid {name}: {value:g}s is out of range (at most {MAX_DURATION / 3600:.0f}h, 100 years)")


def _check_cpus(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"invalid {name} {value!r}: expected a number of CPUs")
    # systemd's CPUQuota= is whole microseconds per second: below 0.000001 CPU is none.
    if not finite(value) or value < 1e-6 or value > MAX_CPUS:
        raise UsageError(f"invalid {name} {value!r}: expected 0.000001 to {MAX_CPUS:g} CPUs")


def _check_int(name: str, value, maximum: int, shown: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"invalid {name} {value!r}: expected a whole number")
    if value <= 0:
        raise UsageError(f"invalid {name} {value}: must be greater than zero")
    if value > maximum:
        raise UsageError(f"invalid {name} {value}: out of range (at most {shown})")


def _check_choice(name: str, value, choices: tuple) -> None:
    if value not in choices:
        raise UsageError(f"invalid {name} {value!r}: expected {', '.join(choices)}")
