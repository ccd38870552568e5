#!/usr/bin/env bash
# Set up, then run the whole test suite: slow and cross-language tests included. A test whose
# toolchain is missing says so in the summary (-rs), it is never skipped in silence.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
exec python -m pytest -rs -q "$@"
