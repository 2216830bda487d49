"""The man pages: they render without a single groff warning, and their
OPTIONS sections match what ``--help`` prints (names, metavars/choices and
defaults), in both directions.

Needs groff (Debian: groff-base). Without it the tests skip, unless $CI is
set: in CI a missing groff is a failure.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import corral_systemd

ROOT = Path(__file__).resolve().parent.parent
MAN = ROOT / "man"

PAGES = {
    # page -> (argv for that program's --help, defaults the page states on purpose
    #          differently from --help)
    "corral.1": ([sys.executable, "-m", "corral_systemd"], {}),
    "corral-enforced.1": (
        [sys.executable, "-c", "from corral_systemd.cli import entry_enforced; entry_enforced()"],
        {},
    ),
}
REQUIRED_SECTIONS = {
    "corral.1": ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "MODES", "ENVIRONMENT",
                 "FILES", "EXAMPLES", "LIMITATIONS", "SEE ALSO"],
    "corral-enforced.1": ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "EXAMPLES", "SEE ALSO"],
}


def _groff() -> str:
    path = shutil.which("groff")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("groff is not installed (Debian: apt-get install groff-base); required when $CI is set")
        pytest.skip("groff is not installed (Debian: groff-base)")
    return path


def _render(page: str) -> str:
    """Plain ASCII text, one paragraph per line (a very long line length)."""
    proc = subprocess.run([_groff(), "-man", "-Tascii", "-rLL=1000n", "-P-cbou", str(MAN / page)],
                          capture_output=True, text=True, check=True)
    return proc.stdout


def _sections(text: str) -> dict[str, str]:
    sections, name = {}, None
    for line in text.splitlines():
        if re.match(r"^[A-Z][A-Z ]+$", line):
            name = line.strip()
            sections[name] = ""
        elif name is not None:
            sections[name] += line + "\n"
    return sections


def _page_options(text: str) -> dict[str, dict]:
    """--option -> {"arg": metavar or choices as printed, "body": text}."""
    opts, current = {}, None
    for line in _sections(text)["OPTIONS"].splitlines():
        m = re.match(r"^ {7}(--[a-z][a-z-]*)(?: ([A-Z]+|[a-z]+(?:\|[a-z]+)+))?(?:\s+(.*))?$", line)
        if m:
            current = opts.setdefault(m.group(1), {"arg": m.group(2), "body": m.group(3) or ""})
        elif current is not None and line.startswith(" " * 14):
            current["body"] += " " + line.strip()
    for opt in opts.values():
        opt["body"] = " ".join(opt["body"].split())
    return opts


def _help_options(argv: list[str]) -> dict[str, dict]:
    """--option -> {"arg": metavar or choices, "default": value or None}."""
    env = dict(os.environ, COLUMNS="200", TERM="dumb")
    proc = subprocess.run(argv + ["--help"], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    options = proc.stdout.split("\nOptions:\n", 1)[1]
    entries: list[str] = []
    for line in options.splitlines():
        if re.match(r"^  -", line):
            entries.append(line)
        elif entries:
            entries[-1] += " " + line
    result = {}
    for entry in entries:
        # On the raw line, the option and its metavar are separated from the help by 2+ spaces.
        m = re.match(r"^  (?:-\w, )?(--[a-z][a-z-]*)(?:, -\w)?(?: ([A-Z]+|\[[a-z|]+\]))?(?:  |$)", entry)
        entry = " ".join(entry.split())
        assert m, entry
        default = re.search(r"\[default: ([^\]]+)\]", entry)
        result[m.group(1)] = {"arg": m.group(2).strip("[]") if m.group(2) else None,
                              "default": default.group(1).strip() if default else None}
    return result


@pytest.mark.parametrize("page", sorted(PAGES))
def test_renders_without_warnings(page):
    proc = subprocess.run([_groff(), "-man", "-Tutf8", "-ww", "-z", str(MAN / page)],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("page", sorted(PAGES))
def test_has_required_sections(page):
    sections = _sections(_render(page))
    missing = [name for name in REQUIRED_SECTIONS[page] if name not in sections]
    assert not missing, f"{page} lacks sections {missing}"
    assert "systemd-run(1)" in sections["SEE ALSO"]
    assert "systemd.resource-control(5)" in sections["SEE ALSO"]
    assert "timeout(1)" in sections["SEE ALSO"]


@pytest.mark.parametrize("page", sorted(PAGES))
def test_version_matches_package(page):
    th = next(line for line in (MAN / page).read_text().splitlines() if line.startswith(".TH "))
    assert f"corral-systemd {corral_systemd.__version__}" in th, th


@pytest.mark.parametrize("page", sorted(PAGES))
def test_options_match_help(page):
    argv, page_defaults = PAGES[page]
    help_opts = _help_options(argv)
    page_opts = _page_options(_render(page))

    assert sorted(set(help_opts) - set(page_opts)) == [], f"options in --help but not in {page} OPTIONS"
    assert sorted(set(page_opts) - set(help_opts)) == [], f"options in {page} OPTIONS but not in --help"

    for name, h in help_opts.items():
        p = page_opts[name]
        assert p["arg"] == h["arg"], f"{page} {name}: page shows {p['arg']!r}, --help {h['arg']!r}"
        default = page_defaults.get(name, h["default"])
        if default is not None:
            assert re.search(r"Default: " + re.escape(default) + r"\b", p["body"]), \
                f"{page} {name}: page does not say 'Default: {default}': {p['body']!r}"
        elif p["arg"] is not None:
            # Options with a value but no default in --help must say what happens without them.
            assert "Default: none" in p["body"], f"{page} {name}: no 'Default: none': {p['body']!r}"


def test_exit_status_table_is_complete():
    text = _sections(_render("corral.1"))["EXIT STATUS"]
    for code in ("120", "125", "126", "127", "128+N", "124", "121", "122"):
        assert re.search(rf"^ {{7}}{re.escape(code)}\b", text, re.M), f"exit status {code} missing"
    assert "overrides" in text
