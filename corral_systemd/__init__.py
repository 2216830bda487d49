"""corral-systemd: run a command under limits; when it returns, everything
the command started is gone — proven, or exit 120.

This module stays import-light: the CLI imports it on every run.
"""

from .common.version import __version__ as __version__

# The library API loads on first use (PEP 562), so the CLI's start-up does
# not pay for asyncio and pydantic.
_API = {"run", "arun", "start", "Runner", "RunHandle", "RunResult", "make_spec"}
_ERRORS = {
    "CorralError",
    "UsageError",
    "SetupError",
    "RunError",
    "ExecFailed",
    "NotFound",
    "CannotExecute",
    "Unverified",
}
_SESSION = {"Session", "BackgroundRun"}
__all__ = sorted(_API | _ERRORS | _SESSION | {"__version__"})


def __getattr__(name):
    if name in _API:
        from . import api

        return getattr(api, name)
    if name in _SESSION:
        from . import session

        return getattr(session, name)
    if name in _ERRORS:
        from .common import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'corral_systemd' has no attribute {name!r}")
