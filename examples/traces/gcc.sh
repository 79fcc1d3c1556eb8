#!/usr/bin/env bash
# gcc compiling a generated C file. The gcc driver forks cc1, the
# compiler proper, so the script traces cc1 itself (one address space).
# F functions (default 5: 31 M references, ~6 min under lackey).
source "$(dirname "$0")/common.sh"
need gcc gcc
F=${F:-5}
{
    echo 'int printf(const char *, ...);'
    for i in $(seq 1 "$F"); do
        echo "static int f$i(int x) { int s = 0; for (int j = 0; j < x; j++) s += (j * $i) ^ (s >> 3); return s + $i; }"
    done
    echo 'int main(void) { long s = 0;'
    for i in $(seq 1 "$F"); do echo "  s += f$i($i);"; done
    echo '  printf("%ld\n", s); return 0; }'
} > "$work/big.c"
cc1=$(gcc -print-prog-name=cc1)
record gcc "$cc1" -quiet -O2 "$work/big.c" -o "$work/big.s"
