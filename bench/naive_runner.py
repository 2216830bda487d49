#!/usr/bin/env python3
"""NAIVE RUNNER — a deliberately simple baseline, NOT a recommended tool.

This is what many agent/CI harnesses do:
    subprocess.run(cmd, capture_output=True, timeout=WALL)
On timeout Python's subprocess.run() SIGKILLs only the direct child (then
waits for it and closes the pipes). So:

* grandchildren (background jobs, daemons, setsid'd processes) are never
  killed: they survive the runner;
* a grandchild that still holds the inherited stdout/stderr pipe keeps
  communicate() from seeing EOF, so a command that exited 0 at once is
  reported as a timeout (124) after the full wall time.

Usage: naive_runner.py SECONDS CMD [ARG...]
Exit status: the command's, or 124 on timeout (like timeout(1)),
128+N if it was killed by signal N.
"""

import subprocess
import sys


def main() -> int:
    wall = float(sys.argv[1])
    cmd = sys.argv[2:]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=wall, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        sys.stdout.buffer.write(exc.stdout or b"")
        sys.stderr.buffer.write(exc.stderr or b"")
        return 124
    sys.stdout.buffer.write(proc.stdout)
    sys.stderr.buffer.write(proc.stderr)
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


if __name__ == "__main__":
    sys.exit(main())
