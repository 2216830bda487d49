"""corral's entry points leave without the interpreter's teardown
(``client._leave``, issue 38: ~10 ms of every run): what the run printed on
a piped (block-buffered) stdout still arrives, and the exit code is the run's.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY = [sys.executable, "-c", "from corral_systemd.client import entry_in_process; entry_in_process()", "corral"]


def test_the_exit_code_is_the_runs(tmp_path):
    proc = subprocess.run([*ENTRY, "--quiet", "--", "sh", "-c", "exit 7"], capture_output=True, cwd=tmp_path)
    assert proc.returncode == 7, proc.stderr


def test_what_corral_printed_to_a_pipe_arrives(tmp_path):
    # --background prints the run's id with print(): buffered, as stdout is a pipe.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.run([*ENTRY, "--background", "--", "true"], capture_output=True, cwd=tmp_path, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().isalnum() and proc.stdout.endswith("\n"), (proc.stdout, proc.stderr)


def test_bad_input_is_one_line_and_125(tmp_path):
    proc = subprocess.run([*ENTRY, "--wall", "soon", "--", "true"], capture_output=True, cwd=tmp_path, text=True)
    assert proc.returncode == 125
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("tier", ["subreaper", "pidns"])
def test_a_run_loads_only_what_it_uses(tmp_path, tier):
    # Start-up is product speed (issue 38): an in-process run writing its --json
    # record loads neither tempfile (random, shutil) nor threading, socket or pwd
    # (but where screen keeps its sockets: the user's directory there is looked up),
    # nor the client's service modules when no service listens; nor typing,
    # dataclasses (and inspect with it: common/plainclass.py), json (and re:
    # common/jsoncodec.py), re (units.py) or enum (signal's: _signal instead);
    # nor contextlib (and functools: common/cleanup.py), collections (array's
    # import of collections.abc too: kernel/fdpass.py), ctypes (kernel/libc.py), math
    # (common/units.py's finite), or a --pty run's termios.
    # Without site (-S): an editable install's finder loads re and more before
    # corral does; the package is found on its path instead.
    unused = [
        "tempfile",
        "threading",
        "socket",
        "corral_systemd.varlink.wire",
        "typing",
        "dataclasses",
        "inspect",
        "re",
        "json",
        "enum",
        "contextlib",
        "functools",
        "collections",
        "array",
        "ctypes",
        "math",
        "termios",
        "corral_systemd.core.pty",
        "corral_systemd.state.registry.audit",
    ]
    if not os.path.isdir("/run/screen"):
        unused.append("pwd")
    script = (
        f"import sys; sys.path.insert(0, {ROOT!r}); before = set(sys.modules)\n"
        "from corral_systemd.client import main\n"
        f"code = main(['--guarantee', {tier!r}, '--quiet', '--wall', '30s', '--json', "
        f"{str(tmp_path / 'r.json')!r}, '--', 'true'])\n"
        f"print(sorted(m for m in {unused!r} if m in sys.modules and m not in before), code)"
    )
    env = {**os.environ, "CORRAL_SERVICE_SOCKET": str(tmp_path / "nobody-listens")}
    out = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    if tier == "pidns" and "pid namespace" in out.stderr:
        pytest.skip(f"no pid namespace here: {out.stderr.strip()}")
    assert out.stdout.strip() == "[] 0", out
    assert (tmp_path / "r.json").exists()


def test_a_run_without_the_registry_loads_none_of_it(tmp_path):
    """--no-registry: no entry, no token to answer in the run's waits, so none of the
    registry's modules (a dozen, about a millisecond of the start) is loaded."""
    script = (
        f"import sys; sys.path.insert(0, {ROOT!r})\n"
        "from corral_systemd.client import main\n"
        "code = main(['--guarantee', 'subreaper', '--quiet', '--no-registry', '--', 'true'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('corral_systemd.state')), code)"
    )
    env = {**os.environ, "CORRAL_SERVICE_SOCKET": str(tmp_path / "nobody-listens")}
    out = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.strip() == "[] 0", out


@pytest.mark.parametrize("closed", [1, 2], ids=["stdout", "stderr"])
def test_a_closed_stdout_or_stderr_is_dev_null_not_a_traceback(tmp_path, closed):
    # The interpreter starts with sys.stdout (or sys.stderr) None for a closed
    # descriptor: corral's own writes there (the record on stdout, its summary
    # on stderr) go to /dev/null, as the compiled client's do.
    other = 2 if closed == 1 else 1
    script = f"import os, sys; os.close({closed}); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    argv = [*ENTRY[1:], "--guarantee", "subreaper", "--json", "-", "--", "true"]
    env = {**os.environ, "CORRAL_SERVICE": "0"}
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, cwd=tmp_path, env=env)
    out = proc.stderr if other == 2 else proc.stdout
    assert proc.returncode == 0 and b"Traceback" not in out, (proc.returncode, out)
    assert (b'"run_id"' in out) == (closed == 2)  # the record, where stdout is open
