# Driver of decode-cp-async-prologue-h100-2026-11-24.txt and decode-refill-order-h100-2026-11-24.txt (run 3's form; the earlier runs had Nq = 1 points
# given as (B, d, Hkv, Nk) and the variants named in each file's header). Run from the project root on the GPU machine after building the experiment patch:
#   python3 docs/results/raw/decode_prologue_refill.py OUT.jsonl ROUNDS
# 4e's prologue by cp.async (FA_EXP bits: 1 Q, 2 the first K/V stages) against TMA, and cuDNN, interleaved rounds
import json, os, subprocess, sys, statistics
sys.path.insert(0, "docs/bench"); import sweep
exe = 'build/step4_fused_pipelined/step4_fused_pipelined'
pts = [(8, 64, 32, 1, 2048), (8, 64, 32, 1, 8192), (8, 64, 32, 1, 32768), (8, 64, 8, 1, 2048), (8, 64, 8, 1, 8192), (8, 64, 8, 1, 32768), (8, 128, 32, 1, 2048), (8, 128, 32, 1, 8192), (8, 128, 32, 1, 32768), (8, 128, 8, 1, 2048), (8, 128, 8, 1, 8192), (8, 128, 8, 1, 32768), (8, 64, 32, 16, 8192), (8, 64, 8, 16, 8192), (8, 128, 32, 16, 8192), (8, 128, 8, 16, 8192)]
vars_ = {'base': {}, 'v-late': {'FA_EXP': '8'}, 'ktop-vlate': {'FA_EXP': '32'}}
tp = sweep.load_torch(); torch = tp[0]
flush = torch.empty(int(2 * torch.cuda.get_device_properties(0).L2_cache_size), dtype=torch.uint8, device='cuda')
before = sweep.make_before(torch, flush, 500000)
res = {}
out = open(sys.argv[1], 'w')
for rnd in range(int(sys.argv[2])):
    for b, d, hkv, nq, nk in pts:
        s = dict(B=b, Hq=32, Hkv=hkv, Nq=nq, Nk=nk, N=nk, d=d, causal=True)
        ms, err, how = sweep.time_decode_peer(tp, 'torch_sdpa_cudnn', s, 0, before)
        res.setdefault((b, d, hkv, nq, nk), {}).setdefault('cudnn', []).append(ms * 1000)
        out.write(json.dumps(dict(point=[b, d, hkv, nq, nk], who='cudnn', round=rnd, us=ms * 1000)) + '\n')
        for name, env in (list(vars_.items()) if rnd % 2 == 0 else list(reversed(list(vars_.items())))):
            e = dict(os.environ, FA_TIMING_LEAD_CYCLES='500000', **env)
            r = subprocess.run([exe, '--batch', str(b), '--heads', '32', '--kv-heads', str(hkv), '--seq-q', str(nq), '--seq-k', str(nk),
                                '--dim', str(d), '--causal', '--bench', '--json', '/tmp/x.json'], env=e, capture_output=True, text=True)
            if r.returncode: print(r.stdout, r.stderr); continue
            us = json.loads(open('/tmp/x.json').read().splitlines()[-1])['fwd_ms'] * 1000; os.remove('/tmp/x.json')
            res[(b, d, hkv, nq, nk)].setdefault(name, []).append(us)
            out.write(json.dumps(dict(point=[b, d, hkv, nq, nk], who=name, round=rnd, us=us)) + '\n'); out.flush()
names = ['cudnn'] + list(vars_)
print('B d Hkv Nq Nk ' + ' '.join(f'{n:>9}' for n in names))
for k, v in res.items():
    print(*k, ' '.join(f'{statistics.median(v[n]):9.1f}' if n in v else '        -' for n in names))
