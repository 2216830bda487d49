"""Errors that end a run before or instead of its normal course."""


class CorralError(Exception):
    exit_code = 125


class UsageError(CorralError):
    """Bad option or argument: the command was not started (exit 125)."""


class SetupError(CorralError):
    """corral could not set the run up (no manager, no cgroup...): exit 125."""


class RunError(CorralError):
    """A run that ended in a way the library reports as an exception.

    ``result`` is the run's RunResult (the CLI's record plus output). Limits
    being hit are results, not errors.
    """

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


class ExecFailed(RunError):
    """The command could not be executed."""


class NotFound(ExecFailed):
    exit_code = 127


class CannotExecute(ExecFailed):
    exit_code = 126


class Unverified(RunError):
    """corral could not prove every process of the run stopped (exit 120)."""

    exit_code = 120
