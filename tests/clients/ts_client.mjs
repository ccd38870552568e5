// The TypeScript SDK's MCP client (sdk/typescript's @modelcontextprotocol/sdk) against the face:
// lists the tools, calls each named tool with {"name": "Ada"}, prints one JSON object to stdout.
//   node ts_client.mjs stdio '<command JSON array>' tool...
//   node ts_client.mjs http <endpoint URL> tool...
import { pathToFileURL } from "node:url";
import path from "node:path";

const sdkRoot = path.resolve(import.meta.dirname, "../../sdk/typescript/node_modules/@modelcontextprotocol/sdk/dist/esm");
const load = (p) => import(pathToFileURL(path.join(sdkRoot, p)).href);
const { Client } = await load("client/index.js");

const [mode, target, ...tools] = process.argv.slice(2);
let transport;
if (mode === "stdio") {
  const { StdioClientTransport } = await load("client/stdio.js");
  const [command, ...args] = JSON.parse(target);
  transport = new StdioClientTransport({ command, args, stderr: "inherit" });
} else if (mode === "http") {
  const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");
  transport = new StreamableHTTPClientTransport(new URL(target));
} else {
  console.error(`mode ${mode}: give stdio or http`);
  process.exit(2);
}
const client = new Client({ name: "mesh-face-test", version: "0.1.0" });
await client.connect(transport);
const listed = await client.listTools();
const calls = {};
for (const name of tools) {
  const result = await client.callTool({ name, arguments: { name: "Ada" } });
  calls[name] = { isError: result.isError ?? false, text: result.content.map((c) => c.text ?? "").join("\n") };
}
console.log(
  JSON.stringify({
    protocolVersion: transport.protocolVersion ?? null,
    server: client.getServerVersion(),
    listChanged: client.getServerCapabilities()?.tools?.listChanged ?? false,
    tools: listed.tools.map((t) => ({ name: t.name, subject: t._meta?.["mesh/subject"] })),
    calls,
  }),
);
await client.close();
