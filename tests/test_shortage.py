"""A read that fails for want of a descriptor says nothing about what it
would have read: the kernel readers corral's proofs rest on raise it (EMFILE),
never take it for "the process is gone" or "the group is empty". The command
can cause exactly that shortage (``prlimit --pid $PPID --nofile=4:``)."""

import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import errno, os, resource, sys
    from corral_systemd.kernel import cgroupfs, procfs, pidfd

    group = sys.argv[1]
    os.makedirs(group + "/child", exist_ok=True)
    with open(group + "/child/cgroup.procs", "w") as f:
        f.write("%d\\n" % os.getpid())
    me = os.getpid()
    checks = {
        "read_stat": lambda: procfs.read_stat(me),
        "live_task": lambda: procfs.live_task(me),
        "scan": procfs.scan,
        "proc_cgroup": lambda: cgroupfs.proc_cgroup(me),
        "procs_below": lambda: cgroupfs.procs_below(group),
        "carries_run_id": lambda: pidfd._carries_run_id(me, "x"),
    }
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for name, check in checks.items():
        lowest_free = os.dup(0)
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # not one descriptor more
        try:
            value = check()
            outcome = "returned %r" % (value,)
        except OSError as exc:
            outcome = "EMFILE" if exc.errno == errno.EMFILE else repr(exc)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        print(name, outcome)
    """
)


def test_a_descriptor_shortage_is_never_taken_for_absence(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "group")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    results = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert results == {name: "EMFILE" for name in results} and len(results) == 6, results
