"""corral's own process as its caller started it, before it does anything else.

Two things a corral entry point (the CLI, the Python client) puts right
first, so that what the command inherits is what the caller gave:

- **a closed 0, 1 or 2** gets ``/dev/null`` (read-only for 0, write-only
  for 1 and 2), as glibc does for setuid programs. Else the next descriptor
  corral opens takes that number: its signal pipe would become the
  command's stdin, its socket to the service the command's stdout (which
  the command could write calls onto). The command then has ``/dev/null``
  there too, on every path (``packaging/client/corral.c`` does the same);
  and Python's own ``sys.stdin``, ``sys.stdout`` or ``sys.stderr``, None
  for a descriptor closed at its start, is made on it, so that corral's
  own writes there (``--json -``, a message) go to ``/dev/null`` as the
  compiled client's do, never into a traceback;
- **the C locale's coercion**: a Python started with the C or POSIX locale
  sets ``LC_CTYPE=C.UTF-8`` in its own environment (PEP 538), which every
  command it starts would inherit. The caller never set it: it is taken
  out again, unless the environment corral was started with (what exec
  gave it, /proc/self/environ) had it.
"""

import os

#: The values PEP 538 coercion sets LC_CTYPE to.
_COERCED = ("C.UTF-8", "C.utf8", "UTF-8")


def prepare() -> None:
    open_closed_stdio()
    undo_locale_coercion()
    from .prctl import set_dumpable

    set_dumpable(False)  # the command runs as this uid: it must not ptrace or open corral


def open_closed_stdio() -> None:
    import sys

    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if opened != fd:  # a lower one was closed meanwhile: cannot happen in order 0, 1, 2
                os.close(opened)
        if getattr(sys, name) is None:  # closed when the interpreter started
            # As Python's own: stderr never fails on what it cannot encode (an undecodable argv).
            errors = "backslashreplace" if fd == 2 else "surrogateescape"
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", errors=errors, closefd=False))


def fresh_stdio() -> None:
    """``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` made again on 0, 1 and 2,
    as an interpreter's start makes them (its encoding and error handlers;
    line-buffered on a terminal, stderr always), for a forked process whose 0,
    1 and 2 are now others: a background run's corral, or a compiled client's
    front, forked by a session's holder. The former objects never close their
    descriptors (Python's own are ``closefd=False``) and are dropped unflushed
    (``kernel.detach`` flushed them before the fork). Not made: ``-u``'s
    unbuffered streams (``PYTHONUNBUFFERED``: a corral's own lines are whole
    lines either way). OSError for a descriptor no such stream can be made on
    (a directory)."""
    import sys

    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        encoding = getattr(old, "encoding", None) or "utf-8"
        errors = "backslashreplace" if fd == 2 else (getattr(old, "errors", None) or "strict")
        buffering = 1 if fd == 2 or os.isatty(fd) else -1  # 1: by line (text)
        mode = "r" if fd == 0 else "w"
        setattr(sys, name, open(fd, mode, buffering, encoding=encoding, errors=errors, newline="\n", closefd=False))


def undo_locale_coercion() -> None:
    value = os.environ.get("LC_CTYPE")
    if value not in _COERCED:
        return
    try:
        with open("/proc/self/environ", "rb") as f:
            given = f.read().split(b"\0")
    except OSError:
        return  # cannot tell: keep it
    if not any(entry.startswith(b"LC_CTYPE=") for entry in given):
        del os.environ["LC_CTYPE"]
