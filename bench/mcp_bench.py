"""What ``corralctl mcp`` costs an agent: a tool call, and the clean-up after its client dies.

1. ``exec`` of ``/bin/true`` through ``corralctl mcp``, against the same call to a
   plain MCP server whose ``exec`` tool runs the command as a bare subprocess (no
   corral: what an agent's shell tool does today), both driven by the official
   Python SDK's stdio client, interleaved, after a warm-up; the median per call
   and their ratio, in one invocation.
2. The time from the client's death (the server SIGKILLed, as a crashed agent
   leaves it) to the last process of its runs gone: two ``start`` runs (one with
   a ``setsid`` daemon that ignores SIGTERM) and an ``exec`` still running; the
   end read from /proc by the marker every process carries (environ), never by name.

    python bench/mcp_bench.py [--calls 30] [--kills 5] [--out DIR]

Needs the MCP SDK (``pip install 'corral-systemd[mcp]'``). Writes mcp.json into --out.
"""

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import RESULTS, environment_info

MARKER = "CORRAL_BENCH_MARKER"

#: The peer: an MCP server with one tool, ``exec``, that runs the command as a bare subprocess.
PLAIN_SERVER = """
import asyncio, json
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[types.Tool(name="exec", description="run a command", input_schema=SCHEMA)])


async def call_tool(ctx, params):
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", params.arguments["cmd"], stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    result = {"exit_code": proc.returncode, "output": out.decode()}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(result))], structured_content=result
    )


async def main():
    server = Server("plain", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())

asyncio.run(main())
"""


def _marked(marker: str) -> list[int]:
    pids = []
    needle = f"{MARKER}={marker}".encode()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        pids.append(int(name))
            except OSError:
                pass
    return pids


async def _timed_calls(command: list[str], env: dict, calls: int, warmup: int = 3) -> list[float]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    times = []
    async with stdio_client(params, errlog=open(os.devnull, "w")) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for i in range(warmup + calls):
                t0 = time.perf_counter()
                result = await session.call_tool("exec", {"cmd": "/bin/true"})
                elapsed = time.perf_counter() - t0
                assert not result.is_error, result
                if i >= warmup:
                    times.append(elapsed)
    return times


async def _kill_to_gone(env: dict, ctl: list[str]) -> float:
    """Seconds from the server's SIGKILL to the last marked process gone."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    marker = uuid.uuid4().hex
    params = StdioServerParameters(command=ctl[0], args=[*ctl[1:], "mcp"], env=dict(env, **{MARKER: marker}))
    async with stdio_client(params, errlog=open(os.devnull, "w")) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            listed = await session.call_tool("list", {})
            server = listed.structured_content["server_pid"]
            await session.call_tool("start", {"cmd": "sleep 600"})
            await session.call_tool("start", {"cmd": "setsid sh -c 'trap \"\" TERM; sleep 600' & sleep 600"})
            await session.call_tool("exec", {"cmd": "sleep 600", "yield_ms": 0})
            await asyncio.sleep(0.5)
            left = len(_marked(marker))
            t0 = time.perf_counter()
            os.kill(server, signal.SIGKILL)
            while _marked(marker):
                if time.perf_counter() - t0 > 120:
                    raise RuntimeError(f"marked processes still there 120 s after the kill: {_marked(marker)}")
                await asyncio.sleep(0.01)
            elapsed = time.perf_counter() - t0
            print(f"  kill → gone: {elapsed * 1000:.0f} ms ({left} marked processes before)", flush=True)
            return elapsed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    try:
        import mcp  # noqa: F401
    except ImportError:
        print("the MCP SDK is not installed: pip install 'corral-systemd[mcp]'", file=sys.stderr)
        return 2
    ctl = [sys.executable, "-m", "corral_systemd.ctl"]
    with tempfile.TemporaryDirectory(prefix="corral-mcp-bench-") as tmp:
        env = dict(os.environ, CORRAL_STATE_DIR=str(Path(tmp) / "state"))
        plain = Path(tmp) / "plain_server.py"
        plain.write_text(PLAIN_SERVER)
        corral_times, plain_times = [], []
        for _ in range(3):  # interleaved rounds: the machine's load falls on both alike
            corral_times += asyncio.run(_timed_calls([*ctl, "mcp"], env, args.calls // 3))
            plain_times += asyncio.run(_timed_calls([sys.executable, str(plain)], env, args.calls // 3))
        kills = [asyncio.run(_kill_to_gone(env, ctl)) for _ in range(args.kills)]
    result = {
        "environment": environment_info(env),
        "exec_true_ms": {
            "corral_mcp_median": statistics.median(corral_times) * 1000,
            "plain_mcp_median": statistics.median(plain_times) * 1000,
            "ratio": statistics.median(corral_times) / statistics.median(plain_times),
            "calls_each": len(corral_times),
        },
        "kill_to_gone_ms": {"median": statistics.median(kills) * 1000, "max": max(kills) * 1000, "runs": len(kills)},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mcp.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result["exec_true_ms"], indent=2), json.dumps(result["kill_to_gone_ms"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
