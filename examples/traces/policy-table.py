#!/usr/bin/env python3
"""Markdown tables of the shipped policy against the seeds' policies:
for each trace and disk cost, the normalised paging time (x `none`, LRU
with no compression, at the same memory) per memory size of the best
static size, `kaplan`, `castro` and `pressure` (over LRU, which sees every
reference: the 1999 model) next to the fault-driven policies replayed
through the model of `ztier run`'s pager: `shipped` (segmented+walk,
its store beside the memory, as `ztier run` runs by default), `fifo+walk`
and `shipped+kaplan` (the memory split between resident pages and the
store by kaplan, with `ztier run`'s floors).

usage: policy-table.py DIR NAME...

Reads DIR/NAME.json (a sweep with none, static:F..., kaplan, castro,
pressure) and DIR/NAME.shipped.json (a sweep with the fault-driven
policies); a policy missing from a sweep is shown as `–`."""
import json
import sys

LRU = ['kaplan', 'castro', 'pressure']
PAGER = ['shipped', 'fifo+walk', 'shipped+kaplan']


def is_static(policy):
    return policy == 'none' or policy.startswith('static:')


def table(folder, name, out, wins, ran):
    seeds = json.load(open(f'{folder}/{name}.json'))
    ours = json.load(open(f'{folder}/{name}.shipped.json'))
    rows = seeds['results'] + [r for r in ours['results'] if r['policy'] in PAGER]
    out.append(f"### {name} ({seeds['references'] / 1e6:.1f} M references, "
               f"{seeds['distinct_pages']} distinct pages)\n")
    for disk in sorted({r['disk_ms'] for r in rows}, reverse=True):
        out.append(f'disk {disk:g} ms: paging time x `none`\n')
        out.append('| memory (pages) | best static (LRU) | ' + ' | '.join(LRU) + ' | '
                   + ' | '.join(PAGER) + ' |')
        out.append('|---|---|' + '---|' * (len(LRU) + len(PAGER)))
        for m in sorted({r['memory_pages'] for r in rows}):
            here = {r['policy']: r for r in rows if r['memory_pages'] == m and r['disk_ms'] == disk}
            # Disk-independent rows (fault-driven policies without sizing) are listed once.
            for r in rows:
                if r['memory_pages'] == m and r['policy'] not in here:
                    here.setdefault(r['policy'], r)
            static = [r for p, r in here.items() if is_static(p)]
            best = min(static, key=lambda r: r['normalized'])
            cells = [f"{best['normalized']:.3f} ({best['policy']})"]
            for p in LRU + PAGER:
                r = here.get(p)
                cells.append('–' if r is None else f"{r['normalized']:.3f}")
            out.append(f'| {m} | ' + ' | '.join(cells) + ' |')
            for p in LRU + PAGER:
                r = here.get(p)
                if r is not None:
                    ran.add((name, p))
                if r is not None and r['normalized'] <= best['normalized'] * 1.1:
                    wins[(name, disk, p)] = wins.get((name, disk, p), 0) + 1
            wins[(name, disk, 'sizes')] = wins.get((name, disk, 'sizes'), 0) + 1
        out.append('')


def main():
    folder, names = sys.argv[1], sys.argv[2:]
    out, wins, ran = [], {}, set()
    for n in names:
        table(folder, n, out, wins, ran)
    print('Sizes at which each policy is within 10% of the best static size (of the sizes swept):\n')
    print('| trace, disk | ' + ' | '.join(LRU + PAGER) + ' |')
    print('|---|' + '---|' * len(LRU + PAGER))
    for n in names:
        for disk in (5.0, 0.1):
            k = wins.get((n, disk, 'sizes'), 0)
            print(f'| {n}, {disk:g} ms | ' + ' | '.join(f"{wins.get((n, disk, p), 0)}/{k}" if (n, p) in ran else '–' for p in LRU + PAGER) + ' |')
    print()
    print('\n'.join(out))


if __name__ == '__main__':
    main()
