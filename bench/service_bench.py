"""The corral CLI through the corral service against systemd-run (issue 16).

Same manager, same invocation, interleaved (each round times one of each, so
a machine that slows down mid-way hits every side alike):

1. per run, ``/bin/true``, one at a time:
   ``corral-enforced --quiet -- /bin/true`` through the service, scope and
   ``--unit-type service``, against ``systemd-run --user --wait --collect -q
   /bin/true``; for reference the same CLI in-process (``CORRAL_SERVICE=0``)
   and ``corral --cgroup-mode fallback`` (the service never takes those).
   Targets: median ratio to systemd-run <= 1.0 (must: <= 1.3), both unit types.
   Each with both clients: the compiled one (packaging/client/corral.c, the
   .deb's corral-enforced; built here with cc) and the Python one (pip's).
   With nothing installed (no --installed, no corral.socket), also the same
   through the transient service the client starts itself (issue 38:
   ``corral-transient.socket``, warm: started by the warm-up run) against the
   same systemd-run: target ratio <= 1.0 (goal 0.6); the pair is stopped after.
   Each case is timed twice per round: *settled*, after ``--gap`` seconds
   (0.1) in which nothing of the bench runs (``per_run``: one invocation, as
   an interactive or agent call makes it), then *back to back*, right
   after that run of the same command (``per_run_back_to_back``: a loop).
   Why not one run right after another case, as this bench did before
   2026-12-05: moving a process into a cgroup (what the manager does for
   every scope and service, corral's and systemd-run's) waits for an RCU
   grace period when no move happened in the last few tens of milliseconds
   (the kernel's cgroup_threadgroup_rwsem, a per-CPU rwsem), 10-13 ms on
   the 2-core VM; so a case timed right after a run that moved a process
   paid nothing, one timed after ``python3 -IS -c pass`` or a fallback run
   paid it in full, and the ratios said which case came after which
   (systemd-run came right after the transient rows' served runs).
2. 8 in flight: ``seq N | xargs -P8 -n1 corral-enforced --quiet [--unit-type service] -- /bin/true``
   against the same with systemd-run, in rounds: runs/s ratio >= 1.

The service is started here on a private socket (``--socket``) with this
interpreter, unless ``--installed`` (then the user's socket-activated one).
Time with a non-editable install (see README.md): an editable one adds
~16 ms of import machinery to every start. Needs a user manager (inside
tests/harness/with-user-manager on a machine without one). Writes
bench/results/service.json.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS, ROOT, start_service

SYSTEMD_RUN = ["systemd-run", "--user", "--wait", "--collect", "-q", "/bin/true"]


def python_client(work: str, name: str) -> list[str]:
    """bin/NAME (the Python client) as pip installs it where no C compiler
    was there: its ``#!python`` line pointed at this interpreter."""
    source = ROOT / "bin" / name
    path = os.path.join(work, f"{name}.py-client")
    with open(path, "w") as f:
        f.write(source.read_text().replace("#!python", f"#!{sys.executable}", 1))
    os.chmod(path, 0o755)
    return [path]


def compiled_client(work: str) -> list[str]:
    """packaging/client/corral.c built by packaging/client/build (as for the
    .deb), as ``corral-enforced``; its way back in-process is this venv's
    ``client.entry_in_process`` run as the .deb runs it (``python3 -IS``,
    site-packages put on sys.path by hand)."""
    import sysconfig

    in_process = os.path.join(work, "corral-inprocess")
    with open(in_process, "w") as f:
        f.write(
            f"#!{sys.executable} -IS\nimport sys\n\nsys.path.append({sysconfig.get_paths()['purelib']!r})\n"
            # an editable install's package is in the checkout, which -S leaves off sys.path
            f"sys.path.append({str(ROOT)!r})\n"
            "from corral_systemd.client import entry_in_process\n\nentry_in_process()\n"
        )
    os.chmod(in_process, 0o755)
    binary = os.path.join(work, "corral-enforced")
    subprocess.run(["sh", str(ROOT / "packaging" / "client" / "build"), binary, in_process], check=True)
    return [binary]


def clients(work: str) -> dict[str, list[str]]:
    """Each client's argv, built once for both measurements."""
    return {
        "compiled": compiled_client(work),
        "python": python_client(work, "corral-enforced"),
        "python corral": python_client(work, "corral"),
    }


def per_run(
    rounds: int,
    env_service: dict,
    env_plain: dict,
    argv: dict[str, list[str]],
    env_transient: dict | None = None,
    gap: float = 0.1,
    with_back_to_back: bool = True,
) -> dict:
    compiled, python_enforced, corral = argv["compiled"], argv["python"], argv["python corral"]
    transient = {
        # Nothing installed: the transient service the first of these started (the warm-up).
        "transient-scope": ([*compiled, "--quiet", "--", "/bin/true"], env_transient),
        "transient-scope, python client": ([*python_enforced, "--quiet", "--", "/bin/true"], env_transient),
    }
    cases = {
        "systemd-run": (SYSTEMD_RUN, env_plain),
        "python -IS -c pass": ([sys.executable, "-IS", "-c", "pass"], env_plain),
        # The .deb's corral-enforced: the compiled client.
        "service-scope": ([*compiled, "--quiet", "--", "/bin/true"], env_service),
        "service-service": ([*compiled, "--quiet", "--unit-type", "service", "--", "/bin/true"], env_service),
        # A pip install's corral-enforced: the Python client.
        "service-scope, python client": ([*python_enforced, "--quiet", "--", "/bin/true"], env_service),
        "service-service, python client": (
            [*python_enforced, "--quiet", "--unit-type", "service", "--", "/bin/true"],
            env_service,
        ),
        "in-process-scope": ([*compiled, "--quiet", "--", "/bin/true"], env_plain),
        "in-process-scope, python client": ([*python_enforced, "--quiet", "--", "/bin/true"], env_plain),
        # What corral-enforced ran before the client existed (pip's console-script wrapper: re, then cli)
        "in-process-scope, before the client": (
            [
                sys.executable,
                "-c",
                "import re, sys; from corral_systemd.cli import main; "
                "sys.exit(main(prog='corral-enforced', default_mode='enforced'))",
                "--quiet",
                "--",
                "/bin/true",
            ],
            env_plain,
        ),
        "fallback": ([*compiled, "--quiet", "--cgroup-mode", "fallback", "--", "/bin/true"], env_plain),
        "fallback, python client": ([*corral, "--quiet", "--cgroup-mode", "fallback", "--", "/bin/true"], env_plain),
        **(transient if env_transient is not None else {}),
    }
    settled: dict[str, list[float]] = {name: [] for name in cases}
    back_to_back: dict[str, list[float]] = {name: [] for name in cases}
    for argv, env in cases.values():  # warm: page cache, byte-code, the service's session
        subprocess.run(argv, env=env, check=True)
    for _ in range(rounds):
        for name, (argv, env) in cases.items():
            time.sleep(gap)  # every case starts from the same state (see the docstring)
            settled[name].append(_timed(argv, env))
            if with_back_to_back:
                back_to_back[name].append(_timed(argv, env))  # right after a run of the same command
    out = {"per_run": _summary(settled)}
    if with_back_to_back:
        out["per_run_back_to_back"] = _summary(back_to_back)
    return out


def _timed(argv: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(argv, env=env, check=True)
    return time.perf_counter() - t


def _summary(times: dict[str, list[float]]) -> dict:
    base = statistics.median(times["systemd-run"])
    out = {}
    for name, values in times.items():
        values.sort()
        out[name] = {
            "p50_ms": round(statistics.median(values) * 1e3, 2),
            "p95_ms": round(values[max(0, int(len(values) * 0.95) - 1)] * 1e3, 2),
            "ratio_to_systemd_run": round(statistics.median(values) / base, 3),
        }
    return out


def throughput(n: int, rounds: int, env_service: dict, env_plain: dict, argv: dict[str, list[str]]) -> dict:
    compiled, python_enforced = " ".join(argv["compiled"]), " ".join(argv["python"])
    sides = {
        "systemd-run": (f"seq {n} | xargs -P8 -n1 sh -c 'exec {' '.join(SYSTEMD_RUN)}' x", env_plain),
        "service-scope": (f"seq {n} | xargs -P8 -n1 sh -c 'exec {compiled} --quiet -- /bin/true' x", env_service),
        "service-service": (
            f"seq {n} | xargs -P8 -n1 sh -c 'exec {compiled} --quiet --unit-type service -- /bin/true' x",
            env_service,
        ),
        "service-scope, python client": (
            f"seq {n} | xargs -P8 -n1 sh -c 'exec {python_enforced} --quiet -- /bin/true' x",
            env_service,
        ),
    }
    per_round = []
    for _ in range(rounds):
        rates = {}
        for name, (script, env) in sides.items():
            t = time.perf_counter()
            subprocess.run(["sh", "-c", script], env=env, check=True)
            rates[name] = n / (time.perf_counter() - t)
        per_round.append(rates)
    return {
        "runs": n,
        "rounds": [{k: round(v, 1) for k, v in r.items()} for r in per_round],
        **{
            f"ratio_runs_per_s_median, {name}": round(
                statistics.median(r[name] / r["systemd-run"] for r in per_round), 3
            )
            for name in sides
            if name != "systemd-run"
        },
    }


def nothing_installed() -> dict | None:
    """The environment of a user with nothing installed, where the client may
    start the transient service (issue 38); None when a service already
    listens at the manager's socket or no manager's private socket is there."""
    from corral_systemd.common.programs import manager_for

    env = dict(os.environ)
    for name in ("CORRAL_SERVICE", "CORRAL_SERVICE_SOCKET", "CORRAL_STATE_DIR"):
        env.pop(name, None)
    path = os.path.join(env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}", "io.corral.Run")
    return env if manager_for(path) == "user" and not os.path.exists(path) else None


def stop_transient() -> None:
    from corral_systemd.common.unit_names import TRANSIENT_SERVICE

    units = [f"{TRANSIENT_SERVICE}.socket", f"{TRANSIENT_SERVICE}.service"]
    subprocess.run(["systemctl", "--user", "stop", *units], capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--throughput-runs", type=int, default=64)
    parser.add_argument("--throughput-rounds", type=int, default=3)
    parser.add_argument("--installed", action="store_true", help="use the socket-activated service")
    parser.add_argument(
        "--gap",
        type=float,
        default=0.1,
        help="seconds of nothing before each settled run (0 and --no-back-to-back: the order-bound figures of before)",
    )
    parser.add_argument("--no-back-to-back", action="store_true", help="time each case once per round")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    if shutil.which("systemd-run") is None or subprocess.run(
        ["systemctl", "--user", "is-system-running"], capture_output=True
    ).returncode not in (0, 1):
        print("service_bench: needs a user manager (run inside tests/harness/with-user-manager)", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="corral-service-bench-")
    service = None
    env_plain = dict(os.environ, CORRAL_SERVICE="0")
    env_service = dict(os.environ)
    if not args.installed:
        socket_path = os.path.join(work, "io.corral.Run")
        service = start_service(socket_path)
        env_service["CORRAL_SERVICE_SOCKET"] = socket_path
    env_transient = None if args.installed else nothing_installed()
    try:
        argv = clients(work)
        load_before = os.getloadavg()
        runs = per_run(args.rounds, env_service, env_plain, argv, env_transient, args.gap, not args.no_back_to_back)
        result = {
            **runs,
            "per_run_method": {
                "rounds": args.rounds,
                "gap_s": args.gap,
                "back_to_back": not args.no_back_to_back,
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "harness_layout": os.environ.get("CORRAL_HARNESS_LAYOUT"),
            },
            "throughput_8_in_flight": throughput(
                args.throughput_runs, args.throughput_rounds, env_service, env_plain, argv
            ),
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
        }
    finally:
        if service is not None:
            service.terminate()
            service.wait(timeout=60)
        if env_transient is not None:
            stop_transient()
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "service.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
