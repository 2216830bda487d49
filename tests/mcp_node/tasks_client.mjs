// MCP tasks through `corralctl mcp`, driven by the official TypeScript MCP SDK's client: the
// 2025-11-25 revision's tasks (`client.experimental.tasks` in @modelcontextprotocol/sdk 1.x).
// node tasks_client.mjs PYTHON PORT MARKER  (the server's environment: this process's)
// A long `exec` asked as a task: created, polled (tasks/get), its result (tasks/result).
// A short `start` asked as a task: tasks/result at once, which waits for the run's end.
// A `start` asked as a task: created once ready, listed (tasks/list), cancelled (tasks/cancel);
// then, read from /proc, the processes carrying MARKER, and whether PORT still accepts.
// Prints one JSON line.
import fs from "node:fs";
import net from "node:net";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

const [python, port, marker] = process.argv.slice(2);

function marked() {
  const needle = `CORRAL_TEST_MARKER=${marker}`;
  const found = [];
  for (const name of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${name}/stat`, "latin1");
      if (/^[ZX]$/.test(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0])) continue;
      if (fs.readFileSync(`/proc/${name}/environ`, "latin1").split("\0").includes(needle)) found.push(Number(name));
    } catch {
      // gone while read
    }
  }
  return found;
}

function accepts() {
  return new Promise((resolve) => {
    const socket = net.connect({ host: "127.0.0.1", port: Number(port) });
    socket.on("connect", () => { socket.destroy(); resolve(true); });
    socket.on("error", () => resolve(false));
  });
}

const transport = new StdioClientTransport({
  command: python,
  args: ["-m", "corral_systemd.ctl", "mcp"],
  env: { ...process.env },
  stderr: "inherit",
});
const client = new Client({ name: "corral-test", version: "1.0.0" }, { capabilities: { tasks: { list: {}, cancel: {} } } });
await client.connect(transport);
const tasks = client.experimental.tasks;
const listedTools = await client.listTools();
const asTask = { task: { ttl: 60000 } };

const exec = [];
for await (const message of tasks.callToolStream({ name: "exec", arguments: { cmd: "echo early; sleep 1; echo late" } }, CallToolResultSchema, asTask)) {
  exec.push(message.type === "error" ? { type: "error", error: String(message.error) } : message);
}

// A short start asked as a task: tasks/result waits for its end.
let short = null;
for await (const message of tasks.callToolStream({ name: "start", arguments: { cmd: "sleep 1" } }, CallToolResultSchema, asTask)) {
  if (message.type === "taskCreated") { short = message.task; break; }
  if (message.type === "error") throw message.error;
}
const shortResult = await tasks.getTaskResult(short.taskId, CallToolResultSchema);

let created = null;
const cmd = `export CORRAL_TEST_MARKER=${marker}; setsid sleep 300 & exec python3 -m http.server --bind 127.0.0.1 ${port}`;
for await (const message of tasks.callToolStream({ name: "start", arguments: { cmd, ready_port: Number(port) } }, CallToolResultSchema, asTask)) {
  if (message.type === "taskCreated") { created = message.task; break; }
  if (message.type === "error") throw message.error;
}
const before = { marked: marked().length, accepts: await accepts(), task: await tasks.getTask(created.taskId) };
const listed = await tasks.listTasks();
const cancelled = await tasks.cancelTask(created.taskId);
const after = { marked: marked(), accepts: await accepts(), task: await tasks.getTask(created.taskId) };
const stopResult = await tasks.getTaskResult(created.taskId, CallToolResultSchema);
console.log(JSON.stringify({
  capabilities: client.getServerCapabilities().tasks,
  execution: Object.fromEntries(listedTools.tools.map((t) => [t.name, t.execution?.taskSupport ?? null])),
  exec, short, shortResult, created, before, listed, cancelled, after, stopResult,
}));
await client.close();
