#!/bin/sh
# gcc under make -j2: generates F C files (default 6) of one large
# function each (S statements, default 4000), a Makefile, and builds the
# objects with `make -j2` at -O2; prints the objects' SHA-256 sums (the
# same every run: no debug information, relative paths). Each cc1 takes
# a few hundred MB at -O2 on such a function.
#
# usage: sh cc-build.sh [F] [S]
set -e
files=${1:-6}
stmts=${2:-4000}
dir=$(mktemp -d "${TMPDIR:-/tmp}/cc-build.XXXXXX")
trap 'rm -rf "$dir"' EXIT
cd "$dir"
i=0
objs=
while [ $i -lt "$files" ]; do
    awk -v n="$stmts" -v f="$i" 'BEGIN {
        printf "int f%d(int *a, int x) {\n int s = x;\n", f
        for (k = 0; k < n; k++)
            printf " if (a[%d] > s) s += a[%d] * %d; else s ^= a[%d] + %d;\n", k % 97, (k * 7) % 97, k % 13 + 1, (k * 3) % 97, k
        printf " return s;\n}\n"
    }' > "f$i.c"
    objs="$objs f$i.o"
    i=$((i + 1))
done
printf 'all:%s\n%%.o: %%.c\n\tgcc -O2 -c $< -o $@\n' "$objs" > Makefile
make -s -j2
sha256sum f*.o
