// A tools bundle's server: the official MCP SDK's McpServer, served on stdio.

import { McpServer, type RegisteredTool, type ToolCallback } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import type { AnySchema, ZodRawShapeCompat } from "@modelcontextprotocol/sdk/server/zod-compat.js";
import type { CallToolResult, ToolAnnotations } from "@modelcontextprotocol/sdk/types.js";

import { FactsMissing } from "./facts.js";
import { log as defaultLog, type Logger } from "./log.js";
import { checkToolName, ToolNameError } from "./names.js";

export interface ServerInfo {
  /** Defaults to the module's name (MESH_MODULE), which is what the runtime knows the bundle by. */
  name?: string;
  version?: string;
  instructions?: string;
}

/** A McpServer for one bundle; tools are added with `defineTool`. */
export function createServer(info: ServerInfo = {}): McpServer {
  const name = info.name ?? process.env.MESH_MODULE ?? "mesh-bundle";
  return new McpServer({ name, version: info.version ?? "0.0.0" }, { instructions: info.instructions });
}

type Schema = ZodRawShapeCompat | AnySchema;

/** How a tool presents itself: `input`/`output` are zod shapes (`{ name: z.string() }`) or zod objects. */
export interface ToolSpec<I extends undefined | Schema, O extends undefined | Schema> {
  title?: string;
  description?: string;
  input?: I;
  /** When given, the library checks every structuredContent against it. */
  output?: O;
  annotations?: ToolAnnotations;
}

/**
 * Register a tool on `server`. The handler receives the arguments already validated against
 * `input` and typed from it; a thrown error becomes an `isError` result, as McpServer does it.
 * The name is checked first so that a name the runtime could not serve fails at start-up, not
 * on the bus.
 */
export function defineTool<I extends undefined | Schema = undefined, O extends undefined | Schema = undefined>(
  server: McpServer,
  name: string,
  spec: ToolSpec<I, O>,
  handler: ToolCallback<I>,
): RegisteredTool {
  const config = {
    title: spec.title,
    description: spec.description,
    inputSchema: spec.input,
    outputSchema: spec.output as Schema | undefined,
    annotations: spec.annotations,
  };
  return server.registerTool(checkToolName(name), config, handler);
}

/** A tool result with a text for people and, optionally, structured content for programs. */
export function result(
  text: string,
  structured?: Record<string, unknown>,
  options: { isError?: boolean } = {},
): CallToolResult {
  const out: CallToolResult = { content: [{ type: "text", text }] };
  if (structured !== undefined) out.structuredContent = structured;
  if (options.isError) out.isError = true;
  return out;
}

/**
 * Serve `server` on stdin/stdout until stdin closes, which is how the runtime says "exit now".
 *
 * Calls are served concurrently: McpServer starts each request's handler as it arrives and
 * answers by id, so a slow call does not hold up the others. console.log/info/debug are sent
 * to stderr because a stray line on stdout would break the protocol stream.
 */
export async function serveStdio(server: McpServer, options: { log?: Logger } = {}): Promise<void> {
  const log = options.log ?? defaultLog;
  console.log = console.info = console.debug = console.error;
  server.server.onerror = (error: Error) => log.error("protocol: %s", error.message);
  process.stdin.once("end", () => {
    // Do not wait for calls still running: the runtime has gone or wants this process gone.
    void server.close().finally(() => process.exit(0));
  });
  await server.connect(new StdioServerTransport());
}

/**
 * Run a bundle's start-up: `main` reads facts, defines tools and calls serveStdio. A failure
 * the bundle's author or operator can fix (MESH_* unset, a tool name the runtime cannot
 * serve) ends the process with one clear line on stderr instead of a stack trace; any other
 * error is a bug and keeps its stack.
 */
export function run(main: () => Promise<void> | void, options: { log?: Logger } = {}): void {
  const log = options.log ?? defaultLog;
  Promise.resolve()
    .then(main)
    .catch((error: unknown) => {
      const expected = error instanceof FactsMissing || error instanceof ToolNameError;
      log.error("cannot start: %s", expected ? (error as Error).message : (error as Error)?.stack ?? String(error));
      process.exit(1);
    });
}
