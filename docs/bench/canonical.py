#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/canonical.py: the canonical run, one per GPU kind.

Every number the pages show for a GPU (the README's staircase, the scoreboard of docs/index.md, each
chapter's table of its sub-steps) comes from ONE run of this script on that GPU, written to ONE file,
docs/results/canonical-<gpu>.json (<gpu>: h100, h200, ... from the device's name). docs/bench/pages.py
turns that file into the pages' tables and the staircase plot. It is a mode of sweep.py and uses its
timing (the stages' harness, the PyTorch peers, the mma.sync ceiling, the decode roof):

    python3 docs/bench/sweep.py --canonical --build build            # on a GPU: the run (about 6 min on an H100)
    python3 docs/bench/sweep.py --canonical --build build --dry-run  # anywhere: every point, its command, its time

What it runs (bf16; B*N = 16384 and Hq*d = 2048 as in the sweep; every stage behind the same lead as the peers):
  forward    step 3, step 4's default (4d) and step 7's: d = 64, 128; N = 1024, 4096, 16384; causal and not
             (the 12 points of FWD_POINTS); the other sub-steps (4a-4c, 7a-7d) at 7 of them (SUBSTEP_POINTS)
  backward   step 5's variants (their forward too), the same 12 points
  step6      step 6 tuned, forward and backward, at STEP6_POINTS, from an empty cache of its own (it tunes)
  mods       step 4 with each score modifier of MODS at d = 128, N = 4096 (the plain points are the forward's)
  decode     step 4's split-KV sub-step at DECODE (B = 1 and 8), the decode peers, the GPU's copy roof
  peers      PyTorch SDPA's flash and cuDNN backends, forward and backward, at the 12 points
plus, before them, the mma.sync ceiling of this GPU (build/docs/bench/mma_peak). Each point is one process of
the stage (sweep.py's run_stage: median of warmed-up runs, L2 flushed before each), each printed as it ends.
--only splits the run over calls (a device call's time limit) and --append merges them into one file.

The file records the GPU's name, driver, CUDA and PyTorch versions, the build's and the tree's git revisions,
the date, the command, and the two speeds of light its percentages use (docs/conventions.md, "Speed of light"):
the GPU's dense bf16 tensor-core peak (NVIDIA's data sheet, DENSE_BF16_PEAKS, or --dense-peak) and the
mma.sync ceiling measured in this run. Exit status: 0 done; 1 the GPU cannot run the stages, or every point
failed; 2 bad arguments (a missing build, executable or option; an unknown GPU without --dense-peak).
"""
import argparse
import datetime
import json
import os
import re
import shlex
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402  (run_stage, stage_command, time_peer, time_decode_peer, copy_roof, mma_peak, ...)

ROOT = sweep.ROOT

# ---- the variants the run times: a stage's renamed variant is a one-line change here --------------------
STEP4_SUBSTEPS = ["4a-padded", "4b-swizzle", "4c-cp-async", "4d-tma"]
STEP4_SPLIT_KV = "4f-split-kv"    # the split-KV decoding sub-step
STEP4_MODS = "4e-score-mods"      # the score modifiers' sub-step: 4d's kernel with their mask (4d-tma refuses them)
STEP5_VARIANTS = ["deterministic", "atomic"]
STEP6_VARIANT = "tuned"
STEP7_SUBSTEPS = ["7a-wgmma", "7b-specialized", "7c-pingpong", "7d-persistent"]
STEP7_DEFAULT = "auto"
PEERS = ["torch_sdpa_flash", "torch_sdpa_cudnn"]

# ---- the points -------------------------------------------------------------------------------------------
FWD_SEQS = [1024, 4096, 16384]
FWD_POINTS = sweep.shapes(FWD_SEQS)  # d = 64, 128 x non-causal, causal x N, B = 16384 / N, Hq = 2048 / d
# The lesson sub-steps (4a-4c, 7a-7d) at 7 of them, every point the pages show (the stages' defaults, step 3,
# step 5 and the peers run at all 12): without a mask, and d = 128, N = 4096 with one. Saves about a minute.
SUBSTEP_POINTS = [s for s in FWD_POINTS if not s["causal"] or (s["d"] == 128 and s["N"] == 4096)]
STEP6_POINTS = [s for s in FWD_POINTS if s["N"] == 4096 and not s["causal"]]
MODS = [  # (flags, masks): step 4 with each score modifier, d = 128, N = 4096
    ("--softcap 30", [False, True]),
    ("--alibi", [False, True]),
    ("--window 256,0", [False]),  # causal or not, the same band: R is capped at 0 when causal
]
MODS_POINT = dict(d=128, N=4096)
DECODE = dict(batches=[1, 8], hkv=[8], nq=[1, 16], nk=[8192, 32768], dims=[128])
DECODE_POINTS = sweep.decode_shapes(DECODE["batches"], DECODE["hkv"], DECODE["nq"], DECODE["nk"], DECODE["dims"])

GROUPS = ["forward", "step7", "backward", "step6", "mods", "decode", "peers"]

# The dense bf16 tensor-core peak of each GPU (NVIDIA's data sheets; dense, without sparsity), the speed of
# light of the pages' "% of SoL". First match of the regular expression on the device's name wins.
DENSE_BF16_PEAKS = [
    (r"H100.*NVL", 835.0, "NVIDIA H100 NVL data sheet"),
    (r"H100.*PCIe", 756.0, "NVIDIA H100 PCIe data sheet"),
    (r"H100", 989.0, "NVIDIA H100 SXM data sheet"),
    (r"H200.*NVL", 835.0, "NVIDIA H200 NVL data sheet"),
    (r"H200", 989.0, "NVIDIA H200 SXM data sheet"),
]

# ---- the time estimate (--dry-run, and the progress lines) --------------------------------------------------
# A stage point is one process: start-up (CUDA context, allocations, the record) and the seeded inputs, made on
# the host; then the harness's runs (one, 3 warm-ups, one to size the count, then 5 to 100 filling 0.3 s), each
# behind an L2 flush and the lead. Kernel times come from the reference file (a canonical run of the same kind
# of GPU) where it has the point, else from GUESS_TFLOPS.
PROCESS_S = 1.2              # per stage process, besides its inputs and runs (a guess until a run records wall_s)
INPUT_ELEMENTS_PER_S = 4e8   # seeded normal inputs, made on the host's cores
REP_OVERHEAD_MS = 0.45       # per timed run of a stage: flush, lead (0.25 ms), synchronisation
PEER_REP_OVERHEAD_MS = 0.55  # per timed call of a peer: the same, and Python's dispatch
PEER_POINT_S = 0.3           # per peer point: making its tensors
TUNE_S = {"fwd": 8.0, "bwd": 12.0}  # step 6 tuning one problem from an empty cache: every configuration timed
START_S = dict(gpu_status=1.0, probes=2.0, mma_peak=3.0, torch=10.0, copy_roof=1.5)
GUESS_TFLOPS = {"step3_naive_kernel": 3.0, "step4_fused_pipelined": 250.0, "step5_backward": 230.0,
                "step6_autotune": 300.0, "step7_hopper_wgmma": 550.0, "torch_sdpa_flash": 300.0,
                "torch_sdpa_cudnn": 500.0}
GUESS_DECODE_GBPS = 1500.0


def gpu_slug(name):
    """h100, h200, rtx5090, ...: the model in the device's name ("NVIDIA H100 80GB HBM3" -> "h100")."""
    words = re.sub(r"\b(nvidia|geforce)\b", " ", name.lower()).split()
    if len(words) > 1 and words[0] in ("rtx", "gtx"):
        return re.sub(r"[^a-z0-9]", "", words[0] + words[1])
    return re.sub(r"[^a-z0-9]", "", words[0]) if words else "unknown"


def dense_peak(name):
    """(TFLOP/s, source) of the device's dense bf16 peak, or (None, None) for a GPU the table does not know."""
    for pattern, tflops, source in DENSE_BF16_PEAKS:
        if re.search(pattern, name or ""):
            return tflops, source
    return None, None


# ---- the plan -------------------------------------------------------------------------------------------------

def job(group, name, variant, s, backward=False, flags="", kind="stage", env=None):
    return dict(group=group, name=name, variant=variant, shape=s, backward=backward, flags=flags, kind=kind,
                env=env or {})


def plan(groups):
    """Every point of the run, in the order it runs: the stages group by group, then the peers."""
    out = []
    if "forward" in groups:
        out += [job("forward", "step3_naive_kernel", "", s) for s in FWD_POINTS]
        out += [job("forward", "step4_fused_pipelined", v, s) for v in STEP4_SUBSTEPS
                for s in (FWD_POINTS if v == STEP4_SUBSTEPS[-1] else SUBSTEP_POINTS)]
    if "step7" in groups:
        out += [job("step7", "step7_hopper_wgmma", v, s) for v in STEP7_SUBSTEPS for s in SUBSTEP_POINTS]
        out += [job("step7", "step7_hopper_wgmma", STEP7_DEFAULT, s) for s in FWD_POINTS]
    if "backward" in groups:
        out += [job("backward", "step5_backward", v, s, backward=True) for v in STEP5_VARIANTS for s in FWD_POINTS]
    if "step6" in groups:
        # An empty cache of its own (TMP: a fresh folder of the run), so that every point tunes on this GPU.
        out += [job("step6", "step6_autotune", STEP6_VARIANT, s, backward=True,
                    env={"FA_AUTOTUNE_CACHE": f"TMP/autotune-{s['d']}.json"}) for s in STEP6_POINTS]
    if "mods" in groups:
        for flags, masks in MODS:
            out += [job("mods", "step4_fused_pipelined", STEP4_MODS, s, flags=flags) for s in FWD_POINTS
                    if s["d"] == MODS_POINT["d"] and s["N"] == MODS_POINT["N"] and s["causal"] in masks]
    if "decode" in groups:
        out += [job("decode", "step4_fused_pipelined", STEP4_SPLIT_KV, s) for s in DECODE_POINTS]
        out += [job("decode", p, "", s, kind="decode-peer") for p in PEERS for s in DECODE_POINTS]
    if "peers" in groups:
        out += [job("peers", p, "", s, kind="peer") for p in PEERS for s in FWD_POINTS]
    return out


def describe(j):
    label = j["name"] + (f":{j['variant']}" if j["variant"] else "") + (f" {j['flags']}" if j["flags"] else "")
    return sweep.describe(label, j["shape"]) + (" fwd+bwd" if j["backward"] or j["kind"] == "peer" else "")


def command(j, build):
    """What the point runs: the stage's command line, or what the peer times in this process."""
    if j["kind"] == "stage":
        cmd = sweep.stage_command(os.path.relpath(sweep.stage_exe(build, j["name"]), ROOT), j["shape"], j["variant"],
                                  j["backward"], False, "REC.jsonl", shlex.split(j["flags"]))
        env = "".join(f"{k}={v} " for k, v in j["env"].items())
        return env + shlex.join(cmd)
    s = j["shape"]
    if j["kind"] == "decode-peer":
        return (f"(PyTorch, in this process) SDPA {j['name'].split('_')[-1]} backend, forward: q [{s['B']}, {s['Hq']}, "
                f"{s['Nq']}, {s['d']}], k, v [{s['B']}, {s['Hkv']}, {s['Nk']}, {s['d']}], bottom-right causal")
    return (f"(PyTorch, in this process) SDPA {j['name'].split('_')[-1]} backend, forward and backward: "
            f"[{s['B']}, {s['Hq']}, {s['N']}, {s['d']}]" + (", is_causal" if s["causal"] else ""))


# ---- the estimate ---------------------------------------------------------------------------------------------

def reference_records(path):
    """{(name, variant, flags, mode, d, N, causal, B, Hkv, Nq): record} of a reference file, or {}."""
    if not path or not os.path.isfile(path):
        return {}
    with open(path) as f:
        data = json.load(f)
    return {key_of(r): r for r in data.get("records", []) if r.get("ms")}


def key_of(r, mode=None):
    return (r["name"], r.get("variant") or "", r.get("stage_flags", ""), mode or r["mode"], r["d"], r["N"],
            r["causal"], r["B"], r.get("Hkv"), r.get("Nq"))


def kernel_ms(j, mode, ref):
    """(ms, known, wall_s): the expected time of one run of the point's kernel (mode fwd, bwd or decode), whether
    the reference had it, and the wall time the reference's whole point took (a canonical run records it)."""
    s = j["shape"]
    probe = dict(name=j["name"], variant=j["variant"], stage_flags=j["flags"], **s)
    hit = ref.get(key_of(probe, mode))
    if hit is None:  # the same point of another variant of the stage (a decode run under "auto", say)
        near = [r for k, r in ref.items() if k[0] == j["name"] and k[2:] == key_of(probe, mode)[2:]]
        hit = near[0] if near else None
    if hit is not None:
        return hit["ms"], True, hit.get("wall_s")
    if mode == "decode":
        return sweep.decode_bytes(s)[0] / (GUESS_DECODE_GBPS * 1e9) * 1e3, False, None
    return sweep.flops(s, mode) / (GUESS_TFLOPS.get(j["name"], 250.0) * 1e12) * 1e3, False, None


def timed_runs_s(t_ms, overhead_ms):
    """Seconds the harness (or time_cuda) spends on one timed mode: 4 untimed runs, then 5 to 100 timed ones."""
    reps = min(100, max(5, int(300.0 / max(t_ms, 1e-3))))
    return (4 * t_ms + reps * (t_ms + overhead_ms)) / 1e3


def estimate(j, ref):
    """(seconds, known): the point's expected wall time, and whether it came from the reference: the wall time
    the reference's point took where it recorded one, else the model above with the reference's kernel times."""
    s = j["shape"]
    if j["kind"] in ("peer", "decode-peer"):
        modes = ["decode"] if j["kind"] == "decode-peer" else ["fwd", "bwd"]
        sec, known = PEER_POINT_S, True
        for m in modes:
            t, k, wall = kernel_ms(j, m, ref)
            if wall:
                return wall, True
            sec, known = sec + timed_runs_s(t, PEER_REP_OVERHEAD_MS) + t / 1e3, known and k
        return sec, known
    nq, nk, hkv = s.get("Nq", s["N"]), s.get("Nk", s["N"]), s.get("Hkv", s["Hq"])
    elements = s["B"] * s["d"] * (s["Hq"] * nq * (2 if j["backward"] else 1) + 2 * hkv * nk)
    sec = PROCESS_S + elements / INPUT_ELEMENTS_PER_S
    t_f, known, wall = kernel_ms(j, "decode" if "Nq" in s else "fwd", ref)
    if wall:
        return wall, True
    sec += t_f / 1e3 + timed_runs_s(t_f, REP_OVERHEAD_MS)
    if j["backward"]:
        t_b, k, _ = kernel_ms(j, "bwd", ref)
        sec += (t_f + t_b) / 1e3 + timed_runs_s(t_b, REP_OVERHEAD_MS)
        known = known and k
    if j["name"] == "step6_autotune":
        sec += TUNE_S["fwd"] + (TUNE_S["bwd"] if j["backward"] else 0.0)
    return sec, known


def start_s(groups):
    """The run's fixed costs before its points: the GPU check, step 7's probe, mma_peak, PyTorch, the copy roof."""
    sec = START_S["gpu_status"] + START_S["probes"] + START_S["mma_peak"]
    if "peers" in groups or "decode" in groups:
        sec += START_S["torch"]
    return sec + (START_S["copy_roof"] if "decode" in groups else 0.0)


def shown(path):
    """A path as the messages print it: from the repository root when it is inside, else as it is."""
    rel = os.path.relpath(os.path.abspath(path), ROOT)
    return path if rel.startswith("..") else rel


def minutes(sec):
    return f"{int(sec // 60)} min {int(round(sec % 60)):02d} s" if sec >= 60 else f"{sec:.0f} s"


# ---- the run --------------------------------------------------------------------------------------------------

def run_job(j, build, tp, before, lead, timeout, seed, tmp):
    """The records of one point (sweep.py's record format), each with the wall time of its point (wall_s).
    tmp: the run's scratch folder, for TMP in a point's environment."""
    t0 = time.monotonic()
    s = j["shape"]
    if j["kind"] == "peer":
        res = sweep.time_peer(tp, j["name"], s, seed=seed, before=before)
        recs = [sweep.record(j["name"], "peer", "", s, m, ms=ms, error=err, extra=dict(lead_cycles=lead))
                for m, (ms, err) in res.items()]
    elif j["kind"] == "decode-peer":
        ms, err, how = sweep.time_decode_peer(tp, j["name"], s, seed=seed, before=before)
        recs = [sweep.record(j["name"], "peer", "", s, "decode", ms=ms, error=err,
                             extra=dict(sweep.decode_fields(s, ms, how.get("kv_heads")), **how, lead_cycles=lead))]
    else:
        flags = shlex.split(j["flags"])
        rec, err = sweep.run_stage(sweep.stage_exe(build, j["name"]), s, j["variant"], j["backward"], False, timeout,
                                   flags, lead, env={k: v.replace("TMP", tmp, 1) for k, v in j["env"].items()})
        recs = [dict(r, lead_cycles=lead)
                for r in sweep.stage_records(j["name"], j["variant"], s, rec, err, j["backward"], flags)]
        for r in recs:
            if rec and rec.get("config") and "config" not in r:
                r["config"] = rec["config"]  # the configuration the variant ran on this GPU
            if rec and r["mode"] == "fwd" and rec.get("fwd_tflops") and flags:
                r["tflops"] = rec["fwd_tflops"]  # the harness's count: a window's is its visible pairs'
            if rec and not j["variant"]:
                r["variant"] = rec.get("variant") or ""
    wall = time.monotonic() - t0
    return [dict(r, wall_s=round(wall, 2)) for r in recs], rec if j["kind"] == "stage" else None


def compact(x):
    """Floats to 6 significant digits, so that the file stays small (docs/results has a budget)."""
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: compact(v) for k, v in x.items()}
    if isinstance(x, list):
        return [compact(v) for v in x]
    return x


def write_json(path, result):
    """The file: its facts one per line, then one line per record (diffs stay readable, the file small)."""
    head = {k: v for k, v in result.items() if k != "records"}
    lines = [f" {json.dumps(k)}: {json.dumps(compact(v))}," for k, v in head.items()]
    recs = ",\n".join("  " + json.dumps(compact(r)) for r in result["records"])
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("{\n" + "\n".join(lines) + '\n "records": [\n' + recs + "\n ]\n}\n")


def record_key(r):
    return sweep.record_key(r)


def parse(argv, prog):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[1],
                                 epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, metavar="DIR", help="the CMake build directory of the GPU stages (sm_90 for step 7)")
    ap.add_argument("--out", metavar="FILE", help="the JSON to write (default: docs/results/canonical-<gpu>.json)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print every point, its command and its expected time, and the total; run nothing")
    ap.add_argument("--only", nargs="+", choices=GROUPS, metavar="GROUP",
                    help=f"run these groups only ({', '.join(GROUPS)}; default: all)")
    ap.add_argument("--append", action="store_true",
                    help="merge into an existing --out file (a run split over calls with --only); "
                         "a point measured again replaces the old record")
    ap.add_argument("--timeout", type=int, default=300, metavar="S", help="seconds allowed per point (default: 300)")
    ap.add_argument("--lead-cycles", type=int, default=sweep.DEFAULT_LEAD, metavar="CYCLES",
                    help=f"the timing lead of stages and peers alike (sweep.py --lead-cycles; default: {sweep.DEFAULT_LEAD})")
    ap.add_argument("--dense-peak", type=float, metavar="TFLOPS",
                    help="the GPU's dense bf16 tensor-core peak, for a GPU DENSE_BF16_PEAKS does not know")
    ap.add_argument("--gpu-slug", metavar="NAME", help="the <gpu> of the file's name (default: from the device's name)")
    ap.add_argument("--estimate-from", metavar="FILE",
                    help="the run whose times the estimate uses (default: --out, or docs/results/canonical-<gpu>.json "
                         "with --gpu-slug, else canonical-h100.json)")
    a = ap.parse_args(argv)
    if a.timeout <= 0:
        ap.error("--timeout must be more than 0")
    if a.lead_cycles < 0:
        ap.error("--lead-cycles must be 0 or more")
    if a.dense_peak is not None and a.dense_peak <= 0:
        ap.error("--dense-peak must be more than 0")
    if a.gpu_slug is not None and not re.fullmatch(r"[a-z0-9][a-z0-9-]*", a.gpu_slug):
        ap.error(f"--gpu-slug {a.gpu_slug!r}: lower-case letters, digits and dashes only")
    if not os.path.isdir(a.build):
        ap.error(f"--build {a.build}: no such directory (build the GPU stages first: "
                 "CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90 ./run.sh build)")
    if a.estimate_from and not os.path.isfile(a.estimate_from):
        ap.error(f"--estimate-from {a.estimate_from}: no such file")
    if a.out and os.path.isdir(a.out):
        ap.error(f"--out {a.out} is a directory: name the JSON file")
    return ap, a


def default_out(slug):
    return os.path.join(ROOT, "docs", "results", f"canonical-{slug}.json")


def dry_run(a, jobs, groups):
    ref_path = a.estimate_from or a.out or default_out(a.gpu_slug or "h100")
    build = os.path.abspath(a.build)
    out = a.out or (default_out(a.gpu_slug) if a.gpu_slug else "docs/results/canonical-<gpu>.json")
    print(f"canonical run: {len(jobs)} points with the build {a.build}, into {shown(out) if os.path.isabs(out) else out}")
    missing = sorted({j["name"] for j in jobs if j["kind"] == "stage" and not os.path.exists(sweep.stage_exe(build, j["name"]))})
    if missing:
        print(f"  (not in this build, so the run would stop: {', '.join(missing)})")
    print_plan(jobs, groups, ref_path, a.build)
    return 0


def print_plan(jobs, groups, ref_path, build):
    """The dry run's listing: the fixed costs, then every point with its expected time and its command, then the
    total by group and where the times came from (ref_path, a canonical run). Returns the total in seconds."""
    ref = reference_records(ref_path)
    total, by_group, guessed = start_s(groups), {}, 0
    print(f"  before the points: the GPU check, step 7's probe, mma_peak, PyTorch{' and the copy roof' if 'decode' in groups else ''}"
          f": ~{start_s(groups):.0f} s")
    for i, j in enumerate(jobs, 1):
        sec, known = estimate(j, ref)
        total += sec
        by_group[j["group"]] = by_group.get(j["group"], 0.0) + sec
        guessed += not known
        print(f"  [{i:3d}/{len(jobs)}] {j['group']:8s} {describe(j):62s} ~{sec:5.1f} s{'' if known else '*'}  {command(j, build)}")
    src = shown(ref_path) if ref else "none"
    print(f"estimate: {minutes(total)} of GPU time (" + ", ".join(f"{g} {minutes(t)}" for g, t in by_group.items())
          + f"); kernel times from {src}" + (f", {guessed} points (*) from guessed TFLOP/s" if guessed else ""))
    return total


def run_points(jobs, plan_s, build, tp, before, lead, timeout, label):
    """Runs the points in order, each printed as it ends (sweep.py's progress line), with its wall time against
    the plan's and the time left: the rest of the plan (plan_s, from estimate()), scaled by how the run has gone
    so far. label: the group's prefix of each line. Returns (records, the first harness record, seconds)."""
    t0, recs, harness, tmp = time.monotonic(), [], {}, tempfile.mkdtemp(prefix="fa-canonical-")
    for i, j in enumerate(jobs, 1):
        new, rec = run_job(j, build, tp, before, lead, timeout, seed=i, tmp=tmp)
        harness = harness or rec or {}
        recs += new
        done = time.monotonic() - t0
        left = sum(plan_s[i:]) * (done / max(sum(plan_s[:i]), 1e-3))  # the plan, scaled by how it went so far
        sweep.progress(i, len(jobs), f"{label(j)}: {describe(j)}", new)
        print(f"        {new[0]['wall_s']:.1f} s (planned {plan_s[i - 1]:.1f}); {minutes(done)} so far, "
              f"about {minutes(left)} left", flush=True)
    return recs, harness, time.monotonic() - t0


def main(argv=None, prog="canonical.py"):
    ap, a = parse(sys.argv[1:] if argv is None else argv, prog)
    groups = a.only or GROUPS
    jobs = plan(groups)
    if a.dry_run:
        return dry_run(a, jobs, groups)

    build = os.path.abspath(a.build)
    names = sorted({j["name"] for j in jobs if j["kind"] == "stage"})
    missing = [n for n in names if not os.path.exists(sweep.stage_exe(build, n))]
    peak_exe = os.path.join(build, "docs", "bench", "mma_peak")
    if not os.path.exists(peak_exe):
        missing.append("docs/bench/mma_peak")
    if missing:
        ap.error(f"not in the build {a.build}: {', '.join(missing)} (build the GPU stages for this GPU: "
                 "CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90 ./run.sh build; step 7 needs 90)")
    sweep.require_gpu(build)  # exit 1 with the reason when no GPU can run the stages
    left_out = {}
    if "step7_hopper_wgmma" in names:
        why = sweep.unavailable(sweep.stage_exe(build, "step7_hopper_wgmma"), STEP7_DEFAULT, a.timeout)
        if why:  # a GPU other than a Hopper: the rest of the run is still this GPU's canonical run
            print(f"canonical: step 7 left out: {why}", flush=True)
            left_out["step7_hopper_wgmma"] = why
            jobs = [j for j in jobs if j["name"] != "step7_hopper_wgmma"]
    peak = sweep.mma_peak(build, a.timeout)
    if not peak or not peak.get("tflops"):
        sys.exit("canonical: mma_peak measured no ceiling (its output is above)")
    smi = sweep.sh(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).splitlines()
    smi = [x.strip() for x in smi[0].split(",")] if smi else ["", ""]
    gpu = peak.get("device") or smi[0] or "unknown GPU"
    dense, dense_source = (a.dense_peak, "--dense-peak") if a.dense_peak else dense_peak(gpu)
    if dense is None:
        ap.error(f"the dense bf16 peak of the {gpu} is not in DENSE_BF16_PEAKS (docs/bench/canonical.py): "
                 "give it with --dense-peak TFLOPS (NVIDIA's data sheet, dense, without sparsity)")
    slug = a.gpu_slug or gpu_slug(gpu)
    out = a.out or default_out(slug)
    old = None
    if a.append and os.path.exists(out):
        with open(out) as f:
            old = json.load(f)
        if old.get("gpu") != gpu:
            ap.error(f"--append: {out} is a run on the {old.get('gpu')}, this GPU is the {gpu}")
    ref = reference_records(a.estimate_from or out)
    need_torch = any(j["kind"] != "stage" for j in jobs)
    tp = sweep.load_torch() if need_torch else None
    if need_torch and not tp:
        sys.exit("canonical: the peers and the decode roof need PyTorch with CUDA in this Python "
                 f"({sys.executable}); run it with one, or leave them out with --only")
    before, copy_gbps, copy_how = None, None, None
    if tp:
        torch = tp[0]
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
        before = sweep.make_before(torch, torch.empty(2 * l2, dtype=torch.uint8, device="cuda"), a.lead_cycles)
        if "decode" in groups:
            copy_gbps, copy_how = sweep.copy_roof(torch, before)
            print(f"copy roof: {copy_gbps:.0f} GB/s ({copy_how})", flush=True)

    plan_s = [estimate(j, ref)[0] for j in jobs]
    print(f"canonical: {len(jobs)} points on the {gpu}, about {minutes(start_s(groups) + sum(plan_s))} in all; "
          f"into {shown(out)}", flush=True)
    recs, harness, elapsed = run_points(jobs, plan_s, build, tp, before, a.lead_cycles, a.timeout, lambda j: j["group"])

    now = datetime.datetime.now(datetime.timezone.utc)
    result = dict(
        canonical=1, gpu=gpu, gpu_slug=slug, date=now.strftime("%Y-%m-%d %H:%M UTC"),
        driver=smi[1], cuda=peak.get("cuda") or harness.get("cuda") or "", torch=tp[0].__version__ if tp else None,
        git=sweep.sh(["git", "describe", "--always", "--dirty"]) or "unknown", build_git=harness.get("git"),
        command=shlex.join(["python3", "docs/bench/sweep.py", "--canonical"] + (sys.argv[1:] if argv is None else argv)),
        sol=dict(dense_bf16_tflops=dense, dense_source=dense_source, mma_sync_tflops=peak["tflops"],
                 mma_sync_source="docs/bench/mma_peak.cu, measured at the start of this run"),
        dtype="bf16", tokens=sweep.TOKENS, width=sweep.WIDTH, lead_cycles=a.lead_cycles,
        convention="TFLOP/s: fwd = 4*B*Hq*N*N*d (halved when causal; with --window, 4*B*Hq*d * the visible pairs); "
                   "bwd = 2.5x fwd; B*N = 16384, Hq*d = 2048. decode: GB/s = (Q + K + V read, O written) bytes / time, "
                   "K and V once per KV head (sweep.py --decode); copy_gbps is the same run's device copy.",
        copy_gbps=copy_gbps, copy_method=copy_how, peer_timing=sweep.PEER_TIMING if tp else None,
        plan=dict(groups=groups, fwd_seqs=FWD_SEQS, mods=[f for f, _ in MODS], mods_point=MODS_POINT, decode=DECODE,
                  step4_substeps=STEP4_SUBSTEPS, step4_split_kv=STEP4_SPLIT_KV, step4_mods=STEP4_MODS,
                  step5=STEP5_VARIANTS, step6=STEP6_VARIANT, step7=STEP7_SUBSTEPS + [STEP7_DEFAULT], peers=PEERS),
        left_out=left_out, elapsed_s=round(elapsed, 1), records=recs)
    if old:
        mine = {record_key(r) for r in recs}
        result["records"] = [r for r in old["records"] if record_key(r) not in mine] + recs
        result["copy_gbps"] = copy_gbps or old.get("copy_gbps")
        result["copy_method"] = copy_how or old.get("copy_method")
        result["torch"] = result["torch"] or old.get("torch")
        result["plan"]["groups"] = sorted(set(groups) | set(old.get("plan", {}).get("groups", [])), key=GROUPS.index)
        result["elapsed_s"] = round(result["elapsed_s"] + (old.get("elapsed_s") or 0), 1)
        result["command"] = f"{old.get('command')} && {result['command']}"  # the calls, in order
    write_json(out, result)
    failed = [r for r in result["records"] if r.get("error")]
    print(f"wrote {shown(out)}: {len(result['records'])} records, {len(failed)} failed; "
          f"{minutes(elapsed)} of points. Next: /usr/bin/python3 docs/bench/pages.py --write --plot")
    for r in failed:
        print(f"  failed: {r['name']} {r['variant']} {r.get('stage_flags', '')} d={r['d']} N={r['N']} "
              f"{r['mode']}: {r['error']}")
    return 1 if recs and all(r.get("error") for r in recs) else 0


if __name__ == "__main__":
    sys.exit(main())
