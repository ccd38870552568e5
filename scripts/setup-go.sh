#!/usr/bin/env bash
# Fetch the Go modules the Go SDK and the Go bundles need, ahead of a build or a test run
# (CI runs this once, so builds and `go test` need no network later). Safe to run again:
# `go mod download` only fetches what the module cache does not hold yet.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if ! command -v go >/dev/null 2>&1; then
  echo "setup-go: \`go\` is not installed; install Go 1.25 or newer from https://go.dev/dl/" >&2
  exit 1
fi

# sdk/go, then every Go bundle source (a folder under bundles/ or tests/children/ holding a
# go.mod): bundles/handoff, for one, needs a SQLite driver the SDK does not.
dirs=("$repo/sdk/go")
while IFS= read -r mod; do
  dirs+=("$(dirname "$mod")")
done < <(find "$repo/bundles" "$repo/tests/children" -name go.mod -not -path '*/node_modules/*' | sort)

for dir in "${dirs[@]}"; do
  echo "setup-go: go mod download in ${dir#"$repo"/}"
  (cd "$dir" && go mod download)
done
