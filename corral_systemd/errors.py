"""Errors that end a run before or instead of its normal course."""


class CorralError(Exception):
    exit_code = 125


class UsageError(CorralError):
    """Bad option or argument: the command was not started (exit 125)."""


class SetupError(CorralError):
    """corral could not set the run up (no manager, no cgroup...): exit 125."""
