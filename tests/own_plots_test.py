#!/usr/bin/env python3
"""FlashAttention, step by step — tests/own_plots_test.py: `./run.sh plots` without a GPU (ctest OwnPlots).

    own_plots_test.py        run every check; exit 1 with what failed

What a machine without a GPU (CI) can check of ./run.sh plots (docs/bench/own_plots.py):
  - ./run.sh help and ./run.sh plots --help describe it;
  - --dry-run lists the short run's points (and --full's, more of them), each with its command, and the
    estimate from the committed H100 run, building nothing;
  - a bad argument is one line on stderr and exit 2, before any build (BUILD_DIR is a folder that must
    stay absent); without a GPU (nvidia-smi finds none), ./run.sh plots says so in one line, exit 2;
  - the run itself against a fake build (scripts standing for the stage executables, the tour and mma_peak,
    writing the harness's records; step 7 refusing as on a GPU that is not a Hopper): the progress lines
    with the time left, step 7 left out in one line, the run's JSON, and the three plots, into a scratch
    folder, beside the committed canonical run.
What it cannot check: timing on a GPU, PyTorch's peers (--no-peers here), a real build's executables.
"""
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAILED = []

# The fake build: one script for every executable, telling which by its name.
FAKE = r'''#!PYTHON
import json, os, sys
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
def arg(flag, default=None):
    return args[args.index(flag) + 1] if flag in args else default
if name == "flashattention_tour":
    print("NVIDIA Fake GPU")  # --gpu-status: usable
    sys.exit(0)
if name == "mma_peak":
    with open(arg("--json"), "w") as f:
        f.write(json.dumps(dict(device="NVIDIA Fake GPU", cuda="0.0", tflops=400.0)) + "\n")
    print("mma.sync bf16: 400.0 TFLOP/s (fake)")
    sys.exit(0)
if "--bench" not in args:  # the probe of sweep.unavailable and sweep.has_backward
    if name == "step7_hopper_wgmma":
        sys.exit(name + " needs a CUDA GPU: sm_90 only (fake: an sm_120 GPU)")
    sys.exit(0)
B, H, N, d = (int(arg(f)) for f in ("--batch", "--heads", "--seq", "--dim"))
flops = 4.0 * B * H * N * N * d / (2 if "--causal" in args else 1)
rate = {"step3_naive_kernel": 2e12, "step4_fused_pipelined": 200e12, "step5_backward": 200e12}[name]
rec = dict(stage=name, variant=arg("--variant", ""), device="NVIDIA Fake GPU", cuda="0.0", git="fake",
           fwd_ms=flops / rate * 1e3)
if "--backward" in args:
    rec["bwd_ms"] = 2.5 * flops / (0.6 * rate) * 1e3
with open(arg("--json"), "a") as f:
    f.write(json.dumps(rec) + "\n")
'''
STAGES = ["step3_naive_kernel", "step4_fused_pipelined", "step5_backward", "step6_autotune", "step7_hopper_wgmma"]


def check(what, ok, detail=""):
    print(("ok     " if ok else "FAILED ") + what)
    if not ok:
        FAILED.append(what + (f"\n{detail}" if detail else ""))


def run(cmd, env=None, timeout=300):
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout, p.stderr


def shown(rc, out, err):
    return f"exit {rc}\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}"


def tree_status():
    """What a check must leave as it found it: git's view of the tracked and untracked files, and what the
    ignored plots/ holds (the folder the command writes by default). Not the rest of what git ignores: the
    build folders, where ctest itself writes while this test runs beside others."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                            capture_output=True, text=True).stdout
    plots = []
    for d, _, files in os.walk(os.path.join(ROOT, "plots")):
        plots += sorted(os.path.relpath(os.path.join(d, f), ROOT) for f in files)
    return status + "\n".join(plots)


def fake_build(folder):
    script = FAKE.replace("PYTHON", sys.executable, 1)
    paths = [os.path.join(folder, "flashattention_tour"), os.path.join(folder, "docs", "bench", "mma_peak")]
    paths += [os.path.join(folder, s, s) for s in STAGES]
    for p in paths:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(script)
        os.chmod(p, os.stat(p).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def main():
    tmp = tempfile.mkdtemp(prefix="fa-own-plots-")
    no_build = os.path.join(tmp, "no-build")  # BUILD_DIR of the run.sh calls: nothing may create it
    env = dict(BUILD_DIR=no_build)
    before = tree_status()
    try:
        rc, out, err = run(["./run.sh", "help"])
        check("./run.sh help describes plots", rc == 0 and "plots [FLAGS]" in out and "--dry-run" in out, shown(rc, out, err))
        rc, out, err = run(["./run.sh", "plots", "--help"], env)
        check("./run.sh plots --help: exit 0, the flags and the short run's points",
              rc == 0 and all(w in out for w in ("--full", "--dry-run", "--out", "N = 1k, 4k, 16k", "sm_90")),
              shown(rc, out, err))

        counts = {}
        for flags in ([], ["--full"]):
            rc, out, err = run(["./run.sh", "plots", "--dry-run"] + flags, env)
            what = " ".join(["./run.sh plots --dry-run"] + flags)
            points = re.findall(r"^ +\[ *\d+/(\d+)\] ", out, re.M)
            counts[tuple(flags)] = len(points)
            check(f"{what}: exit 0, every point listed with its command",
                  rc == 0 and points and len(points) == int(points[0]) and out.count("--json REC.jsonl") > 0,
                  shown(rc, out, err))
            check(f"{what}: the estimate, from the committed H100 run",
                  re.search(r"^estimate: .* of GPU time .*kernel times from docs/results/canonical-h100\.json", out, re.M)
                  is not None, shown(rc, out, err))
        short = run(["./run.sh", "plots", "--dry-run"], env)[1]
        check("the short run: steps 3, 4 (4d), 5 (deterministic), 7 (auto) and both peers, at d = 64, 128, "
              "N = 1k, 4k, 16k, causal and not",
              all(s in short for s in ("step3_naive_kernel d=64 N=1024 non-causal", "step4_fused_pipelined:4d-tma d=128 N=16384 causal",
                                       "step5_backward:deterministic d=64 N=4096 causal fwd+bwd",
                                       "step7_hopper_wgmma:auto d=128 N=4096 non-causal",
                                       "torch_sdpa_flash d=64 N=1024", "torch_sdpa_cudnn d=128 N=16384 causal"))
              and "4a-padded" not in short and counts[()] == 72, short[-2000:])
        check("--full has more points than the short run", counts[("--full",)] > counts[()], str(counts))

        bad = [["--bogus"], ["--timeout", "0"], ["--out", "docs/results"], ["--replot", "no-such.json"],
               ["--full", "--replot", "docs/results/canonical-h100.json"], ["--compare", "no-such.json"]]
        for flags in bad:
            rc, out, err = run(["./run.sh", "plots"] + flags, env)
            check(f"./run.sh plots {' '.join(flags)}: one line, exit 2",
                  rc == 2 and not out and len(err.strip().splitlines()) == 1, shown(rc, out, err))

        gpu = subprocess.run(["sh", "-c", "nvidia-smi -L"], capture_output=True, text=True)
        if gpu.returncode != 0 or "GPU" not in gpu.stdout:
            rc, out, err = run(["./run.sh", "plots"], env)
            check("./run.sh plots without a GPU: one line, exit 2, before any build",
                  rc == 2 and not out and len(err.strip().splitlines()) == 1 and "--dry-run" in err, shown(rc, out, err))
        else:
            print("skip   ./run.sh plots without a GPU: this machine has one")
        check("no build was started (BUILD_DIR stays absent)", not os.path.exists(no_build))

        # The run, against the fake build.
        fake, out_dir = os.path.join(tmp, "fake-build"), os.path.join(tmp, "plots")
        fake_build(fake)
        rc, out, err = run([sys.executable, "docs/bench/own_plots.py", "--build", fake, "--out", out_dir, "--no-peers"],
                           )
        check("the run on the fake build: exit 0", rc == 0, shown(rc, out, err))
        check("step 7 left out in one line, with the stage's reason",
              re.search(r"^run\.sh plots: step 7's 12 points left out: sm_90 only", out, re.M) is not None, shown(rc, out, err))
        progress = re.findall(r"^\[(\d+)/(\d+)\] ", out, re.M)
        left = re.findall(r"so far, about .* left$", out, re.M)
        check("a progress line for every point, each with the time left",
              len(progress) == 36 and progress[-1] == ("36", "36") and len(left) == 36, shown(rc, out, err))
        wrote = ["run-fake.json", "staircase-fake.png", "sweep-fake-fwd.png", "sweep-fake-bwd.png"]
        check("it wrote the run and the three plots, and printed where",
              all(os.path.getsize(os.path.join(out_dir, w)) > 1000 and w in out for w in wrote), shown(rc, out, err))
        if os.path.exists(os.path.join(out_dir, wrote[0])):
            with open(os.path.join(out_dir, wrote[0])) as f:
                data = json.load(f)
            recs = data["records"]
            check("the run's JSON: 48 records (step 5 forward and backward), step 7 in left_out, no speed of light",
                  len(recs) == 48 and not any(r.get("error") for r in recs) and "step7_hopper_wgmma" in data["left_out"]
                  and data["sol"]["dense_bf16_tflops"] is None and data["sol"]["mma_sync_tflops"] == 400.0,
                  json.dumps({k: v for k, v in data.items() if k != "records"})[:2000])
        rc, out, err = run([sys.executable, "docs/bench/own_plots.py", "--replot", os.path.join(out_dir, wrote[0]),
                            "--out", os.path.join(tmp, "again")])
        check("--replot draws the plots of the run again", rc == 0 and all(
            os.path.exists(os.path.join(tmp, "again", w)) for w in wrote[1:]), shown(rc, out, err))
        check("nothing written into the tree", tree_status() == before, f"before:\n{before}\nafter:\n{tree_status()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILED:
        print(f"\n{len(FAILED)} FAILED:\n" + "\n".join(FAILED))
        return 1
    print("\nevery check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
