"""A fallback run in its own process, for the library.

The fallback engine makes its process the child subreaper and owns every
descendant of it — right for the CLI, wrong inside an application that has
children of its own and runs several commands at once. So the library runs
each fallback run here: ``python -m corral_systemd._child SPEC_FD RESULT_FD``.

Protocol: the spec arrives as JSON on SPEC_FD; the command's stdio is this
process's stdio; the outcome leaves as JSON on RESULT_FD. SIGTERM/SIGINT
stop the run (verified); so does the death of the parent process (watched
through a pidfd), so an application that dies leaves no run behind.
"""

import json
import os
import sys
from dataclasses import asdict


def main(spec_fd: int, result_fd: int) -> int:
    from .engines.fallback import FallbackEngine
    from .errors import CorralError
    from .spec import RunSpec
    from .supervisor import SignalWatch, Supervisor

    with os.fdopen(spec_fd, "rb") as f:
        spec = RunSpec(**json.load(f))
    parent = os.pidfd_open(os.getppid())
    with SignalWatch() as signals:
        try:
            engine = FallbackEngine(spec)
        except CorralError as exc:
            _write(result_fd, {"error": str(exc)})
            return 125
        outcome = Supervisor(spec, engine, signals=signals, cancel_fd=parent).run()
    _write(result_fd, asdict(outcome))
    return outcome.exit_code


def _write(fd: int, data: dict) -> None:
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
