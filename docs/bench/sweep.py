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

Without a usable GPU (asked of the build's flashattention_tour --gpu-status before the first point), it
stops at once with one line saying why, and exit code 1.

FLOPs (docs/conventions.md): forward 4*B*Hq*N*N*d, halved when causal; backward 2.5x the forward.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GPU_STAGES = ["step3_naive_kernel", "step4_fused_pipelined", "step5_backward", "step6_autotune"]
SEQS, QUICK_SEQS, DIMS = [512, 1024, 2048, 4096, 8192, 16384], [1024, 4096], [64, 128]
TOKENS, WIDTH = 16384, 2048  # B*N and Hq*d


def shapes(seqs):
    """Every (d, causal, N, B, Hq) point of the sweep, in plot-panel order."""
    return [dict(d=d, causal=c, N=n, B=TOKENS // n, Hq=WIDTH // d)
            for d in DIMS for c in (False, True) for n in seqs]


def flops(s, mode):
    f = 4.0 * s["B"] * s["Hq"] * s["N"] * s["N"] * s["d"] / (2 if s["causal"] else 1)
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


def run_stage(exe, s, variant, backward, check, timeout, extra=()):
    """One executable run: returns (harness JSON record or None, error string or None)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rec.jsonl")
        cmd = [exe, "--bench", "--json", out, "--dtype", "bf16", "--batch", str(s["B"]),
               "--heads", str(s["Hq"]), "--seq", str(s["N"]), "--dim", str(s["d"])] + list(extra)
        cmd += ["--causal"] * s["causal"] + ["--backward"] * backward + ["--check"] * check
        cmd += ["--variant", variant] if variant else []
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
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


def time_cuda(torch, fn, flush):
    """Median CUDA-event time of fn in ms: warm-up, then 5..100 runs filling ~0.3 s, L2 flushed before each."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once():
        flush.zero_()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)

    for _ in range(3):
        fn()
    reps = min(100, max(5, int(300.0 / max(once(), 1e-3))))
    return statistics.median(once() for _ in range(reps))


def time_peer(tp, backend, s, seed, flush):
    """{mode: (ms, error)} of SDPA with one backend on shape s; the backward timed alone on a retained graph."""
    torch, backends, sdpa_kernel = tp
    F = torch.nn.functional
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (s["B"], s["Hq"], s["N"], s["d"])

    def rand(mean, grad):  # fresh inputs, offset from zero like the C++ harness's
        t = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32) + mean
        return t.to(torch.bfloat16).requires_grad_(grad)

    def attempt(work):
        try:
            return work(), None
        except Exception as e:  # unsupported shape or backend, out of memory: record it, keep going
            torch.cuda.empty_cache()
            return None, last_error_line(str(e)) or type(e).__name__

    q, k, v, dout = rand(0.3, True), rand(0.3, True), rand(0.5, True), rand(0.5, False)
    with sdpa_kernel([backends[backend]]):
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=s["causal"])

        def time_fwd():
            with torch.no_grad():
                return time_cuda(torch, fwd, flush)

        def time_bwd():
            out = fwd()
            return time_cuda(torch, lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), flush)

        return {"fwd": attempt(time_fwd), "bwd": attempt(time_bwd)}


# ---- the sweep ----------------------------------------------------------------------------------

def record(name, kind, variant, s, mode, ms=None, error=None, extra=None):
    r = dict(name=name, kind=kind, variant=variant, d=s["d"], N=s["N"], B=s["B"], Hq=s["Hq"],
             causal=s["causal"], mode=mode, ms=ms, tflops=tflops(s, mode, ms) if ms else None)
    if error:
        r["error"] = error
    r.update(extra or {})
    return r


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


def describe(name, s):
    return f"{name} d={s['d']} N={s['N']} {'causal' if s['causal'] else 'non-causal'}"


def progress(i, total, what, recs):
    def one(r):
        if not r["tflops"]:
            return f"{r['mode']}: FAILED ({r['error']})"
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="the CMake build directory (default: build)")
    ap.add_argument("--stages", nargs="*", metavar="STAGE[:VARIANT]",
                    help="stages to run, each optionally with a variant (default: every GPU stage built; "
                         "--stages with no name: peers only)")
    ap.add_argument("--out", help="output JSON (default: docs/results/sweep-<gpu>-<date>.json)")
    ap.add_argument("--quick", action="store_true", help=f"N in {QUICK_SEQS} only: a smoke test")
    ap.add_argument("--seqs", type=int, nargs="+", choices=SEQS, help="sequence lengths (default: all, or --quick's)")
    ap.add_argument("--dims", type=int, nargs="+", choices=DIMS, default=DIMS, help="head dims (default: 64 128)")
    ap.add_argument("--check", action="store_true",
                    help="also --check every point against step 1 (slow at large N)")
    ap.add_argument("--no-peers", action="store_true", help="skip PyTorch SDPA even when it is available")
    ap.add_argument("--append", action="store_true",
                    help="merge into an existing --out file (a sweep split over several runs); "
                         "a point measured again replaces the old record")
    ap.add_argument("--timeout", type=int, default=600, help="seconds allowed per point (default: 600)")
    ap.add_argument("--against", metavar="VARIANT",
                    help="each stage also times VARIANT of itself at every point, alternating with the main "
                         "run (--bench-against); records get against_ms")
    ap.add_argument("--tuning-tables", metavar="FILE",
                    help="step6_autotune appends each tuned problem's table of every config's TFLOP/s to FILE")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    seqs = a.seqs or (QUICK_SEQS if a.quick else SEQS)
    points = [s for s in shapes(seqs) if s["d"] in a.dims]

    if a.stages != []:  # stages to time (--stages with no name: the peers only)
        require_gpu(build)
    impls = []  # (name, variant, exe, backward)
    specs = a.stages if a.stages is not None else [n for n in GPU_STAGES if os.path.exists(stage_exe(build, n))]
    for spec in specs:
        name, _, variant = spec.partition(":")
        exe = stage_exe(build, name)
        if not os.path.exists(exe):
            sys.exit(f"sweep.py: {exe} does not exist (build it, or fix --build/--stages)")
        impls.append((name, variant, exe, has_backward(exe, variant, a.timeout)))
    tp = None if a.no_peers else load_torch()
    peers = list(tp[1]) if tp else []
    if not impls and not peers:
        sys.exit(f"sweep.py: no stage executable under {build} and no PyTorch with CUDA: nothing to time")
    why = " (--no-peers)" if a.no_peers else "" if tp else " (no PyTorch with CUDA here)"
    print(f"sweep: {len(impls)} stage(s), {len(peers)} peer(s){why}, {len(points)} shapes", flush=True)

    peak = mma_peak(build, a.timeout)
    total, i, recs = (len(impls) + len(peers)) * len(points), 0, []
    harness = {}  # the first harness record: its device and CUDA version describe the run
    for name, variant, exe, backward in impls:
        label, mine = name + (f":{variant}" if variant else ""), []
        for s in points:
            i += 1
            flags = ["--table-json", os.path.abspath(a.tuning_tables)] if a.tuning_tables and name == "step6_autotune" else []
            flags += ["--bench-against", a.against] if a.against else []
            rec, err = run_stage(exe, s, variant, backward, a.check, a.timeout, flags)
            harness = harness or rec or {}
            new = [record(name, "stage", variant, s, m, ms=(rec or {}).get(f"{m}_ms"), error=err, extra=details(rec, m))
                   for m in (["fwd", "bwd"] if backward else ["fwd"])]
            progress(i, total, describe(label, s), new)
            mine += [(r, rec) for r in new]
        resolved = next((rec["variant"] for _, rec in mine if rec), variant)  # "" -> the stage's default's name
        recs += [dict(r, variant=resolved) for r, _ in mine]
    if tp:
        torch = tp[0]
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
        flush = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
        for peer in peers:
            for n, s in enumerate(points):
                i += 1
                res = time_peer(tp, peer, s, seed=n, flush=flush)
                new = [record(peer, "peer", "", s, m, ms=ms, error=err) for m, (ms, err) in res.items()]
                progress(i, total, describe(peer, s), new)
                recs += new

    smi = sh(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).splitlines()
    smi = [x.strip() for x in smi[0].split(",")] if smi else ["", ""]
    gpu = ((peak or {}).get("device") or harness.get("device") or (tp and tp[0].cuda.get_device_name(0))
           or smi[0] or "unknown GPU")
    now = datetime.datetime.now(datetime.timezone.utc)
    result = dict(
        gpu=gpu, date=now.strftime("%Y-%m-%d %H:%M UTC"),
        cuda=(peak or {}).get("cuda") or harness.get("cuda") or (tp and tp[0].version.cuda) or "",
        driver=smi[1], torch=tp[0].__version__ if tp else None,
        git=sh(["git", "describe", "--always", "--dirty"]) or "unknown", build_git=harness.get("git"),
        dtype="bf16", tokens=TOKENS, width=WIDTH, mma_peak_tflops=(peak or {}).get("tflops"),
        convention="TFLOP/s; fwd = 4*B*Hq*N*N*d (halved when causal); bwd = 2.5x fwd; B*N = 16384; Hq*d = 2048",
        check=a.check, quick=a.quick, records=recs)
    out = a.out or os.path.join(ROOT, "docs", "results", f"sweep-{slug(gpu)}-{now:%Y-%m-%d}.json")
    if a.append and os.path.exists(out):
        with open(out) as f:
            old = json.load(f)
        key = lambda r: (r["name"], r["variant"], r["d"], r["N"], r["causal"], r["mode"])
        mine = {key(r) for r in recs}
        result["records"] = [r for r in old["records"] if key(r) not in mine] + recs
        for k in ("mma_peak_tflops", "torch", "build_git"):
            result[k] = result[k] or old.get(k)
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
