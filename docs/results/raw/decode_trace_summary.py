#!/usr/bin/env python3
# Summary of a 4e decode timeline (decode-trace-*-h100-2026-11-24.txt): the kernel built with
# -DFA_DECODE_TRACE (decode-trace-experiment.patch) prints, for launches 7 and 8 of a --bench run, one line per
# block: launch, blockIdx.x, blockIdx.y, SM, last (1: the block that merged), then %globaltimer stamps (ns).
# Per run and launch it prints min/median/max over blocks of each stamp, in us from the launch's first entry,
# and the stamps of two merging blocks.
#   decode_trace_summary.py decode-trace-after-h100-2026-11-24.txt
#   decode_trace_summary.py --before decode-trace-before-h100-2026-11-24.txt   (the kernel of 526c816)
#   decode_trace_summary.py --ends decode-trace-b8-h100-2026-11-24.txt   (also: when the blocks' loops end, in 2 us
#     bins, by how many blocks shared their SM, and each block's time per K/V tile after its first)
import collections, sys
before = '--before' in sys.argv
path = [a for a in sys.argv[1:] if not a.startswith('--')][0]
tail = ['fenced', 'end'] if before else ['barrier', 'merge_start', 'end']
names = ['entry', 'init+issue' if not before else 'init', 'Q', 'K0', 'V0', 'K1', 'V1', 'K2', 'V2', 'K3', 'V3',
         'loop_end', 'written'] + tail
runs, cur = [], None
for line in open(path):
    if line.startswith('== '):
        cur = (line.strip(), []); runs.append(cur)
    elif line.startswith('TR ') and cur:
        cur[1].append(list(map(int, line.split()[1:])))
for title, rows in runs:
    by = collections.defaultdict(list)
    for r in rows: by[r[0]].append(r)
    print(title)
    for ln in sorted(by):
        rs = by[ln]; t0 = min(r[5] for r in rs); out = []
        for i, c in enumerate(zip(*[r[5:] for r in rs])):
            v = sorted(x - t0 for x in c if x > 0)
            if v: out.append(f"{names[i]} {v[0]/1000:.2f}/{v[len(v)//2]/1000:.2f}/{v[-1]/1000:.2f}")
        print(f"  launch {ln}, {len(rs)} blocks:", ', '.join(out))
        if '--ends' in sys.argv:  # runs of one split, 128-key tiles (d = 64), their Nk in the title's --seq-k
            SM, K0, LOOP_END = 3, 5 + names.index('K0'), 5 + names.index('loop_end')  # columns of a TR line
            on_sm = collections.Counter(r[SM] for r in rs)
            end = {id(r): (r[LOOP_END] - t0) / 1000 for r in rs}
            print('    loop end, blocks per 2 us bin:', sorted(collections.Counter(int(e // 2) * 2 for e in end.values()).items()))
            for k in sorted(set(on_sm.values())):
                e = sorted(end[id(r)] for r in rs if on_sm[r[SM]] == k)
                print(f'    blocks on an SM with {k}: {len(e)}, loop end {e[0]:.1f}/{e[len(e)//2]:.1f}/{e[-1]:.1f}')
            after_k0 = max(1, (int(title.split('--seq-k ')[1].split()[0]) + 127) // 128 - 1)  # tiles after the first
            per = sorted((r[LOOP_END] - r[K0]) / 1000 / after_k0 for r in rs)
            print(f'    us per tile after K0 (min/median/max): {per[0]:.2f}/{per[len(per)//2]:.2f}/{per[-1]:.2f}')
        for r in [r for r in rs if r[4] == 1][:2]:
            print(f"    merging block ({r[1]}, {r[2]}):", ', '.join(f"{names[i]} {(x - t0)/1000:.2f}" for i, x in enumerate(r[5:]) if x > 0))
