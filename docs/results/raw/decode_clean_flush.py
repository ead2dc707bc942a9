# decode-clean-flush-h100-2026-11-24.txt; run from the project root with the build of decode-clean-flush-experiment.patch in build/:
#   python3 decode_clean_flush.py OUT.jsonl ROUNDS
# 4e (default, and evict_first: FA_EXP=2) and cuDNN under two L2 flushes: 'dirty' (the convention: zero a buffer of 2x L2)
# and 'clean' (the same, then read a second zeroed buffer of 2x L2, so the L2 starts with clean lines)
import json, os, subprocess, sys, statistics
sys.path.insert(0, 'docs/bench'); import sweep
exe = 'build/step4_fused_pipelined/step4_fused_pipelined'
pts = [(8, 64, 32, 2048), (8, 64, 8, 8192), (8, 64, 32, 32768), (8, 128, 32, 8192), (1, 64, 8, 2048)]
tp = sweep.load_torch(); torch = tp[0]
L2 = torch.cuda.get_device_properties(0).L2_cache_size
flush = torch.empty(2 * L2, dtype=torch.uint8, device='cuda')
other = torch.zeros(2 * L2, dtype=torch.uint8, device='cuda')
dirty = sweep.make_before(torch, flush, 500000)
def clean():
    flush.zero_(); other.sum(dtype=torch.int64)
    torch.cuda._sleep(500000)
res = {}
out = open(sys.argv[1], 'w')
for rnd in range(int(sys.argv[2])):
    for b, d, hkv, nk in pts:
        for fl, before in (('dirty', dirty), ('clean', clean)):
            s = dict(B=b, Hq=32, Hkv=hkv, Nq=1, Nk=nk, N=nk, d=d, causal=True)
            ms, err, how = sweep.time_decode_peer(tp, 'torch_sdpa_cudnn', s, 0, before)
            k = (b, d, hkv, nk, fl)
            res.setdefault(k, {}).setdefault('cudnn', []).append(ms * 1000)
            out.write(json.dumps(dict(point=[b, d, hkv, nk], flush=fl, who='cudnn', round=rnd, us=ms * 1000)) + '\n')
            for name, env in (('base', {}), ('evict', {'FA_EXP': '2'})):
                e = dict(os.environ, FA_TIMING_LEAD_CYCLES='500000', **env)
                if fl == 'clean': e['FA_EXP_CLEAN_FLUSH'] = '1'
                r = subprocess.run([exe, '--batch', str(b), '--heads', '32', '--kv-heads', str(hkv), '--seq-q', '1', '--seq-k', str(nk),
                                    '--dim', str(d), '--causal', '--bench', '--json', '/tmp/x.json'], env=e, capture_output=True, text=True)
                if r.returncode: print(r.stdout, r.stderr); continue
                us = json.loads(open('/tmp/x.json').read().splitlines()[-1])['fwd_ms'] * 1000; os.remove('/tmp/x.json')
                res[k].setdefault(name, []).append(us)
                out.write(json.dumps(dict(point=[b, d, hkv, nk], flush=fl, who=name, round=rnd, us=us)) + '\n'); out.flush()
print('B d Hkv Nk flush     cudnn      base     evict')
for k, v in res.items():
    print(*k, ' '.join(f'{statistics.median(v[n]):9.1f}' if n in v else '        -' for n in ('cudnn', 'base', 'evict')))
