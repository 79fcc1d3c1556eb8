#!/usr/bin/env bash
# Installs the Debian packages the tests need (one list per component in
# scripts/deb-packages/*.txt) and the cargo tools. As root it installs what
# is missing; otherwise it only reports what is missing, and the tests that
# need those tools fail loudly.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=$(cat scripts/deb-packages/*.txt 2>/dev/null | sed 's/#.*//' | tr -s ' \n' '\n' | sort -u | grep -v '^$' || true)
missing=()
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "install-deps: not root; missing Debian packages: ${missing[*]} (tests needing them will fail)" >&2
  fi
fi
if ! cargo +nightly miri --version >/dev/null 2>&1; then
  echo "install-deps: installing a nightly toolchain with miri (make miri)"
  rustup toolchain install nightly --profile minimal --component miri,rust-src
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "install-deps: installing cargo-fuzz"
  cargo install --locked -q cargo-fuzz
fi
