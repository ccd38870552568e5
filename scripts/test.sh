#!/usr/bin/env bash
# Set up, check lint, format and types (configured in pyproject.toml), then run the whole test
# suite: slow and cross-language tests included. A test whose toolchain is missing says so in the
# summary (-rs), it is never skipped in silence.
#
# --fast: only the tests that need no compiler and no node process: the unit tests (tests/unit,
# mirroring the packages) and the in-process node tier (tests/node: a real Node with fake children
# on one nats-server). Other arguments go to pytest.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
# Lint, format and types first: seconds, and a finding is cheaper here than in a review.
echo "test: ruff check, ruff format --check, mypy, the import rules"
ruff check .
ruff format --check .
mypy
python scripts/check_imports.py
# One compiler cache for the toolchain tests, the node's from-source builds and the smoke run.
export MESH_TOOLCHAIN_CACHE="${MESH_TOOLCHAIN_CACHE:-$repo/.cache/toolchains}"
if [ "${1:-}" = "--fast" ]; then
  shift
  exec python -m pytest -rs -q tests/unit tests/node -m "not toolchain and not slow" "$@"
fi
exec python -m pytest -rs -q "$@"
