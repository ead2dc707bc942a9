#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/mods_bench.py: what the score modifiers cost, measured.

Three measurements, all in one run, written to ONE JSON (docs/results/mods-<gpu>-<date>.json by default):

1. window: does tile skipping work?  bf16, d = 128, Hq = 16, B*N = 16384, causal, N in --window-seqs
   (4096, 8192, 16384): step 4 plain (full causal) and with a sliding window of --window keys to the left
   (--window W,0). The prediction scales the causal time by the ratio of the (query tile, K/V tile) pairs
   each run visits, counted with the kernel's own rule (scheduler.cuh: a query tile of Br rows visits the
   tiles from its first row's left edge to its last row's right edge) for the configuration each run
   reports, each pair weighted by its area Br x Bc. The bar: window time <= 1.25 x predicted.
2. costs: bf16, Hq*d = 2048, N = --cost-seq (4096, B = 16384 / N), d = 64 and 128, causal and not:
   plain, --alibi, --softcap 30, --bias (one [1, 1, N, N] float32 bias, broadcast over B and heads),
   --window N,N (a window that cuts no tile: what the modifier path costs when nothing changes), and all of
   alibi + softcap + bias together; step 4's forward, and step 5's backward (its default) where it runs them.
3. bias vs SDPA: step 4 with that bias against PyTorch SDPA with the same values as an additive attn_mask
   (bf16 [1, 1, N, N], broadcast), its efficient and cuDNN backends, forward, in the same run.

    python3 docs/bench/mods_bench.py --build build
    python3 docs/bench/mods_bench.py --build build --quick     # N = 4096 only, d = 128: a smoke test

Each stage run is `STAGE --bench --json F --dtype bf16 ... [modifier flags]`: the harness's median of CUDA-event
times after a warm-up, the L2 flushed before each. The peers: time_cuda of sweep.py (the same rule, and the
same lead before each run, given to the stages too: sweep.py --lead-cycles).
Noise between runs of one build on the H100 is about +-2 %: differences below that are not claims.
"""
import argparse
import array
import datetime
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402  (run_stage, load_torch, time_cuda, attempt, require_gpu, stage_exe, sh)


def write_npy_f32(path, shape, data):
    """A float32 .npy (format 1.0) from raw little-endian bytes, without numpy."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % "".join(f"{n}, " for n in shape)
    pad = 64 - (10 + len(header) + 1) % 64
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + (len(header) + pad + 1).to_bytes(2, "little"))
        f.write((header + " " * pad + "\n").encode())
        f.write(data)


def bias_bytes(n, seed=7):
    """[n, n] float32 values ~ N(0, 1), rows drawn as shifted windows of one random sequence (fast in pure Python)."""
    rnd = random.Random(seed)
    base = array.array("f", (rnd.gauss(0.0, 1.0) for _ in range(2 * n)))
    return b"".join(base[(i * 31) % n:(i * 31) % n + n].tobytes() for i in range(n))


def tile_pairs(n, br, bc, left, causal=True):
    """K/V tiles visited by step 4's scheduler for one head: per query tile of br rows, from the first row's
    window edge (or 0) to the last row's diagonal (Nq = Nk = n, so input_pos = 0)."""
    pairs = 0
    for m0 in range(0, n, br):
        last = min(m0 + br, n) - 1
        lo = max(0, m0 - left) if left >= 0 else 0
        hi = last if causal else n - 1
        pairs += hi // bc - lo // bc + 1
    return pairs


def tiles_of(config):
    """(Br, Bc) of a configuration name like "Br128-Bc128-W8-S2"."""
    parts = dict((p[:2], p[2:]) for p in config.split("-") if p[:2] in ("Br", "Bc"))
    return int(parts["Br"]), int(parts["Bc"])


def shape(n, d, causal, batch_tokens=16384, width=2048):
    return {"B": max(1, batch_tokens // n), "Hq": width // d, "Hkv": width // d, "N": n, "Nq": n, "Nk": n,
            "d": d, "causal": causal}


def run(exe, s, flags, backward=False, timeout=900, variant=None):
    rec, err = sweep.run_stage(exe, s, variant, backward, False, timeout, extra=flags, lead=sweep.DEFAULT_LEAD)
    if err:
        print(f"    {' '.join(flags) or 'plain'}: {err}", flush=True)
        return None, err
    ms = rec.get("bwd_ms" if backward else "fwd_ms")
    print(f"    {' '.join(flags) or 'plain':<40s} {ms:9.3f} ms  {rec.get('config', '')}", flush=True)
    return rec, None


def window_point(exe, s, plain, variant, left):
    """Measurement 1 at one shape: the window run of `variant` against the plain causal record `plain`."""
    n = s["N"]
    win, err = run(exe, s, ["--window", f"{left},0"], variant=variant)
    if plain is None or win is None:
        return {"shape": s, "variant": variant or "auto", "error": err or "the plain run failed"}
    (brc, bcc), (brw, bcw) = tiles_of(plain["config"]), tiles_of(win["config"])
    pc, pw = tile_pairs(n, brc, bcc, -1), tile_pairs(n, brw, bcw, left)
    # Tiles of different sizes compare by the area of scores they cover (rows x keys).
    pred = plain["fwd_ms"] * (pw * brw * bcw) / (pc * brc * bcc)
    r = {"shape": s, "variant": variant or "auto", "git": win.get("git"), "window_left": left, "causal_ms": plain["fwd_ms"],
         "causal_config": plain["config"], "window_ms": win["fwd_ms"], "window_config": win["config"],
         "causal_tile_pairs": pc, "window_tile_pairs": pw, "predicted_ms": pred,
         "ratio_to_predicted": win["fwd_ms"] / pred, "window_tflops": win["fwd_tflops"],
         "meets_bar": win["fwd_ms"] <= 1.25 * pred, "device": win["device"]}
    print(f"  N = {n}: tile pairs {pw} / {pc}, predicted {pred:.3f} ms, measured {win['fwd_ms']:.3f} ms "
          f"({r['ratio_to_predicted']:.2f}x predicted; bar 1.25x)", flush=True)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--window", type=int, default=1024, help="left window size of measurement 1 (keys)")
    ap.add_argument("--window-seqs", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--window-variants", nargs="+", default=None,
                    help="step 4 variants to run the window with (default: auto); the causal run is auto")
    ap.add_argument("--only-window", action="store_true", help="measurement 1 alone")
    ap.add_argument("--cost-seq", type=int, default=4096)
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--no-peers", action="store_true")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    sweep.require_gpu(build)
    fwd_exe = sweep.stage_exe(build, "step4_fused_pipelined")
    bwd_exe = sweep.stage_exe(build, "step5_backward")
    dims = [128] if a.quick else [64, 128]
    wseqs = [4096] if a.quick else a.window_seqs
    n = a.cost_seq
    out = {"what": "score modifiers: window tile skipping, modifier costs, bias vs SDPA attn_mask",
           "date": datetime.date.today().isoformat(), "git": None,  # the stage runs' own revision, below
           "window": [], "costs": [], "bias_vs_sdpa": []}

    with tempfile.TemporaryDirectory() as tmp:
        # ---- 1. the window ------------------------------------------------------------------------------
        print(f"window: left {a.window}, causal, d = 128", flush=True)
        for wn in wseqs:
            s = shape(wn, 128, True)
            plain, _ = run(fwd_exe, s, [])
            for variant in a.window_variants or [None]:
                out["window"].append(window_point(fwd_exe, s, plain, variant, a.window))

        if a.only_window:
            dims = []
        # ---- 2. what each modifier costs ----------------------------------------------------------------
        bias_file = os.path.join(tmp, f"bias{n}.npy")
        data = bias_bytes(n)
        write_npy_f32(bias_file, (1, 1, n, n), data)
        mods = [("plain", []), ("alibi", ["--alibi"]), ("softcap", ["--softcap", "30"]), ("bias", ["--bias", bias_file]),
                ("window_cuts_nothing", ["--window", f"{n},{n}"]),
                ("alibi+softcap+bias", ["--alibi", "--softcap", "30", "--bias", bias_file])]
        for d in dims:
            for causal in (False, True):
                s = shape(n, d, causal)
                for backward in ([False] if a.no_backward else [False, True]):
                    exe = bwd_exe if backward else fwd_exe
                    print(f"costs: N = {n}, d = {d}, {'causal' if causal else 'full'}, "
                          f"{'backward (step 5)' if backward else 'forward (step 4)'}", flush=True)
                    base = None
                    for name, flags in mods:
                        rec, err = run(exe, s, flags, backward)
                        key = "bwd_ms" if backward else "fwd_ms"
                        r = {"shape": s, "pass": "bwd" if backward else "fwd", "modifier": name,
                             "ms": rec[key] if rec else None, "config": rec.get("config") if rec else None,
                             "error": err, "device": rec["device"] if rec else None}
                        if name == "plain":
                            base = r["ms"]
                        if base and r["ms"]:
                            r["vs_plain"] = r["ms"] / base
                        out["costs"].append(r)

        # ---- 3. the bias against SDPA's attn_mask -------------------------------------------------------
        tp = None if a.no_peers else sweep.load_torch()
        if tp is None:
            out["bias_vs_sdpa_note"] = "no torch with a GPU here (or --no-peers): peers not timed"
        else:
            torch, _, sdpa_kernel = tp
            from torch.nn.attention import SDPBackend
            before = sweep.make_before(torch, torch.empty(512 << 20, dtype=torch.uint8, device="cuda"),
                                       sweep.DEFAULT_LEAD)
            mask = torch.frombuffer(bytearray(data), dtype=torch.float32).view(1, 1, n, n).to("cuda", torch.bfloat16)
            for d in dims:
                for causal in (False, True):
                    s = shape(n, d, causal)
                    rec, err = run(fwd_exe, s, ["--bias", bias_file])
                    g = torch.Generator(device="cuda").manual_seed(1)
                    q, k, v = (torch.randn((s["B"], s["Hq"], n, d), generator=g, device="cuda") + 0.3
                               for _ in range(3))
                    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
                    # SDPA takes no causal flag together with attn_mask: causal is folded into the mask.
                    m = mask if not causal else mask.masked_fill(
                        ~torch.ones(n, n, dtype=torch.bool, device="cuda").tril(), float("-inf"))
                    r = {"shape": s, "ours_ms": rec["fwd_ms"] if rec else None, "ours_error": err,
                         "ours_config": rec.get("config") if rec else None,
                         "mask": "bf16 [1, 1, N, N] additive attn_mask (ours: float32 bias), causal folded in"}
                    for name, be in (("torch_sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION),
                                     ("torch_sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                        def work():
                            with sdpa_kernel([be]), torch.no_grad():
                                f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
                                return sweep.time_cuda(torch, f, before)
                        ms, perr = sweep.attempt(torch, work)
                        r[name + "_ms"], r[name + "_error"] = ms, perr
                        if ms and r["ours_ms"]:
                            r[name + "_speedup"] = ms / r["ours_ms"]
                        print(f"    {name:<24s} {ms if ms else perr}", flush=True)
                    out["bias_vs_sdpa"].append(r)
                    del q, k, v, m
            out["torch"] = torch.__version__

    dev = next((r["device"] for r in out["costs"] if r.get("device")), "gpu")
    out["git"] = next((r["git"] for r in out["window"] if r.get("git")), None)  # what the build says it is
    path = a.out or os.path.join(sweep.ROOT, "docs", "results",
                                 f"mods-{sweep.slug(dev)}-{out['date']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(path + ".tmp", path)
    print("wrote", path)


if __name__ == "__main__":
    main()
