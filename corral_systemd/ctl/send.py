"""``corralctl send RUN [TEXT] [--file F] [--eof]``: type into a run's kept stdin.

The run is one whose corral keeps its stdin (``--stdin keep``, or ``--pty``, in
a ``--background`` or ``--yield`` run: ``core.stdin_keeper``). The bytes go to
the pipe itself (a copy of its write end, lent by the run's corral -- the
process the kernel names as the run's token holder -- and closed after);
``--eof`` then closes the kept end, so the command reads end of file.

What is sent: TEXT exactly (``--line`` adds a newline), or the file's bytes
(``--file F``; ``-`` for stdin), or, with neither, this process's stdin to its
end (unless only ``--eof`` is asked).

Exit codes: 0 all written; 125 bad input (an unknown run, one that keeps no
stdin or has ended, its stdin closed, TEXT and --file together); 124 the
command did not read it all within ``--timeout`` (the count written is said).
"""

import sys

from .status import CtlError

#: Exit code when the command did not take every byte within --timeout (as ``wait``'s 124).
NOT_READ = 124


def send(
    run: str,
    text: str | None,
    file: str | None = None,
    eof: bool = False,
    line: bool = False,
    timeout: float | None = 30.0,
    directory: str | None = None,
) -> int:
    from ..core import stdin_keeper as K
    from ..state import registry as REG
    from .logs import find_run

    if text is not None and file is not None:
        raise CtlError("give TEXT or --file, not both")
    directory = directory or REG.state_dir()
    run_id = find_run(run, directory)["run_id"]
    data = _data(text, file, eof, line)
    try:
        written = K.send(run_id, data, eof, timeout)
    except BrokenPipeError:
        raise CtlError(f"{run_id}: nothing reads its stdin any more (the command closed it or ended)") from None
    except K.NotKept as exc:
        raise CtlError(str(exc)) from None
    if written < len(data):
        shown = "" if timeout is None else f" within {timeout:g}s"
        print(f"corralctl: {run_id}: the command read {written} of {len(data)} bytes{shown}", file=sys.stderr)
        return NOT_READ
    return 0


def _data(text: str | None, file: str | None, eof: bool, line: bool) -> bytes:
    if text is not None:
        data = text.encode()
    elif file is not None:
        try:
            if file == "-":
                data = sys.stdin.buffer.read()
            else:
                with open(file, "rb") as f:
                    data = f.read()
        except OSError as exc:
            raise CtlError(f"--file {file!r}: {exc.strerror or exc}") from None
    elif eof and not line:
        data = b""
    else:
        data = sys.stdin.buffer.read()
    return data + b"\n" if line else data
