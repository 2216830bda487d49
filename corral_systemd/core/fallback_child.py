"""A run without a manager in its own process, for the library.

The fallback engine makes its process the child subreaper and owns every
descendant of it, and the delegated cgroup tier may move its process into
a leaf group — right for the CLI, wrong inside an application that has
children of its own and runs several commands at once. So the library runs
each such run here (the ladder below the manager: ``engines.open_engine``):
``python -m corral_systemd.core.fallback_child SPEC RESULT CANCEL``
(three inherited file descriptors).

Protocol: the spec arrives as JSON on SPEC; the command's stdio is this
process's stdio; the outcome leaves as JSON on RESULT. CANCEL turning
readable stops the run (verified): the parent writes to it to cancel, and
it reaches EOF when the parent dies, so an application that dies leaves no
run behind. Signals that would kill this process stop the run instead.
"""

import _signal  # not signal: the same numbers without enum's start-up cost
import os
import sys

from ..common import jsoncodec
from ..common.plainclass import asdict


def main(spec_fd: int, result_fd: int, cancel_fd: int) -> int:
    from ..common.errors import CorralError
    from ..engines import open_engine
    from .assemble import assemble_and_run
    from .signalwatch import SignalWatch
    from .spec import RunSpec

    # Any signal that would kill us must instead stop the run: an orphaned
    # run is the one outcome we exist to prevent.
    with SignalWatch(extra=(_signal.SIGUSR1, _signal.SIGUSR2, _signal.SIGALRM, _signal.SIGQUIT)) as signals:
        with os.fdopen(spec_fd, "rb") as f:
            fields = jsoncodec.loads(f.read())
        register = fields.pop("register", True)
        skip_manager = fields.pop("skip_manager", False)
        spec = RunSpec(**fields)
        # Registered with this process as owner: `corralctl stop` SIGTERMs it,
        # which stops the run like any corral.
        try:
            outcome = assemble_and_run(
                spec,
                lambda: open_engine(spec, skip_manager=skip_manager),
                guard={"registry": register},
                supervisor={"signals": signals, "cancel_fd": cancel_fd},
            )
        except CorralError as exc:
            _write(result_fd, {"error": str(exc)})
            return 125
    _write(result_fd, asdict(outcome))
    return outcome.exit_code


def _write(fd: int, data: dict) -> None:
    with os.fdopen(fd, "w") as f:
        f.write(jsoncodec.dumps(data))


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
