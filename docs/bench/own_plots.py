#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/own_plots.py: your GPU's plots in one command, `./run.sh plots`.

    ./run.sh plots               build, time the short run on this GPU, draw its plots beside the committed ones
    ./run.sh plots --full        the same with every sub-step, step 5's atomic variant and step 6 (tuning)
    ./run.sh plots --dry-run     anywhere, without a GPU or a build: every point, its command and its time

The short run (the default, about 2 minutes on an H100) times the stages' defaults, each chapter's last word:
step 3, step 4 (4d-tma), step 5 (deterministic: forward and backward) and step 7 (auto; Hopper only), and
PyTorch's SDPA flash and cuDNN backends when this Python imports torch with CUDA, at the 12 shapes of the
committed canonical run's forward: d = 64, 128; N = 1k, 4k, 16k (B*N = 16384, Hq*d = 2048); causal and not;
bf16. The same shapes, so that each of your numbers has the H100's beside it; the stages' defaults, because
the lesson sub-steps, step 5's atomic variant and step 6's tuning (tens of seconds a point from an empty
cache) more than double the time. --full runs them too: the canonical run's points (docs/bench/canonical.py)
less its score modifiers and decoding, which these plots do not draw.

Each point runs as the canonical run's do (docs/bench/canonical.py: one process per stage point, the L2 flushed
and the same timing lead before each timed run) and prints its result as it ends, with the time so far and
an estimate of the time left: the plan's times from a committed run (canonical-<gpu>.json of this GPU kind
where one exists, else the H100's), scaled by how the run has gone so far. Step 7 runs only on sm_90 (an
H100 or H200): elsewhere its points are left out, with the reason in one line.

What it writes, into plots/<gpu>/ (plots/<gpu>-full/ with --full; git ignores plots/), and prints at the end:
  run-<gpu>.json            every record, in the canonical run's format
  staircase-<gpu>.png       the README's staircase (docs/bench/pages.py) at d = 128, N = 4k: your bars, the
                            committed run's level as a dashed outline over each
  sweep-<gpu>-fwd.png, -bwd.png   TFLOP/s against N, four panels (d x mask), as docs/bench/plot.py draws
                            the committed sweeps: your lines, and the committed run's faint and dotted
Exit status: 0 done; 1 every point failed; 2 bad arguments, or no GPU that can run the stages.
"""
import argparse
import datetime
import importlib.util
import json
import os
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import canonical  # noqa: E402  (the plan, the estimate, the run loop, the file format)
import sweep  # noqa: E402

ROOT = sweep.ROOT
PROG = "run.sh plots"
COMPARE = "docs/results/canonical-h100.json"  # the committed run drawn beside yours

# The short run: the stages' defaults at the forward's 12 shapes, then the peers there.
S3, S4, S5, S7 = "step3_naive_kernel", "step4_fused_pipelined", "step5_backward", "step7_hopper_wgmma"
SHORT = [("forward", S3, "", False), ("forward", S4, canonical.STEP4_SUBSTEPS[-1], False),
         ("step7", S7, canonical.STEP7_DEFAULT, False), ("backward", S5, canonical.STEP5_VARIANTS[0], True)]
FULL_GROUPS = ["forward", "step7", "backward", "step6", "peers"]  # canonical.GROUPS less mods and decode
# The series of the plots over N (the staircase shows every sub-step): the stages' defaults, step 5's
# atomic variant where the run has it, the peers; step 5's forward is step 4d's kernel, left out as in the
# committed sweeps.
SERIES = {(S3, "", "fwd"), (S4, canonical.STEP4_SUBSTEPS[-1], "fwd"), (S7, canonical.STEP7_DEFAULT, "fwd")} | \
    {(S5, v, "bwd") for v in canonical.STEP5_VARIANTS} | {(p, "", m) for p in canonical.PEERS for m in ("fwd", "bwd")}


def plan(full):
    """The points, in the order they run."""
    if full:
        return canonical.plan(FULL_GROUPS), FULL_GROUPS
    jobs = [canonical.job(g, name, variant, s, backward=bwd) for g, name, variant, bwd in SHORT for s in canonical.FWD_POINTS]
    jobs += [canonical.job("peers", p, "", s, kind="peer") for p in canonical.PEERS for s in canonical.FWD_POINTS]
    return jobs, ["forward", "step7", "backward", "peers"]


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        print(f"{PROG}: {message} (./run.sh plots --help lists the options)", file=sys.stderr)
        sys.exit(2)


def parse(argv):
    ap = Parser(prog="./run.sh plots", description=__doc__.split("\n\n")[1],
                epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true",
                    help="also the sub-steps (4a-4c, 7a-7d), step 5's atomic variant and step 6 tuned")
    ap.add_argument("--dry-run", action="store_true",
                    help="print every point, its command and its expected time, and the total; build and run nothing")
    ap.add_argument("--no-peers", action="store_true",
                    help="leave PyTorch's SDPA out, even where this Python imports torch with CUDA")
    ap.add_argument("--out", metavar="DIR", help="where the files go (default: plots/<gpu>/, plots/<gpu>-full/ with "
                                                 "--full); a folder with committed files is refused")
    ap.add_argument("--compare", metavar="FILE", default=COMPARE,
                    help=f"the run drawn beside yours, in the canonical format (default: {COMPARE})")
    ap.add_argument("--timeout", type=int, default=300, metavar="S", help="seconds allowed per point (default: 300)")
    ap.add_argument("--replot", metavar="RUN_JSON",
                    help="draw the plots of an earlier run's run-<gpu>.json again (no GPU needed; into --out, "
                         "default: beside it)")
    ap.add_argument("--build", default="build", metavar="DIR",
                    help="the build folder (run.sh passes $BUILD_DIR; default: build)")
    ap.add_argument("--check-args", action="store_true", help=argparse.SUPPRESS)  # run.sh: before the build
    a = ap.parse_args(argv)
    if a.timeout <= 0:
        ap.error("--timeout must be more than 0")
    if a.replot and (a.full or a.dry_run):
        ap.error("--replot draws an earlier run: no --full or --dry-run with it")
    if a.replot and not os.path.isfile(a.replot):
        ap.error(f"--replot {a.replot}: no such file")
    if not os.path.isfile(a.compare if os.path.isabs(a.compare) else os.path.join(ROOT, a.compare)):
        ap.error(f"--compare {a.compare}: no such file")
    if a.out:
        if os.path.exists(a.out) and not os.path.isdir(a.out):
            ap.error(f"--out {a.out} is a file: name a folder")
        tracked = committed(a.out)
        if tracked:
            ap.error(f"--out {a.out} holds committed files ({tracked[0]}, ...): the run must not overwrite "
                     "them; name another folder")
    return a


def committed(folder):
    """The files git tracks under folder (inside the repository), or []."""
    path = os.path.abspath(folder)
    if os.path.relpath(path, ROOT).startswith(".."):
        return []
    r = subprocess.run(["git", "-C", ROOT, "ls-files", "--", path], capture_output=True, text=True)
    return r.stdout.split() if r.returncode == 0 else []


def abs_root(path):
    return path if os.path.isabs(path) else os.path.join(ROOT, path)


# ---- what this machine has ------------------------------------------------------------------------------------

def gpu_name():
    """The first GPU nvidia-smi names, or ""."""
    out = sweep.sh(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]).splitlines()
    return out[0].strip() if out else ""


def estimate_file(slug):
    """The committed run whose times the estimate uses: this GPU kind's, else the H100's."""
    own = canonical.default_out(slug) if slug else None
    return own if own and os.path.isfile(own) else canonical.default_out("h100")


def has_torch():
    return importlib.util.find_spec("torch") is not None


# ---- the dry run ----------------------------------------------------------------------------------------------

def dry_run(a, jobs, groups):
    name = gpu_name()
    slug = canonical.gpu_slug(name) if name else None
    ref = estimate_file(slug)
    out = a.out or f"plots/{slug or '<gpu>'}{'-full' if a.full else ''}/"
    print(f"{PROG}{' --full' if a.full else ''}: {len(jobs)} points, into {out} (a dry run: nothing is built or run)")
    total = canonical.print_plan(jobs, groups, ref, a.build)
    n7 = sum(j["name"] == S7 for j in jobs)
    npeer = sum(j["kind"] == "peer" for j in jobs)
    with open(ref) as f:
        ref_gpu = json.load(f)["gpu"]
    print(f"  the GPU here: {name or 'none (nvidia-smi finds no GPU)'}; the estimate is for the {ref_gpu}, "
          f"from the times of {canonical.shown(ref)}")
    print(f"  step 7's {n7} points run on sm_90 only (an H100 or H200); on another GPU they are left out, with the reason")
    if npeer:
        print(f"  the peers' {npeer} points need PyTorch with CUDA in this Python ({sys.executable}): "
              + ("torch is importable here" if has_torch() else "no torch here, so they would be left out"))
    print(f"then: run-<gpu>.json, staircase-<gpu>.png, sweep-<gpu>-fwd.png and -bwd.png in {out}, beside "
          f"{a.compare}; about {canonical.minutes(total)} in all on the {ref_gpu}, plus the build")
    return 0


# ---- the run --------------------------------------------------------------------------------------------------

def fail(message):
    print(f"{PROG}: {message}", file=sys.stderr)
    sys.exit(2)


def run(a, jobs, groups):
    build = os.path.abspath(a.build)
    tour = os.path.join(build, "flashattention_tour")
    if not os.path.exists(tour):
        fail(f"no build in {a.build} ({tour} does not exist): ./run.sh plots builds it")
    r = subprocess.run([tour, "--gpu-status"], capture_output=True, text=True, timeout=60)
    if r.returncode == 1:  # 0: usable; 1: not, and why
        fail(f"no GPU here can run the stages: {r.stdout.strip()} (./run.sh plots --dry-run shows what it would run)")
    left_out = {}
    for name in sorted({j["name"] for j in jobs if j["kind"] == "stage"}):
        exe = sweep.stage_exe(build, name)
        if not os.path.exists(exe):
            if name != S7:
                fail(f"{a.build} has no {name} ({exe}): a build without the GPU stages? "
                     "(CMAKE_ARGS=-DFA_WITH_CUDA=OFF leaves them out)")
            why = "not in this build: step 7 is built only when 90 (an H100 or H200) is among the CUDA architectures"
        else:  # step 7 asks for a Hopper GPU; the others run on any GPU the tour accepted
            why = sweep.unavailable(exe, canonical.STEP7_DEFAULT, a.timeout) if name == S7 else ""
        if why:
            n = sum(j["name"] == name for j in jobs)
            print(f"{PROG}: step 7's {n} points left out: {why}" if name == S7 else
                  f"{PROG}: {name}'s {n} points left out: {why}", flush=True)
            left_out[name] = why
    jobs = [j for j in jobs if j["name"] not in left_out]
    tp = sweep.load_torch() if any(j["kind"] == "peer" for j in jobs) else None
    if any(j["kind"] == "peer" for j in jobs) and not tp:
        why = f"no PyTorch with CUDA in this Python ({sys.executable}; PYTHON=... ./run.sh plots picks another)"
        print(f"{PROG}: the peers' {sum(j['kind'] == 'peer' for j in jobs)} points left out: {why}", flush=True)
        left_out.update({p: why for p in canonical.PEERS})
        jobs = [j for j in jobs if j["kind"] != "peer"]
    before = None
    if tp:
        torch = tp[0]
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
        before = sweep.make_before(torch, torch.empty(2 * l2, dtype=torch.uint8, device="cuda"), sweep.DEFAULT_LEAD)
    peak = sweep.mma_peak(build, a.timeout) or {}
    smi = sweep.sh(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).splitlines()
    smi = [x.strip() for x in smi[0].split(",")] if smi else ["", ""]
    gpu = peak.get("device") or smi[0] or "unknown GPU"
    slug = canonical.gpu_slug(gpu)
    out_dir = a.out or os.path.join(ROOT, "plots", slug + ("-full" if a.full else ""))
    ref_path = estimate_file(slug)
    ref = canonical.reference_records(ref_path)
    plan_s = [canonical.estimate(j, ref)[0] for j in jobs]
    print(f"{PROG}: {len(jobs)} points on the {gpu}, about {canonical.minutes(sum(plan_s))} by the times of "
          f"{canonical.shown(ref_path)}; into {canonical.shown(out_dir)}", flush=True)
    recs, harness, elapsed = canonical.run_points(jobs, plan_s, build, tp, before, sweep.DEFAULT_LEAD, a.timeout,
                                                  lambda j: j["group"])
    dense, dense_source = canonical.dense_peak(gpu)
    now = datetime.datetime.now(datetime.timezone.utc)
    result = dict(
        own_plots="full" if a.full else "short", gpu=gpu, gpu_slug=slug, date=now.strftime("%Y-%m-%d %H:%M UTC"),
        driver=smi[1], cuda=peak.get("cuda") or harness.get("cuda") or "", torch=tp[0].__version__ if tp else None,
        git=sweep.sh(["git", "describe", "--always", "--dirty"]) or "unknown", build_git=harness.get("git"),
        command=shlex.join(["./run.sh", "plots"] + [x for x in sys.argv[1:] if x != "--build" and x != a.build]),
        sol=dict(dense_bf16_tflops=dense, dense_source=dense_source, mma_sync_tflops=peak.get("tflops"),
                 mma_sync_source="docs/bench/mma_peak.cu, measured at the start of this run"),
        dtype="bf16", tokens=sweep.TOKENS, width=sweep.WIDTH, lead_cycles=sweep.DEFAULT_LEAD,
        peer_timing=sweep.PEER_TIMING if tp else None, left_out=left_out, elapsed_s=round(elapsed, 1),
        records=recs)
    path = os.path.join(out_dir, f"run-{slug}.json")
    canonical.write_json(path, result)
    failed = [r for r in recs if r.get("error")]
    print(f"{PROG}: {len(recs)} records, {len(failed)} failed, in {canonical.minutes(elapsed)}")
    for r in failed:
        print(f"  failed: {r['name']} {r['variant']} d={r['d']} N={r['N']} {r['mode']}: {r['error']}")
    print(f"{PROG}: wrote {canonical.shown(path)}")
    draw(path, out_dir, a.compare)
    return 1 if recs and len(failed) == len(recs) else 0


# ---- the plots ------------------------------------------------------------------------------------------------

def as_sweep(data):
    """A canonical-format run as the sweep JSON plot.py draws: the plain points of SERIES (no score modifier,
    no decoding), the mma.sync ceiling of the run."""
    recs = [r for r in data["records"] if "Nq" not in r and not r.get("stage_flags")
            and (r["name"], r.get("variant") or "", r["mode"]) in SERIES]
    return dict(gpu=data["gpu"], date=data["date"], git=data.get("git") or "?", build_git=data.get("build_git"),
                dtype=data.get("dtype", "bf16"), tokens=data.get("tokens", sweep.TOKENS),
                width=data.get("width", sweep.WIDTH), mma_peak_tflops=(data.get("sol") or {}).get("mma_sync_tflops"),
                records=recs)


def draw(path, out_dir, compare):
    """The staircase and the plots over N of the run in path, into out_dir, each beside compare; in a Python
    with matplotlib (this one, else Debian's /usr/bin/python3). Prints what it wrote."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        other = "/usr/bin/python3"
        cmd = [other, os.path.abspath(__file__), "--replot", path, "--out", out_dir, "--compare", compare]
        if os.path.abspath(sys.executable) != other and os.path.exists(other) and \
                subprocess.run([other, "-c", "import matplotlib"], capture_output=True).returncode == 0:
            subprocess.run(cmd, check=True)
            return
        print(f"{PROG}: no matplotlib in {sys.executable} or {other}, so no plots: wrote {canonical.shown(path)}; "
              f"draw them with a Python that has it: {shlex.join(['python3'] + cmd[1:])}")
        return
    import pages
    import plot

    os.makedirs(out_dir, exist_ok=True)
    run = pages.Run(None, path=canonical.shown(path))
    ref = pages.Run(None, path=canonical.shown(abs_root(compare)))
    slug = run.data.get("gpu_slug") or canonical.gpu_slug(run.gpu)
    stair = os.path.join(out_dir, f"staircase-{slug}.png")
    pages.plot(run, stair, ref=ref)
    written = [stair]
    mine, theirs = as_sweep(run.data), as_sweep(ref.data)
    for mode in plot.MODES:
        if plot.has_stage(mine, mode):
            png = os.path.join(out_dir, f"sweep-{slug}-{mode}.png")
            plot.plot(mine, mode, png, ref=theirs, ref_what=f"the committed run {ref.path}")
            written.append(png)
    print(f"{PROG}: wrote, beside the committed {ref.path}:")
    for p in written:
        print(f"  {canonical.shown(p)}")


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.check_args:
        return 0
    if a.replot:
        draw(a.replot, a.out or os.path.dirname(os.path.abspath(a.replot)), a.compare)
        return 0
    jobs, groups = plan(a.full)
    if a.no_peers:
        jobs = [j for j in jobs if j["kind"] != "peer"]
        groups = [g for g in groups if g != "peers"]
    if a.dry_run:
        return dry_run(a, jobs, groups)
    return run(a, jobs, groups)


if __name__ == "__main__":
    sys.exit(main())
