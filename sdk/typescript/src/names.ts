// Tool names: `<seat>.<verb>` implements a seat's verb; a name without a dot is the module's own.
// The rules match the manifest's seat names and what the runtime can put in one bus subject
// token, so a name accepted here is a name the runtime serves (same rules as the Python SDK).

const SEAT_RE = /^[a-z][a-z0-9-]{0,62}$/;
// One token of a bus subject and a valid MCP tool name: no dots, spaces, `*` or `>`.
const PART_RE = /^[A-Za-z][A-Za-z0-9_-]{0,63}$/;

/** A tool name the runtime could not serve on a subject. */
export class ToolNameError extends Error {
  override name = "ToolNameError";
}

/** The tool name implementing `verb` of `seat`: "seat.verb". */
export function seatVerb(seat: string, verb: string): string {
  if (!SEAT_RE.test(seat)) {
    throw new ToolNameError(`seat ${JSON.stringify(seat)} is not a seat name: [a-z][a-z0-9-]{0,62}, e.g. "memory"`);
  }
  if (!PART_RE.test(verb)) {
    throw new ToolNameError(
      `verb ${JSON.stringify(verb)} is not a verb: a letter, then letters, digits, _ or - (at most 64)`,
    );
  }
  return `${seat}.${verb}`;
}

/** Return `name` if the runtime can serve it: no dot, or exactly one (a seat verb). */
export function checkToolName(name: string): string {
  const parts = name.split(".");
  if (parts.length === 2) return seatVerb(parts[0]!, parts[1]!);
  if (parts.length > 2) {
    throw new ToolNameError(`tool ${JSON.stringify(name)} has more than one dot; a seat verb is <seat>.<verb>`);
  }
  if (!PART_RE.test(name)) {
    throw new ToolNameError(
      `tool ${JSON.stringify(name)} is not a tool name: a letter, then letters, digits, _ or - (at most 64)`,
    );
  }
  return name;
}
