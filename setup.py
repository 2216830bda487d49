"""Build steps pyproject.toml cannot declare: the compiled corral client,
the pidns tier's compiled init, the compiled tether and the library scope's
compiled gate.

``corral`` and ``corral-enforced`` are built from packaging/client/corral.c
when a C compiler is there (``$CC``, else ``cc``), replacing the Python
scripts in bin/ of the same names: the compiled client hands a run to the
corral service without starting an interpreter (about 15 ms of every run).
It finds its way back in-process (no service, or a run the service does not
take) as ``corral-inprocess`` beside itself, which pip installs from bin/.
No compiler, or the build fails: the Python scripts stay, with a note, and
everything works as before, only slower through the service. The wheel is
tagged for the platform (py3-none-linux_*), since it may hold the binary.

The init (packaging/pidns-init/init.c, built by packaging/pidns-init/build)
goes into the package as corral_systemd/libexec/corral-pidns-init, where
engines/pidns.py looks for it, the tether (packaging/tether/tether.c) as
corral_systemd/libexec/corral-tether, where engines/tether.py does, and the
gate (packaging/gate/gate.c) as corral_systemd/libexec/corral-gate, where
engines/libexec.py does; not built, each has its Python twin (a clone or
fork of corral, or an interpreter) as before (CORRAL_NO_COMPILED_CLIENT
skips them too).
"""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 has its own
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover
    try:
        from wheel.bdist_wheel import bdist_wheel  # type: ignore[no-redef]
    except ImportError:  # an older setuptools building no wheel (an sdist): nothing to tag
        bdist_wheel = None  # type: ignore[assignment,misc]

# setuptools provides distutils (its own copy) on every Python it supports.
from distutils.command.build_scripts import build_scripts  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join("packaging", "client", "build")
COMPILED = ("corral", "corral-enforced")


def compile_client(directory: str) -> bool:
    """The client built into ``directory`` as corral and corral-enforced; False (and why on stderr) if not."""
    if os.environ.get("CORRAL_NO_COMPILED_CLIENT"):
        print(
            "corral-systemd: CORRAL_NO_COMPILED_CLIENT: corral and corral-enforced stay Python scripts", file=sys.stderr
        )
        return False
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        print("corral-systemd: no C compiler: corral and corral-enforced stay Python scripts", file=sys.stderr)
        return False
    target = os.path.join(directory, "corral.compiled")
    # packaging/client/build: the one recipe (stage, tests and bench use it too).
    command = ["sh", os.path.join(HERE, BUILD), target, "corral-inprocess"]
    try:
        subprocess.run(command, check=True, timeout=300, env=dict(os.environ, CC=compiler))
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"corral-systemd: the compiled client did not build ({exc}): Python scripts instead", file=sys.stderr)
        return False
    for name in COMPILED:
        shutil.copy2(target, os.path.join(directory, name))
    os.unlink(target)
    return True


class BuildScripts(build_scripts):
    def run(self):
        super().run()
        compile_client(self.build_dir)


#: The programs built into the package's libexec (the name there: its packaging/ directory).
LIBEXEC = {"corral-pidns-init": "pidns-init", "corral-tether": "tether", "corral-gate": "gate"}


def compile_libexec(package_dir: str) -> None:
    """Each of ``LIBEXEC`` built into ``package_dir``/libexec; one that does not
    build is left out (and why on stderr): its Python twin serves instead."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None or os.environ.get("CORRAL_NO_COMPILED_CLIENT"):
        print("corral-systemd: no compiled pidns init, tether or gate: the Python ones serve", file=sys.stderr)
        return
    for name, source in LIBEXEC.items():
        target = os.path.join(package_dir, "libexec", name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        command = ["sh", os.path.join(HERE, "packaging", source, "build"), target]
        try:
            subprocess.run(command, check=True, timeout=300, env=dict(os.environ, CC=compiler))
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"corral-systemd: {name} did not build ({exc}): the Python one serves", file=sys.stderr)


class BuildPy(build_py):
    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):  # an editable install's package is the tree
            compile_libexec(os.path.join(self.build_lib, "corral_systemd"))


cmdclass: dict = {"build_scripts": BuildScripts, "build_py": BuildPy}
if bdist_wheel is not None:

    class BdistWheel(bdist_wheel):
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False  # the compiled client is platform-specific

        def get_tag(self):
            python, abi, platform = super().get_tag()
            return "py3", "none", platform  # any Python 3: the binary does not link libpython

    cmdclass["bdist_wheel"] = BdistWheel

setup(cmdclass=cmdclass)
