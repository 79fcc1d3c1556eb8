#!/usr/bin/env bash
# Prints the compiler arguments a C script in scripts/ needs for liblz4:
# nothing if it does not include "lz4.h", else the include path and the
# sources of the liblz4 that the lz4-sys crate brought into cargo's
# registry (the same C library ztier links). Fails if a script needs it
# and no build has fetched lz4-sys yet.
#
#   usage: scripts/lz4-src.sh scripts/lz4hc-decode.c
set -euo pipefail
grep -q '#include "lz4.h"' "$1" || exit 0
lib=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -type d -path '*lz4-sys*liblz4/lib' 2>/dev/null | sort | tail -1 || true)
if [ -z "$lib" ]; then
  echo "lz4-src: no lz4-sys sources in cargo's registry (run cargo build first)" >&2
  exit 1
fi
echo "-I$lib $lib/lz4.c $lib/lz4hc.c"
