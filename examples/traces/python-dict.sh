#!/usr/bin/env bash
# python3 building and walking a dict and a list (the 1999 suite's
# interpreter-style workload). Size with N (default 20000; ~3 min under lackey).
source "$(dirname "$0")/common.sh"
need python3 python3
N=${N:-20000}
# The interpreter itself, not a wrapper script (e.g. pyenv's shim runs bash
# and pyenv before it execs python: dozens of processes in the trace).
py=$(python3 -c 'import sys; print(sys.executable)')
record python-dict "$py" -c "
d = {i: str(i) * 3 for i in range($N)}
l = sorted(d.values(), key=len)
print(sum(len(v) for v in l), len(d))"
