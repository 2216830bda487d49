"""One way in (issue 26): ``core/request.py`` reads every command line.

corral's own parser (``request.parse_options``) and the click command that
prints --help (``cli.click_command``) are built from the one table,
``request.OPTIONS``. These tests hold them to the same reading: for every
line of the corpus, the same RunSpec, the same one-line error, or both
print. A parser that splits differently from the help it prints is a bug a
user meets as "the help says X, corral did Y".
"""

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral_systemd import cli
from corral_systemd.common.errors import UsageError
from corral_systemd.core import request

CORPUS = [
    ["--wall=5s", "true"],
    ["--wall", "5s", "true"],
    ["-pCPUWeight=10", "true"],
    ["-p", "CPUWeight=10", "-p", "IOWeight=5", "true"],
    ["--property=CPUWeight=10", "true"],
    ["--wall", "1s", "--wall", "2s", "true"],
    ["--", "-x"],
    ["--", "--wall", "1s"],
    ["true", "--wall", "3s"],
    ["-", "x"],
    ["--wall", "-5", "x"],
    ["--json", "-", "x"],
    ["--env-keep", "A*", "--env-keep", "B", "--env-clear", "x"],
    ["--cgroup-mode", "fallback", "--stdin", "inherit", "--network", "none", "x"],
    ["--unit-type", "service", "--manager", "user", "--slice", "a.slice", "x"],
    ["--quiet", "--no-registry", "--pty", "x"],
    # errors: the same one line
    ["--wal", "1s", "x"],
    ["--grac", "1s", "x"],
    ["--", ""],
    ["--wall"],
    ["--wall", "1s"],
    [],
    ["--quiet=1", "x"],
    ["-x", "y"],
    ["-hx", "y"],
    ["--cgroup-mode", "bogus", "x"],
    ["--stdin=tty", "x"],
    # printing wins over a value check, not over a split error
    ["--cgroup-mode", "bogus", "--help", "x"],
    ["--help", "--wal"],
    ["-h"],
    ["--version", "--wall", "nonsense", "x"],
]


def _mine(args):
    try:
        parsed = request.parse_command_line(args, default_mode="auto", environ={}, cwd="/")
    except request.Printing:
        return ("prints",)
    except UsageError as exc:
        return ("error", str(exc))
    return ("spec", _comparable(parsed.spec), parsed.json_path, parsed.quiet)


def _clicks(args):
    """The same line through the click command built from the same table:
    its split and parameters, then ``request.from_options`` (which takes
    either parser's values)."""
    command = cli.click_command("auto")
    try:
        with command.make_context("corral", list(args)) as ctx:
            params = ctx.params
    except click.exceptions.Exit:
        return ("prints",)
    except click.ClickException as exc:
        return ("error", exc.format_message())
    try:
        parsed = request.from_options(params, list(params.pop("command")), environ={}, cwd="/")
    except UsageError as exc:
        return ("error", str(exc))
    return ("spec", _comparable(parsed.spec), parsed.json_path, parsed.quiet)


def _comparable(spec):
    return {k: v for k, v in vars(spec).items() if k != "run_id"}


@pytest.mark.parametrize("args", CORPUS, ids=[" ".join(a) or "(empty)" for a in CORPUS])
def test_the_parser_reads_a_line_as_the_help_describes_it(args, capsys):
    mine, clicks = _mine(args), _clicks(args)
    capsys.readouterr()  # what click printed for --help
    assert mine == clicks


def test_the_corpus_covers_every_outcome():
    """A corpus of one kind of line could not tell the parsers apart."""
    outcomes = {_mine(a)[0] for a in CORPUS}
    assert outcomes == {"spec", "error", "prints"}


_FLAGS = [f for o in request.OPTIONS if not o.printing for f in o.flags]
_token = st.one_of(
    st.sampled_from(_FLAGS),
    st.sampled_from(_FLAGS).map(lambda f: f + "=1s" if f.startswith("--") else f + "1"),
    st.sampled_from(["1s", "5", "-", "--", "x", "fallback", "service", "none", "A=1", "-q", "--nope"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=st.lists(_token, max_size=6))
def test_any_line_is_read_alike(args):
    assert _mine(args) == _clicks(args)
