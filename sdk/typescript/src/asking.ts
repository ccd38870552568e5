// Asking the caller mid-call: an elicitation that reaches the caller of this call across the mesh
// (docs/bus.md, "Asking"). With several calls in flight on one child the node must know which
// call a request belongs to: every tools/call of a caller that answers carries
// `_meta["mesh/call"]`, and these helpers copy it onto the request (sdk/COMMON.md, "Asking"). A
// caller that cannot answer makes the request fail at once (the promise rejects with the node's
// JSON-RPC error), never a hang.

import type { RequestHandlerExtra } from "@modelcontextprotocol/sdk/shared/protocol.js";
import {
  type ElicitRequestFormParams,
  type ElicitResult,
  ElicitResultSchema,
  type ServerNotification,
  type ServerRequest,
} from "@modelcontextprotocol/sdk/types.js";

type Extra = RequestHandlerExtra<ServerRequest, ServerNotification>;

/** The `_meta` key of the call reference the node puts on a tools/call whose caller answers. */
export const CALL_REF_KEY = "mesh/call";

/** A form's schema: an object of primitive properties (MCP's ElicitRequestFormParams.requestedSchema). */
export type RequestedSchema = ElicitRequestFormParams["requestedSchema"];

function ref(extra: Pick<Extra, "_meta">): Record<string, unknown> | undefined {
  const found = extra._meta?.[CALL_REF_KEY];
  return typeof found === "number" && Number.isInteger(found) ? { [CALL_REF_KEY]: found } : undefined;
}

/** Ask the caller to fill a form; `action` is accept, decline or cancel, `content` the answer when accepted. */
export async function elicit(
  extra: Pick<Extra, "_meta" | "sendRequest">,
  message: string,
  requestedSchema: RequestedSchema,
): Promise<ElicitResult> {
  const meta = ref(extra);
  const params = { mode: "form" as const, message, requestedSchema, ...(meta ? { _meta: meta } : {}) };
  return extra.sendRequest({ method: "elicitation/create", params }, ElicitResultSchema);
}

/** Send the caller's user to `url` (URL mode: what happens there never passes the mesh). */
export async function elicitUrl(
  extra: Pick<Extra, "_meta" | "sendRequest">,
  message: string,
  url: string,
  elicitationId: string,
): Promise<ElicitResult> {
  const meta = ref(extra);
  const params = { mode: "url" as const, message, url, elicitationId, ...(meta ? { _meta: meta } : {}) };
  return extra.sendRequest({ method: "elicitation/create", params }, ElicitResultSchema);
}
