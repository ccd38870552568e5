#!/bin/sh
# What building and testing C bundles needs on a Debian machine (CI, a developer's box):
# gcc, jansson's headers and static library (the C SDK's JSON library), valgrind for the
# memory test. Idempotent: installs only what is missing, and refreshes the package lists only then.
set -eu

packages="gcc libjansson-dev valgrind"

missing=""
for p in $packages; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
if [ -z "$missing" ]; then
    echo "setup-c: already installed: $packages"
    exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "setup-c: installing$missing"
$sudo apt-get update
# shellcheck disable=SC2086  # the list is meant to split into words
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing
