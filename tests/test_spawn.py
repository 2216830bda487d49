"""A library scope's command held at its gate (``kernel.spawn.spawn_held``:
corral-gate, packaging/gate/gate.c, and its Python twin): executed as the
forked child of every other path executes it (``kernel.gate``'s held child).
Issue 13: relative PATH entries are the command's (after chdir to its cwd),
not the host's; a service's are resolved alike before the unit starts
(``resolve_in_cwd``)."""

import ast
import errno
import os
import subprocess
import sys

import pytest
from tethers import ROOT, build_gate

from corral_systemd.engines.libexec import gate_program
from corral_systemd.kernel.spawn import ExecError, resolve_in_cwd, spawn_held


@pytest.fixture(params=["c", "python"])
def gate_kind(request, monkeypatch):
    """Either gate program (``CORRAL_GATE``): the compiled one (built into the
    package as setup.py does) and the Python twin, where it was not built."""
    if request.param == "c":
        build_gate()
    monkeypatch.setenv("CORRAL_GATE", request.param)
    return request.param


def _tool(directory, name="mytool", text="from-cwd"):
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / name
    tool.write_text(f"#!/bin/sh\necho {text}\n")
    tool.chmod(0o755)
    return tool


def _held(argv, env, cwd):
    r, w = os.pipe()
    child = spawn_held(gate_program(), argv, stdin=0, stdout=w, stderr=w, env=env, cwd=str(cwd))
    return child, r, w


def _run_gated(argv, env, cwd):
    child, r, w = _held(argv, env, cwd)
    try:
        child.release()
    finally:
        os.close(w)
    _, status = os.waitpid(child.pid, 0)
    os.close(child.pidfd)
    out = b""
    while chunk := os.read(r, 4096):
        out += chunk
    os.close(r)
    return os.waitstatus_to_exitcode(status), out.decode()


@pytest.mark.parametrize("path_entry", ["bin", "./bin", ""], ids=["relative", "dot-relative", "empty-is-cwd"])
def test_library_scope_takes_relative_path_entries_from_the_commands_cwd(gate_kind, tmp_path, monkeypatch, path_entry):
    work = tmp_path / "work"
    host = tmp_path / "host"
    _tool(work / "bin" if path_entry else work)
    # The host's own cwd has a different tool under the same relative name: never taken.
    _tool(host / "bin" if path_entry else host, text="from-host")
    monkeypatch.chdir(host)
    env = {"PATH": f"{path_entry}:/usr/bin:/bin"}
    code, out = _run_gated(["mytool"], env, work)
    assert (code, out) == (0, "from-cwd\n")


def test_relative_entry_found_only_in_the_hosts_cwd_is_127(gate_kind, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    host = tmp_path / "host"
    _tool(host / "bin", text="from-host")
    monkeypatch.chdir(host)
    child, r, w = _held(["mytool"], {"PATH": "bin:/usr/bin:/bin"}, work)
    with pytest.raises(ExecError) as err:
        child.release()
    os.close(r)
    os.close(w)
    assert (err.value.errno, err.value.exit_code, child.reaped) == (errno.ENOENT, 127, True)


def test_missing_cwd_is_127(gate_kind, tmp_path):
    with pytest.raises(ExecError) as err:
        resolve_in_cwd("sh", "/usr/bin:/bin", str(tmp_path / "nope"))  # a service's, before its unit starts
    assert err.value.exit_code == 127
    child, r, w = _held(["sh", "-c", "echo ran"], None, tmp_path / "nope")
    with pytest.raises(ExecError) as err:
        child.release()
    os.close(r)
    os.close(w)
    assert err.value.exit_code == 127


def test_a_file_the_kernel_will_not_execute_is_126_never_a_shell_script(gate_kind, tmp_path):
    # The fork path's exec (os.execvpe) fails it with ENOEXEC; a shell's exec
    # (the gate this one replaced) ran it as a script instead.
    script = tmp_path / "no-shebang"
    script.write_text("echo ran-as-a-script\n")
    script.chmod(0o755)
    child, r, w = _held([str(script)], None, tmp_path)
    with pytest.raises(ExecError) as err:
        child.release()
    os.close(w)
    assert (err.value.errno, err.value.exit_code) == (errno.ENOEXEC, 126)
    assert os.read(r, 100) == b""  # nothing ran
    os.close(r)


def test_the_gate_holds_even_when_the_host_closed_stdin(gate_kind):
    """A host with fd 0 closed (a daemon): the gate's socket may land on 0,
    and the command must still wait for release() (a bypassed gate lets it
    run before its scope exists)."""
    script = f"""
import os, sys, time
sys.path.insert(0, {str(ROOT)!r})
from corral_systemd.engines.libexec import gate_program
from corral_systemd.kernel.spawn import spawn_held
null = os.open("/dev/null", os.O_RDONLY)
r, w = os.pipe()
keep = os.dup(null)
os.close(0)
child = spawn_held(gate_program(), ["sh", "-c", "echo ran"], stdin=keep, stdout=w, stderr=2, env=None, cwd=None)
time.sleep(0.3)
os.set_blocking(r, False)
try:
    early = os.read(r, 100)
except BlockingIOError:
    early = b""
assert early == b"", ("the command ran before its gate opened", early)
child.release()
os.close(w)
os.set_blocking(r, True)
assert os.read(r, 100) == b"ran\\n"
assert os.waitpid(child.pid, 0)[1] == 0
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr


def test_absolute_entries_and_paths_unchanged(tmp_path):
    tool = _tool(tmp_path / "abs")
    assert resolve_in_cwd("mytool", f"{tmp_path}/abs", "/") == str(tool)
    assert resolve_in_cwd("abs/mytool", "/usr/bin", str(tmp_path)) == str(tool)


@pytest.mark.parametrize(
    "given",
    [
        {},
        {"PWD": "/not/where/it/runs", "OLDPWD": "/elsewhere", "_": "/usr/bin/the-callers"},
        {"PWD": ""},
    ],
    ids=["none-of-them", "each-its-own", "empty"],
)
def test_the_gate_leaves_the_environment_as_given(gate_kind, tmp_path, monkeypatch, given):
    # A shell's cd would set and export PWD and OLDPWD, its read _ (the gate
    # this one replaced did): the command gets the environment it was given,
    # exactly, as a forked child's exec does.
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "CORRAL_TEST_KEEP": "kept", **given}
    # Read as exec gave it (/proc/self/environ): a shell would set PWD of its own, Python LC_CTYPE.
    probe = "import os; print(repr(open('/proc/self/environ', 'rb').read())); print(os.getcwd())"
    code, out = _run_gated([sys.executable, "-I", "-S", "-c", probe], env, work)
    environ, cwd = out.splitlines()
    assert code == 0 and cwd == str(work.resolve())
    assert dict(item.decode().split("=", 1) for item in ast.literal_eval(environ).split(b"\0") if item) == env


def test_the_command_ignores_what_its_host_ignores_and_nothing_more(gate_kind, tmp_path):
    # glibc's posix_spawn starts the gate with its own signals (32, 33:
    # SIGCANCEL, SIGSETXID) ignored, which exec keeps; a forked child's exec
    # has them at their default, and so must the gate's command. A signal
    # the host ignores (and corral does not put back: CHILD_DEFAULTS) stays ignored.
    import signal

    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        code, out = _run_gated(["grep", "SigIgn", "/proc/self/status"], None, tmp_path)
    finally:
        signal.signal(signal.SIGTTOU, previous)
    assert code == 0 and int(out.split()[1], 16) == 1 << (signal.SIGTTOU - 1), out


def test_a_host_with_stdio_closed_gives_the_command_the_stdio_it_was_given(gate_kind, tmp_path):
    # The gate then starts with 0, 1, 2 closed (a host's /dev/null from
    # kernel.startup is close-on-exec), so the descriptors it receives land on
    # 0, 1, 2 themselves, close-on-exec: kept for the command all the same.
    script = f"""
import os, sys
sys.path.insert(0, {str(ROOT)!r})
from corral_systemd.engines.libexec import gate_program
from corral_systemd.kernel import startup
from corral_systemd.kernel.spawn import spawn_held
for fd in (0, 1, 2):
    os.close(fd)
startup.prepare()
out = os.open({str(tmp_path / "out")!r}, os.O_WRONLY | os.O_CREAT)
probe = "import os; print([os.readlink(f'/proc/self/fd/{{fd}}') for fd in (0, 1, 2)])"
child = spawn_held(gate_program(), [sys.executable, "-c", probe], stdin=0, stdout=out, stderr=out, env=None, cwd=None)
child.release()
sys.exit(os.waitstatus_to_exitcode(os.waitpid(child.pid, 0)[1]))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    out = str(tmp_path / "out")
    assert (tmp_path / "out").read_text() == f"{['/dev/null', out, out]}\n"


def test_argv_is_the_commands_exactly(gate_kind, tmp_path):
    # argv[0] as given (a PATH lookup finds the program; the shell gate this
    # one replaced gave the command the resolved absolute path instead).
    code, out = _run_gated(["cat", "/proc/self/cmdline"], None, tmp_path)
    assert (code, out) == (0, "cat\0/proc/self/cmdline\0")


_EXEC_PROBE = """
import os, sys
sys.path.insert(0, os.environ["CORRAL_SOURCE"])
from corral_systemd.kernel.pathexec import execvpe
which, file, path, form = sys.argv[1:5]
env = None if form == "inherited" else {"PATH": path, "MARK": "m"}
if form == "inherited":
    os.environ["PATH"] = path
elif form == "bytes":
    env = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
try:
    if which == "os":
        os.execvp(file, [file]) if env is None else os.execvpe(file, [file], env)
    else:
        execvpe(file, [file], env)
except OSError as exc:
    print(type(exc).__name__, exc.errno, "warnings" in sys.modules)
"""


@pytest.mark.parametrize("form", ["str", "bytes", "inherited"])
@pytest.mark.parametrize(
    "case", ["second-is-executable", "only-not-executable", "absent", "a-directory-first", "slash", "empty-path"]
)
def test_the_commands_exec_searches_path_as_os_does_without_loading_warnings(tmp_path, case, form):
    """``kernel.pathexec.execvpe``, every child's exec: the same outcome as
    ``os.execvpe``/``os.execvp`` (the program run, or the error raised), and a
    failed search leaves the warnings module unloaded (os's loads it: half a
    millisecond before every command's exec; -S: a site's .pth files may load it)."""
    a, b = tmp_path / "a", tmp_path / "b"
    _tool(b, text="ran-b")
    file, dirs = "mytool", [a, b]
    if case == "second-is-executable":
        _tool(a, text="ran-a").chmod(0o644)
    elif case == "only-not-executable":
        _tool(a, text="ran-a").chmod(0o644)
        dirs = [a]
    elif case == "absent":
        file = "no-such-tool"
    elif case == "a-directory-first":
        (a / "mytool").mkdir(parents=True)
    elif case == "slash":
        file = str(b / "mytool")
    path = "" if case == "empty-path" else ":".join(map(str, dirs))

    def outcome(which):
        run = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _EXEC_PROBE, which, file, path, form],
            cwd=b if case == "empty-path" else tmp_path,
            env={**os.environ, "CORRAL_SOURCE": str(ROOT)},
            capture_output=True,
            text=True,
        )
        assert run.stderr == ""
        return run.stdout.split()

    ours, theirs = outcome("ours"), outcome("os")
    if theirs[0].endswith("Error"):
        assert ours[:2] == theirs[:2] and ours[2] == "False"
    else:
        assert ours == theirs == ["ran-b"]
