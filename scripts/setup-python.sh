#!/usr/bin/env bash
# Install the Python SDK (mesh_sdk) editable into the active virtual environment, with its
# dependencies. Idempotent: pip leaves a satisfied install as it is.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${VIRTUAL_ENV:-}" ]; then
  echo "setup-python.sh: activate the project's virtual environment first (. .venv/bin/activate)" >&2
  exit 1
fi
python -m pip install --disable-pip-version-check --quiet -e "$repo/sdk/python"
python -c 'import mesh_sdk; print("mesh_sdk installed:", mesh_sdk.__file__)'
