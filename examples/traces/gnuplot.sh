#!/usr/bin/env bash
# gnuplot plotting many points to SVG. N points (default 3000; N=20000:
# 148 M references, ~16 min under lackey on an idle machine).
source "$(dirname "$0")/common.sh"
need gnuplot gnuplot-nox
N=${N:-3000}
awk -v n="$N" 'BEGIN { for (i = 0; i < n; i++) printf "%d %f\n", i, sin(i / 100.0) * i }' > "$work/data"
record gnuplot gnuplot -e "set terminal svg size 800,600; set output '$work/out.svg'; plot '$work/data' with points, '$work/data' using 1:(\$2/2) with lines"
