"""Both tether programs for the tests that exercise a tether (``CORRAL_TETHER``),
and the build of the package's compiled helpers for the tests (``build_program``,
``build_gate``).

``tether_kind`` (a fixture; import it into a test module) runs the test once
with the compiled tether (packaging/tether/tether.c, built into the package as
setup.py does for an install: an editable one's tree has none until then) and
once with the Python one, the fallback where it was not built.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The compiled tether, where the package finds it (``engines.tether.TETHER_PROGRAM``).
TETHER_PROGRAM = ROOT / "corral_systemd" / "libexec" / "corral-tether"
TETHER_SOURCE = ROOT / "packaging" / "tether"
#: The compiled gate of a library scope (``engines.libexec.GATE_PROGRAM``), and what it is built of.
GATE_PROGRAM = ROOT / "corral_systemd" / "libexec" / "corral-gate"
GATE_SOURCES = (ROOT / "packaging" / "gate" / "gate.c", ROOT / "packaging" / "client" / "held.c")


def build_program(program: Path, source: Path, also: tuple[Path, ...] = ()) -> None:
    """``source``'s directory's build recipe (packaging/<helper>/build) into
    ``program`` in the package, rebuilt when stale (older than ``source`` or
    what it includes, ``also``; skip: no C compiler)."""
    newest = max(path.stat().st_mtime for path in (source, *also))
    if not program.exists() or program.stat().st_mtime < newest:
        if shutil.which(os.environ.get("CC", "cc")) is None:
            pytest.skip(f"no C compiler: {program.name} cannot be built")
        built = program.with_name(f".{program.name}.{os.getpid()}")
        subprocess.run(["sh", str(source.parent / "build"), str(built)], check=True)
        os.replace(built, program)  # atomic: a run beside never execs half a file


@pytest.fixture(params=["c", "python"])
def tether_kind(request, monkeypatch):
    """The test with either tether program (``CORRAL_TETHER``, in this
    process's environment: every corral the test starts inherits it)."""
    if request.param == "c":
        build_program(TETHER_PROGRAM, TETHER_SOURCE / "tether.c")
    monkeypatch.setenv("CORRAL_TETHER", request.param)
    return request.param


def build_gate() -> None:
    """packaging/gate/build into the package (``CORRAL_GATE=c``), rebuilt when stale."""
    build_program(GATE_PROGRAM, GATE_SOURCES[0], also=GATE_SOURCES[1:])
