// What a tool handler learns about its call from the node, beyond the arguments: who is calling
// (`_meta["mesh/caller"]`, set only by the node), the request's progress token, and whether the
// call was cancelled (the library's `extra.signal`). Handlers pass the `extra` McpServer gives
// them; nothing here holds state.

import type { RequestHandlerExtra } from "@modelcontextprotocol/sdk/shared/protocol.js";
import type { ServerNotification, ServerRequest } from "@modelcontextprotocol/sdk/types.js";

import { log } from "./log.js";

/** How the call reached the node: a bus caller, the node's own, an MCP face or a console (delegates). */
export type Via = "bus" | "local" | "mcp" | "console";

/** The human behind a delegate's call (an MCP face, a console), as the delegate named them. */
export interface Person {
  /** Who vouched for them: an OAuth issuer, or `unix:<host>` for an OS user. */
  readonly iss: string;
  readonly sub: string;
  readonly name: string;
}

/** Who is calling, as the node took it from the NATS server-stamped request info. */
export interface Caller {
  readonly account: string;
  /** The user within the account; null when the account's import does not share it. */
  readonly user: string | null;
  readonly name: string | null;
  readonly via: Via;
  /** The person behind a delegate's call (via "mcp" or "console"); null otherwise. */
  readonly person: Person | null;
  /**
   * The key for author/owner: the person's when a delegate named one (`"person:<iss>/<sub>"`),
   * else `"<account>/<user>"` (`"<account>"` without a user), `"local:"` before it for the node's
   * own caller; names escaped (`%`, `/`, `:` as `%25`, `%2F`, `%3A`), so no two callers share one.
   */
  readonly id: string;
}

type Extra = RequestHandlerExtra<ServerRequest, ServerNotification>;

/** The `_meta` key the node puts the caller under on every tools/call. */
export const CALLER_KEY = "mesh/caller";
/** Longest account, user or name accepted, in UTF-8 bytes. */
export const MAX_CALLER_FIELD_BYTES = 256;
const VIA: readonly string[] = ["bus", "local", "mcp", "console"] satisfies Via[];
const DELEGATE_VIA: readonly string[] = ["mcp", "console"] satisfies Via[];
// C0 controls, DEL, and UTF-16 halves without their other half (not text, not UTF-8 encodable).
const NOT_TEXT = /[\u0000-\u001f\u007f]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** Why `value` is not a caller field, or null when it is one. */
function fieldProblem(field: string, value: unknown): string | null {
  if (typeof value !== "string") return `${field} is ${value === null ? "null" : typeof value}, not a string`;
  if (value === "") return `${field} is empty`;
  if (Buffer.byteLength(value, "utf8") > MAX_CALLER_FIELD_BYTES) return `${field} is longer than ${MAX_CALLER_FIELD_BYTES} bytes`;
  if (NOT_TEXT.test(value)) return `${field} holds control characters or broken UTF-16`;
  return null;
}

/** A name as it stands in an id: `%`, `/` and `:` percent-encoded (every SDK's rule). */
function escape(text: string): string {
  return text.replaceAll("%", "%25").replaceAll("/", "%2F").replaceAll(":", "%3A");
}

/** Why `raw` is not a delegate's person, or null when it is one (or absent). */
function personProblem(raw: unknown, via: unknown): string | null {
  if (raw === undefined || raw === null) return null;
  if (typeof via !== "string" || !DELEGATE_VIA.includes(via)) return `a person comes only with via ${DELEGATE_VIA.join(" or ")}`;
  if (typeof raw !== "object" || Array.isArray(raw)) return "person is not an object";
  const { iss, sub, name } = raw as Record<string, unknown>;
  return fieldProblem("person.iss", iss) ?? fieldProblem("person.sub", sub) ?? fieldProblem("person.name", name);
}

/** The caller in `meta`, or why there is none (a string). */
export function parseCaller(meta: unknown): Caller | string {
  const raw = (meta as Record<string, unknown> | undefined)?.[CALLER_KEY];
  if (raw === undefined) return "no caller in _meta";
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) return `${CALLER_KEY} is not an object`;
  const { account, user = null, name = null, via, person: rawPerson = null } = raw as Record<string, unknown>;
  const problem =
    fieldProblem("account", account) ??
    (user === null ? null : fieldProblem("user", user)) ??
    (name === null ? null : fieldProblem("name", name)) ??
    (typeof via === "string" && VIA.includes(via) ? null : `via is not one of ${VIA.join(", ")}`) ??
    personProblem(rawPerson, via);
  if (problem) return `${CALLER_KEY} is malformed: ${problem}`;
  const given = rawPerson as Person | null;
  const person = given === null ? null : Object.freeze({ iss: given.iss, sub: given.sub, name: given.name });
  const base = user === null ? escape(account as string) : `${escape(account as string)}/${escape(user as string)}`;
  const id = person ? `person:${escape(person.iss)}/${escape(person.sub)}` : via === "local" ? `local:${base}` : base;
  return Object.freeze({ account, user, name, via, person, id } as Caller);
}

/**
 * Who is calling: the caller the node put in this call's `_meta`, or null when there is none
 * (a bundle run by hand) or it is malformed (logged as a warning). Never read identity from the
 * arguments: any client can write those.
 */
export function caller(extra: Pick<Extra, "_meta">): Caller | null {
  const found = parseCaller(extra._meta);
  if (typeof found !== "string") return found;
  if (extra._meta?.[CALLER_KEY] !== undefined) log.warn("%s; the handler gets no caller", found);
  return null;
}

/**
 * Tell the caller how far this call is: a `notifications/progress` with the request's
 * progressToken. A no-op when the caller asked for no progress or the call was cancelled.
 * `progress` should grow with every call; await each one so they leave in order.
 */
export async function progress(
  extra: Pick<Extra, "_meta" | "sendNotification" | "signal">,
  progress: number,
  options: { total?: number; message?: string } = {},
): Promise<void> {
  if (!Number.isFinite(progress) || (options.total !== undefined && !Number.isFinite(options.total))) {
    throw new RangeError(`progress and total must be finite numbers, got ${progress} and ${options.total}`);
  }
  const token = extra._meta?.progressToken;
  if ((typeof token !== "string" && typeof token !== "number") || extra.signal.aborted) return;
  const params = { progressToken: token, progress, ...options };
  await extra.sendNotification({ method: "notifications/progress", params });
}
