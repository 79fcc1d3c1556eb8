"""Python: a garbage-collected build-then-scan heap. Builds N lists of
1,000 ints each (default 18,000: about 740 MB peak on CPython 3.11),
then makes three strided passes over them (every 7th list, then every
5th, then every 3rd, each pass from another start), summing; prints the
sums (the same every run). The passes touch the whole heap in an order
no prefetch by address follows.

usage: python3 strided.py [N]
"""
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 18_000
lists = [list(range(i, i + 1000)) for i in range(n)]
for stride, start in ((7, 3), (5, 1), (3, 2)):
    total = 0
    for k in range(n):
        total += sum(lists[(start + k * stride) % n])
    print(stride, total)
