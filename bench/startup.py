"""What an in-process run costs to start, and to hold (issue 38): ratios in one invocation.

Start-up: ``/bin/true`` under each runner, the runners taking turns
round-robin (the first one rotates each round, ``--warmup`` rounds
discarded), so a busy machine slows every side of a ratio alike:

- ``corral --guarantee pidns --quiet -- /bin/true`` and ``--guarantee
  subreaper`` (no manager: the in-process tiers; the registry on, as a user
  runs it);
- the peers: ``python3 -I -S -c pass`` (this interpreter: the floor of any
  Python program), ``timeout 10 /bin/true`` and the bare ``/bin/true``.

Reported: median and p90 per runner, and each corral's median over each
peer's (the issue's goal: pidns and subreaper ≤ 3× ``python3 -I -S``).

Memory: ``--mem-runs`` runs of ``corral --guarantee T -- sleep 60`` per tier
in flight at once; once every ``sleep`` runs, the Pss of each run's own
processes (those whose environment carries the run's marker, less the
command: the sleep binary by device and inode, and its descendants; never by
name), and how many processes per run are corral's and how many of those
run the Python interpreter (by /proc/PID/exe, device and inode). The issue's
goal: ≤ 16 MiB resident per run, one Python process per run. Every run is
then stopped by its pid (bench/waiting.py's helpers).

    python bench/startup.py [--rounds 40] [--mem-runs 5] [--out DIR]

Writes ``startup.json`` into ``--out`` (default bench/results/).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

from waiting import MARKER, _exe_id, _exe_id_of_path, mem_sample, scan_marked, split_run, stop_all

from common import RESULTS, corral_argv, environment_info, timed

TIERS = ("pidns", "subreaper")


def runners(corral: list[str]) -> dict[str, list[str]]:
    out = {f"corral {tier}": [*corral, "--guarantee", tier, "--quiet", "--", "/bin/true"] for tier in TIERS}
    out["python3 -I -S -c pass"] = [sys.executable, "-I", "-S", "-c", "pass"]
    out["timeout 10 /bin/true"] = ["timeout", "10", "/bin/true"]
    out["/bin/true"] = ["/bin/true"]
    return out


def startup(corral: list[str], rounds: int, warmup: int) -> dict:
    argvs = runners(corral)
    names = list(argvs)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(warmup + rounds):
        turn = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in turn:
            elapsed = timed(argvs[name])
            if round_ >= warmup:
                samples[name].append(elapsed)
    med = {name: statistics.median(values) for name, values in samples.items()}
    p90 = {name: statistics.quantiles(values, n=10)[-1] for name, values in samples.items()}
    ratios = {
        f"corral {tier} / {peer}": med[f"corral {tier}"] / med[peer]
        for tier in TIERS
        for peer in ("python3 -I -S -c pass", "timeout 10 /bin/true", "/bin/true")
    }
    return {"argv": argvs, "median_s": med, "p90_s": p90, "ratios": ratios, "samples": samples}


def memory(corral: list[str], tier: str, n: int) -> dict:
    """Pss and processes per waiting run of ``tier`` (``n`` at once)."""
    sleep_id = _exe_id_of_path("/bin/sleep")
    python_id = _exe_id_of_path(os.path.realpath(sys.executable))
    markers = {uuid.uuid4().hex: None for _ in range(n)}
    procs = {}
    try:
        for marker in markers:
            env = dict(os.environ, **{MARKER: marker})
            argv = [*corral, "--guarantee", tier, "--quiet", "--", "/bin/sleep", "60"]
            procs[marker] = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            found = scan_marked(set(markers))
            split = {m: split_run(pids, sleep_id) for m, pids in found.items()}
            if all(commands for commands, _ in split.values()):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{tier}: not every sleep started within 60 s")
            time.sleep(0.05)
        time.sleep(0.5)  # settle: start-up's garbage collected, pages faulted in
        rows = []
        for marker in markers:
            _, own = split_run(scan_marked({marker})[marker], sleep_id)
            mems = [m for m in (mem_sample(pid) for pid in own) if m is not None]
            rows.append(
                {
                    "processes": len(own),
                    "python_processes": sum(1 for pid in own if _exe_id(pid) == python_id),
                    "pss_kib": sum(m["pss"] or 0 for m in mems),
                    "rss_kib": sum(m["rss"] for m in mems),
                    "uss_kib": sum(m["uss"] or 0 for m in mems),
                }
            )
    finally:
        stopped = stop_all(procs, set(markers))
    return {
        "runs": n,
        "pss_kib_median": statistics.median(r["pss_kib"] for r in rows),
        "rss_kib_median": statistics.median(r["rss_kib"] for r in rows),
        "uss_kib_median": statistics.median(r["uss_kib"] for r in rows),
        "processes_per_run": max(r["processes"] for r in rows),
        "python_processes_per_run": max(r["python_processes"] for r in rows),
        "per_run": rows,
        "stopped": stopped,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--mem-runs", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    corral = corral_argv()
    result = {"environment": environment_info(), "rounds": args.rounds, "corral": corral}
    result["startup"] = startup(corral, args.rounds, args.warmup)
    result["memory"] = {tier: memory(corral, tier, args.mem_runs) for tier in TIERS}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "startup.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    s = result["startup"]
    for name, med in s["median_s"].items():
        print(f"{name:24} {med * 1000:7.1f} ms (p90 {s['p90_s'][name] * 1000:.1f})")
    for name, ratio in s["ratios"].items():
        print(f"{name:44} {ratio:6.2f}x")
    for tier, m in result["memory"].items():
        print(
            f"corral {tier:10} waiting: Pss {m['pss_kib_median']:,.0f} KiB, "
            f"RSS {m['rss_kib_median']:,.0f} KiB per run; "
            f"{m['processes_per_run']} processes per run, {m['python_processes_per_run']} of them Python"
        )
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
