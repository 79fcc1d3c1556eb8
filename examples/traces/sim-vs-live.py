#!/usr/bin/env python3
"""`ztier sim` (shipped policy) against `ztier run` on one program: a
Markdown row per budget with the simulator's store faults and
`taken_back` next to the run's (medians of RUNS runs, each managed from
the first byte: ZTIER_START_AFTER=0, with their ranges), and their sums;
each simulated count's offset from the run's median. See docs/policy.md,
"Does the simulator predict `ztier run`?".

usage: sim-vs-live.py NAME TRACE BUDGETS RUNS -- CMD...
  e.g. sim-vs-live.py sort sort.trace 1M,2M,3M 5 -- sort --parallel=1 sort50k.in -o /dev/null

Runs in the current folder (the command's files are found there) and
leaves NAME-sim.json and NAME-live-BUDGET.json there; ZTIER names the
binary (default: ztier on PATH); SIM_ARGS adds arguments to `ztier sim`
(e.g. --no-pipeline)."""
import json
import os
import statistics
import subprocess
import sys


def main():
    if '--' not in sys.argv or len(sys.argv) < 7:
        sys.exit(__doc__)
    z = os.environ.get('ZTIER', 'ztier')
    name, trace, budgets, runs = sys.argv[1], sys.argv[2], sys.argv[3].split(','), int(sys.argv[4])
    cmd = sys.argv[sys.argv.index('--') + 1:]
    sim = json.loads(subprocess.run(
        [z, 'sim', '--trace', trace, '--memory', ','.join(budgets), '--policy', 'shipped', '--disk-ms', '5',
         '--json', '--threads', '2'] + os.environ.get('SIM_ARGS', '').split(), capture_output=True,
        check=True).stdout)
    json.dump(sim, open(f'{name}-sim.json', 'w'))
    env = dict(os.environ, ZTIER_START_AFTER='0')
    for b, m in zip(budgets, sorted({r['memory_pages'] for r in sim['results']})):
        row = next(r for r in sim['results'] if r['memory_pages'] == m and r['policy'] == 'shipped')
        p, q = row['store_faults'], row['taken_back']
        live = []
        for _ in range(runs):
            f = f'{name}-stats.json'
            subprocess.run([z, 'run', '--budget', b, '--stats', f, '--'] + cmd, env=env,
                           stdout=subprocess.DEVNULL, check=True)
            s = json.load(open(f))
            live.append(tuple(sum(x[k] for x in s['per_process']) for k in ('store_faults', 'taken_back')))
        json.dump(live, open(f'{name}-live-{b}.json', 'w'))

        def cell(sim, xs):
            m = statistics.median(xs)
            off = f'{(sim / m - 1) * 100:+.0f}%' if m else '–'
            return f'{sim} | {int(m)} ({min(xs)}–{max(xs)}) | {off}'
        print(f'| {name} | {b} | {cell(p, [x[0] for x in live])} | {cell(q, [x[1] for x in live])} '
              f'| {cell(p + q, [x[0] + x[1] for x in live])} |', flush=True)


if __name__ == '__main__':
    main()
