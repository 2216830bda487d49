"""What README.md, docs/, ARCHITECTURE.md and the man pages say matches what the code does.

README.md is the short introduction (Try it, every option, exit codes, recipes, the tiers, the
test command); the rest lives in docs/*.md and ARCHITECTURE.md, linked from it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOC_FILES = sorted((ROOT / "docs").glob("*.md"))
ARCHITECTURE = (ROOT / "ARCHITECTURE.md").read_text()
SESSIONS_DOC = (ROOT / "docs" / "sessions.md").read_text()
TESTING_DOC = (ROOT / "docs" / "testing.md").read_text()
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
    assert "Ctrl-C goes to corral, not to the command" in ARCHITECTURE and "`trap … TERM` does" in ARCHITECTURE


@pytest.mark.parametrize("where", ["docs/sessions.md", "corral.1"])
def test_the_service_environment_is_listed(where):
    """Item 17: what a service adds (tests/test_service_env.py pins it)."""
    text = SESSIONS_DOC if where == "docs/sessions.md" else _man("corral.1")
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


def test_corralctl_synopsis_matches_help():
    """Item 18: every corralctl command and each of its options, as --help lists them (docs/sessions.md)."""
    block = SESSIONS_DOC.split("```\ncorralctl ps", 1)[1].split("```", 1)[0]
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
    """Item 18: the test command and its duration in README; the harness steps, the VM lane and
    how to run it in docs/testing.md, which README links."""
    text = _readme_section("Run the tests")
    for needle in (
        "./tests/run ",
        "about 50 minutes on 2 cores",
        "both VM guests and the container lane included",
        "CORRAL_VM_LANE=0 CORRAL_CONTAINER_LANE=0 ./tests/run",
        "about 15 minutes",
        "docs/testing.md",
    ):
        assert needle in text, needle
    for needle in (
        "about 50 minutes",
        "CORRAL_VM_TRIXIE=0",
        "CORRAL_VM_LANE=0",
        "CORRAL_CONTAINER_LANE=0",
        "tests/vm/run-lane",
        "tests/containers/run-lane",
        "tests/harness/with-user-manager",
        "manager_kill",
        "private_run",
        "hybrid",
        "unified",
    ):
        assert needle in TESTING_DOC, needle


def test_readme_says_how_pip_users_read_the_man_pages():
    """Issue 13 item 15: `man corralctl` fails after a pip install; README says what to do."""
    readme = (ROOT / "README.md").read_text()
    assert "man -l man/corral.1" in readme and "pip" in readme.split("man -l man/corral.1")[0][-400:]


# -- the README's shape, its options, its links and its Try it ----------------------------------
def _corral_help_options() -> list[str]:
    """Every option ``corral --help`` lists (long names, and -p/-h as the short forms they are)."""
    text = subprocess.run(
        [sys.executable, "-m", "corral_systemd", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", "TERM": "dumb"},
        timeout=60,
    ).stdout
    body = text.split("Options:", 1)[1].split("Exit codes:", 1)[0]
    options = re.findall(r"^\s{1,4}(?:-[a-z], )?(--[a-z][a-z-]*)", body, re.M)
    assert len(options) > 30, text
    return options


def test_readme_is_short_and_in_order():
    lines = README.splitlines()
    assert len(lines) <= 300, len(lines)
    order = ["## Try it", "## Usage", "### Exit codes", "## Recipes", "## Guarantee tiers", "## Run the tests"]
    positions = [README.index(f"\n{title}") for title in order]
    assert positions == sorted(positions), order
    assert "pipx install ." in README and "`corral-systemd`" in README


def test_every_help_option_is_in_the_readme_usage_and_the_man_page():
    usage = _readme_section("Usage")
    man = _man("corral.1")
    for option in _corral_help_options():
        assert f"`{option}" in usage, f"{option} missing from README's Usage"
        assert option in man, f"{option} missing from man/corral.1"


def test_exit_codes_are_listed_once_in_the_readme():
    assert README.count("### Exit codes") == 1
    assert README.count("| 124 |") == 1 and README.count("**120**") == 1


def _relative_links(text: str) -> list[str]:
    links = re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)
    return [link for link in links if not re.match(r"^[a-z][a-z+.-]*:", link) and not link.startswith("#")]


@pytest.mark.parametrize(
    "doc", ["README.md", "ARCHITECTURE.md"] + [f"docs/{p.name}" for p in DOC_FILES], ids=lambda d: d
)
def test_no_relative_link_is_dead(doc):
    path = ROOT / doc
    links = _relative_links(path.read_text())
    dead = [link for link in links if not (path.parent / link.split("#", 1)[0]).exists()]
    assert not dead, dead


def test_readme_links_every_doc():
    for doc in DOC_FILES:
        assert f"(docs/{doc.name})" in README or f"(docs/{doc.name}#" in README, doc.name
    assert "(ARCHITECTURE.md)" in README and "(LICENSE)" in README and (ROOT / "LICENSE").is_file()


def test_readme_has_no_unresolvable_jargon():
    for phrase in ("this machine", "post-mortem", "F1–F15", "$AGENT_PID"):
        if phrase == "$AGENT_PID":
            assert "AGENT_PID=" in README or phrase not in README
            continue
        assert phrase not in README, phrase
    assert not re.search(r"\b[Ii]ssue \d+", README)
    for doc in DOC_FILES:
        text = doc.read_text()
        assert not re.search(r"\b[Ii]ssue \d+", text), doc.name
        assert "post-mortem" not in text and "this machine" not in text, doc.name
        assert "$AGENT_PID" not in text or "AGENT_PID=" in text, doc.name


_SUMMARY = re.compile(
    r"^corral: [a-z]+(?: corral-\S+)?: wall limit reached; exit 124; [0-9.]+s; \d+ processes stopped;"
    r".*; guarantee ([a-z]+)$"
)


def test_try_it_prints_what_the_readme_shows(tmp_path):
    """README's Try it: its corral part, run by the corral installed here; the summary line has the
    shape README shows (the tier is the host's), and every process was proven gone (124, not 120)."""
    block = _readme_section("Try it (fresh Debian 12, as root)")
    command = block.split("```sh\n", 1)[1].split("```", 1)[0].strip()
    assert "pip install ." in command
    corral_part = command.split("/opt/corral/bin/corral ", 1)[1]
    shown = block.split("```\n", 2)[2].split("```", 1)[0].strip()
    assert _SUMMARY.match(shown) and shown.endswith("; guarantee pidns"), shown
    script = corral_part.split("sh -c ", 1)[1].strip("'")
    assert script.startswith("setsid sleep 600 &")
    proc = subprocess.run(
        [sys.executable, "-m", "corral_systemd", "--wall", "2s", "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CORRAL_SERVICE": "0", "CORRAL_STATE_DIR": str(tmp_path / "state")},
    )
    assert proc.returncode == 124, proc.stderr
    assert proc.stdout == "started two daemons\n"
    last = proc.stderr.strip().splitlines()[-1]
    assert _SUMMARY.match(last), last


# -- every shell example in README.md and docs/ -------------------------------------------------
#: The languages of the fenced blocks that are shell examples.
SHELL_BLOCKS = ("sh", "bash", "console")
#: The annotation, on the line right before a fence, of an example that cannot run here.
_SKIP = re.compile(r"^<!-- docs-test: skip \((.+)\) -->$")
_FENCE = re.compile(r"^([ \t]*)```([\w-]*)[ \t]*\n(.*?)^\1```[ \t]*$", re.M | re.S)  # indented too (in a list)
#: Where a doc's example may take a while (a server, a session): well above any example's need.
EXAMPLE_TIMEOUT = 60


def shell_examples() -> list:
    """Every sh/bash/console block of README.md and docs/*.md (new files too), as pytest params
    (id ``doc:line``): (doc, line, language, text, why it is skipped or None)."""
    params = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        doc = path.relative_to(ROOT).as_posix()
        for match in _FENCE.finditer(text):
            indent, language, body = match.groups()
            if language not in SHELL_BLOCKS:
                continue
            line = text.count("\n", 0, match.start()) + 1
            before = [ln.strip() for ln in text[: match.start()].splitlines() if ln.strip()]
            skip = _SKIP.match(before[-1]) if before else None
            body = "".join(ln[len(indent) :] if ln.startswith(indent) else ln for ln in body.splitlines(True))
            params.append(pytest.param(doc, line, language, body, skip and skip.group(1), id=f"{doc}:{line}"))
    return params


def _console(text: str) -> list[tuple[str, list[str]]]:
    """A console block as (command, the output lines shown after it); ``$ `` starts a command,
    a line ending in ``\\`` continues it."""
    steps: list[tuple[str, list[str]]] = []
    continued = False
    for line in text.splitlines():
        if continued:
            steps[-1] = (steps[-1][0] + "\n" + line, steps[-1][1])
        elif line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        else:
            raise AssertionError(f"output before any command: {line!r}")
        continued = line.endswith("\\") and not steps[-1][1]
    return steps


def _shown_matches(shown: list[str], got: list[str]) -> bool:
    """The output a console block shows, line by line; ``…`` in a shown line stands for any text."""
    if len(shown) != len(got):
        return False
    return all(
        re.fullmatch(".*".join(map(re.escape, want.split("…"))), have) for want, have in zip(shown, got, strict=True)
    )


_NET_ISOLATION: list[str] | None = None


def _isolated_network() -> list[str]:
    """A network namespace of the example's own with only ``lo`` (its ports are its own: an
    example's server does not meet another test's; nothing outside is reached); [] where
    one cannot be had (not root)."""
    global _NET_ISOLATION
    if _NET_ISOLATION is None:
        probe = ["unshare", "--net", "sh", "-c", "ip link set lo up"]
        try:
            ok = subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        _NET_ISOLATION = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "net"] if ok else []
    return _NET_ISOLATION


@pytest.mark.parametrize("doc,line,language,text,skip", shell_examples())
def test_every_shell_example_runs(tmp_path, doc, line, language, text, skip):
    """Each sh/bash/console example of README.md and docs/ runs here as written, by bash in an
    empty directory, with this install's corral first on PATH, a registry of its own and a
    network namespace of its own: it finishes (exit 0) within EXAMPLE_TIMEOUT, no command
    of it exits 125 (bad input), 126 or 127 (not found, not executable), what a console
    block shows is what it prints (``…``: any text), and no process it started is left
    (the test's marker, in /proc). An example that cannot run here says why, visibly:
    ``<!-- docs-test: skip (REASON) -->`` right before its fence."""
    from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker

    if skip:
        pytest.skip(f"{doc}:{line}: {skip}")
    work = tmp_path / "work"
    work.mkdir()
    separator = f"docs-test-{new_marker()}"
    if language == "console":
        steps = _console(text)
        script = "".join(f"printf '\\n%s\\n' {separator}\n{{ {command}\n}} 2>&1\n" for command, _ in steps)
    else:
        steps, script = [], text
    # Each failing command of the example itself (not of what it runs) reports its status.
    trap = "trap 'echo \"docs-test: exit $? at line $LINENO\" >&2' ERR\n"
    marker = new_marker()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
        # what an example writes in the user's home (units, configuration) stays in the test's
        "HOME": str(work),
        "XDG_CONFIG_HOME": str(work / ".config"),
        MARKER_ENV: marker,
    }
    env.pop("CORRAL_SESSION", None)
    try:
        proc = subprocess.run(
            [*_isolated_network(), "bash", "-c", trap + script],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=EXAMPLE_TIMEOUT,
        )
        where = f"{doc}:{line}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        assert proc.returncode == 0, where
        failed = [int(s) for s in re.findall(r"^docs-test: exit (\d+) at line \d+$", proc.stderr, re.M)]
        assert not {125, 126, 127} & set(failed), where
        if steps:
            outputs = proc.stdout.split(f"\n{separator}\n")[1:]
            assert len(outputs) == len(steps), where
            for (command, shown), got in zip(steps, outputs, strict=True):
                lines = got.rstrip("\n").split("\n") if got.rstrip("\n") else []
                assert _shown_matches(shown, lines), f"$ {command}\nshown: {shown}\nprinted: {lines}\n{where}"
        # what the example started is gone once it has returned (its sessions ended, its runs over)
        import time

        deadline = time.monotonic() + 10
        while marked_pids(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not marked_pids(marker), f"left running: {marked_pids(marker)}\n{where}"
    finally:
        kill_marked(marker)
