"""Issue 24: a served run is the caller's own run -- the context-parity matrix.

One table of rows (``ROWS``): each is one part of the process context a
command inherits from its caller through ``execve`` -- each rlimit,
descriptors 3 and up and a process substitution, the caller's network,
mount, pid and user namespaces, supplementary groups, no-new-privs, a
seccomp filter, nice, CPU affinity, oom_score_adj, the signal mask and
dispositions, the exact environment, umask, cwd, a non-ELF executable,
stdio that is closed, a terminal, a pipe or a socket -- and how the command
must see it under corral, as the kernel shows it (``context_probe.py``:
/proc/self/*, fstat; never a name).

Every path runs the same command line under the same caller
(``context_probe.py wrap``): the bare command (the reference: what exec
gives), corral in-process and served, each through both clients (the
Python one and the compiled one), for a scope and for the fallback engine
(which the service does not take: declined, run in-process). Each row must
equal the bare command's, or be corral's documented difference (the same
on every path): ``CORRAL_RUN_ID`` in the environment; the signals corral
watches at their default action and an empty mask; a session of its own;
``/dev/null`` for a closed 0, 1 or 2; the caller (corral, or the client) as
the command's parent. A path that cannot be faithful declines (another
mount namespace: the service does not take it, the record's ``via`` says
``cli``), and the row still holds.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from serving import Service, compiled_client  # noqa: F401  (fixture)
from tethers import build_gate

from conftest import CORRAL
from corral_systemd.kernel.signals import CHILD_DEFAULTS
from modes import PIDNS_FLAGS
from procscan import MARKER_ENV, kill_marked, new_marker

pytestmark = pytest.mark.systemd

HERE = Path(__file__).resolve().parent
PROBE = [str(HERE / "context_probe.sh")]
ROOT = os.geteuid() == 0

#: What one caller sets up at once (``context_probe.py wrap``'s settings),
#: per run; a row reads one part of the result. ``userns`` puts the caller
#: in user and pid namespaces of its own, ``mountns`` in a mount namespace
#: with a mount only it sees, ``closed`` closes its 0, 1 and 2.
RUNS = {
    "context": "rlimits,fd7,procsub,stdio,nnp,seccomp,nice,affinity,oom,signals,env,umask,cwd"
    + (",netns,groups" if ROOT else ""),
    "userns": "userns",
    "pidns": "pidns" if ROOT else None,
    "mountns": "mountns" if ROOT else None,
    "closed": "closed",
    "non-elf": "",
}

#: A signal mask (as /proc shows it) of every signal corral puts back to its default.
_DEFAULTS_MASK = sum(1 << (int(sig) - 1) for sig in CHILD_DEFAULTS)


def _same(field):
    return lambda got, bare, ctx: (got.get(field), bare.get(field))


def _limit(name):
    return lambda got, bare, ctx: (got["limits"].get(name), bare["limits"].get(name))


def _status(name):
    return lambda got, bare, ctx: (got["status"].get(name), bare["status"].get(name))


def _ns(name):
    """The caller's own namespace (each run's caller makes its own: compared with that, not the bare run's)."""
    return lambda got, bare, ctx: (got["ns"].get(name), ctx["caller"]["ns"].get(name))


def _env(got, bare, ctx):
    """The caller's environment exactly, plus the run's id (and, for a
    registered fallback run, its mark): nothing else added, nothing lost."""
    run_id = ctx["record"]["run_id"]
    ours = {f"{b'CORRAL_RUN_ID'!r}={run_id.encode()!r}"}
    extra = [e for e in got["env"] if e.startswith(repr(b"CORRAL_RUN_MARK") + "=")]
    return sorted(set(got["env"]) - ours - set(extra)), sorted(bare["env"]) if ours <= set(got["env"]) else None


def _sigign(got, bare, ctx):
    """Ignored as the caller had it, except the signals corral watches (at their default)."""
    return int(got["status"]["SigIgn"], 16), int(bare["status"]["SigIgn"], 16) & ~_DEFAULTS_MASK


def _stdio(got, bare, ctx):
    """The caller's own open files (fstat: type, device, inode), or /dev/null for a closed one."""
    wanted = ctx["wrap"].get("stdio")
    if "closed" in ctx["wrap"]["settings"]:
        null = os.stat(os.devnull)
        wanted = [[oct(null.st_mode & 0o170000), null.st_dev, null.st_ino, null.st_rdev]] * 3
    return got["stdio"], wanted


#: name -> (the run that sets it up, what the command got vs what it must be).
ROWS = {
    **{
        f"rlimit {name[7:]}": ("context", _limit(label))
        for name, label in (
            ("RLIMIT_CPU", "Max cpu time"),
            ("RLIMIT_FSIZE", "Max file size"),
            ("RLIMIT_DATA", "Max data size"),
            ("RLIMIT_STACK", "Max stack size"),
            ("RLIMIT_CORE", "Max core file size"),
            ("RLIMIT_RSS", "Max resident set"),
            ("RLIMIT_NPROC", "Max processes"),
            ("RLIMIT_NOFILE", "Max open files"),
            ("RLIMIT_MEMLOCK", "Max locked memory"),
            ("RLIMIT_AS", "Max address space"),
            ("RLIMIT_LOCKS", "Max file locks"),
            ("RLIMIT_SIGPENDING", "Max pending signals"),
            ("RLIMIT_MSGQUEUE", "Max msgqueue size"),
            ("RLIMIT_NICE", "Max nice priority"),
            ("RLIMIT_RTPRIO", "Max realtime priority"),
            ("RLIMIT_RTTIME", "Max realtime timeout"),
        )
    },
    "descriptor 7": ("context", _same("fd7")),
    "process substitution": ("context", lambda got, bare, ctx: (got["procsub"], "procsub\n")),
    "network namespace": ("context", _ns("net")),
    "mount namespace": ("context", _ns("mnt")),
    "groups": ("context", _status("Groups")),
    "no-new-privs": ("context", _status("NoNewPrivs")),
    "seccomp": ("context", _status("Seccomp")),
    "seccomp filters": ("context", _status("Seccomp_filters")),
    "nice": ("context", _same("nice")),
    "cpu affinity": ("context", _status("Cpus_allowed_list")),
    "oom_score_adj": ("context", _same("oom_score_adj")),
    "signal mask": ("context", lambda got, bare, ctx: (int(got["status"]["SigBlk"], 16), 0)),
    "signal dispositions": ("context", _sigign),
    "environment": ("context", _env),
    "umask": ("context", _status("Umask")),
    "cwd": ("context", _same("cwd")),
    "stdio: a pipe, a socket, a terminal": ("context", _stdio),
    "stdio flags": ("context", _same("stdio_flags")),
    "parent: the caller": ("context", lambda got, bare, ctx: (got["ppid"], ctx["wrap"]["caller_pid"])),
    "a session of its own": ("context", lambda got, bare, ctx: (got["sid"], got["pid"])),
    "user namespace": ("userns", _ns("user")),
    "pid namespace": ("pidns", _ns("pid")),
    "a private mount": ("mountns", lambda got, bare, ctx: (got["mount_file"], "mounted")),
    "stdio closed: /dev/null": ("closed", _stdio),
}

#: name -> (client, environment, extra options, the record's ``via``).
PATHS = {
    "in-process, python client": ("python", {"CORRAL_SERVICE": "0"}, [], "cli"),
    "in-process, compiled client": ("compiled", {"CORRAL_SERVICE": "0"}, [], "cli"),
    "served, python client": ("python", {}, [], "service"),
    "served, compiled client": ("compiled", {}, [], "service"),
    "fallback, python client": ("python", {}, ["--cgroup-mode", "fallback"], "cli"),
    "fallback, compiled client": ("compiled", {}, ["--cgroup-mode", "fallback"], "cli"),
    "pidns, python client": ("python", {}, PIDNS_FLAGS, "cli"),
    # A library Runner's scope (tests/runner_run.py): its host is multi-threaded, so the command's
    # process is posix_spawn()ed held at its gate (corral-gate, or its Python twin), not forked.
    "library Runner scope, compiled gate": ("runner", {"CORRAL_GATE": "c"}, ["--unit-type", "scope"], "library"),
    "library Runner scope, Python gate": ("runner", {"CORRAL_GATE": "python"}, ["--unit-type", "scope"], "library"),
}

#: A library Runner's documented difference (``Runner.run``): the command's
#: stdout and stderr are pipes to the Runner (``capture=False`` passes what
#: they carry on to the host's own); its stdin is the host's. Row -> the check.
LIBRARY_ROWS = {
    "stdio: a pipe, a socket, a terminal": lambda got, bare, ctx: (got["stdio"][0], _stdio(got, bare, ctx)[1][0]),
    "stdio flags": lambda got, bare, ctx: (got["stdio_flags"][0], bare["stdio_flags"][0]),
    "stdio closed: /dev/null": lambda got, bare, ctx: (got["stdio"][0], _stdio(got, bare, ctx)[1][0]),
}

#: The pid namespace tier's documented differences (README, engines/pidns.py):
#: the command's parent is the namespace's init (pid 1), and it has a mount
#: namespace of its own (a /proc for its pid namespace). Row -> the check.
PIDNS_ROWS = {
    "parent: the caller": lambda got, bare, ctx: (got["ppid"], 1),
    "mount namespace": lambda got, bare, ctx: (got["ns"].get("mnt") != ctx["caller"]["ns"].get("mnt"), True),
}


@pytest.fixture(scope="module")
def parity_service(tmp_path_factory):
    svc = Service(tmp_path_factory.mktemp("parity-service"))
    yield svc
    svc.stop()


def _run(tmp: Path, settings: str, argv: list[str], env: dict) -> tuple[int, dict, dict, str]:
    """The caller with ``settings`` runs ``argv`` (and the probe's OUT as its
    last argument): (exit status, the probe's report or {}, what the caller
    set up and was, stderr)."""
    out = tmp / "probe.json"
    proc = subprocess.run(
        [sys.executable, str(HERE / "context_probe.py"), "wrap", str(out), settings, "--", *argv, str(out)],
        env=env,
        capture_output=True,
        timeout=300,
        cwd="/",
    )
    files = {name: Path(f"{out}.{name}") for name in ("wrap", "caller", "error")}
    report = json.loads(out.read_text()) if out.exists() else {}
    setup = {**json.loads(files["wrap"].read_text()), "caller": json.loads(files["caller"].read_text())}
    error = files["error"].read_text() if files["error"].exists() else ""  # the caller's own exec failed
    return proc.returncode, report, setup, error + proc.stderr.decode(errors="replace")


def _bare_and_corral(tmp_path, run: str, path: str, client_argv: list[str], svc: Service, marker: str):
    settings = RUNS[run]
    if settings is None:
        pytest.skip(f"the {run!r} run needs root")
    client, extra_env, options, _ = PATHS[path]
    # CORRAL_SERVICE_DEBUG: a client that runs the command itself says why (on stderr)
    env = {**svc.env(), MARKER_ENV: marker, "CORRAL_SERVICE_DEBUG": "1", **extra_env}
    mount_dir = tmp_path / "mountpoint"
    mount_dir.mkdir()
    env["CTX_MOUNT_DIR"] = str(mount_dir)
    env["CTX_CWD"] = str(tmp_path)
    (tmp_path / "bare").mkdir()
    (tmp_path / "corral").mkdir()
    record = tmp_path / "record.json"
    command = PROBE
    if run == "non-elf":
        script = tmp_path / "text-file"
        script.write_text("echo not a program\n")
        script.chmod(0o755)
        command = [str(script)]
    bare = _run(tmp_path / "bare", settings, command, env)
    # --stdin inherit: the caller's stdin, as the stdio rows ask (corral's default is /dev/null)
    argv = [*client_argv, "--json", str(record), "--stdin", "inherit", *options, "--", *command]
    ran = _run(tmp_path / "corral", settings, argv, env)
    record_data = json.loads(record.read_text()) if record.exists() else None
    return bare, ran, record_data


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("path", list(PATHS))
def test_the_command_gets_the_callers_context(tmp_path, run, path, parity_service, request):
    client, extra_env, options, via = PATHS[path]
    if client == "runner":
        if extra_env.get("CORRAL_GATE") == "c":
            build_gate()
        client_argv = [sys.executable, str(HERE / "runner_run.py")]
    else:
        client_argv = list(CORRAL) if client == "python" else request.getfixturevalue("compiled_client")
    marker = new_marker()
    try:
        bare, ran, record = _bare_and_corral(tmp_path, run, path, client_argv, parity_service, marker)
    finally:
        kill_marked(marker)
    code, got, wrap, stderr = ran
    if run == "pidns" and "served" not in path:
        # Documented: corral in-process reads /proc by pid, and this /proc is
        # the parent namespace's: it refuses (the service, outside, takes it).
        # A Runner is refused by its manager session first: the same 125, its own words.
        said = "outside this process's pid namespace" if client == "runner" else "another pid namespace than its own"
        assert code == 125 and said in stderr, (code, stderr)
        return
    if run == "non-elf":
        # exec's own error, as every engine reports it: 126, "Exec format error" (never /bin/sh's 127)
        assert code == 126 and "Exec format error" in stderr, (code, stderr)
        assert record is not None and record["via"] == via and record["exit_code"] == 126, record
        return
    assert code == 0 and got, f"{path}: exit {code}: {stderr}"
    assert record is not None, stderr
    expected_via = "cli" if run == "mountns" and via == "service" else via  # another mount namespace: declined
    assert record["via"] == expected_via, (record["via"], expected_via, stderr)
    ctx = {"record": record, "wrap": wrap, "caller": wrap["caller"]}
    wrong = []
    for name, (row_run, read) in ROWS.items():
        if row_run != run:
            continue
        if path.startswith("pidns"):
            read = PIDNS_ROWS.get(name, read)
        if client == "runner":
            read = LIBRARY_ROWS.get(name, read)
        seen, want = read(got, bare[1], ctx)
        if seen != want:
            wrong.append(f"{name}: {seen!r} != {want!r}")
    assert not wrong, f"{path}, {run}:\n" + "\n".join(wrong)


def test_the_rows_cover_what_issue_24_names():
    """The table itself: every part of the context the issue lists is a row."""
    for needed in (
        "rlimit CPU",
        "rlimit NOFILE",
        "rlimit STACK",
        "rlimit FSIZE",
        "descriptor 7",
        "process substitution",
        "network namespace",
        "mount namespace",
        "pid namespace",
        "user namespace",
        "a private mount",
        "groups",
        "no-new-privs",
        "seccomp",
        "nice",
        "cpu affinity",
        "oom_score_adj",
        "signal mask",
        "signal dispositions",
        "environment",
        "umask",
        "cwd",
        "stdio closed: /dev/null",
        "stdio: a pipe, a socket, a terminal",
    ):
        assert needed in ROWS, needed
    assert signal.SIGWINCH in CHILD_DEFAULTS and signal.SIGPIPE in CHILD_DEFAULTS
