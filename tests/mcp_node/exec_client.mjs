// One exec through `corralctl mcp`, driven by the official TypeScript MCP SDK's stdio client.
// node exec_client.mjs PYTHON CMD  (the server's environment: this process's)
// Prints one JSON line: the tool names the server lists and the exec call's result.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [python, cmd] = process.argv.slice(2);
const transport = new StdioClientTransport({
  command: python,
  args: ["-m", "corral_systemd.ctl", "mcp"],
  env: { ...process.env },
  stderr: "inherit",
});
const client = new Client({ name: "corral-test", version: "1.0.0" });
await client.connect(transport);
const tools = await client.listTools();
const result = await client.callTool({ name: "exec", arguments: { cmd, yield_ms: 60000 } });
let badArguments = null;
try {
  await client.callTool({ name: "exec", arguments: { cmd: "" } });
} catch (error) {
  badArguments = { code: error.code, message: error.message };
}
console.log(JSON.stringify({ tools: tools.tools.map((t) => t.name), result, badArguments }));
await client.close();
