"""MCP tasks: ``start`` and a long ``exec`` answered with a task handle whose id names the run.

Two wire shapes over one book of tasks, chosen by the revision the client speaks:

- **The tasks extension** ``io.modelcontextprotocol/tasks`` (SEP-2663; the
  2026-07-28 revision moved tasks out of the core into it). The client
  declares it in each request's capabilities (``extensions``), the server in
  ``server/discover``. The server decides per call: ``start`` is a task once
  its run is ready, ``exec`` once its command outlives ``yield_ms`` (an exec
  that ends in time is answered as ever). ``tasks/get`` is the task as it is
  (``completed``: the final result inlined), ``tasks/cancel`` is ``stop``
  (acknowledged once the stop is proven), ``tasks/update`` is acknowledged
  (a run never waits on the client's input). Requests from a client that did
  not declare the extension: -32021, as the extension says.
- **The 2025-11-25 tasks** (the core's experimental tasks of that revision:
  the SDK's ``mcp_types.Task``, ``CreateTaskResult``, ``GetTaskRequest``...,
  served by no SDK dispatcher: ``tasks/*`` are added here as methods of our
  own). The server declares ``capabilities.tasks`` (list, cancel, tools/call)
  and ``execution.taskSupport: optional`` on ``exec`` and ``start``; a call
  that carries ``task`` is answered with ``CreateTaskResult`` at once.
  ``tasks/get``, ``tasks/result`` (waits for the end), ``tasks/list``,
  ``tasks/cancel`` (the task, ``cancelled``, once the stop is proven).

Either way: a task's id is ``<run_id>.<random>`` (the run it is, and not to
be guessed); its result is the tool result ``wait`` gives for that run (an
exec run's: its whole output, head and tail, since no answer handed any out);
a cancelled task's result is ``stop``'s answer (exit code, reason, proof).
Tasks live as long as the server (``ttl`` null). Without the client's word
(no extension declared, no ``task`` on the call) nothing here changes a call.

Failure modes: an unknown task id is INVALID_PARAMS; cancelling a task that
already ended is INVALID_PARAMS on the 2025-11-25 wire (an acknowledgement on
the extension's, which says cancelling is cooperative); a stop that could
not be proven is INTERNAL_ERROR with one line, the task left ``working``.
"""

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from ..common.plainclass import field, plainclass
from .runs import BadArguments, RunFailed
from .tools import MAX_WAIT_MS, Tools

EXTENSION = "io.modelcontextprotocol/tasks"
#: The tools whose calls may become tasks.
TASK_TOOLS = ("exec", "start")
#: Suggested polling interval, milliseconds.
POLL_MS = 500
_TERMINAL = ("completed", "failed", "cancelled")
_RELATED = "io.modelcontextprotocol/related-task"

Render = Callable[[dict], types.CallToolResult]


class UpdateTaskParams(types.RequestParams):
    """``tasks/update`` (the extension): a task's id and the answers to its input requests."""

    task_id: str
    input_responses: dict[str, Any] | None = None


@plainclass
class Task:
    task_id: str
    run_id: str
    created: str
    updated: str
    status: str = "working"
    message: str | None = None
    #: The final tool result (completed: ``wait``'s; cancelled: ``stop``'s).
    result: types.CallToolResult | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def fields(self, extension: bool) -> dict:
        """The task on the wire: the extension's ``DetailedTask`` (its result
        inlined once completed) or the 2025-11-25 ``Task``."""
        wire: dict = {"taskId": self.task_id, "status": self.status}
        if self.message is not None:
            wire["statusMessage"] = self.message
        wire.update(createdAt=self.created, lastUpdatedAt=self.updated)
        if extension:
            wire.update(ttlMs=None, pollIntervalMs=POLL_MS)
            if self.status == "completed" and self.result is not None:
                wire["result"] = self.result.model_dump(by_alias=True, mode="json", exclude_none=True)
        else:
            wire.update(ttl=None, pollInterval=POLL_MS)
        return wire


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _extension_wire(ctx) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _declared_extension(ctx) -> bool:
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and EXTENSION in (capabilities.extensions or {})


def _legacy_only(ctx) -> None:
    """``tasks/result`` and ``tasks/list`` are the 2025-11-25 revision's; the extension has neither."""
    if _extension_wire(ctx):
        raise MCPError(types.METHOD_NOT_FOUND, "Method not found", ctx.method)


def tool_execution(name: str) -> types.ToolExecution | None:
    """What ``tools/list`` says of a tool's task support (the 2025-11-25 ``execution``)."""
    return types.ToolExecution(task_support="optional") if name in TASK_TOOLS else None


def declare(capabilities: types.ServerCapabilities) -> None:
    """The 2025-11-25 ``capabilities.tasks``: list, cancel, and task-augmented tools/call."""
    capabilities.tasks = types.ServerTasksCapability(
        list=types.TasksListCapability(),
        cancel=types.TasksCancelCapability(),
        requests=types.ServerTasksRequestsCapability(
            tools=types.TasksToolsCapability(call=types.TasksCallCapability())
        ),
    )


class TaskBook:
    """The server's tasks, each one run of ``tools``; ``render`` makes a tool's answer a tool result."""

    def __init__(self, tools: Tools, render: Render):
        self.tools = tools
        self.render = render
        self.tasks: dict[str, Task] = {}

    # -- hooks (server.py) ---------------------------------------------------------------
    def install(self, server, call_tool: Callable[[Any, types.CallToolRequestParams], Awaitable[Any]]) -> None:
        """Serve ``tasks/*`` on ``server``, declare the extension, and let a
        2025-11-25 task answer of ``call_tool`` past the SDK's sieve (which
        holds every legacy tools/call result to ``CallToolResult``)."""
        server.extensions[EXTENSION] = {}
        server.add_request_handler("tasks/get", types.GetTaskRequestParams, self.get)
        server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, self.cancel)
        server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, self.result)
        server.add_request_handler("tasks/list", types.PaginatedRequestParams, self.list_tasks)
        server.add_request_handler("tasks/update", UpdateTaskParams, self.update)

        async def legacy_task_call(ctx, call_next):
            params = ctx.params
            if (
                ctx.method != "tools/call"
                or _extension_wire(ctx)
                or not isinstance(params, Mapping)
                or params.get("task") is None
                or params.get("name") not in TASK_TOOLS
            ):
                return await call_next(ctx)
            try:
                typed = types.CallToolRequestParams.model_validate(params, by_name=False)
            except ValueError:
                raise MCPError(types.INVALID_PARAMS, "tools/call: malformed params") from None
            return await call_tool(ctx, typed)

        server.middleware.append(legacy_task_call)

    def wanted(self, ctx, params: types.CallToolRequestParams) -> bool:
        """Whether this call may be answered with a task: the client said so
        (the extension declared on the request, or ``task`` on a 2025-11-25 call)."""
        if params.name not in TASK_TOOLS:
            return False
        if _extension_wire(ctx):
            return _declared_extension(ctx)
        return params.task is not None

    async def call(self, ctx, params: types.CallToolRequestParams) -> dict | types.CallToolResult:
        """The tool call, answered with a task where its run goes on (BadArguments as ``Tools.call``)."""
        extension = _extension_wire(ctx)
        args = dict(params.arguments or {})
        if params.name == "exec" and not extension:
            args["yield_ms"] = 0  # the client asked for a task: answer at once
        try:
            answer = await self.tools.call(params.name, args)
        except RunFailed as exc:
            if extension:
                raise  # the server's ordinary error result
            return {"task": self._ended(exc).fields(extension)}
        if not answer["running"]:  # an exec that ended within its yield
            if extension:
                return self.render(answer)
            return {"task": self._new(answer["run_id"], result=self.render(answer)).fields(extension)}
        run_id = answer["run_id"]
        if params.name == "exec":
            self.tools.runs[run_id].handed = 0  # the task's result carries the whole output
            message = f"{run_id}: running"
        else:
            message = f"{run_id}: running, ready ({answer['ready']})"
        task = self._new(run_id, message=message)
        if extension:
            return {"resultType": "task", **task.fields(extension)}
        return {"task": task.fields(extension)}

    # -- tasks/* -------------------------------------------------------------------------
    async def get(self, ctx, params: types.GetTaskRequestParams) -> dict:
        task = self._task(ctx, params.task_id)
        if task.status not in _TERMINAL and not self.tools.runs[task.run_id].running:
            await self._settle(task, 0)
        return task.fields(_extension_wire(ctx))

    async def result(self, ctx, params: types.GetTaskPayloadRequestParams) -> dict:
        """2025-11-25 ``tasks/result``: the final tool result, once the run has ended."""
        _legacy_only(ctx)
        task = self._task(ctx, params.task_id)
        while task.status not in _TERMINAL:
            # Woken by the run's corral's exit (a pidfd in the loop), the task's lock not held
            # meanwhile: a tasks/cancel is answered as soon as its stop is proven.
            await self.tools.runs[task.run_id].ended(MAX_WAIT_MS / 1000)
            await self._settle(task, 0)
        assert task.result is not None
        wire = task.result.model_dump(by_alias=True, mode="json", exclude_none=True)
        wire["_meta"] = {**wire.get("_meta", {}), _RELATED: {"taskId": task.task_id}}
        return wire

    async def list_tasks(self, ctx, params: types.PaginatedRequestParams) -> dict:
        """2025-11-25 ``tasks/list``: every task of this server, in one page."""
        _legacy_only(ctx)
        for task in self.tasks.values():
            if task.status not in _TERMINAL and not self.tools.runs[task.run_id].running:
                await self._settle(task, 0)
        return {"tasks": [task.fields(False) for task in self.tasks.values()]}

    async def cancel(self, ctx, params: types.CancelTaskRequestParams) -> dict:
        """``stop``: the task ``cancelled`` once every process of its run is proven gone."""
        extension = _extension_wire(ctx)
        task = self._task(ctx, params.task_id)
        async with task.lock:
            if task.status not in _TERMINAL and not self.tools.runs[task.run_id].running:
                await self._settle(task, 0, locked=True)  # it ended first: completed, not cancelled
            if task.status in _TERMINAL:
                if extension:
                    return {}
                raise MCPError(types.INVALID_PARAMS, f"task {task.task_id} is already {task.status}")
            try:
                answer = await self.tools.call("stop", {"run_id": task.run_id})
            except (RunFailed, BadArguments) as exc:
                raise MCPError(types.INTERNAL_ERROR, f"task {task.task_id}: {exc}") from None
            proof = answer.get("proof") or {}
            proven = "every process proven gone" if proof.get("verified") else "NOT proven gone"
            message = f"cancelled: stopped, exit {answer['exit_code']}, {proven}"
            self._end(task, "cancelled", self.render(answer), message)
        return {} if extension else task.fields(False)

    async def update(self, ctx, params: UpdateTaskParams) -> dict:
        """The extension's ``tasks/update``: acknowledged (no run ever asks the client for input)."""
        if not _extension_wire(ctx):
            raise MCPError(types.METHOD_NOT_FOUND, "Method not found", "tasks/update")
        self._task(ctx, params.task_id)
        return {}

    # -- the book ------------------------------------------------------------------------
    def _task(self, ctx, task_id: str) -> Task:
        if _extension_wire(ctx) and not _declared_extension(ctx):
            raise MCPError(
                types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                "Missing required client capability",
                {"requiredCapabilities": {"extensions": {EXTENSION: {}}}},
            )
        task = self.tasks.get(task_id)
        if task is None:
            raise MCPError(types.INVALID_PARAMS, f"Failed to retrieve task: unknown task {task_id!r}")
        return task

    def _new(self, run_id: str, *, message: str | None = None, result=None) -> Task:
        now = _now()
        task = Task(f"{run_id}.{secrets.token_urlsafe(16)}", run_id, now, now, message=message)
        if result is not None:
            self._end(task, "completed", result, "ended within its yield")
        self.tasks[task.task_id] = task
        return task

    def _ended(self, exc: RunFailed) -> Task:
        """A 2025-11-25 task for a run that could not start or be ready: completed, its result an error."""
        line = str(exc)
        result = types.CallToolResult(content=[types.TextContent(type="text", text=line)], is_error=True)
        now = _now()
        task = Task(f"failed.{secrets.token_urlsafe(16)}", "", now, now)
        self._end(task, "completed", result, line)
        self.tasks[task.task_id] = task
        return task

    def _end(self, task: Task, status: str, result: types.CallToolResult, message: str) -> None:
        task.status, task.result, task.message, task.updated = status, result, message, _now()

    async def _settle(self, task: Task, timeout: float, *, locked: bool = False) -> bool:
        """Wait up to ``timeout`` seconds for the task's run to end; once it has,
        its result is ``wait``'s answer, taken once. True when the task is over."""
        if task.status in _TERMINAL:
            return True
        if not locked:
            async with task.lock:
                return await self._settle(task, timeout, locked=True)
        answer = await self.tools.call("wait", {"run_id": task.run_id, "timeout_ms": int(timeout * 1000)})
        if answer["running"]:
            return False
        self._end(task, "completed", self.render(answer), f"exit {answer['exit_code']}: {answer['reason']}")
        return True
