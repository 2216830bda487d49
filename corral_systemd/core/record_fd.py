"""``--json-fd N``: the run record on a descriptor the caller passed, apart from the command's output.

bwrap's ``--json-status-fd FD`` is the precedent: the caller opens N (a pipe's
write end, a file, a socket), corral writes the record there once the run is
over (the same bytes as ``--json PATH`` holds, nothing else) and never closes
it: the caller's reader sees end of file once corral and every other holder
are gone. ``--json /dev/fd/N`` is refused with a pointer here: opening it would
be a new open of the file behind N (none for a socket), and the command would
still inherit N.

The command never has N:

- in-process, ``keep_from_command`` marks it close-on-exec before anything
  starts (the command inherits corral's other descriptors 3 and up);
- a served run's command is the client's held child (``kernel.gate``), which
  closes it: the client finds N in its argv (``named_in``, and its twin in
  packaging/client/corral.c), passes the descriptor with the call and writes
  the record itself; the service checks that descriptor (``check``) and that
  it is the one the command line names (``service.requests.parse``).

Failure modes: ``number`` and ``check`` raise UsageError (exit 125, before
anything runs): not a number, below 3 (0, 1 and 2 are the command's stdio),
not an open descriptor, not open for writing. ``write`` raises OSError (the
reader gone: EPIPE); the face then says it could not write the record and
keeps the run's exit code, as for ``--json PATH``.

Imports ``os`` only at module level: ``named_in`` is on the Python client's hot path.
"""

import os

OPTION = "--json-fd"
#: 0, 1 and 2 are the command's standard streams.
LOWEST = 3
#: Above any descriptor a process can hold (RLIMIT_NOFILE's ceiling, fs.nr_open, is 2**30).
_HIGHEST = 1 << 30


def _parsed(text: str) -> int | None:
    """N when ``text`` is a descriptor number as corral takes it (ASCII digits, 3 or more); else None."""
    if not text.isascii() or not text.isdigit() or len(text) > 10:
        return None
    value = int(text)
    return value if LOWEST <= value <= _HIGHEST else None


def number(text: str) -> int:
    """``--json-fd``'s value as a descriptor number; UsageError if it is not one corral takes."""
    value = _parsed(text)
    if value is None:
        from ..common.errors import UsageError

        raise UsageError(
            f"invalid {OPTION} {text!r}: a descriptor number, 3 or more "
            "(0, 1 and 2 are the command's; for standard output use --json -)"
        )
    return value


def named_in(args: list[str]) -> int | None:
    """The descriptor a command line names with ``--json-fd`` (its last one
    before ``--``), for a client that passes it to the service; None if none.

    Not the parser: it also reads arguments of the command when no ``--``
    ends the options, so the service compares this with what it parsed
    (a mismatch is not served: the client runs the line itself)."""
    found = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == OPTION and i + 1 < len(args):
            found = _parsed(args[i + 1])
        elif arg.startswith(OPTION + "="):
            found = _parsed(arg[len(OPTION) + 1 :])
    return found


def check(fd: int, shown: int | None = None) -> None:
    """UsageError unless ``fd`` is open for writing. ``shown``: the number the
    caller gave (the service checks its own copy of the client's descriptor)."""
    import fcntl

    from ..common.errors import UsageError

    name = f"{OPTION} {fd if shown is None else shown}"
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        raise UsageError(f"{name}: not an open descriptor") from None
    if flags & getattr(os, "O_PATH", 0) or flags & os.O_ACCMODE == os.O_RDONLY:
        raise UsageError(f"{name}: not open for writing")


def keep_from_command(fd: int) -> None:
    """``fd`` closed at every exec from here: the command (and any helper corral execs) never has it."""
    os.set_inheritable(fd, False)


def write(data: bytes, fd: int) -> None:
    """All of ``data`` to ``fd``, waiting while it is full even if the caller made
    it non-blocking; OSError if it cannot take it (EPIPE: nobody reads)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except InterruptedError:
            continue
        except BlockingIOError:
            import select

            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            poller.poll()
