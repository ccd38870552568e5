#!/usr/bin/env bash
# Build Litestream (the SQLite replicator that replicated seats use, issue 22) into .venv/bin from
# the Go module proxy, as a pure-Go binary (CGO_ENABLED=0: it uses modernc.org/sqlite, no C
# compiler). The binary is 52 MB. A cold build takes 3-4 minutes on 2 cores: about 110 modules
# (226 MB of downloads, 1.3 GB unpacked in Go's module cache), then the compile. So it runs once:
# a second run only checks the version. Offline once Go's module cache holds those modules.
# LITESTREAM_VERSION overrides the pinned version (keep it a v0.5.x: its NATS replica type and
# LTX format are what the seat keeper expects).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${LITESTREAM_VERSION:-v0.5.18}"
bin_dir="$repo/.venv/bin"
binary="$bin_dir/litestream"

if [ -x "$binary" ]; then
  have="$("$binary" version 2>/dev/null || true)"
  if [ "$have" = "$version" ]; then
    echo "setup-litestream: already installed: $binary $have"
    exit 0
  fi
  echo "setup-litestream: $binary is ${have:-unreadable}, want $version: rebuilding"
fi

if ! command -v go >/dev/null 2>&1; then
  echo "setup-litestream: \`go\` is not installed; Litestream $version needs Go 1.26 or newer to build" >&2
  exit 1
fi
if [ ! -d "$bin_dir" ]; then
  echo "setup-litestream: $bin_dir is missing; run scripts/setup.sh (it makes .venv first)" >&2
  exit 1
fi

echo "setup-litestream: building github.com/benbjohnson/litestream/cmd/litestream@$version (CGO_ENABLED=0)"
start=$SECONDS
# GOTOOLCHAIN=local: its go.mod suggests a newer patch toolchain; the installed Go satisfies its
# `go` line, and fetching another toolchain is not wanted. -s -w drops debug info (75 MB -> 52
# MB); panics still print symbolised stacks. The version string comes from the module's
# build info, so `litestream version` prints $version.
# Offline: `go install m@v` also asks the proxy for m's newest version (its deprecation notice),
# so when Go's module cache holds the modules, the cache itself serves as the proxy; anything it
# lacks then comes from the usual proxy.
module="github.com/benbjohnson/litestream"
cached="$(go env GOMODCACHE)/cache/download"
build() {
  CGO_ENABLED=0 GOTOOLCHAIN=local GOBIN="$bin_dir" \
    go install -trimpath -ldflags "-s -w" "$module/cmd/litestream@$version"
}
if [ -f "$cached/$module/@v/$version.zip" ] && [ -f "$cached/$module/@v/list" ] \
  && GOPROXY="file://$cached" build 2>/dev/null; then
  echo "setup-litestream: built offline from Go's module cache"
else
  build
fi

have="$("$binary" version)"
if [ "$have" != "$version" ]; then
  echo "setup-litestream: built $binary but it reports version '$have', not $version" >&2
  exit 1
fi
size_mb=$(( $(stat -c %s "$binary") / 1024 / 1024 ))
echo "setup-litestream: installed $binary $have (${size_mb} MB, $((SECONDS - start)) s)"
