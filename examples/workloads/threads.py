"""Many threads taking turns on their own data: N threads (default 400)
each build 300 byte strings of about 2 KB (about 240 MB in all), meet at
a barrier, then hash their strings; prints one deterministic digest.
Under a tight budget the faults come from every thread, on every CPU,
not from the main thread alone (0.6 s natively here).

usage: python3 threads.py [N]
"""
import hashlib
import sys
import threading

n = int(sys.argv[1]) if len(sys.argv) > 1 else 400
res = [None] * n
bar = threading.Barrier(n)


def work(i):
    data = [bytes([i % 251]) * 2000 + str(j).encode() for j in range(300)]
    bar.wait()
    h = hashlib.sha256()
    for d in data:
        h.update(d)
    res[i] = h.hexdigest()[:8]


ts = [threading.Thread(target=work, args=(i,)) for i in range(n)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(hashlib.sha256("".join(res).encode()).hexdigest())
