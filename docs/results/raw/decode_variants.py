#!/usr/bin/env python3
# FlashAttention, step by step — docs/results/raw/decode_variants.py: variants of one step 4 build, told apart by
# environment switches (an experiment patch's FA_EXP...), and PyTorch SDPA's cuDNN backend, at decode points, in
# interleaved rounds (the variants' order reversed every other round), all behind sweep.py's flush and lead.
# Run from the project root, the patched build in build/:
#   python3 docs/results/raw/decode_variants.py OUT.jsonl ROUNDS --point B,d,Hkv,Nq,Nk ... --var NAME[:K=V,...] ...
# One JSON line per timed call (point [B, d, Hkv, Nq, Nk], who, round, us); the table at the end has each median, µs.
# The runs it made, with their arguments, are named in the headers of the .txt files that cite it.
import argparse, json, os, statistics, subprocess, sys, tempfile
sys.path.insert(0, 'docs/bench'); import sweep  # sweep.py's peer timing, flush and lead

ap = argparse.ArgumentParser()
ap.add_argument('out'); ap.add_argument('rounds', type=int)
ap.add_argument('--point', action='append', required=True, help='B,d,Hkv,Nq,Nk (Hq = 32, causal, bf16)')
ap.add_argument('--var', action='append', required=True, help='NAME or NAME:K=V,K=V (environment of the stage)')
a = ap.parse_args()
pts = [tuple(int(x) for x in p.split(',')) for p in a.point]
vars_ = {}
for v in a.var:
    name, _, env = v.partition(':')
    vars_[name] = dict(kv.split('=', 1) for kv in env.split(',') if kv)
exe = 'build/step4_fused_pipelined/step4_fused_pipelined'
tp = sweep.load_torch(); torch = tp[0]
flush = torch.empty(int(2 * torch.cuda.get_device_properties(0).L2_cache_size), dtype=torch.uint8, device='cuda')
before = sweep.make_before(torch, flush, 500000)
res = {}
tmp = os.path.join(tempfile.mkdtemp(), 'x.json')
with open(a.out, 'w') as out:
    for rnd in range(a.rounds):
        for b, d, hkv, nq, nk in pts:
            k = (b, d, hkv, nq, nk)
            s = dict(B=b, Hq=32, Hkv=hkv, Nq=nq, Nk=nk, N=nk, d=d, causal=True)
            ms, err, how = sweep.time_decode_peer(tp, 'torch_sdpa_cudnn', s, 0, before)
            res.setdefault(k, {}).setdefault('cudnn', []).append(ms * 1000)
            out.write(json.dumps(dict(point=list(k), who='cudnn', round=rnd, us=ms * 1000)) + '\n')
            order = list(vars_.items()) if rnd % 2 == 0 else list(reversed(list(vars_.items())))
            for name, env in order:
                e = dict(os.environ, FA_TIMING_LEAD_CYCLES='500000', **env)
                r = subprocess.run([exe, '--batch', str(b), '--heads', '32', '--kv-heads', str(hkv), '--seq-q', str(nq),
                                    '--seq-k', str(nk), '--dim', str(d), '--causal', '--bench', '--json', tmp],
                                   env=e, capture_output=True, text=True)
                if r.returncode:
                    print(r.stdout, r.stderr, file=sys.stderr)
                    continue
                with open(tmp) as f:
                    us = json.loads(f.read().splitlines()[-1])['fwd_ms'] * 1000
                os.remove(tmp)
                res[k].setdefault(name, []).append(us)
                out.write(json.dumps(dict(point=list(k), who=name, round=rnd, us=us)) + '\n')
                out.flush()
names = ['cudnn'] + list(vars_)
print('B d Hkv Nq Nk ' + ' '.join(f'{n:>9}' for n in names))
for k, v in res.items():
    print(*k, ' '.join(f'{statistics.median(v[n]):9.1f}' if n in v else '        -' for n in names))
