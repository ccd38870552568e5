// The facts the node's runtime gives a bundle through its environment (MESH_*).

import { mkdirSync } from "node:fs";

/** What the runtime tells a bundle about where and as what it runs. */
export interface Facts {
  /** The node's name. */
  node: string;
  /** The module this bundle belongs to. */
  module: string;
  /** This bundle's name in the module. */
  bundle: string;
  /** The unpacked bundle folder (replaced on upgrade: keep no state here). */
  bundleDir: string;
  /** Persistent per-module data; survives upgrades and restarts. */
  dataDir: string;
}

const VARIABLES = {
  node: "MESH_NODE",
  module: "MESH_MODULE",
  bundle: "MESH_BUNDLE",
  bundleDir: "MESH_BUNDLE_DIR",
  dataDir: "MESH_DATA_DIR",
} as const satisfies Record<keyof Facts, string>;

/** The process was not started by the mesh runtime, so some MESH_* variables are unset. */
export class FactsMissing extends Error {
  override name = "FactsMissing";
  constructor(readonly missing: string[]) {
    super(
      `${missing.join(", ")} ${missing.length === 1 ? "is" : "are"} not set: this bundle was not started by ` +
        "the mesh runtime; set them (MESH_NODE, MESH_MODULE, MESH_BUNDLE, MESH_BUNDLE_DIR, MESH_DATA_DIR) " +
        "to run it by hand",
    );
  }
}

/**
 * Read the MESH_* facts; create the data folder if it is not there yet.
 *
 * There is deliberately no fallback: a data folder guessed when the variable is missing would
 * be a second, unconnected store, which the mesh's failure rule forbids.
 */
export function facts(env: NodeJS.ProcessEnv = process.env): Facts {
  const entries = Object.entries(VARIABLES) as [keyof Facts, string][];
  const missing = entries.filter(([, variable]) => !env[variable]).map(([, variable]) => variable);
  if (missing.length > 0) throw new FactsMissing(missing);
  const found = Object.fromEntries(entries.map(([field, variable]) => [field, env[variable]!])) as unknown as Facts;
  mkdirSync(found.dataDir, { recursive: true });
  return found;
}
