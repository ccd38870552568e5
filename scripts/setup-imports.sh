#!/usr/bin/env bash
# Fetch the published MCP servers the import tests use (tests/data/imports.txt) into the package
# cache, .cache/packages (npm's cache and the wheels; Go modules go to Go's own module cache), so
# `meshctl module import --offline` and the builds of those modules need no network later.
# About 35 MB. Idempotent: a spec the cache already holds is imported offline and not fetched again.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export MESH_PACKAGE_CACHE="$repo/.cache/packages"  # where tests/test_imports.py looks
meshctl=(.venv/bin/python -m runtime.meshctl)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
n=0
while read -r spec; do
  case "$spec" in ''|'#'*) continue ;; esac
  n=$((n + 1))
  # In the cache means: imported AND built with no network (npm ci needs tarballs the import's
  # `npm install` may not have kept, e.g. a package's own dependencies resolved by packument).
  if "${meshctl[@]}" module import "$spec" --offline --out "$work/$n" >/dev/null 2>&1 \
    && MESH_OFFLINE=1 "${meshctl[@]}" bundle build "$work/$n" --out "$work/out-$n" >/dev/null 2>&1; then
    echo "setup-imports: $spec is in the cache"
  else
    # Three tries, 15 s then 45 s apart: the registry answered ETARGET in CI for versions it lists
    # (@hono/node-server@2.1.11, ip-address@10.7.7 of 2026-11-28), twice in a row 5 s apart; a
    # third refusal is real and stops the setup with npm's or pip's own words.
    for try in 1 2 3; do
      again=""
      [ "$try" != 1 ] && again=" (try $try of 3)"
      echo "setup-imports: fetching $spec$again"
      rm -rf "$work/$n" "$work/out-$n"
      if "${meshctl[@]}" module import "$spec" --out "$work/$n" >/dev/null \
        && "${meshctl[@]}" bundle build "$work/$n" --out "$work/out-$n" >/dev/null; then  # fills what the build needs
        break
      fi
      [ "$try" = 3 ] && exit 1
      sleep $((try == 1 ? 15 : 45))
    done
  fi
done < tests/data/imports.txt
