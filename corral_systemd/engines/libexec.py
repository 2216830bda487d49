"""The package's compiled helpers (corral_systemd/libexec): where each sits, and whether it serves.

A helper (the pidns tier's init, the tether) is a small C program that
setup.py (pip, and so the .deb's venv) and packaging/stage build from
packaging/<helper>/ into the package, beside its modules: a path the package
computes, never one looked up on $PATH. Each has a Python twin that serves
where it was not built (no C compiler at install) or where its knob asks for
it (the tests run both).
"""

import os

from ..common.errors import SetupError

#: The package's libexec directory.
LIBEXEC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "libexec")


def libexec_path(name: str) -> str:
    return os.path.join(LIBEXEC, name)


def compiled_helper(path: str, knob: str, what: str) -> str | None:
    """``path`` where the helper there is built and ``$knob`` is unset or ``c``;
    None (its Python twin serves) where it is not built or ``$knob=python``.
    SetupError (one line, naming the knob): ``$knob`` is neither, or ``c``
    where the helper was not built."""
    choice = os.environ.get(knob, "")
    if choice not in ("", "c", "python"):
        raise SetupError(f"{knob}={choice!r}: 'c' or 'python'")
    built = os.access(path, os.X_OK)
    if choice == "c" and not built:
        raise SetupError(f"{knob}=c: no {what} at {path} (not built)")
    if choice == "python" or not built:
        return None
    return path


#: corral-gate (packaging/gate/gate.c): a library Runner's scope command, held at its gate.
GATE_PROGRAM = libexec_path("corral-gate")


def gate_program() -> list[str]:
    """corral-gate's argv for ``kernel.spawn.spawn_held``: the compiled one, or
    its Python twin (``kernel.gate.held_on_fd3``) where it was not built or
    with ``CORRAL_GATE=python`` (the tests run both; ``=c`` insists on the
    compiled one: SetupError where it is not)."""
    program = compiled_helper(GATE_PROGRAM, "CORRAL_GATE", "compiled gate")
    if program is not None:
        return [program]
    import sys

    # This package, without site or the caller's environment (-I -S): the twin loads only its own modules.
    root = os.path.dirname(os.path.dirname(LIBEXEC))
    twin = f"import sys; sys.path.insert(0, {root!r}); from corral_systemd.kernel.gate import held_on_fd3"
    return [sys.executable, "-I", "-S", "-c", twin + "; held_on_fd3()"]
