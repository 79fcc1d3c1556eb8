#!/usr/bin/env bash
# ghostscript rendering a generated PostScript document (many paths and
# text) to a bitmap. P pages of T text lines and L strokes each (defaults
# P=1, T=100, L=60; P=3 T=300 L=200: 228 M references, ~45 min under
# lackey on an idle machine).
source "$(dirname "$0")/common.sh"
need gs ghostscript
P=${P:-1}
T=${T:-100}
L=${L:-60}
{
    echo '%!PS'
    echo '/Helvetica findfont 10 scalefont setfont'
    for p in $(seq 1 "$P"); do
        echo "0 1 $T { dup 2 mul 20 add exch 7 mul 600 mod 50 add moveto (ztier page $p) show } for"
        echo "0 1 $L { 3 mul 50 add 50 moveto 0 500 rlineto stroke } for"
        echo 'showpage'
    done
} > "$work/doc.ps"
record ghostscript gs -q -dBATCH -dNOPAUSE -dSAFER -sDEVICE=pnggray -r100 -o "$work/out-%d.png" "$work/doc.ps"
