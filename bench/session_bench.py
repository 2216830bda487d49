"""Background runs and sessions against what agents' runners do today, same invocation.

Two figures (issue 27):
1. start to ready: ``corral --background --ready-port P -- python3 -m http.server P``,
   alone and in a session (its corral then started by the session's holder), against
   ``nohup python3 -m http.server P & until nc -z 127.0.0.1 P; do sleep 0.01; done``
   (the shell idiom, its poll included; issue 38's peer), the same server on each
   side, interleaved round by round (the order rotating each round). Reported: the
   ratio of the medians (issue 38's measure: at most 1.2) and the median of the
   rounds' ratios; and the front's voluntary context switches per start (its
   waits: issue 38's "a waiting run costs nothing"). Each server is stopped
   between rounds (the nohup one by its pid, corral's with corralctl stop), untimed.
   Two servers, each timed on every side: one that says it listens at once
   (``PYTHONUNBUFFERED=1``: its line reaches the log, which wakes corral's
   front; ``start_to_ready``) and one that says nothing (its output buffered,
   as a Python server's is unless told: only corral's timed looks find it;
   ``start_to_ready_silent``). The environment's own ``PYTHONUNBUFFERED`` is
   not what decides it.
2. ``corralctl session end`` latency with N background runs (default 20), each a
   ``sleep`` and a TERM-ignoring ``setsid`` daemon, against ``kill``-ing as many
   ``nohup``'d pids by number (what the shell does, with no proof); the session's
   end also proves every process gone.

3. waiting: N background ``sleep`` runs in one session, what corral's own
   processes cost while they wait (Pss and USS per run, beyond the holder and
   with it; CPU over a window): issue 38's "20 background runs <= 2 MiB each
   beyond the session's process".

Any mode corral picks (fallback on a plain machine; a session's slice and holder
unit where a manager answers). Survivors are counted by the run marker in /proc
(never names) and must be 0. Writes bench/results/session-<mode>.json.
"""

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from common import MARKER_ENV as MARKER
from common import RESULTS, corral_argv, environment_info, kill_marked, marked_pids, new_marker

CTL = [sys.executable, "-m", "corral_systemd.ctl"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server(port: int) -> list[str]:
    return [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]


PEER = "nohup+nc"


def peer(port: int, env: dict) -> float:
    """The shell idiom's seconds from start to ready; its server then killed by pid."""
    t = time.perf_counter()
    shell = subprocess.run(
        [
            "sh",
            "-c",
            f"nohup {' '.join(server(port))} >/dev/null 2>&1 & echo $!; "
            f"until nc -z 127.0.0.1 {port}; do sleep 0.01; done",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    elapsed = time.perf_counter() - t
    os.kill(int(shell.stdout.split()[0]), 9)
    return elapsed


def background(port: int, env: dict, corral: list[str], wakeups: list[int]) -> float:
    """``corral --background --ready-port``'s seconds from start to ready (and, in
    ``wakeups``, the front's voluntary context switches: its waits); the run then
    stopped with corralctl stop and every marked process seen gone."""
    marker = new_marker()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_nvcsw
    t = time.perf_counter()
    run = subprocess.run(
        [*corral, "--background", "--ready-port", str(port), "--", *server(port)],
        capture_output=True,
        text=True,
        env=dict(env, **{MARKER: marker}),
    )
    elapsed = time.perf_counter() - t
    wakeups.append(resource.getrusage(resource.RUSAGE_CHILDREN).ru_nvcsw - before)  # the front alone was reaped
    assert run.returncode == 0, run.stderr
    subprocess.run([*CTL, "stop", run.stdout.strip()], capture_output=True, env=env, check=True)
    # The stop returns once the run is proven gone; its corral (marked too) may still be exiting.
    gone_by = time.monotonic() + 10
    while marked_pids(marker) and time.monotonic() < gone_by:
        time.sleep(0.02)
    assert marked_pids(marker) == [], "corral --background left a process"
    return elapsed


def start_to_ready(rounds: int, env: dict, session: str, also: list[str], announcing: bool = True) -> dict:
    """``also``: other corral programs (another build: before and after a change) timed
    in the same rounds, alone, as ``corral --background [PATH]``. ``announcing``: the
    server's line reaches its log at once (else its output is buffered: it says nothing)."""
    env = dict(env)
    if announcing:
        env["PYTHONUNBUFFERED"] = "1"
    else:
        env.pop("PYTHONUNBUFFERED", None)
    variants = {
        "corral --background": corral_argv(),
        "corral --background, in a session": [*corral_argv(), "--session", session],
    }
    variants.update({f"corral --background [{path}]": [path] for path in also})
    times: dict[str, list[float]] = {PEER: [], **{name: [] for name in variants}}
    wakeups: dict[str, list[int]] = {name: [] for name in variants}
    order = [PEER, *variants]
    for n in range(rounds):
        for name in order[n % len(order) :] + order[: n % len(order)]:
            port = free_port()
            if name == PEER:
                times[name].append(peer(port, env))
            else:
                times[name].append(background(port, env, variants[name], wakeups[name]))
    out: dict = {
        name: {"p50_ms": statistics.median(v) * 1e3, "max_ms": max(v) * 1e3, "rounds_ms": [x * 1e3 for x in v]}
        for name, v in times.items()
    }
    for name, counts in wakeups.items():
        out[name]["front_wakeups_p50"] = statistics.median(counts)
    peer_p50 = statistics.median(times[PEER])
    out["ratio_of_medians"] = {name: statistics.median(times[name]) / peer_p50 for name in variants}
    out["ratio_to_nohup_nc"] = {
        name: statistics.median(a / b for a, b in zip(times[name], times[PEER], strict=True)) for name in variants
    }
    return out


def session_end(runs: int, env: dict) -> dict:
    daemon = "setsid sh -c 'trap \"\" TERM; while :; do sleep 1; done' & trap '' TERM; sleep 1000"
    # The shell way: nohup'd jobs, killed by pid number (no proof, daemons escape).
    pids = []
    shell_marker = new_marker()
    for _ in range(runs):
        p = subprocess.Popen(
            ["nohup", "sh", "-c", daemon],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(env, **{MARKER: shell_marker}),
        )
        pids.append(p)
    time.sleep(0.5)
    t = time.perf_counter()
    for p in pids:
        p.kill()
    for p in pids:
        p.wait()
    kill_elapsed = time.perf_counter() - t
    time.sleep(0.2)
    left_by_kill = len(marked_pids(shell_marker))  # their setsid daemons: the point of the comparison
    kill_marked(shell_marker)
    marker = new_marker()
    sid = subprocess.run([*CTL, "session", "start"], capture_output=True, text=True, env=env, check=True).stdout.strip()
    for _ in range(runs):
        r = subprocess.run(
            [*corral_argv(), "--session", sid, "--background", "--grace", "0.5s", "--", "sh", "-c", daemon],
            capture_output=True,
            text=True,
            env=dict(env, **{MARKER: marker}),
        )
        assert r.returncode == 0, r.stderr
    alive = len(marked_pids(marker))
    t = time.perf_counter()
    end = subprocess.run([*CTL, "session", "end", sid], capture_output=True, text=True, env=env)
    end_elapsed = time.perf_counter() - t
    left = marked_pids(marker)
    kill_marked(marker)
    return {
        "runs": runs,
        "processes_before_end": alive,
        "session_end_s": end_elapsed,
        "session_end_exit": end.returncode,
        "survivors_after_session_end": len(left),
        "kill_by_pid_s": kill_elapsed,
        "survivors_after_kill_by_pid": left_by_kill,
        "note": "kill by pid leaves each run's setsid daemon; session end stops them (grace 0.5s) and proves it",
    }


def _memory_kib(pid: int) -> dict | None:
    """Pss and USS (KiB) from /proc/PID/smaps_rollup, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            rows = dict(line.split(":", 1) for line in f.read().splitlines()[1:])
    except OSError:
        return None
    kib = {k: int(v.split()[0]) for k, v in rows.items()}
    return {"pss": kib["Pss"], "uss": kib["Private_Clean"] + kib["Private_Dirty"]}


def waiting(runs: int, env: dict, window: float) -> dict:
    """``runs`` background runs of ``sleep`` in one session: what corral's own
    processes below the session's holder (the runs' corrals and their helpers,
    not the commands: same executable file as ``sleep``) and the holder cost
    while they wait: Pss and USS per run at the end of ``window`` seconds, and
    their CPU over it."""
    import shutil

    from corral_systemd.ctl.session_spawner import own_descendants

    sleep_st = os.stat(shutil.which("sleep"))
    marker = new_marker()
    sid = subprocess.run([*CTL, "session", "start"], capture_output=True, text=True, env=env, check=True).stdout.strip()
    try:
        with open(os.path.join(env["CORRAL_STATE_DIR"], "sessions", f"{sid}.json")) as f:
            holder = json.load(f)["holder"]["pid"]
        for _ in range(runs):
            r = subprocess.run(
                [*corral_argv(), "--session", sid, "--background", "--", "sleep", "600"],
                capture_output=True,
                text=True,
                env=dict(env, **{MARKER: marker}),
            )
            assert r.returncode == 0, r.stderr

        def corrals() -> list[int]:
            own = []
            for pid in own_descendants(holder):
                try:
                    st = os.stat(f"/proc/{pid}/exe")
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) != (sleep_st.st_dev, sleep_st.st_ino):
                    own.append(pid)
            return own

        def cpu_ticks(pids: list[int]) -> int:
            total = 0
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    total += int(fields[11]) + int(fields[12])
                except OSError:
                    pass
            return total

        time.sleep(1.0)  # settled: every run's corral waiting
        own = corrals()
        ticks = cpu_ticks([holder, *own])
        time.sleep(window)
        ticks = cpu_ticks([holder, *own]) - ticks
        per = [m for m in (_memory_kib(pid) for pid in own) if m is not None]
        held = _memory_kib(holder) or {"pss": 0, "uss": 0}
        total_pss = held["pss"] + sum(m["pss"] for m in per)
        return {
            "runs": runs,
            "corral_processes_below_holder": len(own),
            "holder_kib": held,
            "pss_kib_per_run": total_pss / runs,
            "pss_kib_per_run_beyond_holder": sum(m["pss"] for m in per) / runs,
            "uss_kib_per_run_beyond_holder": sum(m["uss"] for m in per) / runs,
            "cpu_percent_per_run": 100.0 * ticks / os.sysconf("SC_CLK_TCK") / window / runs,
            "window_s": window,
        }
    finally:
        subprocess.run([*CTL, "session", "end", sid], capture_output=True, env=env)
        kill_marked(marker)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", help="default: bench/results/session-<mode>.json (mode: the session's)")
    parser.add_argument("--no-session-end", action="store_true", help="no session-end figure")
    parser.add_argument("--waiting-only", action="store_true", help="the waiting figure only")
    parser.add_argument("--window", type=float, default=5.0, help="seconds the waiting runs' CPU is counted")
    parser.add_argument(
        "--also", action="append", default=[], help="another corral program timed alongside (repeatable)"
    )
    args = parser.parse_args()
    import shutil

    if shutil.which("nc") is None:
        print("session_bench: needs nc (netcat-openbsd) for the shell idiom it compares with", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as state:
        env = dict(os.environ, CORRAL_STATE_DIR=state)
        env.pop("CORRAL_SESSION", None)
        sid = subprocess.run([*CTL, "session", "start"], capture_output=True, text=True, env=env, check=True)
        sid = sid.stdout.strip()
        with open(os.path.join(state, "sessions", f"{sid}.json")) as f:
            mode = json.load(f)["engine"]
        data = {"mode": mode, "environment": environment_info(env)}
        if not args.waiting_only:
            data["start_to_ready"] = start_to_ready(args.rounds, env, sid, args.also)
            data["start_to_ready_silent"] = start_to_ready(args.rounds, env, sid, args.also, announcing=False)
        subprocess.run([*CTL, "session", "end", sid], capture_output=True, env=env, check=True)
        data["waiting"] = waiting(args.runs, env, args.window)
        if not args.no_session_end and not args.waiting_only:
            data["session_end"] = session_end(args.runs, env)
    with open(args.out or RESULTS / f"session-{mode}.json", "w") as f:
        json.dump(data, f, indent=2)
    print(json.dumps(data, indent=2))
    end = data.get("session_end", {"session_end_exit": 0, "survivors_after_session_end": 0})
    return 0 if end["session_end_exit"] == 0 and end["survivors_after_session_end"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
