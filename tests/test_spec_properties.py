"""Property tests: any option value gives a valid RunSpec or a clean 125/UsageError (issue 13, item 11).

A valid RunSpec is one every engine can express: durations finite and
within systemd's uint64 microseconds (their sum too), sizes within a
uint64 byte count that is not "infinity", pids within the kernel's limit.
Nothing is started: the CLI's run step is replaced by one that keeps the spec.
"""

import contextlib
import io
import math
import subprocess
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import CORRAL
from corral_systemd import cli
from corral_systemd.api import make_spec
from corral_systemd.common.errors import UsageError
from corral_systemd.core.spec import MAX_DURATION, MAX_PIDS, MAX_SIZE, RunSpec

UINT64_MAX = 2**64 - 1
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_valid(spec: RunSpec) -> None:
    for name in ("wall", "grace", "verify_timeout"):
        value = getattr(spec, name)
        if value is not None:
            assert isinstance(value, float) and math.isfinite(value) and 0 <= value <= MAX_DURATION
    backstop = (spec.wall or 0) + spec.grace + spec.verify_timeout
    assert int(backstop * 1_000_000) < UINT64_MAX  # RuntimeMaxUSec, TimeoutStopUSec
    for name in ("mem", "max_output"):
        value = getattr(spec, name)
        assert value is None or (type(value) is int and 0 < value <= MAX_SIZE < UINT64_MAX)
    assert spec.pids is None or (type(spec.pids) is int and 0 < spec.pids <= MAX_PIDS)


# -- the command line ---------------------------------------------------------------------------
def _cli(args: list[str]):
    """(exit code, stderr, spec or None) of ``corral ARGS -- true``, without running anything."""
    kept = []

    def fake_run(request):
        kept.append(request.spec)
        return 0

    err = io.StringIO()
    with (
        mock.patch.object(cli, "run", fake_run),
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        code = cli.main([*args, "--", "true"])
    return code, err.getvalue(), kept[0] if kept else None


def _check_cli(args):
    code, err, spec = _cli(args)
    if code == 0:
        assert spec is not None and err == ""
        assert_valid(spec)
    else:
        assert code == 125, (args, code, err)
        assert spec is None
        assert err.count("\n") == 1 and err.startswith("corral: "), (args, err)
    _check_service_parse(args, spec, err)


def _check_service_parse(args, spec, err):
    """The corral service parses a client's command line with
    ``request.parse_command_line``: the same spec, or the same one-line error,
    as ``corral`` itself."""
    from corral_systemd.common.errors import UsageError
    from corral_systemd.core.request import parse_command_line

    try:
        parsed = parse_command_line([*args, "--", "true"], default_mode="auto", environ={}, cwd="/")
    except UsageError as exc:
        assert spec is None and err == f"corral: {exc}\n", (args, err, str(exc))
        return
    assert spec is not None, (args, err)
    mine = {k: v for k, v in vars(parsed.spec).items() if k not in ("run_id", "env", "cwd")}
    assert mine == {k: v for k, v in vars(spec).items() if k not in ("run_id", "env", "cwd")}


VALUE_OPTIONS = [
    "--wall",
    "--grace",
    "--verify-timeout",
    "--mem",
    "--pids",
    "--max-output",
    "--cgroup-mode",
    "--stdin",
    "--manager",
    "--unit-type",
    "--slice",
]

#: Text that looks like values: digits, suffixes, signs, dots, exponents, spaces, unicode digits.
value_text = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"[-+ ]?[0-9٣²]{0,25}(\.[0-9]{0,5})?(e[0-9]{1,3})?(ms|s|m|h|K|M|G|E|)?[ \t]?", fullmatch=True),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
)


@SETTINGS
@given(option=st.sampled_from(VALUE_OPTIONS), value=value_text)
def test_every_option_value_is_a_valid_spec_or_125(option, value):
    _check_cli([option, value])


@SETTINGS
@given(wall=value_text, mem=value_text, pids=value_text, grace=value_text)
def test_option_combinations_are_a_valid_spec_or_125(wall, mem, pids, grace):
    _check_cli(["--wall", wall, "--mem", mem, "--pids", pids, "--grace", grace])


@pytest.mark.parametrize(
    "args",
    [
        ["--wall", "99999999999h"],
        ["--pids", "99999999999999999999"],
        ["--mem", "99999999999999999999G"],
        ["--max-output", "9999999999999G"],
        ["--grace", "9999999999h"],
        ["--verify-timeout", "1e400s"],
    ],
)
def test_out_of_range_values_are_125_one_line(args, tmp_path):
    """End to end: the issue's values, one line, exit 125, nothing started."""
    witness = tmp_path / "ran"
    proc = subprocess.run(
        [*CORRAL, "--cgroup-mode", "fallback", *args, "--", "touch", str(witness)],
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 125 and len(err.splitlines()) == 1 and err.startswith("corral: "), err
    assert not witness.exists()


def test_the_largest_values_are_accepted():
    code, err, spec = _cli(["--wall", "876000h", "--mem", f"{MAX_SIZE}", "--pids", str(MAX_PIDS)])
    assert code == 0, err
    assert_valid(spec)


# -- the library ----------------------------------------------------------------------------------
anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    value_text,
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=2),
)


@SETTINGS
@given(wall=anything, grace=anything, verify_timeout=anything, mem=anything, pids=anything, max_output=anything)
def test_make_spec_limits_are_a_valid_spec_or_usage_error(wall, grace, verify_timeout, mem, pids, max_output):
    kwargs = {
        k: v
        for k, v in dict(
            wall=wall, grace=grace, verify_timeout=verify_timeout, mem=mem, pids=pids, max_output=max_output
        ).items()
        if v is not None or k not in ("grace", "verify_timeout")
    }
    try:
        spec = make_spec(["true"], **kwargs)
    except UsageError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert_valid(spec)


@SETTINGS
@given(
    argv=st.lists(st.one_of(st.text(max_size=5), st.integers(), st.binary(max_size=3)), max_size=3),
    mode=anything,
    unit_type=anything,
    manager=anything,
    slice_=anything,
    stdin=anything,
    cwd=anything,
    env=st.one_of(st.none(), st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2), st.integers()),
)
def test_make_spec_other_arguments_are_a_valid_spec_or_usage_error(
    argv, mode, unit_type, manager, slice_, stdin, cwd, env
):
    try:
        spec = make_spec(
            argv, mode=mode, unit_type=unit_type, manager=manager, slice=slice_, stdin=stdin, cwd=cwd, env=env
        )
    except UsageError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert_valid(spec)
    assert spec.argv and all(isinstance(a, str) and "\0" not in a for a in spec.argv)


@SETTINGS
@given(name=st.sampled_from(["wall", "grace", "verify_timeout", "mem", "pids", "max_output"]), value=anything)
def test_make_spec_each_limit_alone_is_a_valid_spec_or_usage_error(name, value):
    try:
        spec = make_spec(["true"], **{name: value})
    except UsageError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert_valid(spec)


def test_the_longest_wall_runs(tmp_path):
    """A wall of 100 years is accepted and the run behaves: poll() waits are cut into rounds
    (poll takes at most INT_MAX ms, about 24 days)."""
    proc = subprocess.run(
        [
            *CORRAL,
            "--cgroup-mode",
            "fallback",
            "--no-registry",
            "--wall",
            "876000h",
            "--",
            "sh",
            "-c",
            "sleep 0.2; exit 5",
        ],
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 5, proc.stderr
