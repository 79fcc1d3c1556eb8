#!/usr/bin/env python3
"""Markdown tables of `ztier sim --json` sweeps: for each trace and disk
cost, the normalised paging time (x `none`) per memory size of the
adaptive policies next to the best static size (of all those given, and
of those at most 0.5, the adaptive policies' largest size); then, per
trace and disk cost, at how many sizes each policy is within 10% of it.

usage: sim-table.py DIR NAME...

Reads DIR/NAME.json and, if present, DIR/NAME.old.json: a sweep of an
older build's `castro`, shown as "castro (old)"."""
import json
import sys

POLICIES = ['castro', 'castro-aggressive', 'castro-sluggish', 'castro (old)', 'kaplan', 'pressure']


def load(folder, name):
    new = json.load(open(f'{folder}/{name}.json'))
    rows = list(new['results'])
    try:
        old = json.load(open(f'{folder}/{name}.old.json'))
    except FileNotFoundError:
        old = {'results': []}
    rows += [dict(r, policy='castro (old)') for r in old['results'] if r['policy'] == 'castro']
    return new, rows


def is_static(policy):
    return policy == 'none' or policy.startswith('static:')


def fraction(policy):
    return 0.0 if policy == 'none' else float(policy.split(':')[1])


def table(folder, name, out):
    """Appends the trace's tables to `out`; returns {(policy, disk): [sizes, within 10% of
    the best static, within 10% of the best static <= 0.5]}."""
    head, rows = load(folder, name)
    footprint = head['distinct_pages']
    out.append(f"### {name} ({head['references'] / 1e6:.1f} M references, {footprint} distinct pages, "
               f"lz4 mean {head['mean_compressed_size']} B)\n")
    counts = {}
    for disk in sorted({r['disk_ms'] for r in rows}, reverse=True):
        out.append(f'disk {disk:g} ms: paging time x `none`; * = the best adaptive policy of the row; '
                   'sizes outside the interesting range in parentheses\n')
        out.append('| memory (pages, % of footprint) | best static | best static ≤ 0.5 | ' + ' | '.join(POLICIES) + ' |')
        out.append('|---|---|---|' + '---|' * len(POLICIES))
        for m in sorted({r['memory_pages'] for r in rows}):
            here = [r for r in rows if r['memory_pages'] == m and r['disk_ms'] == disk]
            static = [r for r in here if is_static(r['policy'])]
            best = min(static, key=lambda r: r['normalized'])
            best_half = min((r for r in static if fraction(r['policy']) <= 0.5), key=lambda r: r['normalized'])
            value = {p: next((r['normalized'] for r in here if r['policy'] == p), None) for p in POLICIES}
            top = min(v for v in value.values() if v is not None)
            cells = []
            for p in POLICIES:
                v = value[p]
                if v is None:
                    cells.append('–')
                    continue
                cells.append(f'{v:.3f}' + ('*' if v == top else ''))
                c = counts.setdefault((p, disk), [0, 0, 0])
                c[0] += 1
                c[1] += v <= best['normalized'] * 1.1
                c[2] += v <= best_half['normalized'] * 1.1
            label = f'{m} ({100 * m / footprint:.0f}%)'
            if not any(r['interesting'] for r in here):
                label = f'({label})'
            half = '″' if best_half is best else f"{best_half['normalized']:.3f} ({best_half['policy']})"
            out.append(f"| {label} | {best['normalized']:.3f} ({best['policy']}) | {half} | " + ' | '.join(cells) + ' |')
        out.append('')
    return counts


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    folder, names = sys.argv[1], sys.argv[2:]
    out, counts = [], {}
    for name in names:
        counts[name] = table(folder, name, out)
    out.append('### Sizes where each policy is within 10% of the best static size ≤ 0.5 '
               '(in parentheses: of the best static size of all)\n')
    out.append('| trace, disk | ' + ' | '.join(POLICIES) + ' |')
    out.append('|---|' + '---|' * len(POLICIES))
    for name in names:
        for disk in sorted({d for (_, d) in counts[name]}, reverse=True):
            cells = []
            for p in POLICIES:
                c = counts[name].get((p, disk))
                cells.append(f'{c[2]}/{c[0]} ({c[1]})' if c else '–')
            out.append(f'| {name}, {disk:g} ms | ' + ' | '.join(cells) + ' |')
    print('\n'.join(out))


if __name__ == '__main__':
    main()
