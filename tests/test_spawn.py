"""Issue 13: a library scope's command is resolved as exec would find it after
chdir to the command's cwd (``kernel.spawn.spawn_gated_by_shell``), like a
service's (``engines.systemd.envfile.resolve_for_service``): relative PATH entries
are the command's, not the host's."""

import ast
import os
import sys

import pytest

from corral_systemd.kernel.spawn import ExecError, resolve_in_cwd, spawn_gated_by_shell


def _tool(directory, name="mytool", text="from-cwd"):
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / name
    tool.write_text(f"#!/bin/sh\necho {text}\n")
    tool.chmod(0o755)
    return tool


def _run_gated(argv, env, cwd):
    r, w = os.pipe()
    child = spawn_gated_by_shell(argv, stdin=0, stdout=w, stderr=w, env=env, cwd=str(cwd))
    os.close(w)
    child.release()
    _, status = os.waitpid(child.pid, 0)
    os.close(child.pidfd)
    out = b""
    while chunk := os.read(r, 4096):
        out += chunk
    os.close(r)
    return os.waitstatus_to_exitcode(status), out.decode()


@pytest.mark.parametrize("path_entry", ["bin", "./bin", ""], ids=["relative", "dot-relative", "empty-is-cwd"])
def test_library_scope_takes_relative_path_entries_from_the_commands_cwd(tmp_path, monkeypatch, path_entry):
    work = tmp_path / "work"
    host = tmp_path / "host"
    _tool(work / "bin" if path_entry else work)
    # The host's own cwd has a different tool under the same relative name: never taken.
    _tool(host / "bin" if path_entry else host, text="from-host")
    monkeypatch.chdir(host)
    env = {"PATH": f"{path_entry}:/usr/bin:/bin"}
    code, out = _run_gated(["mytool"], env, work)
    assert (code, out) == (0, "from-cwd\n")


def test_relative_entry_found_only_in_the_hosts_cwd_is_127(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    host = tmp_path / "host"
    _tool(host / "bin", text="from-host")
    monkeypatch.chdir(host)
    with pytest.raises(ExecError) as err:
        spawn_gated_by_shell(["mytool"], stdin=0, stdout=1, stderr=2, env={"PATH": "bin:/usr/bin:/bin"}, cwd=str(work))
    assert err.value.exit_code == 127


def test_missing_cwd_is_127_before_anything_starts(tmp_path):
    with pytest.raises(ExecError) as err:
        resolve_in_cwd("sh", "/usr/bin:/bin", str(tmp_path / "nope"))
    assert err.value.exit_code == 127


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
def test_the_gates_shell_leaves_the_environment_as_given(tmp_path, monkeypatch, given):
    # The shell's cd sets and exports PWD and OLDPWD, its read sets _: the
    # command gets the environment it was given, exactly, as a forked child's exec does.
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
