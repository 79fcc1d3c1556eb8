"""A memory-hungry Python job for `ztier run` and `ztier bench pressure`:
builds N user records (dicts with strings, floats and lists), then makes
three passes over all of them (aggregate, group, top-k) and prints a
deterministic summary. Peak memory grows with N: about 700 MB of peak
RSS (690,000 KiB) at the default N = 1,350,000 on CPython 3.11.7, the
scale at which ztier's flagship target is set; 587 MB at N = 1,100,000.

usage: python3 pyapp.py [N]
"""
import heapq
import random
import string
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_350_000
rnd = random.Random(7)
pool = "".join(rnd.choices(string.ascii_lowercase, k=1 << 20))
tag_pool = [rnd.randint(0, 50) for _ in range(1 << 16)]
recs = {}
for i in range(n):
    o = rnd.randrange(len(pool) - 16)
    t = rnd.randrange(len(tag_pool) - 8)
    recs[f"user:{i}"] = {
        "id": i,
        "name": pool[o : o + 5 + i % 10],
        "score": rnd.random() * 100,
        "tags": tag_pool[t : t + i % 7],
        "active": i % 3 == 0,
    }
total = sum(r["score"] for r in recs.values())
by_tag = {}
for r in recs.values():
    for t in r["tags"]:
        by_tag[t] = by_tag.get(t, 0) + 1
top = heapq.nsmallest(5, recs.values(), key=lambda r: (-r["score"], r["id"]))
active = sum(1 for r in recs.values() if r["active"] and r["name"] < "m")
print(len(recs), round(total, 3), active)
print(sorted(by_tag.items())[:5])
print([(r["id"], r["name"], round(r["score"], 4)) for r in top])
