#!/usr/bin/env bash
# ghostscript rendering a generated PostScript document (many paths and
# text) to a bitmap. P pages (P=3: 228 M references, ~45 min under lackey).
source "$(dirname "$0")/common.sh"
need gs ghostscript
P=${P:-1}
{
    echo '%!PS'
    echo '/Helvetica findfont 10 scalefont setfont'
    for p in $(seq 1 "$P"); do
        echo "0 1 300 { dup 2 mul 20 add exch 7 mul 600 mod 50 add moveto (ztier page $p) show } for"
        echo "0 1 200 { 3 mul 50 add 50 moveto 0 500 rlineto stroke } for"
        echo 'showpage'
    done
} > "$work/doc.ps"
record ghostscript gs -q -dBATCH -dNOPAUSE -dSAFER -sDEVICE=pnggray -r100 -o "$work/out-%d.png" "$work/doc.ps"
