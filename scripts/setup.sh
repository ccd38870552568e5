#!/usr/bin/env bash
# Set up everything a node, the toolchains and the tests need, on a fresh Debian machine with
# Python 3.11, Go, Rust, Node.js and gcc: the project's virtual environment (.venv) with the
# runtime, meshctl, nats-server and the Python SDK; each language's packages fetched ahead.
# Idempotent: a second run only checks.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install --disable-pip-version-check --quiet --upgrade pip
python -m pip install --disable-pip-version-check --quiet -e '.[test]'
bash scripts/setup-python.sh
# The sandbox helper every confined child starts through (launcher/sandbox_exec.c), built now so
# that the first child does not wait for gcc; it says what this machine's kernel allows.
python -m launcher.sandbox probe

for lang in c go rust typescript systemd imports; do
  script="scripts/setup-$lang.sh"
  if [ -f "$script" ]; then
    echo "setup: $lang"
    bash "$script"
  fi
done
echo "setup: done. Run a node with: .venv/bin/meshctl node run --manifests bundles"
