# decode-l2-hints-h100-2026-11-24.txt: 4e variants (env switches of decode-l2-hints-experiment.patch) and cuDNN, interleaved rounds.
# Run from the project root with the patched build in build/: python3 decode_l2_hints.py OUT.jsonl ROUNDS
import json, os, subprocess, sys, statistics
sys.path.insert(0, 'docs/bench'); import sweep  # sweep.py's peer timing, flush and lead
exe = 'build/step4_fused_pipelined/step4_fused_pipelined'
pts = [(8, 64, 32, 2048), (8, 64, 32, 32768), (8, 64, 8, 8192), (8, 128, 32, 8192), (1, 64, 8, 2048), (64, 64, 32, 2048)]
vars_ = {'base': {}, 'ev': {'FA_EXP': '2'}, 'ev-p0': {'FA_EXP': '2', 'FA_EXP_PROMO': '0'}, 'ev-p128': {'FA_EXP': '2', 'FA_EXP_PROMO': '2'}, 'ev.5': {'FA_EXP': '6'}, 'ev.25': {'FA_EXP': '10'}}
tp = sweep.load_torch(); torch = tp[0]
flush = torch.empty(int(2 * torch.cuda.get_device_properties(0).L2_cache_size), dtype=torch.uint8, device='cuda')
before = sweep.make_before(torch, flush, 500000)
res = {}
out = open(sys.argv[1], 'w')
for rnd in range(int(sys.argv[2])):
    for b, d, hkv, nk in pts:
        s = dict(B=b, Hq=32, Hkv=hkv, Nq=1, Nk=nk, N=nk, d=d, causal=True)
        ms, err, how = sweep.time_decode_peer(tp, 'torch_sdpa_cudnn', s, 0, before)
        res.setdefault((b, d, hkv, nk), {}).setdefault('cudnn', []).append(ms * 1000)
        out.write(json.dumps(dict(point=[b, d, hkv, nk], who='cudnn', round=rnd, us=ms * 1000)) + '\n')
        for name, env in (list(vars_.items()) if rnd % 2 == 0 else list(reversed(list(vars_.items())))):
            e = dict(os.environ, FA_TIMING_LEAD_CYCLES='500000', **env)
            r = subprocess.run([exe, '--batch', str(b), '--heads', '32', '--kv-heads', str(hkv), '--seq-q', '1', '--seq-k', str(nk),
                                '--dim', str(d), '--causal', '--bench', '--json', '/tmp/x.json'], env=e, capture_output=True, text=True)
            if r.returncode: print(r.stdout, r.stderr); continue
            us = json.loads(open('/tmp/x.json').read().splitlines()[-1])['fwd_ms'] * 1000; os.remove('/tmp/x.json')
            res[(b, d, hkv, nk)].setdefault(name, []).append(us)
            out.write(json.dumps(dict(point=[b, d, hkv, nk], who=name, round=rnd, us=us)) + '\n'); out.flush()
names = ['cudnn'] + list(vars_)
print('B d Hkv Nk ' + ' '.join(f'{n:>9}' for n in names))
for k, v in res.items():
    print(*k, ' '.join(f'{statistics.median(v[n]):9.1f}' if n in v else '        -' for n in names))
