#!/usr/bin/env bash
# Set up everything a node, the toolchains and the tests need, on a fresh Debian machine with
# Python 3.11, Go, Rust, Node.js and gcc: the project's virtual environment (.venv) with the
# runtime, meshctl, nats-server and the Python SDK; each language's packages fetched ahead;
# Litestream (replicated seats) built into .venv/bin.
# Idempotent: a second run only checks.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

# Everything setup reads, and the tools it runs: a second run with the same stamp only says so.
stamp_of() {
  {
    git ls-files -s -- pyproject.toml scripts sdk tests/data/imports.txt tests/clients '*package-lock.json' \
      '*Cargo.lock' '*go.sum' '*requirements.txt' 2>/dev/null
    git diff HEAD -- pyproject.toml scripts sdk tests/clients/package.json 2>/dev/null
    for tool in python3 go cargo node npm gcc; do command -v "$tool" >/dev/null && "$tool" --version 2>&1 | head -1; done
  } | sha256sum | cut -d' ' -f1
}
stamp_file=.venv/.setup-stamp
stamp="$(stamp_of)"
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] && [ -z "${MESH_SETUP_AGAIN:-}" ]; then
  echo "setup: up to date (nothing it reads changed; MESH_SETUP_AGAIN=1 runs it again)"
  exit 0
fi

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

for lang in c go rust typescript systemd imports litestream browser; do
  script="scripts/setup-$lang.sh"
  if [ -f "$script" ]; then
    echo "setup: $lang"
    bash "$script"
  fi
done
echo "$stamp" > "$stamp_file"
echo "setup: done. Run a node with: .venv/bin/meshctl node run --manifests bundles"
