"""A pool of forked workers that run at the same time: each builds N
records of its own (default 200,000: about 50 MB each), walks them twice,
and reports a digest through a pipe; the parent prints the reports in
worker order (the same every run). With `kill`, worker 0 kills itself
(SIGKILL) once its records are built, holding its memory, and the parent
reports that instead. The shape of `make -j` or a `multiprocessing`
pool: under `ztier run --budget-scope tree` the workers share one budget.

usage: python3 workers.py [N] [WORKERS] [kill]
"""
import hashlib
import os
import signal
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
workers = int(sys.argv[2]) if len(sys.argv) > 2 else 3
kill = len(sys.argv) > 3 and sys.argv[3] == "kill"
pipes = []
for w in range(workers):
    r, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        recs = [{"id": i, "name": f"w{w}-{i:08d}" * 3, "tags": list(range(i % 7))} for i in range(n)]
        if kill and w == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        h = hashlib.sha256()
        for _ in range(2):
            for r_ in recs:
                h.update(r_["name"].encode())
                r_["id"] += 1
        os.write(wr, f"worker {w} {h.hexdigest()[:16]} {sum(r_['id'] for r_ in recs)}".encode())
        os._exit(0)
    os.close(wr)
    pipes.append((pid, r))
for w, (pid, r) in enumerate(pipes):
    with os.fdopen(r) as f:
        report = f.read()
    _, status = os.waitpid(pid, 0)
    print(report if status == 0 else f"worker {w} ended by signal {os.WTERMSIG(status)}")
print("done", workers)
