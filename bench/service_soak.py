"""The corral service over many runs: its RSS, descriptors and threads stay flat (issue 16).

Starts a service on a private socket (``--socket``) and hands it ``--runs``
runs of ``/bin/true`` (default 10,000), scope and service alternating, from
this process through the client's own call (``client.run_via_service``: no
interpreter start per run, so the soak takes minutes, not hours). Every
``--every`` runs it samples the service from /proc: VmRSS, open
descriptors, threads. Also in the mix, every 50th run: a run that fails to
parse (UsageError), one stopped by a signal byte, and a connection that
sends garbage, so error paths are soaked too.

Reports the first and last samples, the maximum, and the growth per 1,000
runs past the first 1,000 (the warm-up: caches, the first session). Needs a
user manager (run inside tests/harness/with-user-manager on a machine
without one). Writes bench/results/service_soak.json.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def sample(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    return {
        "rss_kib": int(status["VmRSS"].split()[0]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(status["Threads"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    from corral_systemd.client import run_via_service

    work = tempfile.mkdtemp(prefix="corral-service-soak-")
    path = os.path.join(work, "io.corral.Run")
    env = dict(os.environ, CORRAL_STATE_DIR=os.path.join(work, "state"))
    os.environ["CORRAL_STATE_DIR"] = env["CORRAL_STATE_DIR"]  # the client's registry is the service's
    service = subprocess.Popen(
        [sys.executable, "-m", "corral_systemd.service", "--socket", path, "--manager", "user", "--idle-exit", "3600"],
        env=env,
        stderr=open(os.path.join(work, "service.log"), "wb"),
    )
    samples = []
    failures = 0
    started = time.monotonic()
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(1), os.dup(2)
    try:
        while not os.path.exists(path):
            if service.poll() is not None:
                raise SystemExit("service_soak: the service did not start")
            time.sleep(0.05)
        os.dup2(devnull, 1)  # the runs' summary lines and the client's messages
        os.dup2(devnull, 2)
        for n in range(1, args.runs + 1):
            unit_type = "scope" if n % 2 else "service"
            if n % 50 == 0:
                run_via_service(["--bogus-option", "--", "true"], "corral", path)  # UsageError: 125
                timer = threading.Timer(0.05, lambda: os.kill(os.getpid(), 15))
                # a run stopped by a signal byte: the client forwards SIGTERM (143)
                timer.start()
                run_via_service(["--quiet", "--", "sleep", "5"], "corral-enforced", path)
                timer.join()
                junk = socket.socket(socket.AF_UNIX)
                junk.connect(path)
                junk.sendall(b"\xff garbage\0")
                junk.close()
            rc = run_via_service(["--quiet", "--unit-type", unit_type, "--", "/bin/true"], "corral-enforced", path)
            failures += rc != 0
            if n % args.every == 0:
                samples.append({"runs": n, "seconds": round(time.monotonic() - started, 1), **sample(service.pid)})
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        service.terminate()
        service.wait(timeout=120)
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    warm = [s for s in samples if s["runs"] >= 1000] or samples
    span = max(1, warm[-1]["runs"] - warm[0]["runs"]) / 1000
    result = {
        "runs": args.runs,
        "failed_runs": failures,
        "seconds": round(time.monotonic() - started, 1),
        "first": samples[0],
        "last": samples[-1],
        "max": {k: max(s[k] for s in samples) for k in ("rss_kib", "fds", "threads")},
        "growth_per_1000_runs_after_1000": {
            k: round((warm[-1][k] - warm[0][k]) / span, 2) for k in ("rss_kib", "fds", "threads")
        },
        "samples": samples,
    }
    shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "service_soak.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
