#!/usr/bin/env python3
"""Benchmark workload: a process tree of N sleeping processes.

Usage: tree.py N
Forks N children that each exec `sleep 3600`, prints "ready N <seconds>"
on stderr once all are started, then sleeps forever itself (so N + 1
processes in all). Used by bench.py to time corral's stop as the tree grows.
"""

import os
import sys
import time


def main() -> None:
    n = int(sys.argv[1])
    start = time.monotonic()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                os.execv("/bin/sleep", ["sleep", "3600"])
            finally:
                os._exit(127)
    print(f"ready {n} {time.monotonic() - start:.3f}", file=sys.stderr, flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
