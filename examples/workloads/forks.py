"""A server that forks a worker per request: builds N records (default
1,500,000: about 160 MB), then forks F children (default 40), each of
which looks through its own slice of the records and reports a digest
of it through a pipe; prints the parent's digest of the reports (the
same every run). Each fork copies the page tables of the whole heap;
under a budget, a compressed cache that must bring its stored pages back
for a fork pays for the whole heap at every fork.

usage: python3 forks.py [N] [F]
"""
import hashlib
import os
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_500_000
forks = int(sys.argv[2]) if len(sys.argv) > 2 else 40
records = [("record-%d" % i) * 3 for i in range(n)]
step = n // forks
total = hashlib.sha256()
for k in range(forks):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        h = hashlib.sha256()
        for rec in records[k * step:(k + 1) * step]:
            h.update(rec.encode())
        os.write(w, h.hexdigest().encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        total.update(f.read().encode())
    _, status = os.waitpid(pid, 0)
    assert status == 0, status
print(n, forks, total.hexdigest())
