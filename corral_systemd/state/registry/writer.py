"""The writer side: a run's registration, its entry and events as the run goes."""

import os
import time

from ...common.redact import redact_argv
from .files import VERSION, EventLog, _canonical, _write_atomic, entry_path, log_path
from .identity import OwnerToken, boot_id, mark_hash, own_starttime, proc_stat
from .paths import ensure_private_dir, ensure_state_dir, valid_run_id
from .retention import maybe_prune

#: How often the observer looks for processes leaving the command's session or group.


# -- the writer side ----------------------------------------------------------
class Registration:
    """A registered run: its entry and its log, written by the owning corral."""

    def __init__(self, directory: str, entry: dict, log: EventLog, token: "OwnerToken | None" = None):
        self.directory = directory
        self.entry = entry
        self.log = log
        #: The owner's sealed token (register() makes one; corralctl's reclaim writes without).
        self.token = token

    @property
    def run_id(self) -> str:
        return self.entry["run_id"]

    def event(self, name: str, data: dict | None = None) -> dict:
        return self.log.append(name, data)

    def save(self, **changes) -> None:
        self.entry.update(changes)
        self.entry["log"] = {"lines": self.log.seq, "head": self.log.head}
        # The token first: a reader who finds the entry finds its owner's
        # token too (else a live run reads "expired" for a moment: seen in CI).
        if self.token is not None:
            self.token.update(self.entry)
        _write_atomic(entry_path(self.directory, self.run_id), _canonical(self.entry) + b"\n")

    def close(self) -> None:
        self.log.close()
        if self.token is not None:
            self.token.close()


def register(
    spec,
    *,
    mode: str,
    unit: str | None = None,
    control_group: str | None = None,
    environment: dict | None = None,
    credentials: list | None = None,
    credentials_directory: str | None = None,
    credentials_delivery: str | None = None,
    helper_pids=(),
    directory: str | None = None,
    owner_kind: str = "corral",
    mark: str | None = None,
    labels: dict | None = None,
) -> Registration:
    """Write the run's entry (state ``active``) and its ``registered`` event.

    Raises OSError when the state directory or the files cannot be written:
    the caller must not start the command then. Once the entry is durable,
    removes a few stale finished runs if it is time to (``maybe_prune``:
    usually one stat(); it never raises).
    """
    directory = ensure_private_dir(directory) if directory else ensure_state_dir()
    run_id = spec.run_id
    if not valid_run_id(run_id):
        raise OSError(f"run id {run_id!r} is not a registry id")
    now, mono = time.time(), time.monotonic()
    entry = {
        "version": VERSION,
        "run_id": run_id,
        "state": "active",
        # kind "corral": the owner is a corral process (SIGTERM makes it stop
        # the run, verified); "library": an application using the Python API,
        # which must never be signalled — its runs are stopped through the unit.
        "owner": {
            "pid": os.getpid(),
            "starttime": own_starttime(),
            "pgid": os.getpgid(0),
            "sid": os.getsid(0),
            "uid": os.geteuid(),
            "boot_id": boot_id(),
            "kind": owner_kind,
        },
        "mode": mode,
        "unit": unit,
        "control_group": control_group,
        "registered_at": now,
        "registered_monotonic": mono,
        "wall": spec.wall,
        "grace": spec.grace,
        "verify_timeout": spec.verify_timeout,
        "deadline_at": None if spec.wall is None else now + spec.wall,
        "deadline_monotonic": None if spec.wall is None else mono + spec.wall,
        "command": redact_argv(spec.argv),
        "cwd": os.path.abspath(spec.cwd or os.getcwd()),
        "environment": environment,
        "credentials": list(credentials or []),
        # "systemd" (a service's LoadCredential=; the manager owns and removes
        # the directory) or "corral" (credentials_directory is corral's own)
        "credentials_delivery": credentials_delivery,
        "credentials_directory": credentials_directory,
        "helper_pids": list(helper_pids),
        # SHA-256 of the CORRAL_RUN_MARK the command got (fallback runs): see carries_mark()
        "mark_sha256": mark_hash(mark) if mark else None,
        # What the caller named the run by (--name; --background's output log):
        # for finding it, never a reason to act on anything.
        **(labels or {}),
    }
    log = EventLog(log_path(directory, run_id), run_id, create=True)
    token = OwnerToken(run_id)
    try:
        reg = Registration(directory, entry, log, token)
        reg.event(
            "registered",
            {
                k: entry[k]
                for k in (
                    "owner",
                    "mode",
                    "unit",
                    "control_group",
                    "wall",
                    "deadline_at",
                    "command",
                    "cwd",
                    "environment",
                    "credentials",
                    "credentials_delivery",
                    *(labels or {}),
                )
            },
        )
        reg.save()
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)  # the new names are durable too
        finally:
            os.close(dfd)
    except BaseException:
        log.close()
        token.close()
        raise
    maybe_prune(directory, now=now)
    return reg


def _status_data(status: int | None) -> dict:
    if status is None:
        return {}
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"exit_status": os.waitstatus_to_exitcode(status)}


class RegistryObserver:
    """Writes a run's steps to the registry, each durably before the supervisor acts.

    A ``RunObserver`` (``supervisor.py``) by duck typing, so importing this
    module does not import the supervisor.
    """

    def __init__(self, registration: Registration):
        self.reg = registration
        self.main_pid: int | None = None

    def event(self, name: str, data: dict) -> None:
        reg = self.reg
        if name == "started":
            self.main_pid = data.get("pid")
            st = proc_stat(self.main_pid) if self.main_pid else None
            reg.event(
                "started",
                {
                    "pid": self.main_pid,
                    "pgid": self.main_pid,
                    "sid": self.main_pid,
                    "starttime": st[4] if st else None,
                    "unit": data.get("unit"),
                    "control_group": data.get("control_group"),
                },
            )
            if data.get("control_group") and not reg.entry.get("control_group"):
                reg.save(control_group=data["control_group"], main_pid=self.main_pid)
            else:
                reg.entry["main_pid"] = self.main_pid  # saved with the next state change
        elif name == "deadline_expired":
            line = reg.event("deadline_expired", {})
            reg.save(state="expired", expired_at=line["time"], expired_monotonic=line["monotonic"])
        elif name == "command_exited":
            reg.event("command_exited", _status_data(data.get("status")))
        elif name == "finished":
            line = reg.event("finished", dict(data))
            reg.save(
                state="finished",
                finished_at=line["time"],
                finished_monotonic=line["monotonic"],
                exit_code=data.get("exit_code"),
                outcome=data.get("outcome"),
                verified=self.verified,
                remaining_pids=self.remaining,
            )
            reg.close()
        else:
            if name == "verified":
                self.verified, self.remaining = True, []
            elif name == "unverified":
                self.verified, self.remaining = False, list(data.get("remaining", []))
            reg.event(name, dict(data))

    verified: bool | None = None
    remaining: list = []
