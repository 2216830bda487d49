import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

# Runs register in a state directory; keep the suite's out of the machine's.
# The process that makes it (the controller, or a worker run alone) removes
# it when its session ends (pytest_sessionfinish).
_OWN_STATE_DIR = None
if not os.environ.get("CORRAL_STATE_DIR"):
    _OWN_STATE_DIR = os.environ["CORRAL_STATE_DIR"] = tempfile.mkdtemp(prefix="corral-test-state-")
# A corral the suite runs uses a corral service already there, and never starts
# one as a transient unit of the harness's manager (service/transient.py):
# that service would take the runs of every test after it. The tests of that
# path ask for it (tests/test_service_transient.py, run alone).
os.environ.setdefault("CORRAL_SERVICE", "installed")


def pytest_sessionfinish(session, exitstatus):
    """Remove the state directory this process made (xdist workers share the controller's)."""
    if _OWN_STATE_DIR is not None and os.environ.get("CORRAL_STATE_DIR") == _OWN_STATE_DIR:
        import shutil

        shutil.rmtree(_OWN_STATE_DIR, ignore_errors=True)


ROOT = Path(__file__).resolve().parent.parent

#: The compiled programs an editable install built from this tree (setup.py), by their
#: packaging/ recipe, as (the built file, the recipe's directory, the recipe's arguments
#: after the output).
_BUILT_FROM_TREE = (
    (Path(sys.executable).parent / "corral", "client", ["corral-inprocess"]),
    (Path(sys.executable).parent / "corral-enforced", "client", ["corral-inprocess"]),
    (ROOT / "corral_systemd" / "libexec" / "corral-pidns-init", "pidns-init", []),
    (ROOT / "corral_systemd" / "libexec" / "corral-tether", "tether", []),
    (ROOT / "corral_systemd" / "libexec" / "corral-gate", "gate", []),
)


def pytest_configure(config):
    """Once per run (not in xdist's workers): the compiled programs of an editable
    install of this tree, built when it was installed, are built again where their
    sources changed since, so the suite never tests a client or init older than
    the code beside it (a clean clone's install is newer than its sources: nothing
    to do). Where no compiler is found, or the package is not this tree's, as is."""
    import corral_systemd

    if hasattr(config, "workerinput") or Path(corral_systemd.__file__).resolve().parent != ROOT / "corral_systemd":
        return
    import shutil

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return
    for built, recipe, arguments in _BUILT_FROM_TREE:
        if not built.exists() or built.read_bytes()[:4] != b"\x7fELF":
            continue
        sources = [*(ROOT / "packaging" / recipe).iterdir(), ROOT / "corral_systemd" / "common" / "version.py"]
        if built.stat().st_mtime >= max(source.stat().st_mtime for source in sources):
            continue
        fresh = built.with_name(built.name + ".rebuilt")
        subprocess.run(
            ["sh", str(ROOT / "packaging" / recipe / "build"), str(fresh), *arguments],
            env=dict(os.environ, CC=compiler),
            check=True,
            timeout=300,
        )
        os.replace(fresh, built)
        print(f"conftest: {built} was older than packaging/{recipe}: built again", file=sys.stderr)


FAULTS = ROOT / "faults"
MANIFEST = json.loads((FAULTS / "manifest.json").read_text())
CORRAL = [sys.executable, "-m", "corral_systemd"]
# How many times each fault runs per mode (CI sets 5).
REPEAT = int(os.environ.get("CORRAL_TEST_REPEAT", "2"))
#: How much slower than a real machine this one runs (the VM lane under
#: emulation sets 3): fault walls and the bounds on corral's own step timings
#: are scaled by it, so a program still starting up at its deadline (a Python
#: fault under emulation can take seconds) is not mistaken for a wrong result.
TIME_SCALE = float(os.environ.get("CORRAL_TEST_TIME_SCALE", "1"))


@pytest.fixture
def marker():
    """A fresh run marker; whatever carries it is killed afterwards."""
    m = new_marker()
    yield m
    kill_marked(m)


def marker_env(marker: str) -> dict:
    """This process's environment plus the run marker."""
    return dict(os.environ, **{MARKER_ENV: marker})


class Run:
    def __init__(self, proc, elapsed, marker, record):
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.elapsed = elapsed
        self.marker = marker
        self.record = record
        # Survivors are counted right after corral returned, before cleanup.
        self.survivors = marked_pids(marker)


@pytest.fixture
def corral(tmp_path):
    """Run corral with a fresh marker; returns a Run; kills survivors after."""
    markers = []

    def run(args, *, env=None, timeout=60, input=None, record=True, check_stdin=True, program=None):
        """``program``: the argv that is corral (default: this interpreter's ``-m corral_systemd``)."""
        marker = new_marker()
        markers.append(marker)
        full_env = dict(os.environ if env is None else env)
        full_env[MARKER_ENV] = marker
        json_path = tmp_path / f"record-{marker}.json"
        argv = list(program or CORRAL)
        if record:
            argv += ["--json", str(json_path)]
        argv += scale_walls(args)
        start = time.monotonic()
        proc = subprocess.run(
            argv,
            env=full_env,
            capture_output=True,
            timeout=timeout,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        elapsed = time.monotonic() - start
        data = json.loads(json_path.read_text()) if record and json_path.exists() else None
        if data is not None:
            # Every record the suite reads is the schema's (corral writes it without pydantic).
            from corral_systemd.core.record import RunRecord

            RunRecord.model_validate(data)
        return Run(proc, elapsed, marker, data)

    yield run
    for marker in markers:
        kill_marked(marker)


def fault_cases():
    cases = []
    for fault in MANIFEST["faults"]:
        variants = [(fault["args"], fault["expected_exit"])]
        for variant in fault.get("variants", []):
            pair = (variant["args"], variant["expected_exit"])
            if pair not in variants:
                variants.append(pair)
        for args, expected in variants:
            label = fault["id"] + ("-" + "-".join(f"{k}{v}" for k, v in args.items()))
            cases.append(pytest.param(fault, args, expected, id=label))
    return cases


def _scaled(duration: str) -> str:
    for suffix, factor in (("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)):
        if duration.endswith(suffix) and duration[: -len(suffix)].replace(".", "", 1).isdigit():
            return f"{float(duration[: -len(suffix)]) * factor * TIME_SCALE:g}s"
    return duration


def scale_walls(args: list) -> list:
    """corral's arguments with every ``--wall`` value multiplied by TIME_SCALE
    (up to the ``--`` that starts the command)."""
    if TIME_SCALE == 1:
        return list(args)
    out, i = [], 0
    args = list(args)
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return out + args[i:]
        if arg == "--wall" and i + 1 < len(args):
            out += [arg, _scaled(str(args[i + 1]))]
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def fault_argv(fault, args):
    """corral's options for a fault case, as the manifest gives them (the
    ``corral`` fixture scales ``--wall`` by TIME_SCALE, once)."""
    out = []
    for key, value in args.items():
        out += [f"--{key.replace('_', '-')}", str(value)]
    return out + ["--", str(FAULTS / fault["file"])]


def requires_met(fault) -> bool:
    from shutil import which

    return all(which(tool) for tool in fault.get("requires", []))
