// @mesh/sdk: the thin TypeScript SDK for mesh tools bundles.
//
// A tools bundle is a process that speaks MCP over stdio to the node's runtime (record 0188).
// This package wraps the official @modelcontextprotocol/sdk for that one job and adds the few
// things a module's code needs from the mesh: seat-verb tool names, the node's facts (MESH_*),
// logging to stderr, and the caller and progress of a call. It holds no transport to the bus
// and no client of any module.

export { McpServer, type RegisteredTool } from "@modelcontextprotocol/sdk/server/mcp.js";
export type { CallToolResult, ToolAnnotations } from "@modelcontextprotocol/sdk/types.js";
// One zod for the bundle and the SDK: schemas made with it are the ones McpServer understands.
export { z } from "zod";

export { CALL_REF_KEY, elicit, elicitUrl, type RequestedSchema } from "./asking.js";
export { caller, CALLER_KEY, type Caller, MAX_CALLER_FIELD_BYTES, parseCaller, type Person, progress, type Via } from "./call.js";
export { facts, FactsMissing, type Facts } from "./facts.js";
export { log, logger, type Level, type Logger } from "./log.js";
export { checkToolName, seatVerb, ToolNameError } from "./names.js";
export { createServer, defineTool, result, run, serveStdio, type ServerInfo, type ToolSpec } from "./server.js";
