"""Issue 39 (part): ``corralctl mcp``, driven by the official MCP Python SDK's stdio client.

The agent's day through a real MCP client: an ``exec`` that leaks a
``setsid`` daemon (its result, nothing left), an ``exec`` that outlives its
yield (a run id, its output read with cursors: every byte once), a REPL
answered with ``write_stdin``, a ``start``ed http.server ready by port, fetched
and stopped; then the server SIGKILLed with background runs alive: every
process carrying the server's marker -- the runs, their daemons, the session's
holder -- gone, the port free. Each absence is read from /proc (environ marks).
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from test_background import free_port, gone, port_accepts

from conftest import TIME_SCALE
from procscan import MARKER_ENV, kill_marked, marked_pids, new_marker, voluntary_wakeups

mcp = pytest.importorskip("mcp", reason="the MCP SDK (the mcp extra) is not installed")
from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

CTL = [sys.executable, "-m", "corral_systemd.ctl"]
#: Polling bounds: how long something may take on a slow machine (never asserted as speed).
PATIENCE = 60 * TIME_SCALE
TOOL_NAMES = {"exec", "write_stdin", "read_output", "start", "list", "stop", "wait"}


@contextlib.asynccontextmanager
async def mcp_server(tmp_path, marker: str):
    """The server as an MCP client starts it (``corralctl mcp`` over stdio), every
    process of it carrying ``marker``; yields ``call(tool, **arguments)``."""
    state = tmp_path / "state"
    params = StdioServerParameters(
        command=CTL[0],
        args=[*CTL[1:], "mcp"],
        env={"CORRAL_STATE_DIR": str(state), MARKER_ENV: marker},
        cwd=str(tmp_path),
    )
    try:
        with open(tmp_path / "server.err", "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()

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


@pytest.mark.parametrize(
    "tier",
    [
        "no-manager",
        # A user manager answering (the harness): the server's session is a slice, each run a unit in it.
        pytest.param("unit", marks=pytest.mark.systemd),
    ],
)
async def test_the_agents_day(tmp_path, tier):
    daemon_marker = new_marker()
    port = free_port()
    if tier == "no-manager" and os.environ.get("CORRAL_REQUIRE_SYSTEMD"):
        pytest.skip("a manager answers here: the host lane runs this case")
    try:
        async with mcp_server(tmp_path, new_marker()) as call:
            tools = await call.session.list_tools()
            assert {t.name for t in tools.tools} == TOOL_NAMES

            # A build that leaks a daemon: the result, and nothing of it left.
            build = await call(
                "exec", cmd=f"export {MARKER_ENV}={daemon_marker}; setsid sleep 300 & echo built", yield_ms=30_000
            )
            assert build["running"] is False and build["exit_code"] == 0 and build["output"] == "built\n", build
            assert proven(build) and build["proof"]["processes_stopped"] >= 1
            assert (build["proof"]["guarantee"] == "unit") == (tier == "unit"), build["proof"]
            assert marked_pids(daemon_marker) == []

            # A command outliving its yield: a run id, then every byte once.
            lines = [f"line-{i}" for i in range(60)]
            slow = await call("exec", cmd="for i in $(seq 0 59); do echo line-$i; sleep 0.02; done", yield_ms=0)
            assert slow["running"] is True and "exit_code" not in slow
            pieces = [slow["output"]]
            first = await call("read_output", run_id=slow["run_id"], cursor=slow["cursor"])
            second = await call("read_output", run_id=slow["run_id"], cursor=first["cursor"])
            pieces += [first["output"], second["output"]]
            assert second["cursor"] >= first["cursor"] >= slow["cursor"]
            done = await call("wait", run_id=slow["run_id"], timeout_ms=int(PATIENCE * 1000))
            assert done["running"] is False and done["exit_code"] == 0 and proven(done)
            rest = await call("read_output", run_id=slow["run_id"], cursor=second["cursor"], max_bytes=1 << 20)
            pieces.append(rest["output"])
            assert "".join(pieces) == "".join(f"{line}\n" for line in lines)
            # The same bytes again from 0: the cursor is an absolute offset.
            again = await call("read_output", run_id=slow["run_id"], cursor=0, max_bytes=1 << 20)
            assert again["output"] == "".join(pieces) and again["cursor"] == rest["cursor"]

            # A REPL answered through write_stdin.
            repl = await call("exec", cmd="python3 -u -q -i", yield_ms=0)
            assert repl["running"] is True
            typed = await call("write_stdin", run_id=repl["run_id"], chars="print(6 * 7)\n", yield_ms=200)
            text = typed["output"]
            if "42" not in text:  # not printed within the yield: read on
                text, _ = await until_output(call, repl["run_id"], "42", typed["cursor"])
            assert "42" in text
            bye = await call("write_stdin", run_id=repl["run_id"], chars="", eof=True, yield_ms=int(PATIENCE * 1000))
            assert bye["running"] is False and bye["exit_code"] == 0 and proven(bye)

            # A dev server ready by port: fetched, stopped, the port free.
            web = await call(
                "start",
                cmd=f"exec python3 -m http.server --bind 127.0.0.1 {port}",
                ready_port=port,
                ready_timeout=f"{30 * TIME_SCALE:g}s",
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
            assert not port_accepts(port)
        # The client closed stdin: the server ended its session and everything of it is gone.
        assert call.left_after_close == []
    finally:
        kill_marked(daemon_marker)


async def test_the_server_killed_ends_every_run_of_its_session(tmp_path):
    """SIGKILL leaves the server no word: its session's holder watches it as its owner (a pidfd), and so
    does each run's corral. Two background runs (one with a TERM-ignoring setsid daemon) and an exec
    still running: all gone, the port free."""
    marker = new_marker()
    port = free_port()
    async with mcp_server(tmp_path, marker) as call:
        await call(
            "start",
            cmd=f"setsid sh -c 'trap \"\" TERM; sleep 300' & exec python3 -m http.server --bind 127.0.0.1 {port}",
            ready_port=port,
            ready_timeout=f"{30 * TIME_SCALE:g}s",
        )
        await call("start", cmd="sleep 300")
        running = await call("exec", cmd="sleep 300", yield_ms=0)
        assert running["running"] is True
        listed = await call("list")
        assert sum(r["running"] for r in listed["runs"]) == 3
        assert port_accepts(port)
        os.kill(listed["server_pid"], signal.SIGKILL)
        left = gone(marker, within=PATIENCE)
        assert left == [], f"still alive after the server's SIGKILL: {left}"
        assert not port_accepts(port)


async def test_bad_arguments_are_one_line_mcp_errors_and_the_server_goes_on(tmp_path):
    marker = new_marker()
    async with mcp_server(tmp_path, marker) as call:
        bad = [
            ("exec", {"cmd": ""}, "exec: cmd must not be empty"),
            ("exec", {"cmd": "true", "yield_ms": "soon"}, "exec: yield_ms must be integer"),
            ("exec", {"cmd": "true", "wall": "soon"}, "invalid wall 'soon'"),
            ("exec", {"cmd": "true", "workdir": str(tmp_path / "nowhere")}, "not a directory"),
            ("exec", {"cmd": "true", "shell": "zsh"}, "exec: unknown argument 'shell'"),
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


async def test_a_call_waiting_on_a_run_wakes_the_server_for_its_end_not_on_a_tick(tmp_path):
    """An exec waiting out its yield on a sleeping command: the server is woken by
    its corral's exit (the child watcher), not by a timer. A 20 ms tick would
    wake it some 150 times in the 3 s; a blocked wait, a handful."""
    marker = new_marker()
    async with mcp_server(tmp_path, marker) as call:
        server = (await call("list"))["server_pid"]
        before = voluntary_wakeups(server)
        result = await call("exec", cmd="sleep 3", yield_ms=10000)
        woke = voluntary_wakeups(server) - before
        assert result["exit_code"] == 0, result
        assert woke < 60, f"the server woke {woke} times while its call waited 3 s"


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


def test_the_output_buffer_hands_out_every_byte_once():
    from corral_systemd.mcp.output import OutputBuffer, complete_utf8

    buffer = OutputBuffer(keep=10)
    buffer.append(b"0123456789")
    first = buffer.read(0)
    assert (first.data, first.cursor, first.lost) == (b"0123456789", 10, 0)
    buffer.append(b"abcdef")  # the first 6 bytes leave the buffer
    late = buffer.read(2)
    assert (late.data, late.start, late.cursor, late.lost) == (b"6789abcdef", 6, 16, 4)
    assert buffer.read(first.cursor).data == b"abcdef"
    assert buffer.read(99).data == b"" and buffer.read(99).cursor == 16
    cut = buffer.window(6, 4)
    assert cut.data.startswith(b"67") and cut.data.endswith(b"ef") and cut.omitted == 6
    snowman = "☃".encode()
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
    script = os.path.join(NODE_DIR, "exec_client.mjs")  # beside node_modules: ESM resolves from the script
    shutil.copyfile(os.path.join(os.path.dirname(__file__), "mcp_node", "exec_client.mjs"), script)
    return script


def test_the_typescript_sdks_client_drives_an_exec(tmp_path):
    import json

    script = node_client()
    marker, daemon_marker = new_marker(), new_marker()
    env = dict(os.environ, CORRAL_STATE_DIR=str(tmp_path / "state"), **{MARKER_ENV: marker})
    cmd = f"export {MARKER_ENV}={daemon_marker}; setsid sleep 300 & echo from-node"
    try:
        r = subprocess.run(
            ["node", script, sys.executable, cmd],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120 * TIME_SCALE,
            stdin=subprocess.DEVNULL,
        )
        assert r.returncode == 0, r.stderr
        said = json.loads(r.stdout.strip().splitlines()[-1])
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
