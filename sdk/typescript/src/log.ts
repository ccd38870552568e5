// Logging to stderr: stdout carries only the protocol, and the runtime captures stderr.
// One plain line per record (no colours, no multi-line boxes) because the runtime keeps the
// last stderr lines of a bundle for its status and error replies.

import { format } from "node:util";

const LEVELS = { debug: 10, info: 20, warn: 30, error: 40 } as const;
export type Level = keyof typeof LEVELS;

export interface Logger {
  debug(message: string, ...args: unknown[]): void;
  info(message: string, ...args: unknown[]): void;
  warn(message: string, ...args: unknown[]): void;
  error(message: string, ...args: unknown[]): void;
}

function threshold(): number {
  const wanted = (process.env.LOG_LEVEL ?? "info").toLowerCase();
  const alias = wanted === "warning" ? "warn" : wanted;
  return alias in LEVELS ? LEVELS[alias as Level] : LEVELS.info;
}

/** A logger whose lines read `LEVEL name: message` on stderr; LOG_LEVEL sets the least level shown. */
export function logger(name = "bundle"): Logger {
  const write = (level: Level) => (message: string, ...args: unknown[]) => {
    if (LEVELS[level] < threshold()) return;
    // Newlines inside a message would split one record into several lines; keep it one line.
    const text = format(message, ...args).replace(/\r?\n/g, "\\n");
    process.stderr.write(`${level.toUpperCase()} ${name}: ${text}\n`);
  };
  return { debug: write("debug"), info: write("info"), warn: write("warn"), error: write("error") };
}

/** The bundle's default logger. */
export const log: Logger = logger();
