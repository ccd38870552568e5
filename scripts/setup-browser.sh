#!/bin/sh
# What the console's browser tests need (tests/test_console_*.py): Debian's headless Chromium and
# its driver, and Playwright's Python package driving that browser. Playwright is pointed at
# /usr/bin/chromium (executable_path): it never downloads a browser of its own, so no
# `playwright install` is run here.
# Idempotent: apt runs only when chromium is missing, pip only when playwright is.
set -eu
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    echo "setup-browser: already installed: $(chromium --version 2>/dev/null | head -n 1)"
else
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    echo "setup-browser: installing Debian's chromium and chromium-driver"
    $sudo apt-get update
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver fonts-dejavu-core
fi

if "$python" -c "import playwright" 2>/dev/null; then
    echo "setup-browser: playwright for Python already installed"
else
    echo "setup-browser: installing playwright for Python (no browser download: the tests use /usr/bin/chromium)"
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 "$python" -m pip install --disable-pip-version-check --quiet playwright
fi
