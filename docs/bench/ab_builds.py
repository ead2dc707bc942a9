#!/usr/bin/env python3
# FlashAttention, step by step — docs/bench/ab_builds.py: a same-run A/B of two builds of the project.
#
#   docs/bench/ab_builds.py --a OLD_BUILD --b NEW_BUILD --out ab.jsonl [--rounds 3] [--seqs 1024 16384]
#   docs/bench/ab_builds.py ... --passes fwd --fwd-stage step7_hopper_wgmma [--fwd-variant 7c-pingpong]
#
# For the shipped defaults (step 4's forward "auto", step 5's backward "deterministic" and "atomic"), head
# dims 64 and 128, each sequence length (B * N = 16384, Hq * d = 2048, bf16, as in sweep.py), causal and
# not, runs the two builds' executables with --bench in alternating order (A B, B A, A B, ...), so that clock
# and thermal drift fall on both alike. Every run appends one JSON record (with "ab_build": "a" or "b" and
# "ab_round") to --out; the table at the end gives each side's median over rounds and the ratio B / A of
# throughput (above 1: B is faster).
#   --decode [--batches 1 8] [--nks 2048 8192 32768]: step 4's forward at sweep.py's decode points instead
#   (Hq = 32, Hkv 8 and 32, Nq 1 and 16, causal, bf16): B / A is then the ratio of times A / B.
import argparse
import json
import os
import statistics
import subprocess
import sys

PASSES = [("fwd", "step4_fused_pipelined", ["--variant", "auto"]),
          ("bwd-deterministic", "step5_backward", ["--backward", "--variant", "deterministic"]),
          ("bwd-atomic", "step5_backward", ["--backward", "--variant", "atomic"])]


def run(build, stage, flags, out, tag, rnd):
    exe = os.path.join(build, stage, stage)
    tmp = out + ".tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    r = subprocess.run([exe, "--bench", "--json", tmp] + flags, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ab_builds: {exe} {' '.join(flags)} failed:\n{r.stdout}{r.stderr}")
    rec = json.loads(open(tmp).read().splitlines()[-1])
    os.remove(tmp)
    rec.update(ab_build=tag, ab_round=rnd, ab_build_dir=build)
    with open(out, "a") as f:
        f.write(json.dumps(rec) + "\n")
    return rec


def main():
    ap = argparse.ArgumentParser(description="A same-run A/B of two builds of the project (see the header).")
    ap.add_argument("--a", required=True, help="build folder A (the baseline)")
    ap.add_argument("--b", required=True, help="build folder B (the change)")
    ap.add_argument("--out", required=True, help="JSON lines, one record per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seqs", type=int, nargs="+", default=[1024, 16384])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--passes", nargs="+", default=[n for n, _, _ in PASSES], help="a subset of " +
                    ", ".join(n for n, _, _ in PASSES))
    ap.add_argument("--fwd-stage", default="step4_fused_pipelined",
                    help="the stage of the fwd pass (default: step 4; e.g. step7_hopper_wgmma)")
    ap.add_argument("--fwd-variant", default="auto", help="the fwd pass's variant (e.g. sm120 for step 4)")
    ap.add_argument("--atomic-variant", default="atomic",
                    help="step 5's variant for the bwd-atomic pass (e.g. kv128x64-w4x2-S2-atomic)")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--decode", action="store_true", help="sweep.py's decode points, step 4's forward only")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="decode: the batch sizes")
    ap.add_argument("--nks", type=int, nargs="+", default=[2048, 8192, 32768], help="decode: the KV lengths")
    args = ap.parse_args()
    if args.decode:
        return decode(args)
    chosen = {"auto": args.fwd_variant, "atomic": args.atomic_variant}
    passes = [(n, args.fwd_stage if n == "fwd" else st, [chosen.get(f, f) for f in fl]) for n, st, fl in PASSES
              if n in args.passes]
    rows = []
    total = len(args.dims) * len(args.seqs) * 2 * len(passes)
    k = 0
    for d in args.dims:
        for n in args.seqs:
            for causal in (False, True):
                shape = ["--batch", str(16384 // n), "--heads", str(2048 // d), "--seq", str(n), "--dim", str(d)]
                shape += ["--causal"] if causal else []
                shape += ["--dropout", str(args.dropout)] if args.dropout > 0 else []
                for name, stage, flags in passes:
                    k += 1
                    key = "bwd_tflops" if name.startswith("bwd") else "fwd_tflops"
                    got = {"a": [], "b": []}
                    for rnd in range(args.rounds):
                        order = ("a", "b") if rnd % 2 == 0 else ("b", "a")
                        for tag in order:
                            rec = run(args.a if tag == "a" else args.b, stage, flags + shape, args.out, tag, rnd)
                            got[tag].append(rec[key])
                    a, b = statistics.median(got["a"]), statistics.median(got["b"])
                    rows.append((d, n, causal, name, a, b))
                    print(f"[{k}/{total}] d={d} N={n} causal={causal} {name}: A {a:.1f} B {b:.1f} TFLOP/s "
                          f"(B/A {b / a:.3f})", file=sys.stderr, flush=True)
    print(f"{'d':>4} {'N':>6} {'causal':>6} {'pass':<18} {'A TFLOP/s':>10} {'B TFLOP/s':>10} {'B/A':>6}")
    for d, n, causal, name, a, b in rows:
        print(f"{d:>4} {n:>6} {str(causal):>6} {name:<18} {a:>10.1f} {b:>10.1f} {b / a:>6.3f}")
    worst = min(b / a for *_, a, b in rows)
    print(f"lowest B/A: {worst:.3f}")


def decode(args):
    """Step 4's forward at the decode points: alternating rounds as above, median forward time per side."""
    points = [(d, b, hkv, nq, nk) for d in args.dims for b in args.batches for hkv in (8, 32) for nq in (1, 16)
              for nk in args.nks]
    rows = []
    for k, (d, b, hkv, nq, nk) in enumerate(points, 1):
        flags = ["--variant", args.fwd_variant, "--dtype", "bf16", "--batch", str(b), "--heads", "32",
                 "--kv-heads", str(hkv), "--seq-q", str(nq), "--seq-k", str(nk), "--dim", str(d), "--causal"]
        got = {"a": [], "b": []}
        for rnd in range(args.rounds):
            for tag in (("a", "b") if rnd % 2 == 0 else ("b", "a")):
                rec = run(args.a if tag == "a" else args.b, "step4_fused_pipelined", flags, args.out, tag, rnd)
                got[tag].append(rec["fwd_ms"] * 1000)
        a, b_us = statistics.median(got["a"]), statistics.median(got["b"])
        rows.append((d, b, hkv, nq, nk, a, b_us))
        print(f"[{k}/{len(points)}] d={d} B={b} Hkv={hkv} Nq={nq} Nk={nk}: A {a:.1f} B {b_us:.1f} us "
              f"(B/A {a / b_us:.3f})", file=sys.stderr, flush=True)
    print(f"{'d':>4} {'B':>3} {'Hkv':>4} {'Nq':>3} {'Nk':>6} {'A us':>8} {'B us':>8} {'B/A':>6}")
    for d, b, hkv, nq, nk, a, b_us in rows:
        print(f"{d:>4} {b:>3} {hkv:>4} {nq:>3} {nk:>6} {a:>8.1f} {b_us:>8.1f} {a / b_us:>6.3f}")
    print(f"lowest B/A: {min(a / b_us for *_, a, b_us in rows):.3f}")


if __name__ == "__main__":
    main()
