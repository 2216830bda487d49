"""What to run and under which limits: the input every layer shares.

A plain dataclass, not a pydantic model: building one must cost nothing on
the CLI's hot path. Validation of user text happens in ``units`` (called by
the CLI and the library) before a RunSpec exists.
"""

import os
from dataclasses import dataclass, field

CGROUP_MODES = ("auto", "enforced", "fallback")
STDIN_MODES = ("null", "inherit")
MANAGERS = ("auto", "user", "system")
UNIT_TYPES = ("scope", "service")


def new_run_id() -> str:
    return os.urandom(6).hex()


@dataclass
class RunSpec:
    argv: list[str]
    wall: float | None = None  # seconds
    grace: float = 2.0
    verify_timeout: float = 2.0
    mem: int | None = None  # bytes
    pids: int | None = None
    max_output: int | None = None  # bytes, stdout + stderr together
    cgroup_mode: str = "auto"
    cgroup_parent: str | None = None
    stdin: str = "null"
    manager: str = "auto"
    unit_type: str = "scope"
    slice: str = "corral.slice"
    env: dict[str, str] | None = None  # None: corral's own environment
    cwd: str | None = None  # None: corral's own working directory
    #: --credential (NAME, absolute PATH) pairs the engine delivers itself: set
    #: by RunGuard for a systemd service (LoadCredential=). For every other
    #: mode it stays empty; RunGuard makes corral's private directory instead
    #: and sets $CREDENTIALS_DIRECTORY in ``env``.
    credentials: list = field(default_factory=list)
    #: The (NAME, absolute PATH) pairs asked for (--credential, the library's
    #: ``credentials=``); RunGuard decides who delivers them.
    credential_requests: list = field(default_factory=list)
    run_id: str = field(default_factory=new_run_id)

    def limits(self) -> dict:
        return {
            "wall": self.wall,
            "grace": self.grace,
            "verify_timeout": self.verify_timeout,
            "mem": self.mem,
            "pids": self.pids,
            "max_output": self.max_output,
        }
