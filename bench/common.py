"""Shared helpers for bench/compare.py and bench/bench.py.

Survivor scanning reuses tests/procscan.py (environment marker in
/proc/*/environ, or a live thread's /proc/PID/task/*/environ when the main
thread has exited; never names). Processes are only ever killed by pid.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
FAULTS = ROOT / "faults"
RESULTS = BENCH / "results"

sys.path.insert(0, str(ROOT / "tests"))
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker  # noqa: E402,F401


def manifest() -> dict:
    return json.loads((FAULTS / "manifest.json").read_text())


def corral_argv() -> list[str]:
    """corral as installed next to this interpreter (its console script), else -m."""
    script = Path(sys.executable).parent / "corral"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "corral_systemd"]


def timed(argv: list[str]) -> float:
    """Seconds from spawn to reaped of ``argv`` (stdio to /dev/null); its exit status must be 0."""
    start = time.perf_counter()
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{argv}: exit {proc.returncode}: {proc.stderr.decode()[-400:]}")
    return elapsed


def user_manager_reachable() -> bool:
    """Same probe as tests/modes.py: busctl --user Ping of systemd1."""
    if not os.environ.get("DBUS_SESSION_BUS_ADDRESS") and not os.path.exists(
        os.path.join(os.environ.get("XDG_RUNTIME_DIR", "/nonexistent"), "bus")
    ):
        return False
    busctl = shutil.which("busctl")
    if busctl is None:
        return False
    try:
        probe = subprocess.run(
            [
                busctl,
                "--user",
                "call",
                "org.freedesktop.systemd1",
                "/org/freedesktop/systemd1",
                "org.freedesktop.DBus.Peer",
                "Ping",
            ],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def environment_info(env: dict | None = None) -> dict:
    """The machine and the corral measured; ``env``: the environment corral ran with
    (default: this process's), for where its registry was."""
    import platform

    info = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "corral": " ".join(corral_argv()),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "harness_layout": os.environ.get("CORRAL_HARNESS_LAYOUT"),
        "user_manager": user_manager_reachable(),
        "pythondontwritebytecode": os.environ.get("PYTHONDONTWRITEBYTECODE"),
        "state_dir": state_dir_info(os.environ if env is None else env),
    }
    try:
        from corral_systemd import __version__

        info["corral_version"] = __version__
    except Exception:  # pragma: no cover
        pass
    try:
        out = subprocess.run(["systemctl", "--version"], capture_output=True, text=True, timeout=5).stdout
        info["systemd"] = out.splitlines()[0] if out else None
    except Exception:
        info["systemd"] = None
    return info


def state_dir_info(env) -> dict | None:
    """Where corral's registry was (``CORRAL_STATE_DIR``, else its default) and the
    file system under it: each registry write is fsynced, which costs nothing on a
    tmpfs (``/run`` and ``/run/user/UID`` where systemd is PID 1) and a disk's
    flush elsewhere."""
    try:
        from corral_systemd.state.registry import state_dir
    except ImportError:  # pragma: no cover
        return None
    path = os.path.realpath(state_dir(env))
    mount, fs = "", None
    with open("/proc/self/mounts") as f:
        for line in f:
            _, point, kind, *_ = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)  # the table's escapes
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(mount):
                mount, fs = point, kind
    return {"path": path, "fs": fs}


def exit_status(returncode: int) -> int:
    """Popen returncode -> shell-style status (128+N for signal N)."""
    return returncode if returncode >= 0 else 128 - returncode


def start_service(socket_path: str, max_runs: int | None = None, env: dict | None = None) -> subprocess.Popen:
    """The corral service on a private socket (``--max-runs``: how many runs it
    serves at once; its own default when None); SystemExit if it does not start."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "corral_systemd.service",
            "--socket",
            socket_path,
            "--manager",
            "user",
            "--idle-exit",
            "3600",
            *(["--max-runs", str(max_runs)] if max_runs is not None else []),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.monotonic() + 30
    while not os.path.exists(socket_path):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the corral service did not start")
        time.sleep(0.02)
    return proc
