"""What a *waiting* run costs corral, per path: memory and CPU while the command sleeps.

N runs of ``sleep S`` in flight at once (N = 20 and N = 100), per path, side by
side with ``timeout`` and ``systemd-run --user --wait``. Once every run's
``sleep`` is running (and a short settle), a window of ``--window`` seconds:

- memory: Pss (and RSS, USS) of the path's OWN processes, per run, from
  /proc/PID/smaps_rollup at the window's end;
- CPU: utime+stime (/proc/PID/stat, clock ticks) of those processes at the
  window's start and end, as % of one core per run; also the scheduler's
  nanosecond clock (/proc/PID/schedstat) and voluntary context switches
  (wake-ups) per second per run.

A run's own processes: every process whose environment carries the run's
marker (``CORRAL_BENCH_MARKER=<uuid>``, inherited by everything the run
starts; systemd-run's unit gets it by ``--setenv``) and that is neither the
command (its /proc/PID/exe is the sleep binary: same device and inode) nor a
descendant of it. Never by name. For the served path the corral service is
shared by the N runs: its process tree (less the commands) is measured as a
whole and divided by N, on top of each run's client. What a systemd manager
spends on a unit is in no row (not a process of the run).

Paths: ``timeout`` (peer), corral ``--guarantee pidns``, ``--guarantee
subreaper``, ``--cgroup-mode fallback``; with ``--systemd`` (a user manager
reachable, e.g. inside tests/harness/with-user-manager) ``timeout`` again,
``systemd-run --user --wait --collect -q`` (peer), ``corral-enforced
--unit-type scope`` in-process (CORRAL_SERVICE=0) and through the corral
service (started here on a private socket, as bench/service_bench.py does);
with ``--cgroup-parent DIR`` too, corral's cgroup tier engine in that delegated
cgroup v2 directory (inside the harness: tests/run's ``corral-test-parent``).

At the end every run is sent SIGTERM by its pid (its runner stops it), then
whatever still carries a marker gets SIGKILL by pid, and every child is
waited for. Writes waiting.json (waiting-systemd.json with --systemd) and a
bar chart .png (when matplotlib is importable) into --out.

    python bench/waiting.py [--quick] [--n 20,100] [--window 10] [--out DIR]
    tests/harness/with-user-manager --layout hybrid -- python bench/waiting.py --systemd [--cgroup-parent DIR]
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import RESULTS, corral_argv, environment_info, start_service, user_manager_reachable

MARKER = "CORRAL_BENCH_MARKER"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


# ---------------------------------------------------------------- /proc


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _stat_fields(pid: int) -> list[bytes] | None:
    raw = _read(f"/proc/{pid}/stat")
    if not raw:
        return None
    return raw.rsplit(b")", 1)[1].split()  # [0] = state, [1] = ppid, [11] = utime, [12] = stime


def _ppid(pid: int) -> int | None:
    f = _stat_fields(pid)
    return int(f[1]) if f else None


def cpu_sample(pid: int) -> dict | None:
    """utime+stime (ticks), schedstat on-CPU ns, voluntary context switches."""
    f = _stat_fields(pid)
    if f is None or f[0] in (b"Z", b"X"):
        return None
    sched = _read(f"/proc/{pid}/schedstat")
    status = _read(f"/proc/{pid}/status") or b""
    vcs = 0
    for line in status.splitlines():
        if line.startswith(b"voluntary_ctxt_switches:"):
            vcs = int(line.split()[1])
    # threads: /proc/PID/stat's utime/stime already sum the thread group;
    # schedstat and ctxt switches are per task, so sum the tasks.
    sched_ns, vcs_all = 0, 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = []
    for tid in tids:
        s = _read(f"/proc/{pid}/task/{tid}/schedstat")
        if s:
            sched_ns += int(s.split()[0])
        st = _read(f"/proc/{pid}/task/{tid}/status") or b""
        for line in st.splitlines():
            if line.startswith(b"voluntary_ctxt_switches:"):
                vcs_all += int(line.split()[1])
    if not tids and sched:
        sched_ns, vcs_all = int(sched.split()[0]), vcs
    return {"ticks": int(f[11]) + int(f[12]), "sched_ns": sched_ns, "vcs": vcs_all, "threads": len(tids)}


def mem_sample(pid: int) -> dict | None:
    """KiB: Pss, Rss, USS (Private_Clean + Private_Dirty) from smaps_rollup; VmRSS as a fallback."""
    raw = _read(f"/proc/{pid}/smaps_rollup")
    out = {}
    if raw:
        for line in raw.splitlines():
            key, _, rest = line.partition(b":")
            if key in (b"Rss", b"Pss", b"Private_Clean", b"Private_Dirty"):
                out[key.decode()] = int(rest.split()[0])
    if "Pss" not in out:
        status = _read(f"/proc/{pid}/status") or b""
        for line in status.splitlines():
            if line.startswith(b"VmRSS:"):
                return {"rss": int(line.split()[1]), "pss": None, "uss": None}
        return None
    return {"rss": out["Rss"], "pss": out["Pss"], "uss": out.get("Private_Clean", 0) + out.get("Private_Dirty", 0)}


def wchan(pid: int) -> str:
    w = _read(f"/proc/{pid}/wchan")
    return (w or b"?").decode(errors="replace") or "0"


def _exe_id(pid: int) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _exe_id_of_path(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def scan_marked(markers: set[str]) -> dict[str, list[int]]:
    """marker -> pids of live processes whose environment carries it."""
    needles = {f"{MARKER}={m}".encode(): m for m in markers}
    found: dict[str, list[int]] = {m: [] for m in markers}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        f = _stat_fields(pid)
        if f is None or f[0] in (b"Z", b"X"):
            continue
        env = _read(f"/proc/{pid}/environ")
        if not env:
            continue
        for item in env.split(b"\0"):
            m = needles.get(item)
            if m is not None:
                found[m].append(pid)
                break
    return found


def descendants(root: int) -> list[int]:
    """root and every live descendant (from /proc/*/stat ppids)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            pp = _ppid(int(name))
            if pp is not None:
                children.setdefault(pp, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def split_run(pids: list[int], sleep_id: tuple[int, int]) -> tuple[list[int], list[int]]:
    """(the command's processes: sleep and its descendants, the run's own processes)."""
    commands = {p for p in pids if _exe_id(p) == sleep_id}
    ppid = {p: _ppid(p) for p in pids}

    def under_command(p: int) -> bool:
        seen = set()
        while p is not None and p not in seen:
            if p in commands:
                return True
            seen.add(p)
            p = ppid.get(p)
        return False

    own = [p for p in pids if not under_command(p)]
    return sorted(commands), sorted(own)


# ---------------------------------------------------------------- paths


def paths(systemd: bool, service_env: dict | None, cgroup_parent: str | None = None) -> dict[str, dict]:
    """name -> {argv(marker, S) -> list, env extra, peer?}."""
    corral = corral_argv()
    enforced = [str(Path(sys.executable).parent / "corral-enforced")]
    if not os.path.exists(enforced[0]):
        enforced = [
            sys.executable,
            "-c",
            "import sys; from corral_systemd.cli import main; "
            "sys.exit(main(prog='corral-enforced', default_mode='enforced'))",
        ]

    def runner(prefix: list[str], *opts: str):
        return lambda m, s, w: [*prefix, *opts, "--quiet", "--wall", f"{w}s", "--", "sleep", str(s)]

    out: dict[str, dict] = {
        "timeout": {"argv": lambda m, s, w: ["timeout", str(w), "sleep", str(s)], "env": {}},
    }
    if not systemd:
        out["corral pidns"] = {"argv": runner(corral, "--guarantee", "pidns"), "env": {}}
        out["corral subreaper"] = {"argv": runner(corral, "--guarantee", "subreaper"), "env": {}}
        out["corral fallback"] = {"argv": runner(corral, "--cgroup-mode", "fallback"), "env": {}}
        return out
    out["systemd-run"] = {
        "argv": lambda m, s, w: [
            *("systemd-run", "--user", "--wait", "--collect", "-q", f"--setenv={MARKER}={m}"),
            *("-p", f"RuntimeMaxSec={w}", "sleep", str(s)),
        ],
        "env": {},
    }
    out["corral-enforced scope (in-process)"] = {
        "argv": runner(enforced, "--unit-type", "scope"),
        "env": {"CORRAL_SERVICE": "0"},
    }
    if cgroup_parent is not None:
        tier = runner(corral, "--cgroup-parent", cgroup_parent)
        out["corral --cgroup-parent (cgroup tier)"] = {"argv": tier, "env": {}}
    if service_env is not None:
        out["corral-enforced scope (served)"] = {
            "argv": runner(enforced, "--unit-type", "scope"),
            "env": service_env,
            "served": True,
            "client": enforced[0],
        }
    return out


# ---------------------------------------------------------------- one batch


def stop_all(procs: dict[str, subprocess.Popen], markers: set[str], grace: float = 60.0) -> dict:
    """SIGTERM each runner by pid, wait; SIGKILL by pid whatever still carries a marker; reap."""
    for p in procs.values():
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
        time.sleep(0.05)
    killed = 0
    for _ in range(20):
        left = [pid for pids in scan_marked(markers).values() for pid in pids]
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    for p in procs.values():
        if p.poll() is None:
            p.kill()
        p.wait()
    left = [pid for pids in scan_marked(markers).values() for pid in pids]
    return {"sigkilled_after_term": killed, "left": left}


def batch(name: str, spec: dict, n: int, args, sleep_id, service_pid: int | None) -> dict:
    markers = [uuid.uuid4().hex for _ in range(n)]
    procs: dict[str, subprocess.Popen] = {}
    base_env = {k: v for k, v in os.environ.items() if k != MARKER}
    row = {"path": name, "n": n, "notes": []}
    t0 = time.monotonic()
    try:
        for m in markers:
            argv = spec["argv"](m, args.sleep, args.wall)
            with open(os.path.join(args.work, f"{m}.err"), "wb") as err:
                procs[m] = subprocess.Popen(
                    argv,
                    env={**base_env, **spec["env"], MARKER: m},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    cwd="/",
                )
        # wait until every run's command is running
        deadline = time.monotonic() + args.start_timeout
        while True:
            found = scan_marked(set(markers))
            started = sum(1 for m in markers if any(_exe_id(p) == sleep_id for p in found[m]))
            if started == n:
                break
            dead = [m for m in markers if procs[m].poll() is not None]
            if dead:
                err = Path(args.work, f"{dead[0]}.err").read_text(errors="replace").strip()[-300:]
                raise RuntimeError(
                    f"{name}: {len(dead)} runner(s) exited before their command ran "
                    f"(first: exit {procs[dead[0]].returncode}: {err})"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: only {started}/{n} commands running after {args.start_timeout}s")
            time.sleep(0.2)
        row["start_s"] = round(time.monotonic() - t0, 2)
        time.sleep(args.settle)
        # identify the run's own processes (once, before the window)
        found = scan_marked(set(markers))
        own: dict[str, list[int]] = {}
        command: dict[str, list[int]] = {}
        for m in markers:
            command[m], own[m] = split_run(found[m], sleep_id)
        svc_pids: list[int] = []
        counted = markers  # the runs the per-run figures are over
        if spec.get("served") and service_pid is not None:
            all_cmd = {p for c in command.values() for p in c}
            svc_pids = [p for p in descendants(service_pid) if p not in all_cmd and _exe_id(p) != sleep_id]
            # a served run's runner stays the compiled client; one the service did not take
            # exec'd corral-inprocess (this interpreter): told apart by /proc/PID/exe, not by name
            client_id = _exe_id_of_path(spec["client"])
            counted = [m for m in markers if _exe_id(procs[m].pid) == client_id]
            if len(counted) < n:
                row["notes"].append(
                    f"{n - len(counted)} of {n} runs were NOT served (ran in-process): left out of this row's figures"
                )
            row["served_runs"] = len(counted)
            if not counted:
                raise RuntimeError(f"{name}: no run was served")
        run_pids = [p for m in counted for p in own[m]]
        top_pids = [procs[m].pid for m in counted if procs[m].pid in own[m]]
        all_own = run_pids + svc_pids
        k = len(counted)
        # the window
        before = {p: cpu_sample(p) for p in all_own}
        w0 = time.monotonic()
        time.sleep(args.window)
        after = {p: cpu_sample(p) for p in all_own}
        window = time.monotonic() - w0
        mem = {p: mem_sample(p) for p in all_own}
        chans: dict[str, int] = {}
        for p in all_own:
            chans[wchan(p)] = chans.get(wchan(p), 0) + 1
        # every command still the same and running?
        found_end = scan_marked(set(markers))
        gone = [m for m in markers if not set(command[m]) <= set(found_end[m])]
        if gone:
            row["notes"].append(f"{len(gone)} run(s) lost a command during the window")
        vanished = [p for p in all_own if after[p] is None or before[p] is None]
        if vanished:
            row["notes"].append(f"{len(vanished)} own process(es) gone during the window (not counted)")

        def total(samples: dict, key: str, pids: list[int]) -> float:
            return sum(samples[p][key] for p in pids if samples.get(p) and samples[p].get(key) is not None)

        def cpu_delta(key: str, pids: list[int]) -> float:
            return sum(after[p][key] - before[p][key] for p in pids if before.get(p) and after.get(p))

        per_run = {
            "rss_per_run_kib": total(mem, "rss", all_own) / k,
            "pss_per_run_kib": total(mem, "pss", all_own) / k,
            "uss_per_run_kib": total(mem, "uss", all_own) / k,
            "cpu_pct_per_run": cpu_delta("ticks", all_own) / CLK_TCK / window / k * 100,
            "cpu_pct_per_run_schedstat": cpu_delta("sched_ns", all_own) / 1e9 / window / k * 100,
            "wakeups_per_s_per_run": cpu_delta("vcs", all_own) / window / k,
        }
        row.update({key: round(v, 4 if key.startswith("cpu") else 1) for key, v in per_run.items()})
        counts = sorted({len(own[m]) for m in counted})
        row["own_processes_per_run"] = counts[0] if len(counts) == 1 else counts
        # how many of them run the Python interpreter (by /proc/PID/exe, device and inode, as startup.py)
        python_id = _exe_id_of_path(os.path.realpath(sys.executable))
        py_counts = sorted({sum(1 for p in own[m] if _exe_id(p) == python_id) for m in counted})
        row["python_processes_per_run"] = py_counts[0] if len(py_counts) == 1 else py_counts
        row["own_threads_per_run"] = round(sum(after[p]["threads"] for p in run_pids if after.get(p)) / k, 2)
        # the runner the benchmark started (corral, timeout, systemd-run, the client) against the rest
        # of the run's own processes (pidns init, tethers)
        others = [p for p in run_pids if p not in set(top_pids)]
        row["breakdown_pss_per_run_kib"] = {
            "runner": round(total(mem, "pss", top_pids) / k, 1),
            "its other processes": round(total(mem, "pss", others) / k, 1),
            **({"service share": round(total(mem, "pss", svc_pids) / k, 1)} if svc_pids else {}),
        }
        row["exe_of_own_processes"] = sorted({os.path.realpath(f"/proc/{p}/exe") for p in all_own if _exe_id(p)})
        row["wchan"] = dict(sorted(chans.items(), key=lambda kv: -kv[1]))
        row["window_s"] = round(window, 2)
        if svc_pids:
            svc_mem = {p: mem[p] for p in svc_pids}
            row["service"] = {
                "pids": len(svc_pids),
                "python_pids": sum(1 for p in svc_pids if _exe_id(p) == python_id),
                "threads": sum(after[p]["threads"] for p in svc_pids if after.get(p)),
                "pss_total_kib": total(svc_mem, "pss", svc_pids),
                "rss_total_kib": total(svc_mem, "rss", svc_pids),
                "cpu_pct_total": round(cpu_delta("ticks", svc_pids) / CLK_TCK / window * 100, 3),
                "cpu_pct_total_schedstat": round(cpu_delta("sched_ns", svc_pids) / 1e9 / window * 100, 3),
                "wakeups_per_s_total": round(cpu_delta("vcs", svc_pids) / window, 1),
            }
            row["clients_only"] = {
                "pss_per_run_kib": round(total(mem, "pss", run_pids) / k, 1),
                "rss_per_run_kib": round(total(mem, "rss", run_pids) / k, 1),
                "cpu_pct_per_run_schedstat": round(cpu_delta("sched_ns", run_pids) / 1e9 / window / k * 100, 4),
            }
            row["notes"].append(
                "per-run figures: each served run's client plus the service's whole tree "
                "(less the commands) divided by the runs served"
            )
    except Exception as exc:  # a path that cannot run here: said, not fatal
        row["error"] = str(exc)
    finally:
        row["teardown"] = stop_all(procs, set(markers))
    if not row["notes"]:
        del row["notes"]
    return row


def ratios(rows: list[dict]) -> dict:
    by = {r["path"]: r for r in rows if "error" not in r}
    out = {}
    for peer in ("timeout", "systemd-run"):
        if peer not in by:
            continue
        base = by[peer]
        for r in rows:
            if r["path"] == peer or "error" in r:
                continue
            entry = {}
            for key in ("pss_per_run_kib", "rss_per_run_kib", "cpu_pct_per_run_schedstat", "wakeups_per_s_per_run"):
                entry[key] = round(r[key] / base[key], 2) if base[key] else None
            out.setdefault(f"vs {peer}", {})[r["path"]] = entry
    return out


def plot(result: dict, png: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not importable: no PNG"
    ns = list(result["results"])
    names = []
    for n in ns:
        for r in result["results"][n]["rows"]:
            if "error" not in r and r["path"] not in names:
                names.append(r["path"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    width = 0.8 / max(1, len(ns))
    for ax, key, label in (
        (axes[0], "pss_per_run_kib", "Pss per waiting run (MiB)"),
        (axes[1], "cpu_pct_per_run_schedstat", "CPU per waiting run (% of one core)"),
    ):
        for i, n in enumerate(ns):
            rows = {r["path"]: r for r in result["results"][n]["rows"] if "error" not in r}
            vals = [rows[p][key] / (1024 if key.startswith("pss") else 1) if p in rows else 0 for p in names]
            xs = [j + i * width for j in range(len(names))]
            ax.bar(xs, vals, width, label=f"N = {n}")
            for x, v in zip(xs, vals, strict=True):
                ax.text(x, v, f"{v:.2f}" if key.startswith("cpu") else f"{v:.1f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks([j + width * (len(ns) - 1) / 2 for j in range(len(names))])
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"waiting `sleep`, runner's own processes only; window {result['params']['window_s']} s"
        + (" (systemd user manager)" if result["params"]["systemd"] else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return None


def source_info() -> dict:
    """Which corral was measured: the work tree's commit and its uncommitted corral_systemd files."""
    root = str(Path(__file__).resolve().parent.parent)
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--", "corral_systemd", "bin", "packaging"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if head.returncode != 0:
        return {}
    return {"git_head": head.stdout.strip(), "uncommitted": dirty.stdout.splitlines()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="20,100", help="runs in flight, comma separated (default 20,100)")
    parser.add_argument("--window", type=float, default=10.0, help="measurement window, s (default 10)")
    parser.add_argument("--settle", type=float, default=2.0, help="wait after the last command started, s")
    parser.add_argument("--sleep", type=int, default=90, help="S in `sleep S` (killed at the end anyway)")
    parser.add_argument("--start-timeout", type=float, default=90.0)
    parser.add_argument("--quick", action="store_true", help="N = 5, 3 s window, 1 s settle")
    parser.add_argument(
        "--systemd",
        action="store_true",
        help="the systemd paths (needs a user manager: run inside tests/harness/with-user-manager)",
    )
    parser.add_argument("--no-service", action="store_true", help="with --systemd: leave the served path out")
    parser.add_argument(
        "--cgroup-parent",
        metavar="DIR",
        help="with --systemd: also the cgroup tier's engine, its runs in this delegated cgroup v2 directory",
    )
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    if args.quick:
        args.n, args.window, args.settle, args.sleep = "5", 3.0, 1.0, 30
    ns = [int(x) for x in args.n.split(",")]
    source = source_info()
    args.wall = args.sleep + 60
    sleep_bin = shutil.which("sleep")
    sleep_id = (os.stat(sleep_bin).st_dev, os.stat(sleep_bin).st_ino)

    left_out = {}
    if args.systemd and not user_manager_reachable():
        print("waiting.py --systemd: no user manager (run inside tests/harness/with-user-manager)", file=sys.stderr)
        return 2
    if not args.systemd:
        left_out["systemd-run, corral-enforced (unit tier), served"] = (
            "no user manager here: run with --systemd inside the harness"
        )

    avail_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            avail_kib = int(line.split()[1])
    need_kib = max(ns) * 40 * 1024  # generous: ~40 MiB RSS per corral run
    if avail_kib < need_kib * 2:
        ns = [n for n in ns if n * 40 * 1024 * 2 <= avail_kib] or [min(ns)]
        left_out["larger N"] = f"MemAvailable {avail_kib // 1024} MiB is too little for {max(ns)} runs"

    work = args.work = tempfile.mkdtemp(prefix="corral-waiting-bench-")
    service = None
    service_env = None
    try:
        if args.systemd and not args.no_service:
            sock = os.path.join(work, "io.corral.Run")
            service = start_service(sock, max(64, max(ns)), env={k: v for k, v in os.environ.items() if k != MARKER})
            service_env = {"CORRAL_SERVICE_SOCKET": sock}
            # warm the service (its manager connection) with one short run
            subprocess.run(
                [str(Path(sys.executable).parent / "corral-enforced"), "--quiet", "--", "true"],
                env={**os.environ, **service_env},
                check=False,
                timeout=60,
            )
        elif args.systemd:
            left_out["corral-enforced scope (served)"] = "--no-service"
        specs = paths(args.systemd, service_env, args.cgroup_parent if args.systemd else None)
        t_start = time.monotonic()
        results = {}
        for n in ns:
            rows = []
            for name, spec in specs.items():
                print(f"N={n:<4} {name} ...", end=" ", flush=True)
                row = batch(name, spec, n, args, sleep_id, service.pid if service else None)
                rows.append(row)
                if "error" in row:
                    print(f"error: {row['error']}", flush=True)
                else:
                    print(
                        f"start {row['start_s']}s  Pss {row['pss_per_run_kib']:.0f} KiB/run  RSS "
                        f"{row['rss_per_run_kib']:.0f} KiB/run  CPU {row['cpu_pct_per_run_schedstat']:.4f} %/run  "
                        f"wake-ups {row['wakeups_per_s_per_run']:.2f}/s/run",
                        flush=True,
                    )
            results[str(n)] = {"rows": rows, "ratios": ratios(rows)}
        elapsed = time.monotonic() - t_start
    finally:
        if service is not None:
            service.terminate()
            try:
                service.wait(timeout=60)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait()
        shutil.rmtree(work, ignore_errors=True)

    result = {
        "what": "a waiting run's own processes (not the command's), per run, N runs of `sleep` in flight",
        "params": {
            "n": ns,
            "window_s": args.window,
            "settle_s": args.settle,
            "sleep_s": args.sleep,
            "wall_s": args.wall,
            "systemd": args.systemd,
            "quick": args.quick,
            "clk_tck": CLK_TCK,
            "service_max_runs": max(64, max(ns)) if service is not None else None,
            "elapsed_s": round(elapsed, 1),
        },
        "method": {
            "identification": f"{MARKER}=<uuid per run> in /proc/PID/environ; the command is the process whose "
            "/proc/PID/exe is the sleep binary (device+inode) and its descendants; every other marked process is "
            "the runner's own; served: plus the corral service's tree less the commands, divided by N",
            "memory": "smaps_rollup at the window's end: Pss (shared pages divided among their mappers), Rss, "
            "USS = Private_Clean+Private_Dirty",
            "cpu": "cpu_pct_per_run: utime+stime delta (clock ticks) over the window; cpu_pct_per_run_schedstat: "
            "the same from /proc/PID/task/*/schedstat (ns); % of one core per run",
            "not_counted": "what a systemd manager (and dbus) spends on a unit: no process of the run",
        },
        "environment": {**environment_info(), **source, "source_at": "the benchmark's start"},
        "results": results,
        "left_out": left_out,
    }
    os.makedirs(args.out, exist_ok=True)
    stem = "waiting-systemd" if args.systemd else "waiting"
    if args.quick:
        stem += "-quick"
    path = os.path.join(args.out, f"{stem}.json")
    why_no_png = plot(result, os.path.join(args.out, f"{stem}.png"))
    if why_no_png:
        result["left_out"]["png"] = why_no_png
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    for n, res in results.items():
        for peer, table in res["ratios"].items():
            for p, r in table.items():
                cpu = r["cpu_pct_per_run_schedstat"]
                cpu_text = f"x{cpu}" if cpu is not None else "n/a (the peer spends none)"
                print(f"N={n:<4} {p:38} {peer:15} Pss x{r['pss_per_run_kib']}  CPU {cpu_text}")
    for what, why in left_out.items():
        print(f"left out: {what}: {why}")
    print(f"-> {path} ({elapsed:.0f} s)")
    bad = [r for res in results.values() for r in res["rows"] if r["teardown"]["left"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
