#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/canonical_from_sweeps.py: a STAND-IN for the H100's canonical run.

    /usr/bin/python3 docs/bench/canonical_from_sweeps.py     # writes docs/results/canonical-h100.json

Until `sweep.py --canonical` has run on the H100, the pages are generated from this stand-in: the points of
the canonical run's plan (docs/bench/canonical.py) looked up in the committed records of earlier runs on the
same kind of H100, in canonical.py's format, so that docs/bench/pages.py, its tables, its plot and the ctest
GeneratedPages work end to end. Its rows are NOT one run: each record names its source file (`source`) and
run (`run`), the file's `stand_in` lists the sources and the points none of them has, and every page's
line under its table says "stand-in". The real run replaces the file; then delete this script (the sources
it names stay in the tree only while a page or a script cites them).

Where a source differs from the plan it is kept as measured, and the record says so: the decode points ran
step 4's `auto` (which takes the split-KV kernel at Nq < 64), the window was 1024 keys to the left with a causal
mask (mods_bench.py), not --window 256,0, and step 7's 7d was not timed on its own at these points. Standard
library only.
"""
import datetime
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import canonical  # noqa: E402  (the plan, the file format)
import sweep  # noqa: E402

ROOT = canonical.ROOT
OUT = "docs/results/canonical-h100.json"
SWEEP = "docs/results/sweep-h100-2026-11-24.json"            # steps 3, 4a-4d, 5 and the peers, one run per head dim
STEP7_SUB = "docs/results/sweep-step7-substeps-h100-2026-11-23-run1.json"  # step 7's 7a-7c (no peers, no lead)
STEP7 = "docs/results/sweep-step7-h100-2026-11-24-run12.json"  # step 7's default, three rounds
STEP6 = "docs/results/sweep-step6-h100-2026-11-22.json"      # step 6 tuned (no lead)
MODS = "docs/results/mods-h100-80gb-hbm3-2026-11-23.json"    # the score modifiers' costs, the window
DECODE = "docs/results/sweep-decode-h100-2026-11-24-6ad9b06.json"  # the decode sweep and its copy roof
MOD_NAMES = {"--softcap 30": "softcap", "--alibi": "alibi"}  # the plan's flags -> mods_bench.py's names
WINDOW_LEFT = 1024  # the window mods_bench.py timed (causal), recorded as --window 1024,0


def load(path):
    with open(os.path.join(ROOT, path)) as f:
        return json.load(f)


def run_of(data, r):
    """"DATE build GIT" of a record: merge.py's `run`, else its file's date and build."""
    run = r.get("run")
    if run and " build " in run:
        return run
    return f"{data.get('date')} build {run or data.get('build_git') or data.get('git')}"


def pick(data, path, **want):
    """The records of a sweep file matching every field of want, each tagged with its source and run."""
    out = []
    for r in data["records"]:
        if all(r.get(k, "" if k == "stage_flags" else None) == v for k, v in want.items()):
            out.append(dict({k: v for k, v in r.items() if k != "run"}, source=os.path.basename(path),
                            run=run_of(data, r)))
    return out


def window_pairs(n, left):
    """Visible (i, j) pairs of a causal window of `left` keys to the left, Nq = Nk = n (docs/conventions.md)."""
    return sum(min(n - 1, i) - max(0, i - left) + 1 for i in range(n))


def mods_records(mods, job):
    """The record of one score-modifier point of the plan from mods_bench.py's file, or []."""
    s, name = job["shape"], MOD_NAMES.get(job["flags"])
    if name is None:
        return []
    for c in mods["costs"]:
        sh = c["shape"]
        if (c["modifier"], c["pass"], sh["d"], sh["N"], sh["causal"]) == (name, "fwd", s["d"], s["N"], s["causal"]):
            return [dict(sweep.record("step4_fused_pipelined", "stage", "auto", s, "fwd", ms=c["ms"]),
                         stage_flags=job["flags"], config=c.get("config"), source=os.path.basename(MODS),
                         run=f"{mods['date']} build {mods['git']}")]
    return []


def window_record(mods):
    """The window mods_bench.py timed at d = 128, N = 4096: --window 1024,0, causal; TFLOP/s by visible pairs."""
    for w in mods["window"]:
        sh = w["shape"]
        if (sh["d"], sh["N"]) == (canonical.MODS_POINT["d"], canonical.MODS_POINT["N"]) and w["window_left"] == WINDOW_LEFT:
            s = dict(d=sh["d"], N=sh["N"], B=sh["B"], Hq=sh["Hq"], causal=True)
            flops = 4.0 * s["B"] * s["Hq"] * s["d"] * window_pairs(s["N"], WINDOW_LEFT)
            return [dict(sweep.record("step4_fused_pipelined", "stage", "auto", s, "fwd", ms=w["window_ms"]),
                         tflops=flops / (w["window_ms"] * 1e-3) / 1e12, stage_flags=f"--window {WINDOW_LEFT},0",
                         config=w.get("window_config"), source=os.path.basename(MODS),
                         run=f"{mods['date']} build {mods['git']}")]
    return []


def main():
    files = {p: load(p) for p in (SWEEP, STEP7_SUB, STEP7, STEP6, DECODE, MODS)}
    records, missing = [], []
    for job in canonical.plan(canonical.GROUPS):
        s, name, variant = job["shape"], job["name"], job["variant"]
        shape = dict(d=s["d"], N=s["N"], causal=s["causal"], B=s["B"])
        if job["kind"] in ("decode-peer",) or (job["group"] == "decode"):
            got = pick(files[DECODE], DECODE, name=name, Hkv=s["Hkv"], Nq=s["Nq"], Nk=s["Nk"], **shape)
        elif job["kind"] == "peer":
            got = pick(files[SWEEP], SWEEP, name=name, **shape)
        elif job["group"] == "mods":
            got = mods_records(files[MODS], job)
        elif name == "step7_hopper_wgmma":
            path = STEP7 if variant == canonical.STEP7_DEFAULT else STEP7_SUB
            got = [r for r in pick(files[path], path, name=name, variant=variant, **shape) if r["mode"] == "fwd"]
        elif name == "step6_autotune":
            got = pick(files[STEP6], STEP6, name=name, variant=variant, **shape)
        else:
            got = pick(files[SWEEP], SWEEP, name=name, variant=variant, **shape)
        if not got:
            missing.append(canonical.describe(job))
        records += got
    records += window_record(files[MODS])

    base = files[SWEEP]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    sources = [dict(file=os.path.basename(p), date=d.get("date"), build=d.get("build_git") or d.get("git"),
                    mma_peak_tflops=d.get("mma_peak_tflops"), records=sum(r["source"] == os.path.basename(p) for r in records))
               for p, d in files.items()]
    dense, dense_source = canonical.dense_peak(base["gpu"])
    result = dict(
        canonical=1, gpu=base["gpu"], gpu_slug=canonical.gpu_slug(base["gpu"]), date=base["date"],
        driver=base["driver"], cuda=base["cuda"], torch=base["torch"], git=base["git"], build_git=base["build_git"],
        command="/usr/bin/python3 docs/bench/canonical_from_sweeps.py (a stand-in, not a run)",
        sol=dict(dense_bf16_tflops=dense, dense_source=dense_source, mma_sync_tflops=base["mma_peak_tflops"],
                 mma_sync_source=f"mma_peak_tflops of {os.path.basename(SWEEP)}, the run most rows come from"),
        dtype="bf16", tokens=sweep.TOKENS, width=sweep.WIDTH, lead_cycles=sweep.DEFAULT_LEAD,
        convention="as canonical.py's; each record's lead_cycles says whether its run had the timing lead "
                   "(absent: none, as every run up to 2026-11-23)",
        copy_gbps=files[DECODE]["copy_gbps"], copy_method=files[DECODE]["copy_method"],
        peer_timing=base.get("peer_timing"),
        plan=dict(groups=canonical.GROUPS, fwd_seqs=canonical.FWD_SEQS, mods=[f for f, _ in canonical.MODS],
                  mods_point=canonical.MODS_POINT, decode=canonical.DECODE, step4_substeps=canonical.STEP4_SUBSTEPS,
                  step4_split_kv=canonical.STEP4_SPLIT_KV, step4_mods=canonical.STEP4_MODS,
                  step5=canonical.STEP5_VARIANTS, step6=canonical.STEP6_VARIANT,
                  step7=canonical.STEP7_SUBSTEPS + [canonical.STEP7_DEFAULT], peers=canonical.PEERS),
        left_out={}, elapsed_s=None,
        stand_in=dict(
            note="A stand-in until the canonical run exists: the plan's points taken from earlier runs on the same "
                 "kind of H100 (sources), not one run. Decode points ran step 4's auto (the split-KV kernel at Nq < 64); "
                 f"the window is --window {WINDOW_LEFT},0 with a causal mask, not the plan's; the ceiling is "
                 f"{os.path.basename(SWEEP)}'s.",
            assembled=datetime.date.today().isoformat(), at_commit=commit, sources=sources, missing=missing),
        records=records)
    canonical.write_json(os.path.join(ROOT, OUT), result)
    print(f"wrote {OUT}: {len(records)} records from {len(files)} files (a stand-in); "
          f"{len(missing)} points of the plan in none of them" + (": " + "; ".join(missing) if missing else ""))


if __name__ == "__main__":
    main()
