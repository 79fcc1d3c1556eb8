#!/usr/bin/env bash
# Records every example trace into $OUT (default: the current folder), then
# simulates each one. Expect minutes per program: valgrind lackey slows
# programs ~100× and prints a line per memory access.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for s in python-dict sqlite3 gcc ghostscript gnuplot; do
    "$here/$s.sh" || echo "skipped $s (see the message above)" >&2
done
