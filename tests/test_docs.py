"""Issue 13, items 16-18: what README.md and the man pages say matches what the code does."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CTL = [sys.executable, "-c", "import sys; from corral_systemd.ctl import main; sys.exit(main())"]


def _man(page: str) -> str:
    out = subprocess.run(
        ["man", "-l", str(ROOT / "man" / page)],
        capture_output=True,
        text=True,
        env={"MANWIDTH": "2000", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        timeout=60,
    )
    if out.returncode != 0:
        pytest.skip(f"man cannot render: {out.stderr.strip()}")
    return re.sub(r"\s+", " ", out.stdout.replace("\u2010", "-"))


def _readme_section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_terminal_signals_are_described_as_they_happen():
    """Item 16: Ctrl-C reaches corral (tests/test_terminal.py shows it), not the command."""
    text = _man("corral.1")
    assert "never reach" not in text
    assert "Ctrl-C sends SIGINT to corral, not to the command" in text
    assert "an INT trap in it does not run, but a TERM trap does" in text
    assert "Ctrl-C goes to corral, not to the command" in README and "`trap … TERM` does" in README


@pytest.mark.parametrize("where", ["README.md", "corral.1"])
def test_the_service_environment_is_listed(where):
    """Item 17: what a service adds (tests/test_service_env.py pins it)."""
    text = README if where == "README.md" else _man("corral.1")
    for name in (
        "INVOCATION_ID",
        "MANAGERPID",
        "SYSTEMD_EXEC_PID",
        "show-environment",
        "UnsetEnvironment=",
        "CORRAL_RUN_MARK",
    ):
        assert name in text, name


def _help_options(argv: list[str]) -> list[str]:
    text = subprocess.run(CTL + argv + ["--help"], capture_output=True, text=True, timeout=60).stdout
    body = text.split("Options:", 1)[1]
    return [m for m in re.findall(r"^\s+(?:-[a-z], )?(--[a-z][a-z-]*)", body, re.M) if m != "--help"]


def test_readme_corralctl_synopsis_matches_help():
    """Item 18: every corralctl command and each of its options, as --help lists them."""
    block = README.split("```\ncorralctl ps", 1)[1].split("```", 1)[0]
    block = "corralctl ps" + block
    synopsis = {}
    for line in block.splitlines():
        m = re.match(r"^corralctl ((?:audit |session )?[a-z]+)(.*)$", line)
        if m:
            synopsis[m.group(1)] = m.group(2).split("  ")[0] if "  " in m.group(2) else m.group(2)
    assert sorted(synopsis) == [
        "audit verify",
        "gc",
        "logs",
        "ps",
        "session end",
        "session ls",
        "session start",
        "status",
        "stop",
        "wait",
    ]
    for command, text in synopsis.items():
        assert sorted(re.findall(r"--[a-z][a-z-]*", text)) == sorted(_help_options(command.split())), command


def test_readme_says_how_long_the_tests_take_and_what_they_run():
    """Item 18: duration, the harness steps, the VM lane and how to run it."""
    text = _readme_section("Run the tests")
    for needle in (
        "about 30 minutes",
        "about 10 minutes",
        "CORRAL_VM_LANE=0",
        "tests/vm/run-lane",
        "tests/harness/with-user-manager",
        "manager_kill",
        "private_run",
        "hybrid",
        "unified",
    ):
        assert needle in text, needle


def test_readme_says_how_pip_users_read_the_man_pages():
    """Issue 13 item 15: `man corralctl` fails after a pip install; README says what to do."""
    readme = (ROOT / "README.md").read_text()
    assert "man -l man/corral.1" in readme and "pip" in readme.split("man -l man/corral.1")[0][-400:]
