#!/usr/bin/env bash
# Fetch the crates the Rust SDK and the Rust bundles need, ahead of a build or a test run (CI
# runs this once, so builds and `cargo test` need no network later). Safe to run again:
# `cargo fetch` only downloads what cargo's home does not hold yet, and `--locked` never
# rewrites a committed Cargo.lock.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# rustup installs into cargo's home, which not every shell has on PATH.
cargo="$(command -v cargo || true)"
if [ -z "$cargo" ] && [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
  cargo="${CARGO_HOME:-$HOME/.cargo}/bin/cargo"
fi
if [ -z "$cargo" ]; then
  echo "setup-rust: \`cargo\` is not installed; install Rust 1.88 or newer with rustup (https://rustup.rs)" \
    "or \`apt-get install cargo\` where Debian's Rust is new enough" >&2
  exit 1
fi

# sdk/rust, then every Rust bundle source (a folder under bundles/ holding a Cargo.lock).
dirs=("$repo/sdk/rust")
while IFS= read -r lock; do
  dirs+=("$(dirname "$lock")")
done < <(find "$repo/bundles" -name Cargo.lock -not -path '*/target/*' -not -path '*/node_modules/*' | sort)

for dir in "${dirs[@]}"; do
  echo "setup-rust: cargo fetch in ${dir#"$repo"/}"
  (cd "$dir" && "$cargo" fetch --locked --quiet)
done
