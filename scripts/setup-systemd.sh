#!/bin/sh
# What testing the systemd units needs on a Debian machine (CI, a developer's box):
# `systemd-analyze`, which checks the units `meshctl node unit` and `meshctl node units` write.
# It ships in Debian's `systemd` package. Installing that package does not make systemd the
# init system (that is `systemd-sysv`), so it is safe in a container: nothing is started.
# Idempotent: installs only when systemd-analyze is missing, and refreshes the package lists only then.
set -eu

if command -v systemd-analyze >/dev/null 2>&1; then
    echo "setup-systemd: already installed: $(systemd-analyze --version | head -n 1)"
    exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "setup-systemd: installing systemd (for systemd-analyze; it does not become the init system)"
$sudo apt-get update
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends systemd
