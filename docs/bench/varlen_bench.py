#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/varlen_bench.py: packed batches on the GPU, one JSON line per point.

    /usr/bin/python3 docs/bench/varlen_bench.py [--batches short long] > varlen.jsonl      (after ./run.sh build)

Two batches of Hq = Hkv = 16 heads, bf16, lengths uniform (seed 7): "short", 512 sequences of 32 to 512 tokens,
and "long", 16 of 256 to 4096. At d = 64 and 128, causal or not: the packed kernels (step 4g's forward, step 5's
packed backward, step 7e's forward: one launch per kernel), the dense batch padded to its longest sequence (steps
4 and 5), each sequence alone summed (step 4, long batch) and PyTorch's SDPA (flash backend) on a jagged nested
tensor (forward); --packed-only: the packed kernels alone. Times are the harness's (--bench: CUDA events,
warm-up, median); TFLOP/s count the unpadded work (backward: 2.5x). The records in
docs/results/raw/varlen-*.jsonl came from this script's parts in four runs (docs/interface.md); the three
first timed step 7 on each sequence in turn (step7_loop_*), before 7e."""
import argparse
import json, random, re, subprocess, sys, statistics
B4, B5, B7 = ("build/step4_fused_pipelined/step4_fused_pipelined", "build/step5_backward/step5_backward",
              "build/step7_hopper_wgmma/step7_hopper_wgmma")

def run(exe, args, backward):
    out = subprocess.run([exe, *args, "--bench", *(["--backward"] if backward else [])], capture_output=True, text=True)
    f = re.search(r"forward:\s+([\d.]+) ms", out.stdout); b = re.search(r"backward:\s+([\d.]+) ms", out.stdout)
    if not f: print(exe, out.stdout[-300:], out.stderr[-300:], file=sys.stderr)
    return (float(f.group(1)) if f else None), (float(b.group(1)) if b else None)

def torch_njt(lens, H, d, causal, rounds=30):
    try:
        import torch, torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel, SDPBackend
        g = torch.Generator(device="cuda").manual_seed(0)
        mk = lambda: torch.nested.nested_tensor([torch.randn(L, H, d, device="cuda", dtype=torch.bfloat16, generator=g) for L in lens],
                                               layout=torch.jagged).transpose(1, 2)
        q, k, v = mk(), mk(), mk()
        f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            for _ in range(5): f()
            ts = []
            for _ in range(rounds):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); f(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
        return statistics.median(ts)
    except Exception as e:
        print("torch:", repr(e)[:200], file=sys.stderr); return None

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--batches", nargs="+", default=["short", "long"], choices=["short", "long"])
ap.add_argument("--packed-only", action="store_true", help="only the packed kernels (4g, step 5's, 7e)")
args = ap.parse_args()
H = 16
for name, n, lo, hi in (("short", 512, 32, 512), ("long", 16, 256, 4096)):
    if name not in args.batches: continue
    rng = random.Random(7)
    for d in (64, 128):
        for causal in (False, True):
            lens = [rng.randint(lo, hi) for _ in range(n)]
            cu = [0]
            for L in lens: cu.append(cu[-1] + L)
            cus = ",".join(map(str, cu))
            base = ["--heads", str(H), "--dim", str(d), "--dtype", "bf16", *(["--causal"] if causal else [])]
            packed = ["--cu-seqlens-q", cus, "--cu-seqlens-k", cus, *base]
            pairs = sum(L * (L + 1) / 2 if causal else L * L for L in lens)
            flops = 4 * H * d * pairs
            rec = {"batch": name, "d": d, "causal": causal, "sequences": n, "tokens": cu[-1], "max_len": max(lens), "flops_fwd": flops}
            rec["step4_packed_fwd_ms"], _ = run(B4, packed, False)
            rec["step7_packed_fwd_ms"], rec["step7_packed_bwd_ms"] = run(B7, packed, True)
            _, rec["step5_packed_bwd_ms"] = run(B5, packed, True)
            if not args.packed_only:
                rec["step4_padded_fwd_ms"], _ = run(B4, ["--batch", str(n), "--seq", str(max(lens)), *base], False)
                rec["torch_njt_fwd_ms"] = torch_njt(lens, H, d, causal)
                _, rec["step5_padded_bwd_ms"] = run(B5, ["--batch", str(n), "--seq", str(max(lens)), *base], True)
                if name == "long":
                    alone = [run(B4, ["--batch", "1", "--seq", str(L), *base], False)[0] for L in lens]
                    rec["step4_alone_summed_fwd_ms"] = sum(alone) if None not in alone else None
            for k in list(rec):
                if k.endswith("_ms") and rec[k]:
                    rec[k[:-3] + "_tflops"] = (2.5 if "_bwd" in k else 1.0) * flops / (rec[k] * 1e-3) / 1e12
            print(json.dumps(rec), flush=True)
