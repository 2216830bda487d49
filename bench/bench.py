#!/usr/bin/env python3
"""Latency benchmarks for corral.

Sections (all by default; choose with --sections):

overhead     /bin/true under each runner, round-robin interleaved: direct;
             corral fallback; corral enforced scope/service;
             `systemd-run --user --wait --collect -q /bin/true`;
             `timeout 10 /bin/true`; `python -c "import typer"` with corral's
             interpreter (the start-up floor). Median, p95, ratios, peak RSS.
stop         F5 (daemon + stays) with --wall 200ms, per mode: stop latency =
             steps.verified - steps.deadline from the --json record.
tree         stop latency as the tree grows: bench/tree.py N (N sleeping
             processes) for N in --tree-sizes.
concurrency  K corral runs at once (K in --concurrency), each running F5 (a
             daemon) with --wall 2s; stop latency of every run.

Peak RSS is GNU time's %M (/usr/bin/time -f %M wraps the runner): the
larger of the runner itself and the largest descendant it reaped. For corral
running /bin/true, sleeps or F5 that is corral itself. (wait4() from this
Python process would not do: a child forked/vforked from it inherits its
~15 MiB high-water mark.) In the overhead section the timed runs are not
wrapped; RSS comes from --rss-runs extra runs per runner.

Writes OUT/bench.json and OUT/bench_overhead.png, bench_tree.png,
bench_concurrency.png (if matplotlib is importable). OUT defaults to
bench/results. The systemd modes need a user manager; on a machine without
one run it through tests/harness/with-user-manager (see bench/README.md).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    BENCH,
    FAULTS,
    MARKER_ENV,
    RESULTS,
    corral_argv,
    environment_info,  # noqa: E402
    exit_status,
    kill_marked,
    marked_pids,
    new_marker,
    user_manager_reachable,
)

MODES = {
    "corral-fallback": ["--cgroup-mode", "fallback"],
    "corral-scope": ["--cgroup-mode", "enforced", "--unit-type", "scope"],
    "corral-service": ["--cgroup-mode", "enforced", "--unit-type", "service"],
}
SYSTEMD_RUNNERS = {"corral-scope", "corral-service", "systemd-run"}


def pct(values, q):
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]


def summary(values):
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": statistics.median(values),
        "p95": pct(values, 95),
        "min": min(values),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


GNU_TIME = "/usr/bin/time"


def rss_wrap(argv, path: Path):
    """argv wrapped in GNU time writing peak RSS (KiB) to path; argv if time is missing."""
    if not os.path.exists(GNU_TIME):
        return argv
    return [GNU_TIME, "-q", "-f", "%M", "-o", str(path)] + argv


def read_rss(path: Path):
    try:
        value = int(path.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    finally:
        path.unlink(missing_ok=True)
    return value


def run_wait4(argv, env=None, stdout=subprocess.DEVNULL, timeout=60.0):
    """Spawn, wait with wait4; return (seconds, status, ru_maxrss KiB)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT)
    deadline = start + timeout
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG if timeout else 0)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            pid, status, ru = os.wait4(proc.pid, 0)
            proc.returncode = -9
            return time.perf_counter() - start, "hang", ru.ru_maxrss
        time.sleep(0.0005)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return elapsed, exit_status(proc.returncode), ru.ru_maxrss


# --------------------------------------------------------------------- overhead


def overhead_runners(manager: bool) -> dict:
    corral = corral_argv()
    runners = {
        "direct": ["/bin/true"],
        "python-import-typer": [sys.executable, "-c", "import typer"],
        "timeout": ["timeout", "10", "/bin/true"],
        "corral-fallback": corral + MODES["corral-fallback"] + ["--quiet", "--", "/bin/true"],
        # what an agent runs: the record on stdout (written without pydantic since issue 12)
        "corral-fallback-json": corral + MODES["corral-fallback"] + ["--quiet", "--json", "-", "--", "/bin/true"],
        "corral-scope": corral + MODES["corral-scope"] + ["--quiet", "--", "/bin/true"],
        "corral-service": corral + MODES["corral-service"] + ["--quiet", "--", "/bin/true"],
        "systemd-run": ["systemd-run", "--user", "--wait", "--collect", "-q", "/bin/true"],
    }
    return {name: (argv if manager or name not in SYSTEMD_RUNNERS else None) for name, argv in runners.items()}


def section_overhead(opts, manager, tmp):
    runners = overhead_runners(manager)
    live = [n for n, a in runners.items() if a]
    times = {n: [] for n in live}
    rss = {n: [] for n in live}
    bad = {n: [] for n in live}
    total = opts.overhead_runs + opts.warmup
    for rnd in range(total):
        # Round-robin, rotating who goes first so no runner always follows the same one.
        order = live[rnd % len(live) :] + live[: rnd % len(live)]
        for name in order:
            elapsed, status, _ = run_wait4(runners[name])
            if status != 0:
                bad[name].append(status)
            if rnd >= opts.warmup:
                times[name].append(elapsed)
        if (rnd + 1) % 10 == 0:
            log(f"overhead: round {rnd + 1}/{total}")
    for _ in range(opts.rss_runs):
        for name in live:
            path = tmp / f"rss-{name}"
            run_wait4(rss_wrap(runners[name], path))
            value = read_rss(path)
            if value is not None:
                rss[name].append(value)
    stats = {
        n: (
            {**summary(times[n]), "rss_kib": summary(rss[n]), "nonzero_exits": bad[n]}
            if runners[n]
            else {"n/a": "no systemd user manager reachable"}
        )
        for n in runners
    }
    p50 = {n: stats[n]["p50"] for n in live}
    ratios = {}
    floor = p50.get("python-import-typer")
    if "corral-fallback-json" in p50:
        ratios["corral-fallback-json / corral-fallback"] = p50["corral-fallback-json"] / p50["corral-fallback"]
    for n in ("corral-fallback", "corral-scope", "corral-service"):
        if n in p50 and floor:
            ratios[f"{n} / python-import-typer"] = p50[n] / floor
    for n in live:
        if n != "direct":
            ratios[f"{n} / direct"] = p50[n] / p50["direct"]
    if "systemd-run" in p50:
        for n in live:
            if n != "systemd-run":
                ratios[f"{n} / systemd-run"] = p50[n] / p50["systemd-run"]
    argv = {n: a for n, a in runners.items()}
    return {
        "runs": opts.overhead_runs,
        "warmup_rounds": opts.warmup,
        "argv": argv,
        "seconds": stats,
        "ratios_of_medians": ratios,
        "raw": times,
    }


# ------------------------------------------------------------------------- stop


def corral_record_run(mode, extra, target, tmp: Path, timeout=120.0):
    """One corral run with --json; returns dict with the record's key figures."""
    marker = new_marker()
    env = dict(os.environ)
    env[MARKER_ENV] = marker
    rec_path = tmp / f"{marker}.json"
    argv = corral_argv() + MODES[mode] + extra + ["--quiet", "--json", str(rec_path), "--"] + target
    rss_path = tmp / f"{marker}.rss"
    elapsed, status, _ = run_wait4(rss_wrap(argv, rss_path), env=env, timeout=timeout)
    maxrss = read_rss(rss_path)
    survivors = len(marked_pids(marker))
    kill_marked(marker)
    return figures(rec_path, elapsed, status, maxrss, survivors)


def figures(rec_path: Path, elapsed, status, maxrss, survivors):
    out = {"elapsed": elapsed, "exit": status, "rss_kib": maxrss, "survivors": survivors}
    try:
        rec = json.loads(rec_path.read_text())
    except (OSError, ValueError):
        out["record"] = None
        return out
    steps = rec["steps"]
    out.update(
        {
            "stop_latency": (
                steps["verified"] - steps["deadline"]
                if steps.get("verified") is not None and steps.get("deadline") is not None
                else None
            ),
            "deadline_to_term": (
                steps["term_sent"] - steps["deadline"]
                if steps.get("term_sent") is not None and steps.get("deadline") is not None
                else None
            ),
            "spawned": steps.get("spawned"),
            "processes_stopped": rec.get("processes_stopped"),
            "verified": rec.get("verified"),
            "record_wall_time": rec.get("wall_time"),
        }
    )
    rec_path.unlink(missing_ok=True)
    return out


def modes_available(manager):
    return [m for m in MODES if manager or m not in SYSTEMD_RUNNERS]


def summarize_runs(runs):
    lat = [r["stop_latency"] for r in runs if r.get("stop_latency") is not None]
    return {
        "stop_latency": summary(lat),
        "deadline_to_term": summary([r["deadline_to_term"] for r in runs if r.get("deadline_to_term") is not None]),
        "spawned": summary([r["spawned"] for r in runs if r.get("spawned") is not None]),
        "record_wall_time": summary([r["record_wall_time"] for r in runs if r.get("record_wall_time") is not None]),
        "elapsed": summary([r["elapsed"] for r in runs]),
        "rss_kib": summary([r["rss_kib"] for r in runs if r["rss_kib"] is not None]),
        "exits": sorted({str(r["exit"]) for r in runs}),
        "max_survivors": max((r["survivors"] for r in runs), default=0),
        "unverified": sum(1 for r in runs if r.get("verified") is not True),
        "processes_stopped": summary([r["processes_stopped"] for r in runs if r.get("processes_stopped") is not None]),
    }


def section_stop(opts, manager, tmp):
    modes = modes_available(manager)
    runs = {m: [] for m in modes}
    target = [str(FAULTS / "F05-daemon-stays")]
    for i in range(opts.stop_runs):
        for mode in modes[i % len(modes) :] + modes[: i % len(modes)]:
            runs[mode].append(corral_record_run(mode, ["--wall", "200ms"], target, tmp))
        if (i + 1) % 10 == 0:
            log(f"stop: {i + 1}/{opts.stop_runs}")
    return {
        "fault": "F5",
        "wall": "200ms",
        "runs_per_mode": opts.stop_runs,
        "modes": {m: summarize_runs(runs[m]) for m in modes},
        "unavailable": [m for m in MODES if m not in modes],
        "raw_stop_latency": {m: [r.get("stop_latency") for r in runs[m]] for m in modes},
    }


def section_tree(opts, manager, tmp):
    modes = modes_available(manager)
    out = {}
    for size in opts.tree_sizes:
        wall = f"{1 + size / 400:.2f}s"
        runs = {m: [] for m in modes}
        for i in range(opts.tree_reps):
            for mode in modes[i % len(modes) :] + modes[: i % len(modes)]:
                runs[mode].append(corral_record_run(mode, ["--wall", wall], [str(BENCH / "tree.py"), str(size)], tmp))
        out[str(size)] = {"wall": wall, "modes": {m: summarize_runs(runs[m]) for m in modes}}
        log(
            f"tree {size}: "
            + ", ".join(
                f"{m} p50 {out[str(size)]['modes'][m]['stop_latency'].get('p50', float('nan')):.3f}s" for m in modes
            )
        )
    return {"reps": opts.tree_reps, "sizes": out, "unavailable": [m for m in MODES if m not in modes]}


def section_concurrency(opts, manager, tmp):
    modes = modes_available(manager)
    target = [str(FAULTS / "F05-daemon-stays")]
    out = {}
    for k in opts.concurrency:
        level = {}
        for mode in modes:
            runs = []
            for _ in range(opts.concurrency_rounds):
                batch = []
                for _ in range(k):
                    marker = new_marker()
                    env = dict(os.environ)
                    env[MARKER_ENV] = marker
                    rec = tmp / f"{marker}.json"
                    argv = corral_argv() + MODES[mode] + ["--wall", "2s", "--quiet", "--json", str(rec), "--"] + target
                    argv = rss_wrap(argv, tmp / f"{marker}.rss")
                    start = time.perf_counter()
                    proc = subprocess.Popen(
                        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
                    )
                    batch.append((proc, marker, rec, start))
                finished = {}
                pending = {p.pid: (p, m, r, s) for p, m, r, s in batch}
                limit = time.perf_counter() + 120
                while pending and time.perf_counter() < limit:
                    pid, status, ru = os.wait4(-1, os.WNOHANG)
                    if pid == 0:
                        time.sleep(0.002)
                        continue
                    if pid in pending:
                        proc, _marker, _rec, start = pending.pop(pid)
                        proc.returncode = os.waitstatus_to_exitcode(status)
                        finished[pid] = (time.perf_counter() - start, exit_status(proc.returncode), ru.ru_maxrss)
                for pid, (proc, *_) in pending.items():  # hung: kill by pid
                    proc.kill()
                    proc.wait()
                    finished[pid] = (120.0, "hang", 0)
                for proc, marker, rec, _start in batch:
                    survivors = len(marked_pids(marker))
                    kill_marked(marker)
                    elapsed, status, _ = finished[proc.pid]
                    maxrss = read_rss(tmp / f"{marker}.rss")
                    runs.append(figures(rec, elapsed, status, maxrss, survivors))
            level[mode] = summarize_runs(runs)
        out[str(k)] = level
        log(
            f"concurrency {k}: "
            + ", ".join(
                f"{m} p50 {level[m]['stop_latency'].get('p50', float('nan')):.3f}s "
                f"p95 {level[m]['stop_latency'].get('p95', float('nan')):.3f}s"
                for m in modes
            )
        )
    return {
        "fault": "F5",
        "wall": "2s",
        "rounds": opts.concurrency_rounds,
        "levels": out,
        "unavailable": [m for m in MODES if m not in modes],
    }


# ------------------------------------------------------------------------ plots


def plots(data, out: Path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not importable; PNGs skipped"
    colors = {"corral-fallback": "tab:blue", "corral-scope": "tab:orange", "corral-service": "tab:green"}

    def latency_plot(section, key, xlabel, title, fname, xlog):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        xs = sorted(int(x) for x in section[key])
        for mode in MODES:
            p50, p95, xv = [], [], []
            for x in xs:
                level = section[key][str(x)]
                level = level["modes"] if "modes" in level else level
                if mode in level and level[mode]["stop_latency"].get("n"):
                    xv.append(x)
                    p50.append(level[mode]["stop_latency"]["p50"] * 1000)
                    p95.append(level[mode]["stop_latency"]["p95"] * 1000)
            if xv:
                ax.plot(xv, p50, "o-", color=colors[mode], label=f"{mode} p50")
                ax.plot(xv, p95, "x--", color=colors[mode], alpha=0.6, label=f"{mode} p95")
        if xlog:
            ax.set_xscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("stop latency: deadline → verified (ms)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)

    if "tree" in data:
        latency_plot(
            data["tree"], "sizes", "sleeping processes in the tree", "Stop latency vs tree size", "bench_tree.png", True
        )
    if "concurrency" in data:
        latency_plot(
            data["concurrency"],
            "levels",
            "concurrent corral runs (each with a daemon, F5)",
            "Stop latency vs concurrency",
            "bench_concurrency.png",
            True,
        )
    if "overhead" in data:
        stats = data["overhead"]["seconds"]
        names = [n for n in stats if "p50" in stats[n]]
        fig, ax = plt.subplots(figsize=(7, 3.8))
        ax.barh(names, [stats[n]["p50"] * 1000 for n in names], color="tab:blue", label="p50")
        ax.errorbar(
            [stats[n]["p50"] * 1000 for n in names],
            names,
            xerr=[[0] * len(names), [(stats[n]["p95"] - stats[n]["p50"]) * 1000 for n in names]],
            fmt="none",
            ecolor="black",
            capsize=3,
            label="to p95",
        )
        ax.set_xlabel("ms to run /bin/true")
        ax.set_title("Start-to-return overhead (/bin/true)")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "bench_overhead.png", dpi=110)
        plt.close(fig)
    return None


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sections", default="overhead,stop,tree,concurrency")
    ap.add_argument("--quick", action="store_true", help="small counts (a few minutes in all)")
    ap.add_argument("--overhead-runs", type=int)
    ap.add_argument("--warmup", type=int, default=2, help="discarded round-robin rounds first")
    ap.add_argument("--rss-runs", type=int, default=3, help="extra runs per runner under GNU time for peak RSS")
    ap.add_argument("--stop-runs", type=int)
    ap.add_argument("--tree-sizes", default="10,100,1000")
    ap.add_argument("--tree-reps", type=int)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--concurrency-rounds", type=int)
    ap.add_argument("--out", type=Path, default=RESULTS)
    opts = ap.parse_args(argv)
    defaults = {"overhead_runs": (30, 100), "stop_runs": (50, 100), "tree_reps": (3, 10), "concurrency_rounds": (1, 3)}
    for key, (quick, full) in defaults.items():
        if getattr(opts, key) is None:
            setattr(opts, key, quick if opts.quick else full)
    opts.tree_sizes = [int(x) for x in opts.tree_sizes.split(",") if x]
    opts.concurrency = [int(x) for x in opts.concurrency.split(",") if x]
    sections = [s.strip() for s in opts.sections.split(",") if s.strip()]
    for s in sections:
        if s not in ("overhead", "stop", "tree", "concurrency"):
            ap.error(f"unknown section {s!r}")
    opts.out.mkdir(parents=True, exist_ok=True)
    manager = user_manager_reachable()
    if not manager:
        log("no systemd user manager reachable: systemd modes are n/a (run through tests/harness/with-user-manager)")
    data = {
        "version": 1,
        "environment": environment_info(),
        "options": {k: v for k, v in vars(opts).items() if k != "out"},
    }
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        tmp = Path(tmp)
        for s in sections:
            t0 = time.monotonic()
            data[s] = {
                "overhead": section_overhead,
                "stop": section_stop,
                "tree": section_tree,
                "concurrency": section_concurrency,
            }[s](opts, manager, tmp)
            data[s]["section_seconds"] = round(time.monotonic() - t0, 1)
            log(f"{s} done in {data[s]['section_seconds']} s")
    note = plots(data, opts.out)
    if note:
        data["png"] = note
        log(note)
    (opts.out / "bench.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    print_report(data)
    return 0


def print_report(data):
    if "overhead" in data:
        print("\n## /bin/true overhead (ms)\n\n| runner | p50 | p95 | peak RSS p50 (MiB) |\n|---|---|---|---|")
        for n, s in data["overhead"]["seconds"].items():
            if "p50" in s:
                print(
                    f"| {n} | {s['p50'] * 1000:.1f} | {s['p95'] * 1000:.1f} | {s['rss_kib'].get('p50', 0) / 1024:.1f} |"
                )
            else:
                print(f"| {n} | n/a | n/a | n/a |")
        print("\n| ratio (of medians) | value |\n|---|---|")
        for k, v in data["overhead"]["ratios_of_medians"].items():
            print(f"| {k} | {v:.2f} |")
    if "stop" in data:
        print(f"\n## Stop latency, F5 --wall 200ms, {data['stop']['runs_per_mode']} runs/mode (ms)\n")
        print(
            "| mode | p50 | p95 | max | deadline→TERM p50 | exits | max survivors | unverified "
            "| peak RSS p50 (MiB) |\n|---|---|---|---|---|---|---|---|---|"
        )
        for m, s in data["stop"]["modes"].items():
            sl = s["stop_latency"]
            print(
                f"| {m} | {sl.get('p50', 0) * 1000:.1f} | {sl.get('p95', 0) * 1000:.1f} | "
                f"{sl.get('max', 0) * 1000:.1f} | {s['deadline_to_term'].get('p50', 0) * 1000:.1f} | "
                f"{','.join(s['exits'])} | {s['max_survivors']} | {s['unverified']} | "
                f"{s['rss_kib'].get('p50', 0) / 1024:.1f} |"
            )
    for key, label, sub in (("tree", "tree size", "sizes"), ("concurrency", "concurrent runs", "levels")):
        if key in data:
            print(f"\n## Stop latency vs {label} (ms, p50/p95; peak RSS p50 MiB)\n")
            levels = data[key][sub]
            modes = sorted(
                {m for lv in levels.values() for m in (lv["modes"] if "modes" in lv else lv)}, key=list(MODES).index
            )
            print(f"| {label} | " + " | ".join(modes) + " |\n|---|" + "---|" * len(modes))
            for x, lv in levels.items():
                lv = lv["modes"] if "modes" in lv else lv
                cells = []
                for m in modes:
                    s = lv[m]["stop_latency"]
                    extra = (
                        ""
                        if lv[m]["max_survivors"] == 0 and lv[m]["unverified"] == 0
                        else f" **survivors {lv[m]['max_survivors']}, unverified {lv[m]['unverified']}**"
                    )
                    cells.append(
                        f"{s.get('p50', 0) * 1000:.0f}/{s.get('p95', 0) * 1000:.0f} "
                        f"({lv[m]['rss_kib'].get('p50', 0) / 1024:.0f} MiB){extra}"
                    )
                print(f"| {x} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
