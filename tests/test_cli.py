"""Command-line behaviour: errors, exit codes, signals, the record."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import CORRAL, FAULTS
from modes import all_modes, mode_flags
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

FB = ["--cgroup-mode", "fallback"]


@pytest.mark.parametrize(
    "args",
    [
        ["--wall", "5", "--", "true"],
        ["--wall", "-1s", "--", "true"],
        ["--grace", "abc", "--", "true"],
        ["--verify-timeout", "1x", "--", "true"],
        ["--mem", "12Q", "--", "true"],
        ["--mem", "0", "--", "true"],
        ["--pids", "-4", "--", "true"],
        ["--max-output", "1.5M", "--", "true"],
        ["--cgroup-mode", "sometimes", "--", "true"],
        ["--stdin", "zero", "--", "true"],
        ["--unit-type", "socket", "--", "true"],
        ["--slice", "foo", "--", "true"],
        ["--bogus", "--", "true"],
        ["--json", "/nonexistent-dir/x.json", "--", "true"],
        ["--json", "/tmp", "--", "true"],
        ["--json", "/dev/null", "--", "true"],
        ["--cgroup-mode", "fallback", "--cgroup-parent", "/sys/fs/cgroup", "--", "true"],
        [],
        ["--wall", "1s"],
    ],
)
def test_bad_input_is_125_one_line_command_not_started(args, tmp_path):
    witness = tmp_path / "ran"
    argv = [*CORRAL, *args]
    if argv[-1] == "true":
        argv[-1:] = ["sh", "-c", f"touch {witness}"]
    proc = subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode == 125, proc.stderr
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], proc.stderr
    assert not witness.exists()


def test_not_found_127(corral):
    run = corral(FB + ["--", "/nonexistent/command"])
    assert run.returncode == 127
    assert run.record["outcome"] == "spawn_failed"


def test_not_in_path_127(corral):
    run = corral(FB + ["--", "no-such-command-corral-test"])
    assert run.returncode == 127


def test_not_executable_126(corral, tmp_path):
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    run = corral(FB + ["--", str(script)])
    assert run.returncode == 126


@pytest.mark.parametrize("quiet", [False, True], ids=["loud", "quiet"])
def test_126_and_127_say_why_first_on_a_line_of_their_own(corral, tmp_path, quiet):
    """The reason first, alone (before the warnings; with --quiet the only
    line); the summary line, last, unchanged."""
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    for argv0, code, why in (
        ("no-such-command-corral-test", 127, "No such file or directory"),
        (str(script), 126, "Permission denied"),
    ):
        run = corral([*FB, "--pids", "5", *(["--quiet"] if quiet else []), "--", argv0])
        lines = run.stderr.decode().splitlines()
        assert run.returncode == code, run.stderr
        assert lines[0] == f"corral: cannot run {argv0}: {why}", lines
        if quiet:
            assert len(lines) == 1, lines
            continue
        assert lines[1] == "corral: warning: --pids is not enforced in fallback mode (no cgroup)", lines
        assert len(lines) == 3 and lines[2].startswith(f"corral: fallback: {argv0}: {why}; exit {code}; "), lines
        assert lines[2].endswith("; guarantee subreaper"), lines


def test_exit_code_passes_through(corral):
    run = corral(FB + ["--", "sh", "-c", "exit 7"])
    assert run.returncode == 7
    assert run.record["command_exit_status"] == 7


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV, signal.SIGTERM, signal.SIGUSR1])
def test_signal_death_is_128_plus_n(corral, sig):
    run = corral(FB + ["--", "sh", "-c", f"kill -{int(sig)} $$"])
    assert run.returncode == 128 + sig
    assert run.record["command_signal"] == sig


def test_output_is_byte_exact(corral):
    payload = bytes(range(256)) * 1000
    run = corral(
        FB
        + [
            "--",
            sys.executable,
            "-c",
            "import sys; sys.stdout.buffer.write(bytes(range(256)) * 1000); sys.stderr.buffer.write(b'\\x00\\xff')",
        ]
    )
    assert run.stdout == payload
    assert run.stderr.startswith(b"\x00\xff")


def test_stdin_null_and_inherit(corral):
    run = corral(FB + ["--", "cat"], input=b"fed")
    assert run.stdout == b""
    run = corral(FB + ["--stdin", "inherit", "--", "cat"], input=b"fed")
    assert run.stdout == b"fed"


@pytest.mark.parametrize("cap", [1, 1000, 65536])
def test_max_output_caps_and_exits_122(corral, cap):
    run = corral(FB + ["--max-output", str(cap), "--", "sh", "-c", "while :; do echo xxxxxxxxxxxxxxx; done"])
    assert run.returncode == 122
    assert len(run.stdout) == cap
    assert run.survivors == []


def test_max_output_counts_both_streams(corral):
    run = corral(FB + ["--quiet", "--max-output", "10", "--", "sh", "-c", "printf 123456 >&2; printf abcdef; sleep 5"])
    assert run.returncode == 122
    assert len(run.stdout) + len(run.stderr) == 10


def test_under_cap_output_is_complete(corral):
    run = corral(FB + ["--quiet", "--max-output", "1M", "--", "sh", "-c", "printf abc; printf def >&2"])
    assert run.returncode == 0 and run.stdout == b"abc" and run.stderr == b"def"


def test_child_holding_stdout_does_not_hang_capture(corral):
    run = corral(FB + ["--max-output", "1M", "--", str(FAULTS / "F08-holds-stdout")])
    assert run.returncode == 0 and run.survivors == []
    assert run.record["wall_time"] < 2.0 + 1.0  # grace + 1 s, not a hang until the child's sleep ends


def test_quiet_and_summary(corral):
    run = corral(FB + ["--", "true"])
    assert run.stderr.decode().startswith("corral: fallback: command exited 0; exit 0;")
    run = corral(FB + ["--quiet", "--", "true"])
    assert run.stderr == b""


def test_version_and_help():
    out = subprocess.run([*CORRAL, "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("corral ")
    out = subprocess.run([*CORRAL, "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--wall" in out.stdout


def test_pids_in_fallback_is_announced(corral):
    run = corral(FB + ["--pids", "16", "--", "true"])
    assert b"--pids is not enforced" in run.stderr
    assert run.record["limits_enforced"]["pids"] == "none"


def test_stopped_processes_still_end(corral):
    run = corral(FB + ["--grace", "5s", "--", "sh", "-c", "sleep 100 & kill -STOP $!; sh -c 'kill -STOP $$' & exit 0"])
    assert run.returncode == 0 and run.survivors == []


def test_fork_chain_does_not_slip_through(corral):
    # Each process forks its successor and exits at once: no process lives
    # long, yet the chain must be stopped.
    chain = "import os,time\nwhile True:\n    if os.fork(): os._exit(0)\n"
    run = corral(FB + ["--grace", "100ms", "--", sys.executable, "-c", chain])
    assert run.returncode == 0  # the main process exited at once, cleanly
    assert run.survivors == []
    assert run.record["verified"] and run.record["processes_seen"] > 1


def test_spawners_in_other_sessions_are_all_stopped(corral):
    # Three spawners, each in its own session and deaf to SIGTERM, fork
    # new-session children as fast as they can (bounded: 300 each, so the
    # test can never exhaust the machine's pids). A single scan-and-kill
    # pass misses the children forked between the scan and the spawner's
    # death; the stop must keep finding and killing until nothing is left.
    spawner = (
        'setsid sh -c \'trap "" TERM; i=0; while [ $i -lt 300 ]; do setsid sleep 3600 & i=$((i+1)); done; '
        "exec sleep 3600' &"
    )
    run = corral(
        FB + ["--wall", "200ms", "--grace", "100ms", "--", "sh", "-c", f"{spawner} {spawner} {spawner} sleep 3600"]
    )
    assert run.returncode == 124, run.stderr
    assert run.survivors == []
    assert run.record["processes_seen"] > 10


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_corral_signalled_stops_everything(sig, code, tmp_path):
    marker = new_marker()
    env = dict(os.environ, **{MARKER_ENV: marker})
    proc = subprocess.Popen(
        [*CORRAL, *FB, "--", str(FAULTS / "F05-daemon-stays")],
        env=env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while len(marked_pids(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(marked_pids(marker)) >= 2, "daemon never started"
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == code
        assert marked_pids(marker) == []
    finally:
        proc.kill()
        proc.wait()
        kill_marked(marker)


def test_signal_to_command_group_does_not_reach_corral(tmp_path):
    # The command kills its own process group; corral is in another session.
    # corral itself runs in a new session here, so a broken corral hits only itself.
    marker = new_marker()
    record = tmp_path / "r.json"
    proc = subprocess.run(
        [*CORRAL, *FB, "--json", str(record), "--", "sh", "-c", "sleep 100 & kill -TERM 0; sleep 1"],
        env=dict(os.environ, **{MARKER_ENV: marker}),
        capture_output=True,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )
    try:
        import json

        assert proc.returncode == 143
        assert json.loads(record.read_text())["corral_signal"] is None
        assert json.loads(record.read_text())["command_signal"] == 15
    finally:
        kill_marked(marker)


def test_bystander_with_same_name_survives(corral, tmp_path):
    # A process named like the run's daemon, outside the run, must survive.
    bystander = subprocess.Popen(["sleep", "3600"])
    try:
        run = corral(FB + ["--wall", "1s", "--", "sh", "-c", "setsid sleep 3600 & sleep 3600"])
        assert run.returncode == 124 and run.survivors == []
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_existing_children_of_corral_are_not_touched(tmp_path):
    # `sleep & exec corral`: the sleep becomes corral's child but is not the run's.
    marker = new_marker()
    script = f"sleep 3600 & echo $! > {tmp_path}/pid; exec {' '.join(CORRAL)} {' '.join(FB)} --quiet -- true"
    proc = subprocess.run(["sh", "-c", script], env=dict(os.environ, **{MARKER_ENV: marker}), timeout=30)
    pid = int((tmp_path / "pid").read_text())
    try:
        assert proc.returncode == 0
        os.kill(pid, 0)  # still alive
    finally:
        kill_marked(marker)


def test_record_is_atomic_0600_and_ordered(corral, tmp_path):
    from corral_systemd.core.record import RunRecord

    run = corral(FB + ["--wall", "1s", "--", str(FAULTS / "F05-daemon-stays")])
    record = RunRecord.model_validate(run.record)
    assert record.outcome == "timeout" and record.exit_code == 124
    s = record.steps
    assert s.spawned <= s.deadline <= s.term_sent <= s.verified
    assert record.ended_monotonic >= record.started_monotonic
    assert record.processes_stopped >= 2
    files = list(tmp_path.glob("record-*.json"))
    assert files and all((f.stat().st_mode & 0o777) == 0o600 for f in files)
    assert not list(tmp_path.glob(".corral-record-*"))


def test_record_has_no_environment_values(corral):
    run = corral(FB + ["--", "true"], env=dict(os.environ, CORRAL_SECRET_TOKEN="s3cr3t-value"))
    assert "s3cr3t-value" not in str(run.record)


def test_twenty_concurrent_runs_with_daemons():
    markers = [new_marker() for _ in range(20)]
    procs = []
    try:
        for m in markers:
            procs.append(
                subprocess.Popen(
                    [*CORRAL, *FB, "--quiet", "--wall", "8s", "--", str(FAULTS / "F05-daemon-stays")],
                    env=dict(os.environ, **{MARKER_ENV: m}),
                    stdin=subprocess.DEVNULL,
                )
            )
        # Wait until every run has its main process and its daemon alive at
        # the same time: 20 runs, each subreaper of its own tree, side by side.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all(len(marked_pids(m)) >= 3 for m in markers):  # corral, main, daemon
                break
            time.sleep(0.1)
        else:
            pytest.fail("not every run had its processes up at once")
        codes = [p.wait(timeout=60) for p in procs]
        assert codes == [124] * 20
        assert all(marked_pids(m) == [] for m in markers)
    finally:
        for p in procs:
            p.kill()
        for m in markers:
            kill_marked(m)


@pytest.mark.parametrize("target", ["-", "/dev/stdout"])
def test_json_record_to_stdout(corral, target):
    """``--json -`` (or /dev/stdout): the record follows the command's output on
    stdout; the summary line stays on stderr."""
    import json

    run = corral(FB + ["--json", target, "--", "sh", "-c", "echo from-the-command; exit 3"], record=False)
    assert run.returncode == 3, run.stderr
    head, _, body = run.stdout.partition(b"\n")
    assert head == b"from-the-command"
    record = json.loads(body)
    assert record["exit_code"] == 3 and record["outcome"] == "exited" and record["verified"] is True
    assert run.stderr.decode().startswith("corral: fallback: command exited 3")


@pytest.mark.parametrize("mode", all_modes())
def test_a_directory_as_the_command_is_126_is_a_directory(corral, tmp_path, mode):
    """As shells say it: "Is a directory" (not "Permission denied"), exit 126."""
    run = corral(mode_flags(mode) + ["--", str(tmp_path)])
    err = run.stderr.decode(errors="replace")
    assert run.returncode == 126, err
    assert f"{tmp_path}: Is a directory" in err and "Permission denied" not in err


def test_a_bare_name_found_only_as_a_directory_in_path_is_127(corral, tmp_path):
    """PATH lookup skips directories, as a shell's does: not found (127)."""
    (tmp_path / "notacommand").mkdir()
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    run = corral(FB + ["--", "notacommand"], env=env)
    assert run.returncode == 127, run.stderr


def test_shell_gate_resolution_says_is_a_directory(tmp_path):
    """The library's gated spawn resolves the executable first: same message."""
    import errno

    from corral_systemd.kernel.spawn import ExecError, resolve_executable

    with pytest.raises(ExecError) as info:
        resolve_executable(str(tmp_path), os.defpath, None)
    assert info.value.errno == errno.EISDIR and info.value.exit_code == 126
    assert str(info.value) == f"{tmp_path}: Is a directory"


def test_fallback_memory_peak_is_recorded_with_mem_only(corral):
    """The fallback samples resident memory only for --mem: then the record
    has the sampled peak, else none. (A mutant that swapped the two survived
    the suite: tests/mutate-engines, issue 15.)"""
    code = "b = b'x' * (30 << 20); import time; time.sleep(0.5)"
    run = corral(["--cgroup-mode", "fallback", "--mem", "512M", "--", sys.executable, "-c", code])
    assert run.returncode == 0, run.stderr
    assert run.record["engine"]["memory_peak"] >= 25 << 20, run.record["engine"]
    run = corral(["--cgroup-mode", "fallback", "--", "true"])
    assert run.returncode == 0 and run.record["engine"].get("memory_peak") is None, run.record["engine"]


def test_help_ends_with_the_exit_codes_and_examples():
    """``--help`` lists every exit code corral gives (``result.exit_codes``, one
    declaration) and two examples, after the options."""
    from corral_systemd.cli import EXAMPLES
    from corral_systemd.core.result import exit_codes

    out = subprocess.run([*CORRAL, "--help"], capture_output=True, text=True).stdout
    tail = out[out.index("Exit codes:") :]
    for code, meaning in exit_codes():
        assert f"{code:<8} {meaning}" in tail
    for line, _what in EXAMPLES:
        assert line in tail
    assert "auto: a systemd unit where a manager answers, else the strongest tier" in " ".join(out.split())


def test_corralctl_help_does_not_cut_its_command_descriptions():
    """Each command's line is its description's first paragraph, whole (click cut
    them at about 45 characters with "...")."""
    for args in ([], ["session"], ["service"], ["audit"]):
        out = subprocess.run(
            [sys.executable, "-m", "corral_systemd.ctl", *args, "--help"], capture_output=True, text=True
        ).stdout
        commands = out[out.index("Commands:") :]
        assert "..." not in commands, out
