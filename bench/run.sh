#!/usr/bin/env bash
# The benchmark of issue 5, in one command: `bash bench/run.sh [--quick] [--rounds N]`.
# Sets up the project's .venv when it is missing (scripts/setup.sh), installs the peers it is
# compared with into their own environments under bench/.envs (mcp-proxy from PyPI in a venv,
# supergateway from npm under a prefix), then runs `python -m bench` with the given flags.
# Everything runs on loopback; every process it starts is ended when it ends. Not part of the
# test run: it takes about 5 minutes (a first run longer: it builds every compiled bundle).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

MCP_PROXY_VERSION="0.13.0"
FASTMCP_VERSION="4.2.3"
SUPERGATEWAY_VERSION="4.0.0"
envs="bench/.envs"

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import runtime, nats, msgspec, mcp' 2>/dev/null; then
  echo "bench: setting up the project (scripts/setup.sh)"
  bash scripts/setup.sh
fi

mkdir -p "$envs"
if [ ! -x "$envs/mcp-proxy/bin/mcp-proxy" ]; then
  echo "bench: installing mcp-proxy $MCP_PROXY_VERSION into $envs/mcp-proxy"
  python3 -m venv "$envs/mcp-proxy"
  "$envs/mcp-proxy/bin/python" -m pip install --disable-pip-version-check --quiet "mcp-proxy==$MCP_PROXY_VERSION" \
    || echo "bench: could not install mcp-proxy; its row will say so" >&2
fi
if [ ! -e "$envs/supergateway/node_modules/.bin/supergateway" ]; then
  if command -v npm >/dev/null; then
    echo "bench: installing supergateway $SUPERGATEWAY_VERSION into $envs/supergateway"
    mkdir -p "$envs/supergateway"
    npm install --prefix "$envs/supergateway" --no-audit --no-fund --loglevel=error "supergateway@$SUPERGATEWAY_VERSION" >/dev/null \
      || echo "bench: could not install supergateway; its row will say so" >&2
  else
    echo "bench: npm is missing, so supergateway is not installed; its row will say so" >&2
  fi
fi

if [ ! -x "$envs/fastmcp/bin/python" ] || ! "$envs/fastmcp/bin/python" -c 'import fastmcp' 2>/dev/null; then
  echo "bench: installing fastmcp $FASTMCP_VERSION into $envs/fastmcp"
  python3 -m venv "$envs/fastmcp"
  "$envs/fastmcp/bin/python" -m pip install --disable-pip-version-check --quiet "fastmcp==$FASTMCP_VERSION" \
    || echo "bench: could not install fastmcp; its row will say so" >&2
fi

if [ "${1:-}" = "--face" ]; then
  shift
  exec .venv/bin/python -m bench.face "$@"   # the MCP face beside FastMCP's proxy, mcp-proxy, supergateway
fi
exec .venv/bin/python -m bench "$@"
