#!/usr/bin/env python3
"""The fault matrix: every fault program under every runner.

Runners (wall 2 s, as in faults/manifest.json):
  corral-scope     corral --cgroup-mode enforced --unit-type scope
  corral-service   corral --cgroup-mode enforced --unit-type service
  corral-fallback  corral --cgroup-mode fallback
  timeout          timeout -k 1s 2s
  naive            bench/naive_runner.py 2  (subprocess.run(timeout=2): kills only its direct child)
  systemd-run      systemd-run --user --wait --collect --pipe -q -p RuntimeMaxSec=2

Each cell: exit status / most processes left behind (max over reps). The
survivors are found right after the runner returns, by the run's
CORRAL_TEST_MARKER in /proc/*/environ (tests/procscan.py), then SIGKILLed by
pid. A runner that has not returned within --hang-after seconds is a "hang":
the processes carrying the marker at that moment (other than the runner) are
counted, then the runner and they are SIGKILLed by pid. A runner this
machine cannot run (no user manager) shows "n/a".

Writes OUT/compare.json, OUT/compare.md and OUT/compare.png (if matplotlib
is importable). OUT defaults to bench/results.
"""

import argparse
import collections
import json
import os
import shutil
import signal
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
    manifest,
    marked_pids,
    new_marker,
    user_manager_reachable,
)

RUNNERS = ["corral-scope", "corral-service", "corral-fallback", "timeout", "naive", "systemd-run"]
LABELS = {
    "corral-scope": "corral enforced/scope",
    "corral-service": "corral enforced/service",
    "corral-fallback": "corral fallback",
    "timeout": "timeout -k 1s 2s",
    "naive": "naive runner (kills direct child only)",
    "systemd-run": "systemd-run --user --wait -p RuntimeMaxSec",
}


def fault_argv_for(runner: str, fault: dict, marker: str) -> list[str]:
    args = fault["args"]
    wall = args.get("wall", "2s")
    seconds = float(wall.rstrip("s"))
    target = str(FAULTS / fault["file"])
    if runner.startswith("corral-"):
        mode = {
            "corral-scope": ["--cgroup-mode", "enforced", "--unit-type", "scope"],
            "corral-service": ["--cgroup-mode", "enforced", "--unit-type", "service"],
            "corral-fallback": ["--cgroup-mode", "fallback"],
        }[runner]
        flags = []
        for key, value in args.items():
            flags += [f"--{key.replace('_', '-')}", str(value)]
        return corral_argv() + mode + flags + ["--quiet", "--", target]
    if runner == "timeout":
        return ["timeout", "-k", "1s", wall, target]
    if runner == "naive":
        return [sys.executable, str(BENCH / "naive_runner.py"), str(seconds), target]
    if runner == "systemd-run":
        # The user manager gives units its own small environment, so the
        # marker is passed explicitly (corral passes the caller's environment).
        argv = [
            "systemd-run",
            "--user",
            "--wait",
            "--collect",
            "--pipe",
            "-q",
            "-p",
            f"RuntimeMaxSec={wall}",
            f"--setenv={MARKER_ENV}={marker}",
        ]
        if "mem" in args:
            argv += ["-p", f"MemoryMax={args['mem']}"]
        return argv + [target]
    raise ValueError(runner)


def availability(runners: list[str]) -> dict:
    manager = user_manager_reachable()
    out = {}
    for runner in runners:
        if runner in ("corral-scope", "corral-service", "systemd-run") and not manager:
            out[runner] = "no systemd user manager reachable"
        elif runner == "timeout" and shutil.which("timeout") is None:
            out[runner] = "timeout(1) not installed"
        elif runner == "systemd-run" and shutil.which("systemd-run") is None:
            out[runner] = "systemd-run not installed"
        else:
            out[runner] = None
    return out


def run_once(argv: list[str], marker: str, hang_after: float, logdir: Path) -> dict:
    env = dict(os.environ)
    env[MARKER_ENV] = marker
    log = open(logdir / f"{marker}.log", "wb")
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    hung = False
    try:
        proc.wait(timeout=hang_after)
    except subprocess.TimeoutExpired:
        hung = True
    elapsed = time.monotonic() - start
    if hung:
        survivors = [p for p in marked_pids(marker) if p != proc.pid]
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    else:
        # Two looks, 100 ms apart, the larger counts: a leftover that is still
        # being forked at the first look (a double fork in flight) is seen at
        # the second. Same rule for every runner.
        survivors = marked_pids(marker)
        time.sleep(0.1)
        later = marked_pids(marker)
        survivors = later if len(later) > len(survivors) else survivors
    kill_marked(marker)
    log.close()
    tail = (logdir / f"{marker}.log").read_bytes()[-400:].decode(errors="replace")
    return {
        "exit": "hang" if hung else exit_status(proc.returncode),
        "survivors": len(survivors),
        "elapsed": round(elapsed, 3),
        "tail": tail,
    }


def cell_text(cell: dict) -> str:
    if cell.get("na"):
        return "n/a"
    counts = collections.Counter(str(e) for e in cell["exits"])
    exits = "|".join(k for k, _ in counts.most_common())
    return f"{exits}/{max(cell['survivors'])}"


def write_markdown(data: dict, path: Path) -> None:
    runners = data["runners"]
    lines = [
        "# Fault matrix",
        "",
        f"Cells: exit status / most processes left behind over {data['reps']} rep(s) "
        f"(`a|b` = differing exit statuses, most common first; `hang` = runner had not returned "
        f"after {data['hang_after']} s; `n/a` = runner unavailable here).",
        "",
        "| fault | expected | " + " | ".join(LABELS[r] for r in runners) + " |",
        "|---|---|" + "---|" * len(runners),
    ]
    for fault in data["faults"]:
        fid = fault["id"]
        row = [f"{fid} {fault['file'].split('-', 1)[1]}", str(fault["expected_exit"])]
        for runner in runners:
            cell = data["cells"][fid][runner]
            text = cell_text(cell)
            bad = not cell.get("na") and (max(cell["survivors"]) > 0 or "hang" in text)
            row.append(f"**{text}**" if bad else text)
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Median seconds until the runner returned:",
        "",
        "| fault | " + " | ".join(runners) + " |",
        "|---|" + "---|" * len(runners),
    ]
    for fault in data["faults"]:
        fid = fault["id"]
        row = [fid]
        for runner in runners:
            cell = data["cells"][fid][runner]
            row.append("n/a" if cell.get("na") else f"{statistics.median(cell['elapsed']):.2f}")
        lines.append("| " + " | ".join(row) + " |")
    unavailable = {r: w for r, w in data["unavailable"].items() if w}
    if unavailable:
        lines += ["", "Unavailable: " + "; ".join(f"{r}: {w}" for r, w in unavailable.items())]
    env = data["environment"]
    lines += [
        "",
        f"Environment: Python {env['python']}, kernel {env['kernel']}, {env['cpus']} CPUs, "
        f"{env.get('systemd')}, harness layout {env.get('harness_layout')}.",
    ]
    path.write_text("\n".join(lines) + "\n")


def write_png(data: dict, path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        return "matplotlib not importable; PNG skipped"
    runners, faults = data["runners"], [f["id"] for f in data["faults"]]
    grid = np.full((len(faults), len(runners)), np.nan)
    for i, fid in enumerate(faults):
        for j, runner in enumerate(runners):
            cell = data["cells"][fid][runner]
            if not cell.get("na"):
                grid[i, j] = max(cell["survivors"])
    fig, ax = plt.subplots(figsize=(1.6 * len(runners) + 2, 0.45 * len(faults) + 1.8))
    cmap = plt.get_cmap("Reds").copy()
    cmap.set_bad("#dddddd")
    vmax = max(1.0, np.nanmax(grid) if np.isfinite(grid).any() else 1.0)
    ax.imshow(np.ma.masked_invalid(np.log1p(grid)), cmap=cmap, vmin=0, vmax=np.log1p(vmax), aspect="auto")
    for i, fid in enumerate(faults):
        for j, runner in enumerate(runners):
            ax.text(j, i, cell_text(data["cells"][fid][runner]), ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(runners)), [LABELS[r].replace(" (", "\n(") for r in runners], fontsize=7)
    ax.set_yticks(range(len(faults)), [f"{f['id']} {f['file'].split('-', 1)[1]}" for f in data["faults"]], fontsize=8)
    ax.set_title(f"Processes left behind (cell: exit/survivors, max of {data['reps']} reps; grey = n/a)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--faults", help="comma-separated ids, e.g. F1,F4 (default: all)")
    ap.add_argument("--runners", help="comma-separated subset of: " + ",".join(RUNNERS))
    ap.add_argument("--hang-after", type=float, default=10.0, help="seconds before a runner counts as hung")
    ap.add_argument("--out", type=Path, default=RESULTS, help="output directory (default bench/results)")
    opts = ap.parse_args(argv)

    man = manifest()
    faults = man["faults"]
    if opts.faults:
        wanted = [f.strip() for f in opts.faults.split(",") if f.strip()]
        unknown = set(wanted) - {f["id"] for f in faults}
        if unknown:
            ap.error(f"unknown fault(s): {', '.join(sorted(unknown))}")
        faults = [f for f in faults if f["id"] in wanted]
    runners = RUNNERS if not opts.runners else [r.strip() for r in opts.runners.split(",")]
    for runner in runners:
        if runner not in RUNNERS:
            ap.error(f"unknown runner {runner!r}")
    unavailable = availability(runners)
    opts.out.mkdir(parents=True, exist_ok=True)

    cells = {
        f["id"]: {
            r: (
                {"na": True, "why": unavailable[r]}
                if unavailable[r]
                else {"exits": [], "survivors": [], "elapsed": [], "tails": []}
            )
            for r in runners
        }
        for f in faults
    }
    missing_tools = {f["id"]: [t for t in f.get("requires", []) if shutil.which(t) is None] for f in faults}
    with tempfile.TemporaryDirectory(prefix="corral-compare-") as tmp:
        logdir = Path(tmp)
        for rep in range(opts.reps):
            for fault in faults:
                for runner in runners:
                    cell = cells[fault["id"]][runner]
                    if cell.get("na"):
                        continue
                    if missing_tools[fault["id"]]:
                        cells[fault["id"]][runner] = {"na": True, "why": f"needs {missing_tools[fault['id']]}"}
                        continue
                    marker = new_marker()
                    result = run_once(fault_argv_for(runner, fault, marker), marker, opts.hang_after, logdir)
                    cell["exits"].append(result["exit"])
                    cell["survivors"].append(result["survivors"])
                    cell["elapsed"].append(result["elapsed"])
                    if result["exit"] != fault["expected_exit"] or result["survivors"]:
                        cell["tails"].append(result["tail"])
                    print(
                        f"rep {rep + 1}/{opts.reps} {fault['id']:>3} {runner:<16} exit={result['exit']!s:<4} "
                        f"survivors={result['survivors']:<3} {result['elapsed']:.2f}s",
                        file=sys.stderr,
                        flush=True,
                    )
    for fid in cells:
        for cell in cells[fid].values():
            cell["cell"] = cell_text(cell)
            if "tails" in cell:
                cell["tails"] = cell["tails"][:2]
    data = {
        "version": 1,
        "reps": opts.reps,
        "hang_after": opts.hang_after,
        "runners": runners,
        "runner_labels": {r: LABELS[r] for r in runners},
        "runner_argv": {r: fault_argv_for(r, {"args": {"wall": "2s"}, "file": "FAULT"}, "MARKER") for r in runners},
        "unavailable": unavailable,
        "faults": [{k: f[k] for k in ("id", "file", "args", "expected_exit", "exit_under_timeout")} for f in faults],
        "cells": cells,
        "environment": environment_info(),
    }
    note = write_png(data, opts.out / "compare.png")
    if note:
        data["png"] = note
        print(f"compare: {note}", file=sys.stderr)
    (opts.out / "compare.json").write_text(json.dumps(data, indent=1) + "\n")
    write_markdown(data, opts.out / "compare.md")
    print((opts.out / "compare.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
