"""The record builder of ../shared/corpus/pyapp.py (names drawn letter by
letter, so more CPU per byte than pyapp.py), scaled by N and without the
corpus script's closing sleep; prints a deterministic summary. Peak memory
about 660 MB at N = 1,300,000 on CPython 3.11 (10 s natively here), and
717 MB (700,024 KiB) at N = 1,380,000, the size of the flagship issue's
"similar 719 MB python workload" (14-21 s natively on a slower day).

usage: python3 pyapp-corpus.py [N]
"""
import random
import string
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 400_000
random.seed(7)
recs = {}
for i in range(n):
    name = "".join(random.choice(string.ascii_lowercase) for _ in range(random.randint(5, 14)))
    recs[f"user:{i}"] = {
        "id": i,
        "name": name,
        "score": random.random() * 100,
        "tags": [random.randint(0, 50) for _ in range(random.randint(0, 6))],
        "active": i % 3 == 0,
    }
print("ready", len(recs), round(sum(r["score"] for r in recs.values()), 3), flush=True)
