"""The man pages: they render without a single groff warning, and their
OPTIONS sections match what ``--help`` prints (names, metavars/choices and
defaults), in both directions. For corralctl also per command: the page's
COMMANDS are the CLI's commands, each with its arguments and options.

Needs groff (Debian: groff-base). Without it the tests skip, unless $CI is
set: in CI a missing groff is a failure.
"""

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import corral_systemd
from corral_systemd import ctl
from corral_systemd.common.limits import ENDS_RUN, LIMITS

ROOT = Path(__file__).resolve().parent.parent
MAN = ROOT / "man"

PAGES = {
    # page -> (argv for that program's --help, defaults the page states on purpose
    #          differently from --help)
    "corral.1": ([sys.executable, "-m", "corral_systemd"], {}),
    "corral-enforced.1": (
        [sys.executable, "-c", "from corral_systemd.client import entry_enforced; entry_enforced()"],
        {},
    ),
}
CTL_PAGE = "corralctl.1"
CTL = [sys.executable, "-m", "corral_systemd.ctl"]
ALL_PAGES = sorted(PAGES) + [CTL_PAGE]
REQUIRED_SECTIONS = {
    "corral.1": [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "EXIT STATUS",
        "MODES",
        "ENVIRONMENT",
        "FILES",
        "EXAMPLES",
        "LIMITATIONS",
        "SEE ALSO",
    ],
    "corral-enforced.1": ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "EXAMPLES", "SEE ALSO"],
    CTL_PAGE: [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "COMMANDS",
        "OPTIONS",
        "EXIT STATUS",
        "ENVIRONMENT",
        "FILES",
        "EXAMPLES",
        "LIMITATIONS",
        "SEE ALSO",
    ],
}
SEE_ALSO = {
    "corral.1": ["systemd-run(1)", "systemd.resource-control(5)", "timeout(1)", "corralctl(1)"],
    "corral-enforced.1": ["systemd-run(1)", "systemd.resource-control(5)", "timeout(1)", "corralctl(1)"],
    CTL_PAGE: ["corral(1)", "corral-enforced(1)", "systemctl(1)"],
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
    proc = subprocess.run(
        [_groff(), "-man", "-Tascii", "-rLL=1000n", "-P-cbou", str(MAN / page)],
        capture_output=True,
        text=True,
        check=True,
    )
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
    return _options_in(_sections(text)["OPTIONS"])


def _options_in(section: str) -> dict[str, dict]:
    opts, current = {}, None
    for line in section.splitlines():
        m = re.match(r"^ {7}(--[a-z][a-z-]*)(?: ([A-Z]+|[a-z]+(?:\|[a-z]+)+))?(?:\s+(.*))?$", line)
        if m:
            current = opts.setdefault(m.group(1), {"arg": m.group(2), "body": m.group(3) or ""})
        elif current is not None and line.startswith(" " * 14):
            current["body"] += " " + line.strip()
    for opt in opts.values():
        opt["body"] = " ".join(opt["body"].split())
    return opts


def _help(argv: list[str]) -> str:
    env = dict(os.environ, COLUMNS="200", TERM="dumb")
    proc = subprocess.run(argv + ["--help"], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _help_section(text: str, name: str) -> str:
    """The body of a click help section ("Options", "Commands", "Arguments"), or ""."""
    m = re.search(rf"^{name}:\n((?:  .*\n?|\n)*)", text, re.M)
    return m.group(1) if m else ""


def _help_options(argv: list[str]) -> dict[str, dict]:
    """--option -> {"arg": metavar or choices, "default": value or None}."""
    return _options_from_help(_help(argv))


def _options_from_help(text: str) -> dict[str, dict]:
    entries: list[str] = []
    for line in _help_section(text, "Options").splitlines():
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
        result[m.group(1)] = {
            "arg": m.group(2).strip("[]") if m.group(2) else None,
            "default": default.group(1).strip() if default else None,
        }
    return result


@pytest.mark.parametrize("page", ALL_PAGES)
def test_renders_without_warnings(page):
    proc = subprocess.run([_groff(), "-man", "-Tutf8", "-ww", "-z", str(MAN / page)], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("page", ALL_PAGES)
def test_has_required_sections(page):
    sections = _sections(_render(page))
    missing = [name for name in REQUIRED_SECTIONS[page] if name not in sections]
    assert not missing, f"{page} lacks sections {missing}"
    for ref in SEE_ALSO[page]:
        assert ref in sections["SEE ALSO"], f"{page}: SEE ALSO lacks {ref}"


@pytest.mark.parametrize("page", ALL_PAGES)
def test_version_matches_package(page):
    th = next(line for line in (MAN / page).read_text().splitlines() if line.startswith(".TH "))
    assert f"corral-systemd {corral_systemd.__version__}" in th, th


@pytest.mark.parametrize("page", sorted(PAGES))
def test_options_match_help(page):
    argv, page_defaults = PAGES[page]
    help_opts = _help_options(argv)
    page_opts = _page_options(_render(page))

    _compare_options(page, help_opts, page_opts, page_defaults)


def _compare_options(where: str, help_opts: dict, page_opts: dict, page_defaults: dict) -> None:
    """The same options on both sides, each with the same metavar/choices and the default --help shows."""
    assert sorted(set(help_opts) - set(page_opts)) == [], f"options in --help but not in {where} OPTIONS"
    assert sorted(set(page_opts) - set(help_opts)) == [], f"options in {where} OPTIONS but not in --help"

    for name, h in help_opts.items():
        p = page_opts[name]
        assert p["arg"] == h["arg"], f"{where} {name}: page shows {p['arg']!r}, --help {h['arg']!r}"
        default = page_defaults.get(name, h["default"])
        if default is not None:
            assert re.search(r"Default: " + re.escape(default) + r"\b", p["body"]), (
                f"{where} {name}: page does not say 'Default: {default}': {p['body']!r}"
            )
        elif p["arg"] is not None:
            # Options with a value but no default in --help must say what happens without them.
            assert "Default: none" in p["body"], f"{where} {name}: no 'Default: none': {p['body']!r}"


def test_corral_exit_status_table_is_complete():
    """Every exit code corral has: its own, and each run-ending limit's (read from
    limits.py, so a new limit is not documented until its page says so)."""
    text = _sections(_render("corral.1"))["EXIT STATUS"]
    limit_codes = [str(limit.exit_code) for limit in ENDS_RUN.values()]
    for code in ("120", "125", "126", "127", "128+N", *limit_codes):
        assert re.search(rf"^ {{7}}{re.escape(code)}\b", text, re.M), f"exit status {code} missing"
    assert "overrides" in text


def test_every_limit_has_its_option_on_the_page():
    options = _sections(_render("corral.1"))["OPTIONS"]
    for limit in LIMITS:
        assert re.search(rf"^ {{7}}{re.escape(limit.option)} {limit.metavar}\b", options, re.M), limit.option


# --- corralctl: commands and per-command options -------------------------------------------------


@functools.cache
def _help_commands(path: tuple[str, ...] = ()) -> dict[tuple[str, ...], str]:
    """Every command path of corralctl (groups and leaves) -> its --help text."""
    text = _help(CTL + list(path))
    tree = {path: text}
    for line in _help_section(text, "Commands").splitlines():
        m = re.match(r"^  ([a-z][a-z-]*)\s", line)
        if m:
            tree.update(_help_commands(path + (m.group(1),)))
    return tree


def _is_group(text: str) -> bool:
    return bool(_help_section(text, "Commands"))


def _page_commands(text: str) -> dict[tuple[str, ...], dict]:
    """COMMANDS: command path -> {"options": [--opt...], "arguments": [METAVAR...]} from each heading."""
    out = {}
    for line in _sections(text)["COMMANDS"].splitlines():
        m = re.match(r"^ {7}([a-z][a-z-]*(?: [a-z][a-z-]*)*)((?: .*)?)$", line)
        if not m:
            continue
        rest = m.group(2)
        bare = re.sub(r"\[[^\]]*\]", "", rest)  # positional arguments are outside brackets
        out[tuple(m.group(1).split())] = {
            "options": re.findall(r"--[a-z][a-z-]*", rest),
            "arguments": re.findall(r"\b[A-Z][A-Z_]*\b", bare),
        }
    return out


def _page_command_options(text: str) -> dict[tuple[str, ...], dict[str, dict]]:
    """OPTIONS, split by its subsections ("corralctl", "corralctl gc", ...): command path -> options.

    Options before the first subsection come out under a path no command has.
    """
    out, name, chunk = {}, None, []
    for line in _sections(text)["OPTIONS"].splitlines() + ["   end"]:
        m = re.match(r"^ {3}(\S.*)$", line)
        if m:
            options = _options_in("\n".join(chunk))
            if name is not None or options:
                out[("(before any subsection)",) if name is None else name] = options
            words = m.group(1).split()
            name, chunk = (tuple(words[1:]) if words[0] == "corralctl" else ("?",) + tuple(words)), []
        else:
            chunk.append(line)
    return out


def test_corralctl_commands_match_help():
    """Each command in --help has a COMMANDS entry and each entry a command, with the same arguments and options."""
    tree = _help_commands()
    leaves = {path for path, text in tree.items() if path and not _is_group(text)}
    page = _page_commands(_render(CTL_PAGE))
    assert sorted(leaves - set(page)) == [], f"commands in --help but not in {CTL_PAGE} COMMANDS"
    assert sorted(set(page) - leaves) == [], f"commands in {CTL_PAGE} COMMANDS but not in --help"
    for path in sorted(leaves):
        text = tree[path]
        arguments = re.findall(r"^  ([A-Z][A-Z_]*)\s", _help_section(text, "Arguments"), re.M)
        options = sorted(set(_options_from_help(text)) - {"--help"})
        where = "corralctl " + " ".join(path)
        shown = page[path]
        assert shown["arguments"] == arguments, f"{where}: page shows {shown['arguments']}, --help {arguments}"
        assert sorted(shown["options"]) == options, f"{where}: page shows {shown['options']}, --help {options}"


def test_corralctl_options_match_help():
    """OPTIONS has a subsection per command with options of its own; --help (every command's) is under corralctl."""
    tree = _help_commands()
    page = _page_command_options(_render(CTL_PAGE))
    assert sorted(set(page) - set(tree)) == [], f"{CTL_PAGE} OPTIONS subsections for commands that do not exist"
    assert "--help" in page.get((), {}), f"{CTL_PAGE}: --help is not under the corralctl subsection"
    for path, text in sorted(tree.items()):
        help_opts = _options_from_help(text)
        assert "--help" in help_opts, path
        page_opts = dict(page.get(path, {}))
        if path:
            help_opts.pop("--help")
        _compare_options(f"{CTL_PAGE} corralctl {' '.join(path)}".rstrip(), help_opts, page_opts, {})


def test_corralctl_exit_status_table_is_complete():
    text = _sections(_render(CTL_PAGE))["EXIT STATUS"]
    codes = {0, 1, 125, 130} | set(ctl.STATUS_EXIT.values())
    for code in sorted(codes):
        assert re.search(rf"^ {{7}}{code}\b", text, re.M), f"exit status {code} missing"
    listed = {int(c) for c in re.findall(r"^ {7}(\d+)\b", text, re.M)}
    assert listed == codes, f"exit statuses on the page but not known: {sorted(listed - codes)}"
