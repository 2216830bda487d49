"""The ``--json`` run record as corral writes it: plain data, no pydantic.

``record.py`` declares the record (pydantic models: the schema, the
library's ``RunResult``, the checks). Importing pydantic costs more than
the rest of a CLI run's start-up (~0.3 s here, ~3.5 s under emulation), so
the CLI builds the same document from the outcome with this module alone,
and ``record.from_result`` validates that very dict into the model. The
key order and the defaults below follow the models; tests/test_record_json.py
holds them to it (field lists, and every record the test suite reads is
validated against ``RunRecord``).

Environment values are never part of a record; only names may appear.
Arguments that look like secrets are redacted in ``argv`` exactly as the
run registry redacts them (``redact.redact_argv``), and ``argv_redacted``
says whether any was. Written atomically: a temp file in the target's
directory, mode 0600, fsync, rename — a reader sees the old file or the
whole new one.
"""

import os

from ..common import jsoncodec
from ..common.limits import LIMITS, TIMINGS
from ..common.redact import redact_argv
from ..engines.kinds import GUARANTEE_PROOFS

TYPE_CHECKING = False  # typing is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from typing import Final

RECORD_VERSION: "Final" = 1
#: ``Limits``' fields, in order: the wall, the stop timings, then every other
#: limit as limits.py declares them; seconds and CPUs are floats (JSON keeps
#: 5 and 5.0 apart).
LIMIT_FIELDS = ("wall", *TIMINGS, *(limit.field for limit in LIMITS if limit.field != "wall"))
LIMIT_FLOATS = (*TIMINGS, *(limit.field for limit in LIMITS if limit.kind in ("duration", "cpus")))
#: ``Steps``' fields, in order: seconds since the run started.
STEP_FIELDS = (
    "spawned",
    "command_exited",
    "deadline",
    "limit_exceeded",
    "signal_received",
    "term_sent",
    "kill_sent",
    "verified",
    "unverified",
    "finished",
)
#: ``EngineInfo``'s declared fields, in order (an engine may add others after them).
ENGINE_FIELDS = (
    "manager",
    "unit",
    "unit_type",
    "transport",
    "invocation_id",
    "control_group",
    "unit_result",
    "memory_peak",
    "cpu_usage_nsec",
    "cpu_user_nsec",
    "cpu_system_nsec",
    "tasks_peak",
    "io_read_bytes",
    "io_write_bytes",
    "pids_limit_hits",
    "accounting_source",
    "accounting_final",
    "network",
    "memory_events",
    "auto_fallback_reason",
    "reconnected",
    "properties",
)
#: ``EnvironmentNames``' fields, in order: the --env-* patterns and names, never values.
ENVIRONMENT_FIELDS = ("cleared", "keep", "drop", "kept", "dropped")


def _float(value):
    return None if value is None else float(value)


def record_data(result) -> dict:
    """The record of a ``RunOutcome`` as JSON-ready data, keys in the schema's order."""
    exact = [str(arg) for arg in result.argv]
    argv = redact_argv(exact)
    limits = {name: result.limits.get(name) for name in LIMIT_FIELDS}
    for name in LIMIT_FLOATS:
        limits[name] = _float(limits[name])
    limits.update((k, v) for k, v in result.limits.items() if k not in limits)  # the schema refuses them
    engine = {name: result.engine.get(name) for name in ENGINE_FIELDS}
    engine.update((k, v) for k, v in result.engine.items() if k not in engine)
    environment = getattr(result, "environment", None)
    if environment is not None:
        environment = {name: environment.get(name) for name in ENVIRONMENT_FIELDS} | environment
    return {
        "version": RECORD_VERSION,
        "run_id": result.run_id,
        "mode": result.mode,
        "guarantee": result.guarantee,
        "argv": argv,
        "argv_redacted": argv != exact,
        "cwd": result.cwd,
        "limits": limits,
        "limits_enforced": dict(result.limits_enforced),
        "started_at": float(result.started_at),
        "started_monotonic": float(result.started_monotonic),
        "ended_at": float(result.ended_at),
        "ended_monotonic": float(result.ended_monotonic),
        "wall_time": float(result.wall_time),
        "outcome": result.reason,
        "detail": result.detail,
        "exit_code": result.exit_code,
        "command_exit_status": result.command_exit_status,
        "command_signal": result.command_signal,
        "corral_signal": result.corral_signal,
        "steps": {name: _float(result.steps.get(name)) for name in STEP_FIELDS},
        "processes_seen": result.processes_seen,
        "processes_stopped": result.processes_stopped,
        "remaining_pids": list(result.remaining_pids),
        "verified": result.verified,
        "proof": GUARANTEE_PROOFS.get(result.guarantee, ""),
        "output_bytes": result.output_bytes,
        "output_limit": result.output_limit,
        "output_omitted_bytes": result.output_omitted_bytes,
        "output_file": result.output_file,
        "nested_in": result.nested_in,
        "pty": result.pty,
        "via": result.via,
        "registry": getattr(result, "registry", "registered"),
        "engine": engine,
        "warnings": list(result.warnings),
        "environment": environment,
        "credentials": list(getattr(result, "credentials", [])),
        "credentials_delivery": getattr(result, "credentials_delivery", None),
        "handoff": _handoff(getattr(result, "handoff", None)),
        "handed_off": list(getattr(result, "handed_off", [])),
    }


def _handoff(value):
    return list(value) if isinstance(value, (list, tuple)) else value


def record_bytes(result) -> bytes:
    """The record as ``--json`` writes it (indented, UTF-8, one trailing newline)."""
    return jsoncodec.dumps(record_data(result), indent=2, ensure_ascii=False).encode() + b"\n"


def write_record(result, path: str) -> None:
    """Write the record to ``path`` atomically (0600). OSError if ``path`` is
    not a regular file (a directory, a symlink, a device: never replaced)."""
    write_file(record_bytes(result), path)


def write_file(data: bytes, path: str) -> None:
    """``data`` as the file ``path``, atomically (0600); see ``write_record``."""
    if os.path.lexists(path) and not os.path.isfile(path) or os.path.islink(path):
        raise OSError(f"{path} is not a regular file; not replacing it")
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = _new_file(os.path.join(directory, ".corral-record-"))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _new_file(prefix: str) -> tuple[int, str]:
    """A new file ``prefix`` + 12 random hex digits, mode 0600, open for writing,
    as ``tempfile.mkstemp`` makes one (O_EXCL, never through a symlink)
    without importing tempfile (its random and shutil: ~8 ms of a --json run)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        path = prefix + os.urandom(6).hex()
        try:
            return os.open(path, flags, 0o600), path
        except FileExistsError:
            continue  # taken: another name
    raise FileExistsError(f"no free name for {prefix}...")
