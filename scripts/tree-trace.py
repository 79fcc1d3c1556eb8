#!/usr/bin/env python3
"""Samples the shared budget segment of a running `ztier run` (the tree
scope, `crates/ztier-uffd/src/tree.rs`) from outside, and shows what
each process held, stored and took in tables at the peak of the total.

    python3 scripts/tree-trace.py sample PID OUT   # `ztier run`'s PID (or a parent's)
    python3 scripts/tree-trace.py peak OUT...

`sample` maps the segment read-only through `/proc/PID/fd/N` (the memfd
named `ztier-tree`) and writes a row to OUT each time the counters move
(polled every 0.2 ms; it ends when the last member leaves), so it takes
no slot and none of the budget. A peak shorter than the poll can be
missed: the run's own `tree_peak_total_bytes` is exact.

`peak` prints, for each file, the row with the largest total, from the
row before the pool went overdrawn (held pages past the budget less the
stores and tables) to it: each process's held pages and stored bytes
then and at the peak.
"""
import ast
import mmap
import os
import re
import struct
import sys
import time

MAGIC = b"ZTTREE05"
SLOT = 40
HEADER = 120


def find_segment(pid):
    """The segment's path in `/proc`: held by `pid` or a process under it."""
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            for fd in os.listdir(f"/proc/{p}/fd"):
                if "ztier-tree" in os.readlink(f"/proc/{p}/fd/{fd}"):
                    return f"/proc/{p}/fd/{fd}"
            for t in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in open(f"/proc/{p}/task/{t}/children").read().split()]
        except OSError:
            pass
    return None


def sample(pid, out_path, slots=64):
    path = None
    for _ in range(2000):
        path = find_segment(pid)
        if path:
            break
        time.sleep(0.001)
    if path is None:
        sys.exit(f"no ztier-tree segment in /proc/{pid}/fd")
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), HEADER + SLOT * slots, prot=mmap.PROT_READ)
    if m[:8] != MAGIC:
        sys.exit(f"{path} is not a budget segment of this layout")
    t0, last = time.monotonic(), None
    with open(out_path, "w") as out:
        while True:
            (budget, reserved, _peak, over, _recl, joined, adopted, _slim, stored, _speak, members, _cov, tables,
             tpeak) = struct.unpack_from("<14Q", m, 8)
            taken = []
            for k in range(slots):
                pid_, _wake, held, st, _start, _life, tk = struct.unpack_from("<iIQQQII", m, HEADER + SLOT * k)
                if pid_ > 0 or held or st:
                    taken.append((pid_, held, st, tk))
            row = (reserved, stored, tables, adopted, over, tuple(taken))
            if row != last:
                pool = budget - (stored + tables + 4095) // 4096
                total = reserved * 4096 + stored + tables
                out.write(
                    f"{time.monotonic() - t0:.4f} total={total} over_budget={total - budget * 4096} "
                    f"reserved={reserved} pool={pool} overdrawn={max(0, reserved - pool)} stored={stored} "
                    f"tables={tables} peak={tpeak} adopted={adopted} forced={over} slots={taken}\n"
                )
                last = row
            if members == 0 and joined > 0:
                return
            time.sleep(0.0002)


def parse(line):
    head, slots = line.split(" slots=")
    d = {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", head)}
    d["t"] = float(head.split()[0])
    d["slots"] = ast.literal_eval(slots)
    return d


def peak(paths):
    for p in paths:
        rows = [parse(line) for line in open(p) if " slots=" in line]
        i = max(range(len(rows)), key=lambda k: rows[k]["total"])
        j = i
        while j > 0 and rows[j - 1]["overdrawn"] > 0:
            j -= 1
        a, b = rows[max(0, j - 1)], rows[i]
        print(
            f"{p}: peak {b['total'] / 1e6:.2f} MB at {b['t']:.3f} s, {b['overdrawn']} pages overdrawn, "
            f"{(b['t'] - a['t']) * 1e3:.1f} ms after the pool was last not"
        )
        print(
            f"  held {a['reserved']} -> {b['reserved']} pages, stored {a['stored'] / 1e6:.2f} -> "
            f"{b['stored'] / 1e6:.2f} MB, tables {a['tables'] / 1e3:.0f} -> {b['tables'] / 1e3:.0f} KB, "
            f"adopted {a['adopted']} -> {b['adopted']} pages"
        )
        before = {s[0]: s for s in a["slots"]}
        for s in b["slots"]:
            o = before.get(s[0], (s[0], 0, 0, 0))
            print(
                f"  pid {s[0]}: held {o[1]} -> {s[1]} ({(s[1] - o[1]) * 4096 / 1e3:+.0f} KB), "
                f"stored {o[2] / 1e3:.0f} -> {s[2] / 1e3:.0f} KB ({(s[2] - o[2]) / 1e3:+.0f} KB)"
            )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "sample":
        sample(int(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) >= 3 and sys.argv[1] == "peak":
        peak(sys.argv[2:])
    else:
        sys.exit(__doc__)
