#!/usr/bin/env bash
# Runs every cargo-fuzz target of every fuzz crate in the repository for
# $1 seconds (default 20). Fails if any target finds a crash.
#
# A target starts from its committed seeds, FUZZ_DIR/seeds/TARGET/, when
# there are any (real inputs: the codecs' targets get corpus pages and the
# codecs' output of them, see crates/ztier-codec/examples/fuzz_seeds.rs);
# what it finds beyond them goes to a scratch directory that is removed.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
export RUSTC_BOOTSTRAP=1   # cargo-fuzz's sanitizer flags on the stable toolchain
found=0
# One target directory for every fuzz crate: they share ztier-codec and its
# C codecs, built once with the sanitizer flags instead of once per crate.
target_dir=$(pwd)/target/fuzz
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for dir in $(find . -path ./target -prune -o -name Cargo.toml -path '*/fuzz/Cargo.toml' -print | xargs -r -n1 dirname | sort); do
  parent=$(dirname "$dir")
  for t in $(cd "$parent" && cargo fuzz list); do
    corpus=("$scratch/$(basename "$parent")-$t")
    mkdir -p "${corpus[0]}"
    seeds="$(pwd)/$dir/seeds/$t"
    if [ -d "$seeds" ]; then
      corpus+=("$seeds")
      echo "fuzz-ci: $parent $t for ${secs}s from $(find "$seeds" -type f | wc -l) seeds"
    else
      echo "fuzz-ci: $parent $t for ${secs}s (no seeds)"
    fi
    (cd "$parent" && cargo fuzz run --release --target-dir "$target_dir" "$t" "${corpus[@]}" -- -max_total_time="$secs" -rss_limit_mb=4096 2>&1 | tail -3)
    found=$((found+1))
  done
done
[ "$found" -gt 0 ] || { echo "fuzz-ci: no fuzz targets found" >&2; exit 1; }
echo "fuzz-ci: $found targets ran clean"
