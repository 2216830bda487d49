"""Issue 39 (part): ``corralctl mcp``, driven by the official MCP Python SDK's stdio client.

The agent's day through a real MCP client: an ``exec`` that leaks a
``setsid`` daemon (its result, nothing left), an ``exec`` that outlives its
yield (a run id, its output read with cursors: every byte once), a REPL
answered with ``write_stdin``, a ``start``ed http.server ready by port, fetched
and stopped; then the server SIGKILLed with background runs alive: every
process carrying the server's marker -- the runs, their daemons, the session's
holder -- gone, the port free. Each absence is read from /proc (environ marks).
"""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from test_background import free_port, gone, port_accepts

from conftest import CORRAL, TIME_SCALE
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker, voluntary_wakeups

mcp = pytest.importorskip("mcp", reason="the MCP SDK (the mcp extra) is not installed")
from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

CTL = [sys.executable, "-m", "corral_systemd.ctl"]
#: Polling bounds: how long something may take on a slow machine (never asserted as speed).
PATIENCE = 60 * TIME_SCALE
TOOL_NAMES = {"exec", "write_stdin", "read_output", "start", "list", "stop", "wait"}


@contextlib.asynccontextmanager
async def mcp_server(tmp_path, marker: str, *, modern: bool = False, **session_options):
    """The server as an MCP client starts it (``corralctl mcp`` over stdio), every
    process of it carrying ``marker``; yields ``call(tool, **arguments)``. ``modern``:
    the 2026-07-28 protocol (``server/discover``, no handshake); ``session_options``:
    the SDK's ``ClientSession``'s (its extensions, their result claims)."""
    state = tmp_path / "state"
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(exist_ok=True)
    params = StdioServerParameters(
        command=CTL[0],
        args=[*CTL[1:], "mcp"],
        # CORRAL_SERVICE=installed: the SDK passes a minimal environment, not the suite's
        # (tests/conftest.py): no run of a test may start the transient service other tests' runs would use.
        # TMPDIR: the server's records directory in the test's own (never the machine's /tmp).
        env={"CORRAL_STATE_DIR": str(state), MARKER_ENV: marker, "CORRAL_SERVICE": "installed", "TMPDIR": str(tmpdir)},
        cwd=str(tmp_path),
    )
    try:
        with open(tmp_path / "server.err", "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write, **session_options) as session:
                    await (session.discover() if modern else session.initialize())

                    async def call(tool: str, **arguments) -> dict:
                        result = await session.call_tool(tool, arguments)
                        assert not result.is_error, result.content[0].text
                        assert result.structured_content is not None
                        return result.structured_content

                    call.session = session  # type: ignore[attr-defined]
                    yield call
        # The client closed the server's stdin: what is left of it, the server's session included.
        call.left_after_close = gone(marker, within=PATIENCE)  # type: ignore[attr-defined]
    finally:
        kill_marked(marker)  # whatever a failed test left


async def until_output(call, run_id: str, needle: str, cursor: int) -> tuple[str, int]:
    """read_output from ``cursor`` until ``needle`` shows (bounded by PATIENCE): (text read, cursor)."""
    text, end = "", time.monotonic() + PATIENCE
    while needle not in text and time.monotonic() < end:
        page = await call("read_output", run_id=run_id, cursor=cursor)
        text, cursor = text + page["output"], page["cursor"]
        if needle not in text:
            await _sleep(0.05)
    return text, cursor


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


def proven(answer: dict) -> bool:
    proof = answer["proof"]
    return proof is not None and proof["verified"] is True and proof["remaining_pids"] == []


#: The tiers an MCP server's runs are tested in: ``auto`` (what corral's ladder gives a
#: session's run here, read from a probe run's record), each tier asked for by the tools'
#: ``guarantee`` where it can be had (a probe: 125 skips, saying why), the unit tier marked
#: ``systemd`` (the harness: the server's session a slice, each run a unit in it). What each
#: run's end says is asserted: its record's ``guarantee`` (a ``start`` run's answer carries
#: its registry entry's ``mode`` only: that one is held to the exec runs' ``mode``).
TIERS = ["auto", "subreaper", "pidns", "cgroup", pytest.param("unit", marks=pytest.mark.systemd)]


def _probe(tmp_path, *options: str) -> dict:
    """A ``true`` run's record, in a session of its own (``options``: corral's), or skip with its line."""
    from corral_systemd.session import Session

    record = tmp_path / "probe.json"
    session = Session()
    session.open()
    try:
        r = subprocess.run(
            [*CORRAL, "--session", session.id, "--quiet", "--json", str(record), *options, "--", "true"],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )
    finally:
        session.end()
    if r.returncode == 125:
        pytest.skip(f"{' '.join(options) or 'auto'}: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    import json

    return json.loads(record.read_text())


def tier_arguments(tier: str, tmp_path) -> tuple[dict, str]:
    """The tools' ``guarantee`` for ``tier`` and the guarantee its runs' records must name."""
    if tier == "auto":
        if os.environ.get("CORRAL_REQUIRE_SYSTEMD"):
            pytest.skip("a manager answers here: auto is the unit case, run by the host lane")
        return {}, _probe(tmp_path)["guarantee"]
    _probe(tmp_path, "--guarantee", tier)
    return {"guarantee": tier}, tier


@pytest.mark.parametrize("tier", TIERS)
async def test_the_agents_day(tmp_path, tier):
    daemon_marker = new_marker()
    port = free_port()
    tiered, guarantee = tier_arguments(tier, tmp_path)
    try:
        async with mcp_server(tmp_path, new_marker()) as call:
            tools = await call.session.list_tools()
            assert {t.name for t in tools.tools} == TOOL_NAMES

            # A build that leaks a daemon: the result, and nothing of it left.
            build = await call(
                "exec",
                cmd=f"export {MARKER_ENV}={daemon_marker}; setsid sleep 300 & echo built",
                yield_ms=30_000,
                **tiered,
            )
            assert build["running"] is False and build["exit_code"] == 0 and build["output"] == "built\n", build
            assert proven(build) and build["proof"]["processes_seen"] >= 2
            assert build["proof"]["guarantee"] == guarantee, build["proof"]
            assert marked_pids(daemon_marker) == []

            # A command outliving its yield: a run id, then every byte once.
            lines = [f"line-{i}" for i in range(60)]
            slow = await call(
                "exec", cmd="for i in $(seq 0 59); do echo line-$i; sleep 0.02; done", yield_ms=0, **tiered
            )
            assert slow["running"] is True and "exit_code" not in slow
            pieces = [slow["output"]]
            first = await call("read_output", run_id=slow["run_id"], cursor=slow["cursor"])
            second = await call("read_output", run_id=slow["run_id"], cursor=first["cursor"])
            pieces += [first["output"], second["output"]]
            assert second["cursor"] >= first["cursor"] >= slow["cursor"]
            done = await call("wait", run_id=slow["run_id"], timeout_ms=int(PATIENCE * 1000))
            assert done["running"] is False and done["exit_code"] == 0 and proven(done)
            assert done["proof"]["guarantee"] == guarantee
            rest = await call("read_output", run_id=slow["run_id"], cursor=second["cursor"], max_bytes=1 << 20)
            pieces.append(rest["output"])
            assert "".join(pieces) == "".join(f"{line}\n" for line in lines)
            # The same bytes again from 0: the cursor is an absolute offset.
            again = await call("read_output", run_id=slow["run_id"], cursor=0, max_bytes=1 << 20)
            assert again["output"] == "".join(pieces) and again["cursor"] == rest["cursor"]

            # A REPL answered through write_stdin.
            repl = await call("exec", cmd="python3 -u -q -i", yield_ms=0, **tiered)
            assert repl["running"] is True
            typed = await call("write_stdin", run_id=repl["run_id"], chars="print(6 * 7)\n", yield_ms=200)
            text = typed["output"]
            if "42" not in text:  # not printed within the yield: read on
                text, _ = await until_output(call, repl["run_id"], "42", typed["cursor"])
            assert "42" in text
            bye = await call("write_stdin", run_id=repl["run_id"], chars="", eof=True, yield_ms=int(PATIENCE * 1000))
            assert bye["running"] is False and bye["exit_code"] == 0 and proven(bye)
            assert bye["proof"]["guarantee"] == guarantee

            # A dev server ready by port: fetched, stopped, the port free.
            web = await call(
                "start",
                cmd=f"exec python3 -m http.server --bind 127.0.0.1 {port}",
                ready_port=port,
                ready_timeout=f"{30 * TIME_SCALE:g}s",
                **tiered,
            )
            assert web["running"] is True
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=PATIENCE) as page:
                assert page.status == 200
            log, _ = await until_output(call, web["run_id"], '"GET / HTTP', 0)  # its log: the request
            assert '"GET / HTTP/1.1" 200' in log
            still = await call("wait", run_id=web["run_id"], timeout_ms=0)
            assert still["running"] is True and "exit_code" not in still
            listed = await call("list")
            assert [r["running"] for r in listed["runs"] if r["run_id"] == web["run_id"]] == [True]
            stopped = await call("stop", run_id=web["run_id"])
            assert stopped["running"] is False and stopped["proof"]["verified"] is True
            assert stopped["proof"]["mode"] == build["proof"]["mode"], stopped["proof"]
            assert not port_accepts(port)
        # The client closed stdin: the server ended its session and everything of it is gone.
        assert call.left_after_close == []
    finally:
        kill_marked(daemon_marker)


@pytest.mark.parametrize("tier", TIERS)
async def test_the_server_killed_ends_every_run_of_its_session(tmp_path, tier):
    """SIGKILL leaves the server no word: its session's holder watches it as its owner (a pidfd), and so
    does each run's corral. Two background runs (one with a TERM-ignoring setsid daemon) and an exec
    still running: all gone, the port free."""
    marker = new_marker()
    port = free_port()
    tiered, _ = tier_arguments(tier, tmp_path)
    async with mcp_server(tmp_path, marker) as call:
        await call(
            "start",
            cmd=f"setsid sh -c 'trap \"\" TERM; sleep 300' & exec python3 -m http.server --bind 127.0.0.1 {port}",
            ready_port=port,
            ready_timeout=f"{30 * TIME_SCALE:g}s",
            **tiered,
        )
        await call("start", cmd="sleep 300", **tiered)
        running = await call("exec", cmd="sleep 300", yield_ms=0, **tiered)
        assert running["running"] is True
        listed = await call("list")
        assert sum(r["running"] for r in listed["runs"]) == 3
        assert port_accepts(port)
        os.kill(listed["server_pid"], signal.SIGKILL)
        left = gone(marker, within=PATIENCE)
        assert left == [], f"still alive after the server's SIGKILL: {left}"
        assert not port_accepts(port)


async def test_a_killed_servers_records_directory_is_removed_by_the_next_server(tmp_path):
    """A SIGKILLed server cannot remove its runs' records directory: the next server to
    start does (no process holds its lock any more), and never one a live server holds."""
    records = tmp_path / "tmp"
    async with mcp_server(tmp_path, new_marker()) as call:
        await call("list")
        (live,) = records.glob("corral-mcp-*")
        marker = new_marker()
        env = dict(os.environ, TMPDIR=str(records), CORRAL_STATE_DIR=str(tmp_path / "state"), **{MARKER_ENV: marker})
        killed = subprocess.Popen(
            [*CTL, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
        )
        try:
            deadline = time.monotonic() + PATIENCE
            while len(dirs := set(records.glob("corral-mcp-*"))) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            (left_behind,) = dirs - {live}
            killed.kill()
            killed.wait()
        finally:
            killed.kill()
        assert gone(marker, within=PATIENCE) == []  # its session ended with it (its holder saw its owner die)
        assert left_behind.is_dir()
        async with mcp_server(tmp_path, new_marker()) as next_server:
            await next_server("list")
            assert not left_behind.exists()
            assert live.is_dir()  # its server lives


async def test_bad_arguments_are_one_line_mcp_errors_and_the_server_goes_on(tmp_path):
    marker = new_marker()
    async with mcp_server(tmp_path, marker) as call:
        bad = [
            ("exec", {"cmd": ""}, "exec: cmd must not be empty"),
            ("exec", {"cmd": "true", "yield_ms": "soon"}, "exec: yield_ms must be integer"),
            ("exec", {"cmd": "true", "wall": "soon"}, "invalid wall 'soon'"),
            ("exec", {"cmd": "true", "workdir": str(tmp_path / "nowhere")}, "not a directory"),
            ("exec", {"cmd": "true", "shell": "zsh"}, "exec: unknown argument 'shell'"),
            ("exec", {"cmd": "true", "guarantee": "best"}, "exec: guarantee must be one of auto, unit"),
            ("exec", {}, "exec: cmd is required"),
            ("wait", {"run_id": "r99"}, "unknown run_id 'r99'"),
            ("start", {"cmd": "true", "ready_port": 1, "ready_file": "x"}, "at most one of"),
            ("launch", {}, "unknown tool 'launch'"),
        ]
        for tool, arguments, says in bad:
            with pytest.raises(MCPError) as caught:
                await call.session.call_tool(tool, arguments)
            message = str(caught.value)
            assert says in message and "\n" not in message, (tool, arguments, message)
        # A run that ended takes no input: still one line; and the server still answers.
        ended = await call("exec", cmd="true")
        with pytest.raises(MCPError, match="has ended"):
            await call.session.call_tool("write_stdin", {"run_id": ended["run_id"], "chars": "x"})
        assert (await call("list"))["runs"][0]["exit_code"] == 0
    assert "Traceback" not in (tmp_path / "server.err").read_text()


async def test_an_exec_answer_keeps_head_and_tail_and_says_what_it_cut(tmp_path):
    marker = new_marker()
    async with mcp_server(tmp_path, marker) as call:
        big = await call("exec", cmd="seq 1 20000", max_output_bytes=1000)
        text = big["output"]
        assert text.startswith("1\n2\n") and text.endswith("19999\n20000\n")
        marker_line = f"[corral: {big['output_cut_bytes']} bytes of output left out]\n"
        assert marker_line in text and len(text.encode()) - len(marker_line) == 1000
        whole = "".join(f"{i}\n" for i in range(1, 20001))
        page = await call("read_output", run_id=big["run_id"], cursor=big["output_from"], max_bytes=1 << 20)
        assert page["output"] == whole


async def test_an_exec_on_a_tty_is_answered_through_write_stdin_and_stopped(tmp_path):
    """``tty``: the command on a terminal whose input its corral keeps (``corral --yield --pty``);
    what it printed read back by a computed marker (the terminal echoes the line typed, which
    does not contain it); ``stop`` proves it gone (exit 143)."""
    async with mcp_server(tmp_path, new_marker()) as call:
        repl = await call("exec", cmd="exec python3 -q -i", tty=True, yield_ms=0)
        assert repl["running"] is True, repl
        line = "print('tty' + '-' + str(__import__('os').isatty(0)))\n"
        typed = await call("write_stdin", run_id=repl["run_id"], chars=line, yield_ms=200)
        text = typed["output"]
        if "tty-True" not in text:
            more, _ = await until_output(call, repl["run_id"], "tty-True", typed["cursor"])
            text += more
        assert "tty-True" in text
        stopped = await call("stop", run_id=repl["run_id"])
        assert stopped["running"] is False and stopped["exit_code"] == 143 and proven(stopped), stopped
    assert call.left_after_close == []


async def test_a_call_waiting_on_a_run_wakes_the_server_for_its_end_not_on_a_tick(tmp_path):
    """An exec waiting out its yield on a sleeping command: the server is woken by
    its corral's exit (its pidfd in the event loop), not by a timer. A 20 ms tick
    would wake it some 150 times in the 3 s; a blocked wait, a handful. The server
    is the run's front (``mcp.front``): starting a run wakes it too (the holder's
    call, ``background.launch`` looking for the run's start), so what the 3 s add
    is read against an exec of ``true`` (the same start, no wait), every thread counted."""
    marker = new_marker()
    async with mcp_server(tmp_path, marker) as call:
        server = (await call("list"))["server_pid"]
        before = voluntary_wakeups(server)
        quick = await call("exec", cmd="true", yield_ms=10000)
        started = voluntary_wakeups(server) - before
        before = voluntary_wakeups(server)
        result = await call("exec", cmd="sleep 3", yield_ms=10000)
        woke = voluntary_wakeups(server) - before
        assert quick["exit_code"] == 0 and result["exit_code"] == 0, (quick, result)
        assert woke - started < 60, f"the server woke {woke} times while its call waited 3 s ({started} for a start)"


async def test_an_exec_has_no_front_process_the_server_is_its_front(tmp_path):
    """``exec`` starts no ``corral --yield`` of its own (``mcp.front``): while its call
    waits out the yield, the server has no child (the kernel's children lists of its
    threads); the run's corral is the session holder's. Its end and proof are as ever."""
    async with mcp_server(tmp_path, new_marker()) as call:
        server = (await call("list"))["server_pid"]
        began = tmp_path / "began"
        waiting = asyncio.ensure_future(call("exec", cmd=f"touch {began}; sleep 2", yield_ms=10000))
        end = time.monotonic() + PATIENCE
        while not began.exists() and not waiting.done() and time.monotonic() < end:
            await _sleep(0.02)
        assert began.exists() and not waiting.done()
        children = set()
        for tid in os.listdir(f"/proc/{server}/task"):
            with open(f"/proc/{server}/task/{tid}/children") as f:
                children.update(f.read().split())
        result = await waiting
        assert children == set(), f"the server's children while its exec waited: {children}"
        assert result["exit_code"] == 0 and proven(result), result


async def test_a_quick_exec_is_answered_with_its_record(tmp_path):
    """An exec ending within its yield is answered once its corral has written its
    record (the holder's word once it has reaped the corral; the token holder's pidfd
    said some quick runs had ended before their record was there): its own exit code,
    reason and proof, every time."""
    async with mcp_server(tmp_path, new_marker()) as call:
        for _ in range(5):
            ended = await call("exec", cmd="echo said >&2; exit 3", workdir=str(tmp_path))
            assert ended["exit_code"] == 3 and ended["reason"] == "exited" and proven(ended), ended
            assert ended["output"] == "said\n"
            missing = await call("exec", cmd="exec /nonexistent/program")
            assert missing["exit_code"] == 127 and missing["proof"] is not None, missing
            assert "no record" not in missing["reason"], missing


def test_without_the_sdk_one_line_and_125(tmp_path):
    """A module named mcp that is not the SDK stands in for its absence."""
    (tmp_path / "mcp.py").write_text("")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    r = subprocess.run([*CTL, "mcp"], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=60)
    assert r.returncode == 125
    assert r.stderr.strip().splitlines() == [
        "corralctl mcp: the MCP SDK is not installed: pip install 'corral-systemd[mcp]'"
    ]


def test_corralctls_start_up_does_not_import_the_sdk():
    code = (
        "import sys\n"
        "from corral_systemd.ctl import main\n"
        "main(['--help'])\n"
        "main(['ps'])\n"
        "assert not any(m == 'mcp' or m.startswith(('mcp.', 'mcp_types', 'anyio')) for m in sys.modules), "
        "sorted(m for m in sys.modules if 'mcp' in m)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_a_log_read_with_cursors_hands_out_every_byte_once(tmp_path):
    """``mcp.output.read_log``: the cursor reads of a run's log the tools answer with."""
    from corral_systemd.mcp.output import complete_utf8, read_log

    log = tmp_path / "run.out"
    log.write_bytes(b"0123456789")
    first = read_log(str(log), 0, 4, window=False, running=True)
    assert (first["output"], first["cursor"], first["more"]) == ("0123", 4, True)
    rest = read_log(str(log), first["cursor"], 1 << 20, window=False, running=True)
    assert (rest["output"], rest["cursor"], "more" in rest) == ("456789", 10, False)
    with open(log, "ab") as f:
        f.write(b"abcdef")
    assert read_log(str(log), rest["cursor"], 1 << 20, window=False, running=True)["output"] == "abcdef"
    cut = read_log(str(log), 6, 4, window=True, running=False)
    assert cut["output"].startswith("67") and cut["output"].endswith("ef") and cut["output_cut_bytes"] == 6
    assert (cut["output_from"], cut["cursor"]) == (6, 16)
    log.write_bytes(b"012")  # corral cut the log back: a cursor past its end reads on from there
    assert read_log(str(log), 16, 10, window=False, running=True) == {"log_cut": True, "output": "", "cursor": 3}
    snowman = "☃".encode()
    log.write_bytes(b"ab" + snowman[:2])  # a character cut by the pipe waits for the next read
    half = read_log(str(log), 0, 100, window=False, running=True)
    assert (half["output"], half["cursor"]) == ("ab", 2)
    assert complete_utf8(b"ab" + snowman[:2]) == 2 and complete_utf8(b"ab" + snowman) == 5


#: The official TypeScript SDK's client, installed once per machine outside the tree.
NODE_SDK = "@modelcontextprotocol/sdk@1"
NODE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "corral-tests", "mcp-node")


def node_client() -> str:
    """The TypeScript client script, beside an installed SDK; skips (saying why) where npm cannot get it."""
    import shutil

    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node or npm is not installed")
    os.makedirs(NODE_DIR, exist_ok=True)
    if not os.path.exists(os.path.join(NODE_DIR, "node_modules", "@modelcontextprotocol", "sdk", "package.json")):
        r = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--silent", NODE_SDK],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        if r.returncode != 0:
            pytest.skip(f"npm could not install {NODE_SDK}: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    scripts = os.path.join(os.path.dirname(__file__), "mcp_node")
    for name in os.listdir(scripts):  # beside node_modules: ESM resolves from the script
        shutil.copyfile(os.path.join(scripts, name), os.path.join(NODE_DIR, name))
    return os.path.join(NODE_DIR, "exec_client.mjs")


def run_node(tmp_path, marker: str, script: str, *args: str) -> dict:
    """``node SCRIPT PYTHON ARGS...`` (a script of tests/mcp_node, beside the installed SDK), the
    server's processes carrying ``marker``: the one JSON line it prints."""
    import json

    env = dict(os.environ, CORRAL_STATE_DIR=str(tmp_path / "state"), **{MARKER_ENV: marker})
    r = subprocess.run(
        ["node", os.path.join(os.path.dirname(node_client()), script), sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120 * TIME_SCALE,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_typescript_sdks_client_drives_an_exec(tmp_path):
    marker, daemon_marker = new_marker(), new_marker()
    cmd = f"export {MARKER_ENV}={daemon_marker}; setsid sleep 300 & echo from-node"
    try:
        said = run_node(tmp_path, marker, "exec_client.mjs", cmd)
        assert set(said["tools"]) == TOOL_NAMES
        result = said["result"]["structuredContent"]
        assert result["exit_code"] == 0 and result["output"] == "from-node\n" and proven(result)
        assert marked_pids(daemon_marker) == []
        assert (
            said["badArguments"]["code"] == -32602 and "exec: cmd must not be empty" in said["badArguments"]["message"]
        )
        assert gone(marker, within=PATIENCE) == []  # the client closed: the server and its session are gone
    finally:
        kill_marked(daemon_marker)
        kill_marked(marker)


# -- MCP tasks (corral_systemd/mcp/tasks.py) ---------------------------------------------
#: The tasks extension (SEP-2663, beside the 2026-07-28 revision). The Python SDK (2.3)
#: ships no tasks client: it declares an extension and parses its result shape through
#: its own seams (``ClientSession(extensions=, result_claims=)``); the shapes below are
#: the extension's as its specification gives them.
TASKS = "io.modelcontextprotocol/tasks"


def _task_models():
    from typing import Literal

    import mcp_types as types
    from mcp.client.extension import ClaimContext, ResultClaim

    class TaskHandle(types.Result):
        """``CreateTaskResult``: ``resultType: "task"`` and the task."""

        result_type: Literal["task"] = "task"
        task_id: str
        status: str
        status_message: str | None = None
        created_at: str
        last_updated_at: str
        ttl_ms: int | None = None
        poll_interval_ms: int | None = None

    class DetailedTask(types.Result):
        """``tasks/get``'s answer: the task, its final result inlined once completed."""

        task_id: str
        status: str
        status_message: str | None = None
        result: dict | None = None
        poll_interval_ms: int | None = None

    class TaskId(types.RequestParams):
        task_id: str

    class GetTask(types.Request[TaskId, Literal["tasks/get"]]):
        method: Literal["tasks/get"] = "tasks/get"
        params: TaskId

    class CancelTask(types.Request[TaskId, Literal["tasks/cancel"]]):
        method: Literal["tasks/cancel"] = "tasks/cancel"
        params: TaskId

    async def get(session, task_id: str) -> DetailedTask:
        return await session.send_request(GetTask(params=TaskId(task_id=task_id)), DetailedTask)

    async def cancel(session, task_id: str) -> None:
        await session.send_request(CancelTask(params=TaskId(task_id=task_id)), types.Result)

    async def resolve(handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
        """Poll tasks/get (bounded by PATIENCE) until the task ends: its final result."""
        end = time.monotonic() + PATIENCE
        while (task := await get(ctx.session, handle.task_id)).status == "working" and time.monotonic() < end:
            await _sleep((task.poll_interval_ms or 500) / 1000)
        assert task.status == "completed", task
        return types.CallToolResult.model_validate(task.result)

    claim = ResultClaim(result_type="task", model=TaskHandle, resolve=resolve)
    return types, TaskHandle, ClaimContext, claim, get, cancel


async def test_tasks_extension_start_and_a_long_exec_are_tasks_of_their_runs(tmp_path):
    """The SDK's client declaring the tasks extension: a ``start`` is a task once ready, cancelled
    = stopped (every process of it gone, read from /proc); an ``exec`` outliving its yield is a task
    whose result is its run's end as ``wait`` gives it (the whole output); one ending in time is a
    plain result."""
    types, TaskHandle, ClaimContext, claim, get, cancel = _task_models()
    daemon_marker = new_marker()
    port = free_port()
    options = {"extensions": {TASKS: {}}, "result_claims": {TASKS: [claim]}}
    try:
        async with mcp_server(tmp_path, new_marker(), modern=True, **options) as call:
            session = call.session
            assert TASKS in (session.server_capabilities.extensions or {})

            served = await session.call_tool(
                "start",
                {
                    "cmd": f"export {MARKER_ENV}={daemon_marker}; setsid sleep 300 & "
                    f"exec python3 -m http.server --bind 127.0.0.1 {port}",
                    "ready_port": port,
                    "ready_timeout": f"{30 * TIME_SCALE:g}s",
                },
                allow_claimed=True,
            )
            assert isinstance(served, TaskHandle) and served.status == "working", served
            run_id = served.task_id.split(".")[0]  # the task's id names its run
            assert [r["run_id"] for r in (await call("list"))["runs"]] == [run_id]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=PATIENCE) as page:
                assert page.status == 200
            assert (await get(session, served.task_id)).status == "working"
            assert len(marked_pids(daemon_marker)) >= 2  # the server and its setsid daemon
            await cancel(session, served.task_id)  # acknowledged once the stop is proven
            cancelled = await get(session, served.task_id)
            assert cancelled.status == "cancelled", cancelled
            assert "every process proven gone" in cancelled.status_message
            assert marked_pids(daemon_marker) == [] and not port_accepts(port)

            slow = await session.call_tool(
                "exec", {"cmd": "echo early; sleep 2; echo late", "yield_ms": 500}, allow_claimed=True
            )
            assert isinstance(slow, TaskHandle), slow
            context = ClaimContext(session=session, tool_name="exec", read_timeout_seconds=None)
            final = await claim.resolve(slow, context)
            end = final.structured_content
            assert end["running"] is False and end["exit_code"] == 0 and proven(end), end
            assert end["output"] == "early\nlate\n" and end["run_id"] == slow.task_id.split(".")[0]

            quick = await session.call_tool("exec", {"cmd": "echo quick", "yield_ms": 30_000}, allow_claimed=True)
            assert isinstance(quick, types.CallToolResult) and quick.structured_content["output"] == "quick\n"
        assert call.left_after_close == []
    finally:
        kill_marked(daemon_marker)


async def test_without_the_tasks_extension_calls_answer_as_ever(tmp_path):
    """The same protocol, the client declaring no extension: ``start`` answers with its run, and
    tasks/get is refused with -32021 (the extension's missing-capability error)."""
    _, _, _, _, get, _ = _task_models()
    async with mcp_server(tmp_path, new_marker(), modern=True) as call:
        started = await call("start", cmd="sleep 300")
        assert started["running"] is True and started["run_id"] == "r1"
        with pytest.raises(MCPError) as refused:
            await get(call.session, f"{started['run_id']}.x")
        assert refused.value.code == -32021
        stopped = await call("stop", run_id=started["run_id"])
        assert stopped["proof"]["verified"] is True


def test_the_typescript_sdks_client_drives_tasks(tmp_path):
    """The TypeScript SDK's (1.x) tasks, the 2025-11-25 revision's: asked per call (``task``), a long
    exec is a task whose tasks/result is its run's end; so is a short start's (tasks/result waits for
    it); a start is a task once ready, listed, and cancelled = stopped: no process carrying its marker
    left (the client reads /proc), the port free."""
    marker, daemon_marker = new_marker(), new_marker()
    port = free_port()
    try:
        said = run_node(tmp_path, marker, "tasks_client.mjs", str(port), daemon_marker)
        assert said["capabilities"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
        assert said["execution"]["exec"] == said["execution"]["start"] == "optional"
        assert said["execution"]["wait"] is None

        kinds = [m["type"] for m in said["exec"]]
        assert kinds[0] == "taskCreated" and kinds[-1] == "result" and "taskStatus" in kinds, kinds
        end = said["exec"][-1]["result"]["structuredContent"]
        assert end["running"] is False and end["exit_code"] == 0 and proven(end), end
        assert end["output"] == "early\nlate\n" and said["exec"][0]["task"]["taskId"].startswith(end["run_id"] + ".")

        assert said["short"]["status"] == "working"
        short = said["shortResult"]["structuredContent"]  # tasks/result waited for the run's end
        assert short["running"] is False and short["exit_code"] == 0 and short["proof"]["verified"] is True, short
        assert said["short"]["taskId"].startswith(short["run_id"] + ".")

        task_id = said["created"]["taskId"]
        assert said["before"]["task"]["status"] == "working" and said["before"]["accepts"] is True
        assert said["before"]["marked"] >= 2  # the http.server and its setsid daemon
        assert task_id in [t["taskId"] for t in said["listed"]["tasks"]]
        assert said["cancelled"]["status"] == "cancelled"
        assert said["after"]["marked"] == [] and said["after"]["accepts"] is False
        assert said["after"]["task"]["status"] == "cancelled"
        stop = said["stopResult"]["structuredContent"]
        assert stop["exit_code"] == 143 and stop["proof"]["verified"] is True, stop
        assert gone(marker, within=PATIENCE) == []  # the client closed: the server and its session are gone
    finally:
        kill_marked(daemon_marker)
        kill_marked(marker)
