#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/sweep.py: the benchmark sweep.

Runs the stage executables of a build over FlashAttention's benchmark shapes (bf16; d = 64, 128;
N = 512 .. 16384 with B*N = 16384 and Hq*d = 2048; causal and not; forward, and backward for stages that
have one), times PyTorch's SDPA (flash and cuDNN backends) on the same shapes when torch and a GPU are
there, measures the mma.sync ceiling with mma_peak, and writes everything to ONE JSON file that
docs/bench/plot.py turns into plots and tables. The core needs only the Python standard library.

    python3 docs/bench/sweep.py --build build                 # the whole sweep
    python3 docs/bench/sweep.py --build build --quick         # N = 1024, 4096 only: a smoke test
    python3 docs/bench/sweep.py --stages step5_backward:atomic step4_fused_pipelined --no-peers
    python3 docs/bench/sweep.py --stages --out X.json --append # add the peers to X.json (split runs)
    python3 docs/bench/sweep.py --stages step6_autotune --against default --no-peers
                                  # tuned vs default, timed in alternating rounds inside every point
    python3 docs/bench/sweep.py --stages step7_hopper_wgmma:7a-wgmma step7_hopper_wgmma:7b-specialized \
        step7_hopper_wgmma:7c-pingpong --no-peers          # step 7's sub-steps, one line each in the plots
    python3 docs/bench/sweep.py --canonical --build build  # the canonical run the pages' tables come from
                                  # (docs/bench/canonical.py; --canonical --help lists its options)

Without a usable GPU (asked of the build's flashattention_tour --gpu-status before the first point), it
stops at once with one line saying why, and exit code 1. Without --stages it runs every GPU stage the build
has, and says which it leaves out: one not built (step 7 is built only for sm_90) or one that cannot run on
this GPU (step 7 on anything but a Hopper), with the stage's reason. A stage named with --stages that
cannot run here stops the sweep with that reason.

FLOPs (docs/conventions.md): forward 4*B*Hq*N*N*d, halved when causal; backward 2.5x the forward.

--decode: the decode sweep, for split-KV (flash-decoding) work on step 4's forward. A few new queries at
the end of a long KV cache: B in {1, 8, 64}, Hq = 32, Hkv in {8, 32}, Nq in {1, 16}, Nk in {2048, 8192,
32768}, d in {64, 128}, bf16, causal bottom-right (input_pos = Nk - Nq: the queries are the cache's last
positions). Forward only; by default step 4 alone, with SDPA's flash and cuDNN backends as peers and the
GPU's device-to-device copy bandwidth as the roof, measured in the same run. Points whose Q, K, V and O
take more than --decode-max-gb (24 GB) are skipped, with the reason printed and kept in the JSON.
The measure is bandwidth: GB/s = (Q read + K read + V read + O written) bytes / time, K and V counted
once per KV head (B*Hkv*Nk*d*2 bytes each). docs/bench/plot_decode.py turns the JSON into a plot and a
table. Writes docs/results/sweep-decode-<gpu>-<date>.json by default.

    python3 docs/bench/sweep.py --build build --decode                       # the whole decode sweep
    python3 docs/bench/sweep.py --build build --decode --quick               # B = 1, Nk = 2048, 8192: a smoke test
    python3 docs/bench/sweep.py --build build --decode --decode-batches 64 --decode-nk 32768 --dims 64
    python3 docs/bench/sweep.py --build build --decode --stage-flags="--splits 4" --out X.json --append

--decode-batches, --decode-hkv, --decode-nq, --decode-nk and --dims narrow the grid. --stage-flags "..."
passes flags through to every stage run (checked once on a small problem first); each record keeps them
as stage_flags, and --append keeps runs with different flags apart. Each stage run is
    STAGE --bench --json F --dtype bf16 --batch B --heads 32 --kv-heads Hkv --seq-q Nq --seq-k Nk
          --dim d --causal [--stage-flags ...]
The peers get GQA and the bottom-right mask the way each backend takes them (time_decode_peer in this file),
and every record says which way it was (gqa, mask; explained in the JSON's peer_ways). The stage
generates its inputs on the host (single-threaded): at B = 64 that takes minutes per point, so split a
full sweep over calls (--decode-batches, --dims, --decode-nk) with --append.
"""
import argparse
import datetime
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GPU_STAGES = ["step3_naive_kernel", "step4_fused_pipelined", "step5_backward", "step6_autotune", "step7_hopper_wgmma"]
SEQS, QUICK_SEQS, DIMS = [512, 1024, 2048, 4096, 8192, 16384], [1024, 4096], [64, 128]
TOKENS, WIDTH = 16384, 2048  # B*N and Hq*d

# The decode sweep (--decode): a few queries at the end of a long KV cache, bandwidth-bound.
DECODE_BATCHES, DECODE_HKV, DECODE_NQ, DECODE_NK = [1, 8, 64], [8, 32], [1, 16], [2048, 8192, 32768]
QUICK_DECODE_BATCHES, QUICK_DECODE_NK = [1], [2048, 8192]
DECODE_HQ, DECODE_MAX_GB = 32, 24.0
DECODE_STAGES = ["step4_fused_pipelined"]  # the forward that split-KV work is about
BF16 = 2  # bytes per element


def shapes(seqs):
    """Every (d, causal, N, B, Hq) point of the sweep, in plot-panel order."""
    return [dict(d=d, causal=c, N=n, B=TOKENS // n, Hq=WIDTH // d)
            for d in DIMS for c in (False, True) for n in seqs]


def decode_shapes(batches, hkvs, nqs, nks, dims):
    """Every decode point, smallest batches first. N is Nk, the plots' x axis."""
    return [dict(B=b, Hq=DECODE_HQ, Hkv=h, Nq=q, Nk=k, N=k, d=d, causal=True)
            for b in batches for h in hkvs for q in nqs for d in dims for k in nks]


def decode_bytes(s, kv_heads=None):
    """(all, K and V) bytes of one decode forward: Q read and O written once, K and V read once per KV head.
    kv_heads: the heads K and V had when handed to the kernel (Hq for a peer given them repeated)."""
    qo = 2 * s["B"] * s["Hq"] * s["Nq"] * s["d"] * BF16
    kv = 2 * s["B"] * (kv_heads or s["Hkv"]) * s["Nk"] * s["d"] * BF16
    return qo + kv, kv


def decode_fields(s, ms, kv_heads=None):
    """A decode record's shape and bandwidth: bytes as this implementation read and wrote them (gbps), and
    the problem's own bytes (K/V once per KV head, problem_gbps), the same numerator for every implementation."""
    moved, kv = decode_bytes(s, kv_heads)
    problem = decode_bytes(s)[0]
    gbps = lambda b: b / (ms * 1e-3) / 1e9 if ms else None
    return dict(Hkv=s["Hkv"], Nq=s["Nq"], Nk=s["Nk"], input_pos=s["Nk"] - s["Nq"], bytes=moved, kv_bytes=kv,
                gbps=gbps(moved), problem_bytes=problem, problem_gbps=gbps(problem))


def flops(s, mode):
    nq, nk = s.get("Nq", s["N"]), s.get("Nk", s["N"])
    f = 4.0 * s["B"] * s["Hq"] * nq * nk * s["d"] / (2 if s["causal"] else 1)
    return f * (2.5 if mode == "bwd" else 1.0)


def tflops(s, mode, ms):
    return flops(s, mode) / (ms * 1e-3) / 1e12


def sh(cmd):
    """stdout of a command, or "" when it is missing or fails."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=ROOT).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def last_error_line(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1] if lines else ""


# ---- the stage executables ----------------------------------------------------------------------

def require_gpu(build):
    """Stops with the reason when the GPU stages cannot run here, instead of failing every point."""
    tour = os.path.join(build, "flashattention_tour")
    if not os.path.exists(tour):
        return  # nothing to ask: each point reports its own error
    r = subprocess.run([tour, "--gpu-status"], capture_output=True, text=True, timeout=60)
    if r.returncode == 1:  # 0: usable; 1: not, and why
        sys.exit(f"sweep.py: cannot time the GPU stages: {r.stdout.strip()}")


def stage_exe(build, name):
    return os.path.join(build, name, name)


def has_backward(exe, variant, timeout):
    """Asks the stage itself: the harness refuses --backward (or an unknown --variant) before any GPU work."""
    cmd = [exe, "--backward", "--batch", "1", "--heads", "1", "--seq", "16", "--dim", "64"]
    cmd += ["--variant", variant] if variant else []
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return True
    if "has no variant" in r.stderr:
        sys.exit("sweep.py: " + last_error_line(r.stderr))
    return "has no backward pass" not in r.stderr


def unavailable(exe, variant, timeout):
    """Why the stage cannot run on this GPU, or "": a stage with needs of its own (step 7: a Hopper GPU) is
    refused by the harness before any work, with its reason; on a GPU it can use, this runs a tiny forward
    (untuned: step 6 would otherwise tune, and cache, this problem)."""
    cmd = [exe, "--batch", "1", "--heads", "1", "--seq", "16", "--dim", "64"]
    cmd += ["--variant", variant] if variant else []
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, DISABLE_AUTOTUNE="1"))
    except subprocess.TimeoutExpired:
        return ""
    m = re.search(r"needs a CUDA GPU: (.+)", r.stderr)  # harness/cli.cpp: run_stage
    return m[1].strip() if m else ""


def check_stage_flags(exe, variant, flags, dim, timeout):
    """Runs the stage once on a small decode problem with --stage-flags, so that a flag it does not know
    (or a value it refuses) stops the sweep at once instead of failing every point."""
    cmd = [exe, "--batch", "1", "--heads", "4", "--kv-heads", "1", "--seq-q", "1", "--seq-k", "2048",
           "--dim", str(dim), "--causal"] + (["--variant", variant] if variant else []) + flags
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return
    if r.returncode != 0:
        sys.exit(f"sweep.py: {os.path.basename(exe)} refuses --stage-flags {shlex.join(flags)}: "
                 + (last_error_line(r.stderr) or f"exit code {r.returncode}"))


def shape_flags(s):
    """The harness's flags for a point: one length for queries and keys (the sweep), or Hkv, Nq, Nk (decode)."""
    if "Nq" not in s:
        return ["--batch", str(s["B"]), "--heads", str(s["Hq"]), "--seq", str(s["N"]), "--dim", str(s["d"])]
    return ["--batch", str(s["B"]), "--heads", str(s["Hq"]), "--kv-heads", str(s["Hkv"]),
            "--seq-q", str(s["Nq"]), "--seq-k", str(s["Nk"]), "--dim", str(s["d"])]


def stage_command(exe, s, variant, backward, check, out, extra=()):
    """The command line of one stage run at point s, its JSON record appended to out."""
    cmd = [exe, "--bench", "--json", out, "--dtype", "bf16"] + shape_flags(s) + list(extra)
    cmd += ["--causal"] * s["causal"] + ["--backward"] * backward + ["--check"] * check
    return cmd + (["--variant", variant] if variant else [])


def run_stage(exe, s, variant, backward, check, timeout, extra=(), lead=0, env=None):
    """One executable run: returns (harness JSON record or None, error string or None). lead: GPU cycles the
    harness spins after each L2 flush, before the start event (FA_TIMING_LEAD_CYCLES; the peers' lead);
    env: more environment variables for the run (the canonical run gives step 6 a cache of its own)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rec.jsonl")
        cmd = stage_command(exe, s, variant, backward, check, out, extra)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                               env=dict(os.environ, FA_TIMING_LEAD_CYCLES=str(lead), **(env or {})))
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout} s"
        rec = None
        if os.path.exists(out):
            with open(out) as f:
                lines = [l for l in f if l.strip()]
            rec = json.loads(lines[-1]) if lines else None
        if rec is None or r.returncode not in (0, 1):  # 1: timed, but --check failed (rec["pass"])
            return None, last_error_line(r.stderr) or f"exit code {r.returncode}"
        return rec, None


# ---- PyTorch SDPA peers -------------------------------------------------------------------------

def load_torch():
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception:  # no torch, or one too old for torch.nn.attention
        return None
    if not torch.cuda.is_available():
        return None
    backends = {"torch_sdpa_flash": SDPBackend.FLASH_ATTENTION, "torch_sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
    return torch, backends, sdpa_kernel


def make_before(torch, flush, lead_cycles):
    """What time_cuda runs ahead of each timed call, outside the timed region: the L2 flush (flush, a buffer
    of twice the L2 size, zeroed), then the lead (--lead-cycles)."""
    def before():
        flush.zero_()
        if lead_cycles:  # the GPU spins while Python dispatches the timed call: the start event waits for no CPU
            torch.cuda._sleep(lead_cycles)
    return before


def time_cuda(torch, fn, before):
    """Median CUDA-event time of fn in ms: warm-up, then 5..100 runs filling ~0.3 s, before() ahead of each
    outside the timed region (the L2 flush and the lead: see --lead-cycles)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once():
        before()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)

    for _ in range(3):
        fn()
    reps = min(100, max(5, int(300.0 / max(once(), 1e-3))))
    return statistics.median(once() for _ in range(reps))


def attempt(torch, work):
    """(work(), None), or (None, its error): a backend refusing a shape, or out of memory, is recorded."""
    try:
        return work(), None
    except Exception as e:  # unsupported shape or backend, out of memory: record it, keep going
        torch.cuda.empty_cache()
        return None, last_error_line(str(e)) or type(e).__name__


def time_peer(tp, backend, s, seed, before):
    """{mode: (ms, error)} of SDPA with one backend on shape s; the backward timed alone on a retained graph."""
    torch, backends, sdpa_kernel = tp
    F = torch.nn.functional
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (s["B"], s["Hq"], s["N"], s["d"])

    def rand(mean, grad):  # fresh inputs, offset from zero like the C++ harness's
        t = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32) + mean
        return t.to(torch.bfloat16).requires_grad_(grad)

    q, k, v, dout = rand(0.3, True), rand(0.3, True), rand(0.5, True), rand(0.5, False)
    with sdpa_kernel([backends[backend]]):
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=s["causal"])

        def time_fwd():
            with torch.no_grad():
                return time_cuda(torch, fwd, before)

        def time_bwd():
            out = fwd()
            return time_cuda(torch, lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), before)

        return {"fwd": attempt(torch, time_fwd), "bwd": attempt(torch, time_bwd)}


# How the peers (and the decode roof) are timed: the JSON's peer_timing; each peer record keeps its lead_cycles.
# GPU cycles, about 0.25 ms on an H100: more than Python takes to dispatch an SDPA call or its backward.
DEFAULT_LEAD = 500000
PEER_TIMING = ("CUDA events around one call from Python; before each run, outside the timed region: the L2 "
               "flushed (2 x L2 bytes zeroed) and then, unless lead_cycles is 0, torch.cuda._sleep(lead_cycles): "
               "the GPU spins while Python dispatches the call, so that the start event does not wait for the "
               "CPU. The stages are timed the same way by their harness: flush, the same spin (FA_TIMING_LEAD_CYCLES), "
               "start event, launch, stop event; their records keep lead_cycles too (sweeps up to 2026-11-23 gave "
               "the stages no lead). "
               "3 warm-ups, then the median of 5-100 runs filling ~0.3 s.")

# How a decode point is handed to each SDPA backend (the records' gqa and mask; the JSON's peer_ways).
PEER_WAYS = {
    "gqa": {
        "none": "Hkv = Hq: no grouping",
        "enable_gqa": "scaled_dot_product_attention(..., enable_gqa=True), K/V with their Hkv heads: the "
                      "backend groups the query heads itself; bytes count K/V once per KV head",
        "repeat_interleave": "the backend refused enable_gqa=True (gqa_error): K/V repeated to Hq heads "
                             "(repeat_interleave, outside the timed region); bytes count K/V at Hq heads, as "
                             "the kernel reads them (problem_gbps counts them once per KV head)",
    },
    "mask": {
        "none": "Nq = 1: the one query is the cache's last position and sees every key, so bottom-right "
                "causal masks nothing and no mask is exact",
        "causal_lower_right": "torch.nn.attention.bias.causal_lower_right(Nq, Nk): the flash backend takes no "
                              "attn_mask and refuses is_causal when Nq != Nk (SDPA's is_causal is top-left); "
                              "this bias dispatches to the flash kernel's own causal mask, which is bottom-right",
        "explicit": "an additive bf16 attn_mask [Nq, Nk] (0 where j <= Nk - Nq + i, -inf elsewhere), built "
                    "outside the timed region (a bool mask would be converted on every call); broadcast over "
                    "B and H, its Nq*Nk*2 bytes are not counted",
    },
}
MASK_WAY = {"torch_sdpa_flash": "causal_lower_right", "torch_sdpa_cudnn": "explicit"}


def decode_mask(torch, backend, s):
    """(attn_mask, way) giving a backend the bottom-right causal mask; is_causal stays False (top-left)."""
    if s["Nq"] == 1:
        return None, "none"
    way = MASK_WAY[backend]
    if way == "causal_lower_right":
        from torch.nn.attention.bias import causal_lower_right  # ImportError: recorded as the point's error
        return causal_lower_right(s["Nq"], s["Nk"]), way
    seen = torch.ones(s["Nq"], s["Nk"], dtype=torch.bool, device="cuda").tril(s["Nk"] - s["Nq"])
    mask = torch.zeros(s["Nq"], s["Nk"], dtype=torch.bfloat16, device="cuda")
    return mask.masked_fill_(~seen, float("-inf")), way


def time_decode_peer(tp, backend, s, seed, before):
    """(ms, error, how) of one SDPA backend on a decode point, forward only; how: gqa, mask, kv_heads.
    GQA: enable_gqa=True first (K/V stay at Hkv heads); where the backend refuses it, K/V repeated to Hq."""
    torch, backends, sdpa_kernel = tp
    F = torch.nn.functional
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rand(heads, n, mean):  # fresh inputs, offset from zero like the C++ harness's
        t = torch.randn((s["B"], heads, n, s["d"]), generator=g, device="cuda", dtype=torch.bfloat16)
        return t.add_(mean)

    def make():
        return (rand(s["Hq"], s["Nq"], 0.3), rand(s["Hkv"], s["Nk"], 0.3), rand(s["Hkv"], s["Nk"], 0.5)), \
            decode_mask(torch, backend, s)

    made, err = attempt(torch, make)
    if err:
        return None, err, {}
    (q, k, v), (mask, mask_way) = made

    def timed(k, v, **gqa):
        call = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False, **gqa)
        with sdpa_kernel([backends[backend]]), torch.no_grad():
            return time_cuda(torch, call, before)

    if s["Hkv"] == s["Hq"]:
        ms, err = attempt(torch, lambda: timed(k, v))
        return ms, err, dict(gqa="none", mask=mask_way, kv_heads=s["Hkv"])
    ms, err = attempt(torch, lambda: timed(k, v, enable_gqa=True))
    if not err:
        return ms, None, dict(gqa="enable_gqa", mask=mask_way, kv_heads=s["Hkv"])
    group = s["Hq"] // s["Hkv"]
    ms, err2 = attempt(torch, lambda: timed(k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)))
    return ms, err2, dict(gqa="repeat_interleave", gqa_error=err, mask=mask_way, kv_heads=s["Hq"])


def copy_roof(torch, before, nbytes=2 << 30):
    """The decode plot's roof: the GPU's copy bandwidth, (bytes read + bytes written) / the median time of a
    device-to-device copy far larger than L2, timed like the peers. Returns (GB/s, how it was measured)."""
    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_cuda(torch, lambda: dst.copy_(src), before)
    src = dst = None  # the 4 GiB back to the peers
    torch.cuda.empty_cache()
    how = (f"dst.copy_(src) of {nbytes >> 20} MiB contiguous uint8 on the GPU (a device-to-device cudaMemcpy); "
           "GB/s = 2 * bytes (read + written) / time; timed as the peers (peer_timing)")
    return 2 * nbytes / (ms * 1e-3) / 1e9, how


# ---- the sweep ----------------------------------------------------------------------------------

def record(name, kind, variant, s, mode, ms=None, error=None, extra=None):
    r = dict(name=name, kind=kind, variant=variant, d=s["d"], N=s["N"], B=s["B"], Hq=s["Hq"],
             causal=s["causal"], mode=mode, ms=ms, tflops=tflops(s, mode, ms) if ms else None)
    if error:
        r["error"] = error
    r.update(extra or {})
    return r


def record_key(r):
    """What a record measured: one measured again replaces it (--append). B, Hkv and Nq tell decode points
    apart (the sweep's N fixes its B); stage_flags, runs of one stage with different --stage-flags."""
    return (r["name"], r["variant"], r.get("stage_flags", ""), r["d"], r["N"], r["causal"], r["mode"],
            r["B"], r.get("Hkv"), r.get("Nq"))


def details(rec, mode):
    """What a record keeps of a harness record besides its time: the check's result, the configurations
    step 6 ran (and the defaults), and the --bench-against variant's time."""
    rec = rec or {}
    out = {k: v for k, v in rec.items() if k == "pass" or k.startswith("err_")}
    for k in ("config", "default_config"):
        if f"{mode}_{k}" in rec:
            out[k] = rec[f"{mode}_{k}"]
    if "against" in rec:
        out["against"] = rec["against"]["variant"]
        out["against_ms"] = rec["against"].get(f"{mode}_ms")
    return out


def stage_records(name, variant, s, rec, err, backward, flags):
    """The records of one stage run: fwd (and bwd) for the sweep; one decode record, the forward's, for --decode."""
    extra = dict(stage_flags=shlex.join(flags)) if flags else {}
    if "Nq" in s:
        ms = (rec or {}).get("fwd_ms")
        return [record(name, "stage", variant, s, "decode", ms=ms, error=err,
                       extra=dict(decode_fields(s, ms), **extra, **details(rec, "fwd")))]
    return [record(name, "stage", variant, s, m, ms=(rec or {}).get(f"{m}_ms"), error=err,
                   extra=dict(extra, **details(rec, m)))
            for m in (["fwd", "bwd"] if backward else ["fwd"])]


def describe(name, s):
    if "Nq" in s:
        return f"{name} B={s['B']} Hkv={s['Hkv']} Nq={s['Nq']} Nk={s['Nk']} d={s['d']}"
    return f"{name} d={s['d']} N={s['N']} {'causal' if s['causal'] else 'non-causal'}"


def progress(i, total, what, recs):
    def one(r):
        if not r["tflops"]:
            return f"{r['mode']}: FAILED ({r['error']})"
        if r["mode"] == "decode":
            how = f" (gqa: {r['gqa']}, mask: {r['mask']})" if r["kind"] == "peer" else ""
            return f"{r['ms']:.4f} ms, {r['gbps']:.0f} GB/s{how}"
        vs = f" ({r['against_ms'] / r['ms']:.3f}x {r['against']})" if r.get("against_ms") else ""
        return f"{r['mode']}: {r['tflops']:.1f} TFLOP/s{vs}"
    res = ", ".join(one(r) for r in recs)
    print(f"[{i}/{total}] {what} {res}", flush=True)


def mma_peak(build, timeout):
    exe = os.path.join(build, "docs", "bench", "mma_peak")
    if not os.path.exists(exe):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "peak.jsonl")
        try:
            r = subprocess.run([exe, "--json", out], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        print(r.stdout.strip() or last_error_line(r.stderr), flush=True)
        if r.returncode != 0 or not os.path.exists(out):
            return None
        with open(out) as f:
            return json.loads(f.readline())


def slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-") or "unknown"


def decode_points(a):
    """The decode grid narrowed by the --decode-* lists and --dims, and the points left out over the memory
    cap, each with its reason (printed once the run starts; the JSON keeps them)."""
    batches = a.decode_batches or (QUICK_DECODE_BATCHES if a.quick else DECODE_BATCHES)
    nks = a.decode_nk or (QUICK_DECODE_NK if a.quick else DECODE_NK)
    points, skipped = [], []
    for s in decode_shapes(batches, a.decode_hkv or DECODE_HKV, a.decode_nq or DECODE_NQ, nks, a.dims):
        gb = decode_bytes(s)[0] / 1e9
        if gb <= a.decode_max_gb:
            points.append(s)
            continue
        why = f"Q, K, V and O take {gb:.1f} GB > {a.decode_max_gb:g} GB (--decode-max-gb)"
        skipped.append(dict(B=s["B"], Hq=s["Hq"], Hkv=s["Hkv"], Nq=s["Nq"], Nk=s["Nk"], d=s["d"], reason=why))
    return points, skipped


def earlier_run(out, kind):
    """The --append target's content, or None when it does not exist yet; stops on a run of the other kind
    (decode records have no place among the sweep's, nor the sweep's among them)."""
    if not os.path.exists(out):
        return None
    with open(out) as f:
        old = json.load(f)
    if old.get("sweep", "sweep") != kind:
        sys.exit(f"sweep.py: --append: {out} holds a {old.get('sweep', 'sweep')} run, this is a {kind} run")
    return old


def combine_rounds(by_round):
    """One record per measurement out of --rounds runs: the median time over the rounds that measured it (the
    rates scaled to it), every round's time kept as rounds_ms; an error only when every round failed."""
    if len(by_round) == 1:
        return by_round[0]
    groups = {}
    for recs in by_round:
        for r in recs:
            groups.setdefault(record_key(r), []).append(r)
    out = []
    for rs in groups.values():
        ok = [r for r in rs if r.get("ms")]
        if not ok:
            out.append(rs[0])
            continue
        med = statistics.median(r["ms"] for r in ok)
        first = ok[0]
        r = {k: v for k, v in first.items() if k != "error"}
        for k in ("tflops", "gbps", "problem_gbps"):  # rates: inversely proportional to the time
            if r.get(k):
                r[k] = first[k] * first["ms"] / med
        r["ms"] = med
        r["rounds_ms"] = [x.get("ms") for x in rs]
        if first.get("against_ms"):
            r["against_ms"] = statistics.median(x["against_ms"] for x in ok if x.get("against_ms"))
        out.append(r)
    return out


def main():
    if "--canonical" in sys.argv[1:]:  # the canonical run: docs/bench/canonical.py, which has its own options
        import canonical
        sys.exit(canonical.main([a for a in sys.argv[1:] if a != "--canonical"], prog="sweep.py --canonical"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], epilog=__doc__[__doc__.index("--decode:"):],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="the CMake build directory (default: build)")
    ap.add_argument("--canonical", action="store_true",
                    help="the canonical run instead: every point the pages cite, into ONE "
                         "docs/results/canonical-<gpu>.json (docs/bench/canonical.py; --canonical --help "
                         "lists its options)")
    ap.add_argument("--stages", nargs="*", metavar="STAGE[:VARIANT]",
                    help="stages to run, each optionally with a variant (default: every GPU stage built, or "
                         f"with --decode {' '.join(DECODE_STAGES)}; --stages with no name: peers only)")
    ap.add_argument("--out", help="output JSON (default: docs/results/sweep[-decode]-<gpu>-<date>.json)")
    ap.add_argument("--quick", action="store_true",
                    help=f"N in {QUICK_SEQS} only (with --decode: B in {QUICK_DECODE_BATCHES}, Nk in "
                         f"{QUICK_DECODE_NK}): a smoke test")
    ap.add_argument("--seqs", type=int, nargs="+", choices=SEQS, help="sequence lengths (default: all, or --quick's)")
    ap.add_argument("--dims", type=int, nargs="+", choices=DIMS, default=DIMS, help="head dims (default: 64 128)")
    ap.add_argument("--check", action="store_true",
                    help="also --check every point against step 1 (slow at large N)")
    ap.add_argument("--forward-only", action="store_true",
                    help="time the stages' forward only (step 7's backward is step 5's: time it there)")
    ap.add_argument("--no-peers", action="store_true",
                    help="skip PyTorch SDPA even when it is available (--decode still measures its roof with PyTorch)")
    ap.add_argument("--append", action="store_true",
                    help="merge into an existing --out file (a sweep split over several runs); "
                         "a point measured again replaces the old record")
    ap.add_argument("--timeout", type=int, default=600, help="seconds allowed per point (default: 600)")
    ap.add_argument("--lead-cycles", "--peer-lead-cycles", dest="lead_cycles", type=int, default=DEFAULT_LEAD,
                    metavar="CYCLES",
                    help="before each timed run, after the L2 flush, the GPU spins this many cycles, so that "
                         "Python's dispatch of a peer's call is not timed; the stages get the same lead "
                         "(FA_TIMING_LEAD_CYCLES), so both sides are timed alike (default: 500000, about 0.25 ms; "
                         "0: no lead, as every sweep committed up to 2026-11-23 was timed)")
    ap.add_argument("--rounds", type=int, default=1, metavar="R",
                    help="run everything R times (stages then peers, each round in the same order) and keep, per "
                         "point, the median time over the rounds, every round's time in rounds_ms (default: 1)")
    ap.add_argument("--against", metavar="VARIANT",
                    help="each stage also times VARIANT of itself at every point, alternating with the main "
                         "run (--bench-against); records get against_ms")
    ap.add_argument("--tuning-tables", metavar="FILE",
                    help="step6_autotune appends each tuned problem's table of every config's TFLOP/s to FILE")
    ap.add_argument("--stage-flags", default="", metavar='"FLAGS"',
                    help='more flags for every stage run, e.g. --stage-flags="--splits 4" (the = form lets '
                         "the value start with --); kept in the records as stage_flags")
    dec = ap.add_argument_group("the decode sweep (--decode)")
    dec.add_argument("--decode", action="store_true",
                     help=f"the decode sweep: forward, bf16, causal bottom-right, Hq = {DECODE_HQ}; "
                          "GB/s against a measured copy roof")
    dec.add_argument("--decode-batches", type=int, nargs="+", metavar="B", help=f"B (default: {DECODE_BATCHES})")
    dec.add_argument("--decode-hkv", type=int, nargs="+", metavar="HKV", help=f"Hkv (default: {DECODE_HKV})")
    dec.add_argument("--decode-nq", type=int, nargs="+", metavar="NQ", help=f"Nq (default: {DECODE_NQ})")
    dec.add_argument("--decode-nk", type=int, nargs="+", metavar="NK", help=f"Nk (default: {DECODE_NK})")
    dec.add_argument("--decode-max-gb", type=float, default=DECODE_MAX_GB, metavar="GB",
                     help=f"skip points whose Q, K, V and O take more (default: {DECODE_MAX_GB:g} GB)")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    if a.lead_cycles < 0:
        ap.error("--lead-cycles must be 0 or more")
    decode_opts = [o for o in ("decode_batches", "decode_hkv", "decode_nq", "decode_nk") if getattr(a, o)]
    if not a.decode and (decode_opts or a.decode_max_gb != DECODE_MAX_GB):
        ap.error("the --decode-* options need --decode")
    if a.decode and a.seqs:
        ap.error("--seqs is the sweep's; the decode sweep's lengths are --decode-nq and --decode-nk")
    for h in a.decode_hkv or []:
        if h <= 0 or DECODE_HQ % h:
            ap.error(f"--decode-hkv {h}: Hkv must divide Hq = {DECODE_HQ}")
    build = os.path.abspath(a.build)
    stage_flags = shlex.split(a.stage_flags)
    kind = "decode" if a.decode else "sweep"
    if a.append and a.out:
        earlier_run(a.out, kind)  # a wrong --out stops here, before the run rather than after it
    skipped = []
    if a.decode:
        points, skipped = decode_points(a)
    else:
        seqs = a.seqs or (QUICK_SEQS if a.quick else SEQS)
        points = [s for s in shapes(seqs) if s["d"] in a.dims]

    if a.stages != []:  # stages to time (--stages with no name: the peers only)
        require_gpu(build)
    impls = []  # (name, variant, exe, backward)
    default = DECODE_STAGES if a.decode else GPU_STAGES
    specs = a.stages if a.stages is not None else default
    for spec in specs:
        name, _, variant = spec.partition(":")
        exe = stage_exe(build, name)
        if not os.path.exists(exe):
            if a.stages is None:  # every stage the build has: step 7 is built only for sm_90
                print(f"sweep: {name} left out: not in this build ({exe} does not exist)", flush=True)
                continue
            sys.exit(f"sweep.py: {exe} does not exist (build it, or fix --build/--stages)")
        why = unavailable(exe, variant, a.timeout)
        if why and a.stages is None:
            print(f"sweep: {name} left out: {why}", flush=True)
            continue
        if why:
            sys.exit(f"sweep.py: {name} cannot run here: {why}")
        if stage_flags:
            check_stage_flags(exe, variant, stage_flags, a.dims[0], a.timeout)
        backward = not a.decode and not a.forward_only and has_backward(exe, variant, a.timeout)
        impls.append((name, variant, exe, backward))
    tp = None if a.no_peers else load_torch()
    peers = list(tp[1]) if tp else []
    if not impls and not peers:
        sys.exit(f"sweep.py: no stage executable under {build} and no PyTorch with CUDA: nothing to time")
    why = " (--no-peers)" if a.no_peers else "" if tp else " (no PyTorch with CUDA here)"
    print(f"sweep: {len(impls)} stage(s), {len(peers)} peer(s){why}, {len(points)} shapes"
          + (f", {len(skipped)} skipped" if skipped else ""), flush=True)
    for p in skipped:
        print(f"skip B={p['B']} Hkv={p['Hkv']} Nq={p['Nq']} Nk={p['Nk']} d={p['d']}: {p['reason']}", flush=True)

    # The decode sweep's roof: measured by PyTorch, which is there even when the peers are not wanted.
    roof_tp = (tp or load_torch()) if a.decode else None
    before, lead = None, a.lead_cycles
    if tp or roof_tp:
        torch = (tp or roof_tp)[0]
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
        before = make_before(torch, torch.empty(2 * l2, dtype=torch.uint8, device="cuda"), lead)
    copy_gbps, copy_how = copy_roof(roof_tp[0], before) if roof_tp else (None, None)
    if copy_gbps:
        print(f"copy roof: {copy_gbps:.0f} GB/s ({copy_how})", flush=True)
    peak = None if a.decode else mma_peak(build, a.timeout)
    total, i, by_round = (len(impls) + len(peers)) * len(points) * a.rounds, 0, []
    harness = {}  # the first harness record: its device and CUDA version describe the run
    for rnd in range(a.rounds):  # --rounds: the whole run again, stages then peers, each round in the same order
        recs, rnd_label = [], f" (round {rnd + 1}/{a.rounds})" if a.rounds > 1 else ""
        for name, variant, exe, backward in impls:
            label, mine = name + (f":{variant}" if variant else ""), []
            for s in points:
                i += 1
                flags = ["--table-json", os.path.abspath(a.tuning_tables)] if a.tuning_tables and name == "step6_autotune" else []
                flags += ["--bench-against", a.against] if a.against else []
                rec, err = run_stage(exe, s, variant, backward, a.check, a.timeout, flags + stage_flags, lead)
                harness = harness or rec or {}
                new = [dict(r, lead_cycles=lead) for r in stage_records(name, variant, s, rec, err, backward, stage_flags)]
                progress(i, total, describe(label, s) + rnd_label, new)
                mine += [(r, rec) for r in new]
            resolved = next((rec["variant"] for _, rec in mine if rec), variant)  # "" -> the stage's default's name
            recs += [dict(r, variant=resolved) for r, _ in mine]
        for peer in peers:
            for n, s in enumerate(points):
                i += 1
                if a.decode:
                    ms, err, how = time_decode_peer(tp, peer, s, seed=n, before=before)
                    new = [record(peer, "peer", "", s, "decode", ms=ms, error=err,
                                  extra=dict(decode_fields(s, ms, how.get("kv_heads")), **how, lead_cycles=lead))]
                else:
                    res = time_peer(tp, peer, s, seed=n, before=before)
                    new = [record(peer, "peer", "", s, m, ms=ms, error=err, extra=dict(lead_cycles=lead))
                           for m, (ms, err) in res.items()]
                progress(i, total, describe(peer, s) + rnd_label, new)
                recs += new
        by_round.append(recs)
    recs = combine_rounds(by_round)

    smi = sh(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).splitlines()
    smi = [x.strip() for x in smi[0].split(",")] if smi else ["", ""]
    any_tp = tp or roof_tp
    gpu = ((peak or {}).get("device") or harness.get("device") or (any_tp and any_tp[0].cuda.get_device_name(0))
           or smi[0] or "unknown GPU")
    now = datetime.datetime.now(datetime.timezone.utc)
    result = dict(
        gpu=gpu, date=now.strftime("%Y-%m-%d %H:%M UTC"),
        cuda=(peak or {}).get("cuda") or harness.get("cuda") or (any_tp and any_tp[0].version.cuda) or "",
        driver=smi[1], torch=any_tp[0].__version__ if any_tp else None,
        git=sh(["git", "describe", "--always", "--dirty"]) or "unknown", build_git=harness.get("git"))
    if a.decode:
        result.update(
            sweep="decode", dtype="bf16", Hq=DECODE_HQ, copy_gbps=copy_gbps, copy_method=copy_how,
            decode_max_gb=a.decode_max_gb,
            convention="GB/s = (Q read + K read + V read + O written) bytes / time, bf16 (2 bytes); Q and O: "
                       "B*Hq*Nq*d each; K and V: B*Hkv*Nk*d each, once per KV head. bytes and gbps: as the "
                       "implementation read them (K/V at Hq heads where a peer was given them repeated: "
                       "gqa = repeat_interleave); problem_bytes and problem_gbps: K/V once per KV head for every "
                       "implementation, so their ratio is the time ratio. Causal, bottom-right: input_pos = "
                       "Nk - Nq. TFLOP/s: 4*B*Hq*Nq*Nk*d, halved when causal (docs/conventions.md); the GB/s "
                       "is the decode's measure. N = Nk.",
            peer_ways=PEER_WAYS, skipped=skipped)
    else:
        result.update(
            dtype="bf16", tokens=TOKENS, width=WIDTH, mma_peak_tflops=(peak or {}).get("tflops"),
            convention="TFLOP/s; fwd = 4*B*Hq*N*N*d (halved when causal); bwd = 2.5x fwd; B*N = 16384; Hq*d = 2048")
    if any_tp:
        result.update(peer_timing=PEER_TIMING)
    result.update(check=a.check, quick=a.quick, records=recs)
    out = a.out or os.path.join(ROOT, "docs", "results",
                                f"sweep{'-decode' if a.decode else ''}-{slug(gpu)}-{now:%Y-%m-%d}.json")
    old = earlier_run(out, kind) if a.append else None
    if old:
        mine = {record_key(r) for r in recs}
        result["records"] = [r for r in old["records"] if record_key(r) not in mine] + recs
        for k in ("mma_peak_tflops", "torch", "build_git", "copy_gbps", "copy_method"):
            if k in result:
                result[k] = result[k] or old.get(k)
        if a.decode:  # the points this run skipped, and those of earlier runs it did not measure again
            ran = {(r["B"], r["Hkv"], r["Nq"], r["Nk"], r["d"]) for r in recs}
            result["skipped"] = skipped + [p for p in old.get("skipped", []) if
                                           (p["B"], p["Hkv"], p["Nq"], p["Nk"], p["d"]) not in ran and p not in skipped]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    failed = sum(1 for r in result["records"] if r.get("error"))
    print(f"wrote {out}: {len(result['records'])} records, {failed} failed")
    if recs and all(r.get("error") for r in recs):
        sys.exit(f"sweep.py: every point of this run failed (first error: {recs[0]['error']})")


if __name__ == "__main__":
    main()
