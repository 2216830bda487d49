"""What each guarantee tier costs: ``/bin/true`` start-up and stop latency, per tier.

Each tier against its peer, in the same invocation, rounds interleaved (so a
busy machine slows both sides of a ratio alike):

- start-up: ``corral --guarantee TIER --quiet -- /bin/true`` against the bare
  ``/bin/true`` and ``timeout 60 /bin/true``, both started the same way. The
  cgroup tier runs where a container with a writable cgroup would: inside a
  delegated subtree of its own (``tests/delegated.py``: a fresh group as a
  cgroup namespace's root, cgroup2 at /sys/fs/cgroup); its peers run inside
  the same wrapper, so the ratio is corral's cost, not the wrapper's.
- stop latency: ``--wall 0.3s --grace 2s`` on a tree of two TERM-honouring
  sleeps; the record's own clock from the deadline to the proof
  (``steps.verified - steps.deadline``), so start-up is not in it.

Tiers that cannot be had here are listed with why (``unavailable``). Writes
``tiers.json`` into ``--out`` (default bench/results/).

    python bench/tiers_bench.py [--rounds 20] [--out DIR]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import RESULTS, ROOT, corral_argv, timed

sys.path.insert(0, str(ROOT / "tests"))
import delegated  # noqa: E402

TIERS = ("unit", "cgroup", "pidns", "subreaper")
STOP_TREE = ["sh", "-c", "sleep 600 & sleep 600 & wait"]


def _wrap(tier: str, argv: list[str]) -> list[str]:
    return delegated.program(argv) if tier == "cgroup" else argv


def _available(tier: str) -> str | None:
    """Why ``tier`` cannot be benchmarked here (None: it can)."""
    if tier == "cgroup" and (why := delegated.unavailable()) is not None:
        return why
    probe = subprocess.run(
        _wrap(tier, [*corral_argv(), "--guarantee", tier, "--quiet", "--no-registry", "--", "true"]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return None if probe.returncode == 0 else (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]


def _stop_latency(tier: str, record: str) -> float:
    argv = [*corral_argv(), "--guarantee", tier, "--quiet", "--no-registry", "--json", record]
    argv += ["--wall", "0.3s", "--grace", "2s", "--", *STOP_TREE]
    proc = subprocess.run(_wrap(tier, argv), stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    with open(record) as f:
        data = json.load(f)
    if proc.returncode != 124 or not data["verified"]:
        raise SystemExit(f"{tier}: stop not verified (exit {proc.returncode}): {proc.stderr.decode()[-400:]}")
    return data["steps"]["verified"] - data["steps"]["deadline"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    corral = corral_argv()
    unavailable = {tier: why for tier in TIERS if (why := _available(tier)) is not None}
    tiers = [tier for tier in TIERS if tier not in unavailable]
    samples: dict[str, dict[str, list[float]]] = {
        tier: {"corral": [], "bare": [], "timeout": [], "stop": []} for tier in tiers
    }
    with tempfile.TemporaryDirectory() as tmp:
        record = os.path.join(tmp, "record.json")
        for round_ in range(args.rounds):
            for tier in tiers[round_ % len(tiers) :] + tiers[: round_ % len(tiers)]:
                runs = {
                    "corral": [*corral, "--guarantee", tier, "--quiet", "--no-registry", "--", "/bin/true"],
                    "bare": ["/bin/true"],
                    "timeout": ["timeout", "60", "/bin/true"],
                }
                for name in list(runs)[round_ % 3 :] + list(runs)[: round_ % 3]:
                    samples[tier][name].append(timed(_wrap(tier, runs[name])))
                samples[tier]["stop"].append(_stop_latency(tier, record))
    results = {}
    for tier in tiers:
        med = {name: statistics.median(values) for name, values in samples[tier].items()}
        results[tier] = {
            "startup_median_s": med["corral"],
            "bare_median_s": med["bare"],
            "timeout_median_s": med["timeout"],
            "startup_vs_bare": med["corral"] / med["bare"],
            "startup_vs_timeout": med["corral"] / med["timeout"],
            "stop_latency_median_s": med["stop"],
            "stop_latency_max_s": max(samples[tier]["stop"]),
            "samples": samples[tier],
        }
    out = {
        "rounds": args.rounds,
        "corral": corral,
        "host": os.uname().release,
        "cgroup_peers": "the cgroup tier's bare and timeout runs are inside the same delegated-subtree wrapper",
        "tiers": results,
        "unavailable": unavailable,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "tiers.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    for tier, r in results.items():
        print(
            f"{tier:10} start-up {r['startup_median_s'] * 1000:7.1f} ms = {r['startup_vs_bare']:5.1f}x bare, "
            f"{r['startup_vs_timeout']:5.1f}x timeout; stop latency {r['stop_latency_median_s'] * 1000:6.1f} ms "
            f"(max {r['stop_latency_max_s'] * 1000:.1f})"
        )
    for tier, why in unavailable.items():
        print(f"{tier:10} unavailable: {why}")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
