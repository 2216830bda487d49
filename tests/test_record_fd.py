"""--json-fd N: the record on the caller's descriptor, apart from the command's output, on every path.

The paths: the Python client and the compiled one with no service (each runs
the line in-process), ``corral-inprocess`` itself, and (beside a manager,
``systemd`` marker) both clients through a real service. On each: the record
arrives whole on N, stdout carries the command's bytes and nothing else, the
command does not have N (its /proc/PID/fd shows it), and a descriptor that
takes no record is one line, exit 125, nothing run. The service's side of
the protocol (the descriptor checked there, a mismatch not served) is tested
on the wire without a manager. Also the documented framing of ``--json -``.
"""

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serving import Service, compiled_client, service  # noqa: F401  (fixtures)
from test_service import RUN, _run_params

from conftest import CORRAL
from corral_systemd.core import record_fd
from corral_systemd.core.request import parse_command_line
from corral_systemd.varlink.wire import VarlinkError
from procscan import MARKER_ENV, marked_pids

IN_PROCESS = [sys.executable, "-c", "from corral_systemd.client import entry_in_process; entry_in_process()", "corral"]
#: Binary, no final newline: stdout must be exactly these bytes.
OUTPUT = b"out\x00\xff\n{\nno newline"


def _script(fd: int, touch: str | None = None) -> str:
    """The command: says whether it has ``fd``, writes OUTPUT; touches ``touch`` if given (it ran)."""
    ran = f"touch {touch}; " if touch else ""
    return f"{ran}[ -e /proc/$$/fd/{fd} ] && echo inherited >&2; printf 'out\\000\\377\\n{{\\nno newline'"


def _run(program: list[str], args_for, env: dict, *, readable: bool = False, timeout: float = 60):
    """``program`` with ``args_for(N)``, N the write end of a pipe (or, ``readable``,
    the read end of one) that this test reads; (proc, the bytes N carried)."""
    r, w = os.pipe()
    given_fd = r if readable else w
    try:
        proc = subprocess.Popen(
            [*program, *args_for(given_fd)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            pass_fds=(given_fd,),
        )
        os.close(w)
        w = -1
        out, err = proc.communicate(timeout=timeout)
        carried = b""
        if not readable:
            while chunk := os.read(r, 65536):
                carried += chunk
        proc.stdout, proc.stderr = out, err
        return proc, carried
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def _env(tmp_path, marker: str, **extra) -> dict:
    return {
        **os.environ,
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
        "CORRAL_SERVICE_SOCKET": str(tmp_path / "no-service"),  # nobody listens: in-process
        MARKER_ENV: marker,
        **extra,
    }


@pytest.fixture(params=["python", "compiled", "corral-inprocess"])
def program(request) -> list[str]:
    if request.param == "python":
        return list(CORRAL)
    if request.param == "compiled":
        return request.getfixturevalue("compiled_client")
    return IN_PROCESS


def _assert_record_apart(proc, carried: bytes, via: str) -> dict:
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == OUTPUT  # the command's bytes exactly: no record among them
    assert b"inherited" not in proc.stderr, "the command had the record's descriptor"
    assert carried.endswith(b"}\n") and carried.count(b"\n{") == 0
    record = json.loads(carried)  # whole: one JSON document, nothing else on the descriptor
    assert record["exit_code"] == 0 and record["via"] == via and record["verified"], record
    return record


def test_the_record_arrives_whole_on_the_descriptor_and_stdout_is_the_commands(tmp_path, marker, program):
    proc, carried = _run(
        program, lambda fd: ["--json-fd", str(fd), "--", "sh", "-c", _script(fd)], _env(tmp_path, marker)
    )
    _assert_record_apart(proc, carried, "cli")
    assert not marked_pids(marker)


def test_json_fd_equals_form_and_quiet(tmp_path, marker):
    proc, carried = _run(
        CORRAL, lambda fd: ["--quiet", f"--json-fd={fd}", "--", "sh", "-c", _script(fd)], _env(tmp_path, marker)
    )
    _assert_record_apart(proc, carried, "cli")
    assert proc.stderr == b""


@pytest.mark.parametrize("bad", ["closed", "read-only", "stdio", "not-a-number", "dev-fd-path", "both", "background"])
def test_a_descriptor_that_takes_no_record_is_one_line_125_and_nothing_runs(tmp_path, marker, program, bad):
    ran = tmp_path / "ran"
    env = _env(tmp_path, marker)

    def args_for(fd: int) -> list[str]:
        option = {
            "closed": ["--json-fd", "1000"],
            "read-only": ["--json-fd", str(fd)],
            "stdio": ["--json-fd", "2"],
            "not-a-number": ["--json-fd", "３"],  # a digit to str.isdigit, not to corral
            "dev-fd-path": ["--json", f"/dev/fd/{fd}"],
            "both": ["--json", str(tmp_path / "r.json"), "--json-fd", str(fd)],
            "background": ["--background", "--json-fd", str(fd)],
        }[bad]
        return [*option, "--", "sh", "-c", _script(fd, str(ran))]

    proc, _ = _run(program, args_for, env, readable=bad == "read-only")
    assert proc.returncode == 125, proc.stderr
    assert proc.stderr.count(b"\n") == 1 and b"Traceback" not in proc.stderr, proc.stderr
    assert b"--json" in proc.stderr and proc.stdout == b""
    assert not ran.exists()
    if bad == "closed":
        assert proc.stderr == b"corral: --json-fd 1000: not an open descriptor\n"
    if bad == "read-only":
        assert proc.stderr.endswith(b": not open for writing\n")
    if bad == "dev-fd-path":
        assert b"use --json-fd" in proc.stderr


def test_the_record_to_a_descriptor_nobody_reads_is_a_warning_and_the_runs_exit_code(tmp_path, marker):
    r, w = os.pipe()
    os.close(r)  # EPIPE on the write
    try:
        proc = subprocess.run(
            [*CORRAL, "--json-fd", str(w), "--", "sh", "-c", "exit 3"],
            env=_env(tmp_path, marker),
            pass_fds=(w,),
            capture_output=True,
            timeout=60,
        )
    finally:
        os.close(w)
    assert proc.returncode == 3, proc.stderr
    assert b"corral: cannot write --json record: " in proc.stderr and b"Traceback" not in proc.stderr


# -- what the client passes: the twin of the parser's --json-fd ---------------------------------
_OPTIONS = st.lists(
    st.sampled_from(
        [["--json-fd", "5"], ["--json-fd=7"], ["--json-fd", "12"], ["--wall", "1s"], ["--quiet"], ["--name", "x"]]
    ),
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(options=_OPTIONS, command=st.lists(st.sampled_from(["sh", "--json-fd", "9", "-c"]), min_size=1, max_size=4))
def test_the_clients_reading_is_the_parsers_for_every_line_with_a_separator(options, command):
    """For a line with ``--``, what a client passes (``named_in``) is what the
    service parses; without one it may read more, and the service then declines."""
    args = [a for option in options for a in option] + ["--", *command]
    assert record_fd.named_in(args) == parse_command_line(args).json_fd


def test_a_client_reading_a_commands_argument_is_not_served(service, tmp_path):
    """Without ``--`` a ``--json-fd`` among the command's arguments is the command's: the
    descriptor a client passed for it is not taken (the line runs in the client, where the
    command keeps it)."""
    r, w = os.pipe()
    try:
        args = ["sh", "-c", "true", "--json-fd", str(w)]
        assert record_fd.named_in(args) == w and parse_command_line(args).json_fd is None
        with pytest.raises(VarlinkError) as err:
            service.channel().call(RUN, _params(argv=args, json_fd=w, record=3), [0, 1, 2, w])
        assert err.value.name == "io.corral.Run.NotServed" and "--json-fd" in err.value.parameters["reason"]
    finally:
        os.close(r)
        os.close(w)


# -- the service's side, on the wire (no manager needed: it answers before any run) -------------
def _params(**overrides) -> dict:
    """A Run call's parameters (test_service's), without a control pipe: the descriptors are this test's."""
    return _run_params(control=None, **overrides)


def test_the_service_checks_the_descriptor_the_client_passed(service):
    r, w = os.pipe()
    try:
        # read-only: the CLI's words, a UsageError (125), before anything runs
        with pytest.raises(VarlinkError) as err:
            service.channel().call(
                RUN, _params(argv=["--json-fd", "7", "--", "true"], json_fd=7, record=3), [0, 1, 2, r]
            )
        assert err.value.name == "io.corral.Run.UsageError"
        assert err.value.parameters == {"message": "--json-fd 7: not open for writing"}
        # the number and the descriptor: both or neither
        for partial in ({"json_fd": 7}, {"record": 3}):
            with pytest.raises(VarlinkError) as err:
                service.channel().call(RUN, _params(**partial), [0, 1, 2, w])
            assert err.value.name == "org.varlink.service.InvalidParameter"
        # a line naming --json-fd whose descriptor the client did not pass (an older client), or another one
        for passed in ({}, {"json_fd": 8, "record": 3}):
            with pytest.raises(VarlinkError) as err:
                service.channel().call(RUN, _params(argv=["--json-fd", "7", "--", "true"], **passed), [0, 1, 2, w])
            assert err.value.name == "io.corral.Run.NotServed", err.value
    finally:
        os.close(r)
        os.close(w)
    assert service.alive()


# -- through a real service (beside a manager) --------------------------------------------------
@pytest.mark.systemd
@pytest.mark.parametrize("unit_type", ["scope", "service"])
def test_through_the_service_the_record_arrives_on_the_clients_descriptor(tmp_path, marker, unit_type, client_argv):
    from modes import MANAGER, _unavailable, manager_reachable

    if not manager_reachable():
        _unavailable(f"no systemd {MANAGER} manager reachable")
    svc = Service(tmp_path)
    try:
        env = svc.env(**{MARKER_ENV: marker})
        args = lambda fd: ["--unit-type", unit_type, "--json-fd", str(fd), "--", "sh", "-c", _script(fd)]  # noqa: E731
        proc, carried = _run(client_argv, args, env)
        record = _assert_record_apart(proc, carried, "service")
        assert record["mode"] == "systemd"
        assert svc.status()["runs_served"] == 1
        ran = tmp_path / "ran"
        proc, _ = _run(client_argv, lambda fd: ["--json-fd", str(fd), "--", "touch", str(ran)], env, readable=True)
        assert proc.returncode == 125 and proc.stderr.endswith(b": not open for writing\n"), proc.stderr
        assert proc.stderr.count(b"\n") == 1 and not ran.exists()
        assert svc.status()["runs_served"] == 1
        assert not marked_pids(marker)
    finally:
        svc.stop()


@pytest.fixture(params=["python", "compiled"])
def client_argv(request) -> list[str]:
    return list(CORRAL) if request.param == "python" else request.getfixturevalue("compiled_client")


# -- the framing of --json - (docs/results.md, man corral.1) ------------------------------------
def test_json_dash_record_starts_at_the_last_line_that_is_an_opening_brace(tmp_path, marker):
    """``--json -``: the record follows the command's output with no separator; when that
    output ends in a newline, the record is everything from the last line that is exactly
    ``{`` (the record's own nested objects are indented, so none of its other lines is)."""
    proc = subprocess.run(
        [*CORRAL, "--quiet", "--json", "-", "--", "printf", "{\\n}\\n{\\n"],
        env=_env(tmp_path, marker),
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split(b"\n")
    start = max(i for i, line in enumerate(lines) if line == b"{")
    assert b"\n".join(lines[:start]) + b"\n" == b"{\n}\n{\n"
    record = json.loads(b"\n".join(lines[start:]))
    assert record["exit_code"] == 0 and record["argv"][0] == "printf"
