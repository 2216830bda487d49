"""Background runs and sessions against what agents' runners do today, same invocation.

Two figures (issue 27):
1. start to ready: ``corral --background --ready-port P -- python3 -m http.server P``,
   alone and in a session (its corral then started by the session's holder), against
   ``nohup python3 -m http.server P & until nc -z 127.0.0.1 P; do sleep 0.05; done``
   (the shell idiom, its poll included), interleaved round by round; each ratio is
   the median of the rounds' ratios. Each server is stopped between rounds (the
   nohup one by its pid, corral's with corralctl stop), untimed.
2. ``corralctl session end`` latency with N background runs (default 20), each a
   ``sleep`` and a TERM-ignoring ``setsid`` daemon, against ``kill``-ing as many
   ``nohup``'d pids by number (what the shell does, with no proof); the session's
   end also proves every process gone.

Any mode corral picks (fallback on a plain machine; a session's slice and holder
unit where a manager answers). Survivors are counted by the run marker in /proc
(never names) and must be 0. Writes bench/results/session-<mode>.json.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from common import MARKER_ENV as MARKER
from common import RESULTS, corral_argv, kill_marked, marked_pids, new_marker

CTL = [sys.executable, "-m", "corral_systemd.ctl"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server(port: int) -> list[str]:
    return [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]


def start_to_ready(rounds: int, env: dict, session: str) -> dict:
    variants = {"corral --background": [], "corral --background, in a session": ["--session", session]}
    times: dict[str, list[float]] = {"nohup+nc": [], **{name: [] for name in variants}}
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        port = free_port()
        t = time.perf_counter()
        shell = subprocess.run(
            [
                "sh",
                "-c",
                f"nohup {' '.join(server(port))} >/dev/null 2>&1 & echo $!; "
                f"until nc -z 127.0.0.1 {port}; do sleep 0.05; done",
            ],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        times["nohup+nc"].append(time.perf_counter() - t)
        os.kill(int(shell.stdout.split()[0]), 9)
        for name, options in variants.items():
            port = free_port()
            marker = new_marker()
            t = time.perf_counter()
            run = subprocess.run(
                [*corral_argv(), *options, "--background", "--ready-port", str(port), "--", *server(port)],
                capture_output=True,
                text=True,
                env=dict(env, **{MARKER: marker}),
            )
            times[name].append(time.perf_counter() - t)
            assert run.returncode == 0, run.stderr
            subprocess.run([*CTL, "stop", run.stdout.strip()], capture_output=True, env=env, check=True)
            # The stop returns once the run is proven gone; its corral (marked too) may still be exiting.
            gone_by = time.monotonic() + 10
            while marked_pids(marker) and time.monotonic() < gone_by:
                time.sleep(0.02)
            assert marked_pids(marker) == [], "corral --background left a process"
            ratios[name].append(times[name][-1] / times["nohup+nc"][-1])
    out: dict = {name: {"p50_ms": statistics.median(v) * 1e3, "max_ms": max(v) * 1e3} for name, v in times.items()}
    out["ratio_to_nohup_nc"] = {name: statistics.median(r) for name, r in ratios.items()}
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", help="default: bench/results/session-<mode>.json (mode: the session's)")
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
        data = {"mode": mode, "start_to_ready": start_to_ready(args.rounds, env, sid)}
        subprocess.run([*CTL, "session", "end", sid], capture_output=True, env=env, check=True)
        data["session_end"] = session_end(args.runs, env)
    with open(args.out or RESULTS / f"session-{mode}.json", "w") as f:
        json.dump(data, f, indent=2)
    print(json.dumps(data, indent=2))
    ok = data["session_end"]["session_end_exit"] == 0 and data["session_end"]["survivors_after_session_end"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
