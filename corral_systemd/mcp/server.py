"""The MCP SDK's side: ``tools.Tools`` served over stdio by the SDK's low-level ``Server``.

Imported only by ``corralctl mcp`` once the SDK is known to be there.

Guarantees: a tool call never ends the server. Bad arguments (and an unknown
tool or run id) are a JSON-RPC error (INVALID_PARAMS) with one line; a run
that could not start or be ready, and any unforeseen failure, is a tool
result with ``isError`` and one line (the failure is also logged on stderr).
"""

import json
import logging

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from ..common.version import __version__
from . import tasks as task_ext
from .runs import BadArguments, RunFailed
from .tools import TOOLS, Tools

log = logging.getLogger("corral_systemd.mcp")

INSTRUCTIONS = (
    "Every command runs through corral in one session that this server owns: when a run ends, "
    "everything it started is gone (proven); when this server ends or its client goes away, every run "
    "of the session ends the same way. Use exec for commands (a run_id comes back if it outlives "
    "yield_ms), start for servers that must stay up between calls."
)


def _text(result: dict) -> str:
    """The result as a model reads it: the facts as JSON, then the output as printed."""
    facts = {key: value for key, value in result.items() if key != "output"}
    text = json.dumps(facts, sort_keys=True)
    if "output" in result:
        text += "\n" + result["output"]
    return text


def _result(answer: dict) -> types.CallToolResult:
    """A tool's answer as a tool result: the object as ``structuredContent``, and as text."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=_text(answer))], structured_content=answer)


def build(tools: Tools) -> Server:
    book = task_ext.TaskBook(tools, _result)  # MCP tasks, where the client asks for them (tasks.py)

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=name,
                    description=spec["description"],
                    input_schema=spec["inputSchema"],
                    execution=task_ext.tool_execution(name),
                )
                for name, spec in TOOLS.items()
            ]
        )

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult | dict:
        try:
            if book.wanted(ctx, params):
                return await book.call(ctx, params)
            result = await tools.call(params.name, params.arguments)
        except BadArguments as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from None
        except RunFailed as exc:
            return types.CallToolResult(content=[types.TextContent(type="text", text=str(exc))], is_error=True)
        except Exception as exc:  # a tool call never ends the server
            log.exception("tool %s failed", params.name)
            line = " ".join(f"{params.name}: {type(exc).__name__}: {exc}".split())
            return types.CallToolResult(content=[types.TextContent(type="text", text=line)], is_error=True)
        return _result(result)

    server = Server(
        "corral",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        # A task answer is a plain dict, let through by the tasks middleware (``tasks.py``).
        on_call_tool=call_tool,  # type: ignore[arg-type]
    )
    book.install(server, call_tool)
    return server


async def serve(tools: Tools) -> None:
    """Serve until the client closes stdin."""
    server = build(tools)
    async with stdio_server() as (read_stream, write_stream):
        options = server.create_initialization_options()
        task_ext.declare(options.capabilities)  # the 2025-11-25 tasks capability
        await server.run(read_stream, write_stream, options)
