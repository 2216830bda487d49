"""The library's shared Runner against systemd-run, same manager, same invocation.

Two figures (issue: "Python library API"):
1. per-run overhead, /bin/true, one at a time: Runner.run() (enforced, scope
   and service) vs `systemd-run --user --wait --collect -q /bin/true`;
   the target is a median ratio <= 0.5;
2. throughput with 8 runs in flight: Runner.arun() x 8 concurrent tasks vs
   `seq N | xargs -P8 -n1 systemd-run --user --wait --collect -q /bin/true`;
   the target is >= 1.5x the runs/s. Measured in rounds (xargs, scope,
   service, one after the other); the ratio reported is the median of the
   rounds' ratios, so a machine that slows down mid-way hits both sides of
   a ratio alike. The Runner's own CPU time and voluntary context switches
   per run come with it (getrusage).

Needs a user manager (run inside tests/harness/with-user-manager on a
machine without one). Writes bench/results/runner.json.
"""

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import time

from common import RESULTS, user_manager_reachable

sys.path.insert(0, str(RESULTS.parent.parent))
import corral_systemd as corral  # noqa: E402

SYSTEMD_RUN = ["systemd-run", "--user", "--wait", "--collect", "-q", "/bin/true"]


def per_run(rounds: int) -> dict:
    """Interleaved: each round times one of each, so drift hits all alike.

    systemd-run is timed while no Runner is open: a Runner's connection to
    the manager's private socket receives every unit's signals, which costs
    the manager (and this process) a little for systemd-run's units too. So
    each round opens a Runner (untimed: the tether is made once per Runner),
    times one warm run of each unit type, and closes it again.
    """
    times = {"systemd-run": [], "runner-scope": [], "runner-service": []}
    for _ in range(rounds):
        t = time.perf_counter()
        subprocess.run(SYSTEMD_RUN, check=True)
        times["systemd-run"].append(time.perf_counter() - t)
        with corral.Runner(mode="enforced") as runner:
            runner.run(["/bin/true"])  # warm: the session (connection, tether) is made once
            for unit_type in ("scope", "service"):
                t = time.perf_counter()
                result = runner.run(["/bin/true"], unit_type=unit_type)
                times[f"runner-{unit_type}"].append(time.perf_counter() - t)
                assert result.exit_code == 0 and result.verified
    out = {}
    for name, values in times.items():
        values.sort()
        out[name] = {"p50_ms": statistics.median(values) * 1e3, "p95_ms": values[int(len(values) * 0.95) - 1] * 1e3}
    base = out["systemd-run"]["p50_ms"]
    for name in ("runner-scope", "runner-service"):
        out[name]["ratio_to_systemd_run"] = out[name]["p50_ms"] / base
    return out


async def _runner_throughput(n: int, unit_type: str) -> dict:
    import resource

    async with corral.Runner(mode="enforced", unit_type=unit_type) as runner:
        await runner.arun(["/bin/true"])
        queue = list(range(n))

        async def worker():
            while queue:
                queue.pop()
                result = await runner.arun(["/bin/true"])
                assert result.exit_code == 0 and result.verified

        before = resource.getrusage(resource.RUSAGE_SELF)
        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(8)))
        elapsed = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        return {
            "runs_per_s": n / elapsed,
            "cpu_ms_per_run": cpu * 1e3 / n,
            "voluntary_switches_per_run": (after.ru_nvcsw - before.ru_nvcsw) / n,
        }


def throughput(n: int, rounds: int) -> dict:
    per_round = []
    for _ in range(rounds):
        t = time.perf_counter()
        subprocess.run(f"seq {n} | xargs -P8 -n1 sh -c 'exec {' '.join(SYSTEMD_RUN)}' sh", shell=True, check=True)
        row = {"systemd-run xargs -P8": {"runs_per_s": n / (time.perf_counter() - t)}}
        for unit_type in ("scope", "service"):
            row[f"runner-{unit_type} x8"] = asyncio.run(_runner_throughput(n, unit_type))
        per_round.append(row)
    out = {}
    for name in per_round[0]:
        rows = [r[name] for r in per_round]
        out[name] = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        if name != "systemd-run xargs -P8":
            ratios = [r[name]["runs_per_s"] / r["systemd-run xargs -P8"]["runs_per_s"] for r in per_round]
            out[name]["ratio_to_xargs"] = statistics.median(ratios)
            out[name]["ratio_to_xargs_per_round"] = [round(x, 3) for x in ratios]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--runs", type=int, default=400, help="runs per throughput measurement")
    parser.add_argument("--throughput-rounds", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS / "runner.json"))
    args = parser.parse_args()
    if not user_manager_reachable() or shutil.which("systemd-run") is None:
        print("runner_bench: needs a systemd user manager and systemd-run", file=sys.stderr)
        return 2
    data = {"per_run": per_run(args.rounds), "throughput": throughput(args.runs, args.throughput_rounds)}
    with open(args.out, "w") as f:
        json.dump(data, f, indent=2)
    print(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
