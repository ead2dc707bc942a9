#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/pages.py: the pages' numbers, generated from the canonical run.

    pages.py                 print every generated block
    pages.py --write         rewrite the blocks of the pages (nothing else of them) from the canonical file
    pages.py --check         exit 1, with a diff, where a page's block is not what the file gives (ctest GeneratedPages)
    pages.py --plot          draw the staircase: docs/results/staircase-<gpu>.png (matplotlib: /usr/bin/python3)
    pages.py --words         each page's words: all (wc -w) and prose (no code, tables, images or comments)

The canonical file is docs/results/canonical-<gpu>.json, one run of `sweep.py --canonical` on that GPU
(docs/bench/canonical.py); --gpu picks the kind (default: GPU below, the course's machine). A generated block
is everything between the two lines

    <!-- generated:NAME (docs/bench/pages.py) -->
    <!-- /generated -->

in the pages of BLOCKS: the README's staircase (one table and the plot), the scoreboard of docs/index.md and
what it says, and one table per chapter (steps 3 to 7) of its sub-steps. Each block that names the machine does
so once, in the line under its table, with the file it came from. The percentages: of the speed of light, the GPU's dense bf16 tensor-core peak, and of the
mma.sync ceiling measured in the run (docs/conventions.md, "Speed of light"). The tables and the findings need
only the standard library; --plot needs matplotlib.
"""
import argparse
import difflib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import canonical  # noqa: E402  (the variant names and points of the run)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU = "h100"                                   # the GPU kind the pages show
CPU_RECORD = "docs/results/cpu-2026-11-22.jsonl"  # steps 1 and 2, on a 2-core machine: the scoreboard's CPU rows
CPU_MACHINE = "2 cores"                        # what the CPU record's device name does not say
GOAL_FRACTION = 0.80                           # the course's goal: 80 % of the dense bf16 peak
KEY = (128, 4096, False)                       # (d, N, causal) of the scoreboard, the plot and the % columns
BEGIN = "<!-- generated:{} (docs/bench/pages.py) -->"
END = "<!-- /generated -->"
BLOCK = re.compile(r"^<!-- generated:([\w-]+) \(docs/bench/pages\.py\) -->\n(.*?)^<!-- /generated -->$", re.S | re.M)

S4, S5, S7 = "step4_fused_pipelined", "step5_backward", "step7_hopper_wgmma"
S3, S6 = "step3_naive_kernel", "step6_autotune"
FLASH, CUDNN = "torch_sdpa_flash", "torch_sdpa_cudnn"
PEER_WHAT = {FLASH: "PyTorch SDPA, flash backend (FlashAttention 2)", CUDNN: "PyTorch SDPA, cuDNN backend (Hopper wgmma)"}


def sub(variant):
    """A sub-step's label from its variant's name: "4a-padded" -> "4a"; "" for a name without one."""
    head = (variant or "").split("-")[0]
    return head if re.fullmatch(r"\d[a-z]", head) else ""


# What each row runs, by sub-step label (and variant for step 5): the course's words, once.
WHAT = {
    "3": "first CUDA kernel: a warp per row, fp32 CUDA cores",
    "4a": "tiles in shared memory (padded rows), mma.sync",
    "4b": "the 128-byte swizzle instead of padding",
    "4c": "cp.async: tile j+1 copied while tile j is computed",
    "4d": "TMA into an mbarrier ring (step 4's default)",
    "deterministic": "deterministic: two kernels, no atomics",
    "atomic": "atomic: FlashAttention 2's single kernel",
    "6 fwd": "autotuned: step 4's kernels",
    "6 bwd": "autotuned: step 5's kernels",
    "7a": "Hopper only: wgmma, a warpgroup per 64 rows",
    "7b": "a producer warpgroup, setmaxnreg",
    "7c": "ping-pong, softmax under the next product",
    "7d": "persistent blocks, one per SM",
    "7": "step 7's default: a configuration per head dim, mask and length",
}
# Step 4's chapter: the idea of each sub-step and its kernel (links relative to step4_fused_pipelined/).
STEP4_IDEA = {
    "3": ("one warp per row, K and V through registers, fp32 cores", "[step 3](../step3_naive_kernel/kernel.cuh)"),
    "4a": ("tiles in shared memory, copied by the threads; tensor cores (`mma.sync`); padded rows",
           "[kernel_4a_threads.cuh](kernel_4a_threads.cuh)"),
    "4b": ("the 128-byte swizzle instead of padding", "the same kernel, another layout"),
    "4c": ("`cp.async`: tile j + 1 is copied while tile j is computed", "[kernel_4c_cp_async.cuh](kernel_4c_cp_async.cuh)"),
    "4d": ("TMA into a ring of stages guarded by mbarriers; the default", "[kernel_4d_tma.cuh](kernel_4d_tma.cuh)"),
    "mods": ("with a score modifier: {flags}", "[score_mod.cuh](score_mod.cuh)"),
}
# Step 7's chapter: each row's kernel (links relative to step7_hopper_wgmma/).
STEP7_KERNEL = {
    "4d": "[kernel_4d_tma.cuh](../step4_fused_pipelined/kernel_4d_tma.cuh)",
    "7a": "[kernel_7a_wgmma.cuh](kernel_7a_wgmma.cuh)",
    "7b": "[kernel_7b_warp_specialized.cuh](kernel_7b_warp_specialized.cuh)",
    "7c": "[kernel_7c_pingpong.cuh](kernel_7c_pingpong.cuh)",
    "7d": "[kernel_7d_persistent.cuh](kernel_7d_persistent.cuh)",
    "7": "[configs.h](configs.h) names them, [launch.cu](launch.cu) picks",
}


@dataclass
class Row:
    label: str         # the first column: "4a", "5", "peer"
    what: str          # what runs
    name: str          # stage or peer
    variant: str       # None: any
    mode: str = "fwd"  # fwd, bwd
    flags: str = ""    # the record's stage_flags


# ---- the run ---------------------------------------------------------------------------------------------------

class Run:
    """The canonical file of one GPU kind: its facts and its records."""

    def __init__(self, gpu, path=None):
        """path: another file of the same format (a run of `./run.sh plots`, docs/bench/own_plots.py) instead."""
        self.path = path or f"docs/results/canonical-{gpu}.json"
        full = os.path.join(ROOT, self.path)
        if path is None and not os.path.isfile(full):
            sys.exit(f"pages.py: {self.path} does not exist: run `python3 docs/bench/sweep.py --canonical --build build` "
                     "on that GPU (docs/reproduce.md), or name another kind with --gpu")
        with open(full) as f:
            self.data = json.load(f)
        self.records = self.data["records"]
        self.gpu = self.data["gpu"]
        self.sol = self.data["sol"]["dense_bf16_tflops"]   # None in a run on a GPU DENSE_BF16_PEAKS does not know
        self.ceiling = self.data["sol"]["mma_sync_tflops"]

    def get(self, row, d, N, causal):
        """The record of a row at a point of the sweep's shapes, or None."""
        for r in self.records:
            if (r["name"], r["mode"], r["d"], r["N"], r["causal"]) == (row.name, row.mode, d, N, causal) \
                    and (row.variant is None or r["variant"] == row.variant) \
                    and r.get("stage_flags", "") == row.flags and r.get("tflops") and "Nq" not in r:
                return r
        return None

    def decode(self, name, s):
        for r in self.records:
            if r["name"] == name and r["mode"] == "decode" and r.get("ms") and \
                    all(r.get(k) == s[k] for k in ("B", "Hkv", "Nq", "Nk", "d")):
                return r
        return None

    def mods(self):
        """The score-modifier rows of step 4 the file has, in the order of canonical.MODS, then any other."""
        flags = sorted({r["stage_flags"] for r in self.records if r["name"] == S4 and r.get("stage_flags")
                        and r["mode"] == "fwd"},
                       key=lambda f: next((i for i, (m, _) in enumerate(canonical.MODS) if m.split()[0] == f.split()[0]),
                                          len(canonical.MODS)))
        return [Row(sub(canonical.STEP4_MODS) or "4d", f"`{f}`", S4, None, "fwd", f) for f in flags]


def pct(v, of):
    """v as a percentage of `of`: whole percents, one decimal below 10 %."""
    x = 100 * v / of
    return f"{x:.1f} %" if x < 10 else f"{x:.0f} %"


def fmt(v):
    return f"{v:.1f}" if v >= 1 else f"{v:.4f}"


def cell(run, rec, sol=True):
    if rec is None:
        return "—"
    return f"{fmt(rec['tflops'])} ({pct(rec['tflops'], run.sol)})" if sol else fmt(rec["tflops"])


def seq(n):
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def col(d, n, causal):
    return f"d = {d}, N = {seq(n)}" + (", causal" if causal else "")


def rel(page, target):
    """target (a path from the repository root) as a link from page."""
    return os.path.relpath(os.path.join(ROOT, target), os.path.join(ROOT, os.path.dirname(page))).replace(os.sep, "/")


def link(page, target, text=None):
    return f"[{text or os.path.basename(target)}]({rel(page, target)})"


def table(header, rows, right_from):
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if i >= right_from else "---" for i in range(len(header))) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


# ---- the machine, named once per page -----------------------------------------------------------------------------

def machine(run, page):
    """The one line that names the GPU, the run and the speeds of light."""
    d = run.data
    sol = (f"SoL: the dense bf16 peak, {run.sol:.0f} TFLOP/s; ")
    conv = f"([conventions]({rel(page, 'docs/conventions.md')}#speed-of-light))"
    return (f"One run on the {run.gpu} (driver {d.get('driver') or '?'}, CUDA {d.get('cuda') or '?'}, PyTorch "
            f"{d.get('torch') or '—'}; the build and the date are in the file): "
            f"{link(page, run.path)}. {sol}the run's mma.sync ceiling: {run.ceiling:.0f} TFLOP/s {conv}.")


def shapes_line(run, cells="TFLOP/s (% of SoL)"):
    """What the numbers are: the cells, the shapes, the timing."""
    return f"{cells}; bf16, B·N = 16384, Hq·d = 2048, stages and peers timed alike; — : not run."


# ---- the rows of the course, in its order ----------------------------------------------------------------------

def course_rows():
    rows = [Row("3", WHAT["3"], S3, None)]
    rows += [Row(sub(v), WHAT[sub(v)], S4, v) for v in canonical.STEP4_SUBSTEPS]
    rows += [Row("5", WHAT[v], S5, v, "bwd") for v in canonical.STEP5_VARIANTS]
    rows += [Row("6", WHAT["6 fwd"], S6, canonical.STEP6_VARIANT), Row("6", WHAT["6 bwd"], S6, canonical.STEP6_VARIANT, "bwd")]
    rows += [Row(sub(v), WHAT[sub(v)], S7, v) for v in canonical.STEP7_SUBSTEPS]
    rows += [Row("7", WHAT["7"], S7, canonical.STEP7_DEFAULT)]
    rows += [Row("peer", PEER_WHAT[p], p, None, m) for m in ("fwd", "bwd") for p in (FLASH, CUDNN)]
    return rows


def plot_path(run):
    return f"docs/results/staircase-{run.data['gpu_slug']}.png"


# ---- the blocks ------------------------------------------------------------------------------------------------

def block_staircase(run, page):
    cols = [(128, 1024, False), (128, 4096, False), (128, 16384, False), (128, 4096, True), (64, 4096, False)]
    rows = []
    for row in course_rows():
        recs = [run.get(row, *c) for c in cols]
        key = run.get(row, *KEY)
        rows.append([f"**{row.label}**" if row.label != "peer" else "peer", row.what, row.mode]
                    + [cell(run, r, sol=False) for r in recs] + [pct(key["tflops"], run.sol) if key else "—"])
    head = ["step", "what runs", "pass"] + [col(*c) for c in cols] + [f"% of SoL at {col(*KEY)}"]
    return "\n".join(table(head, rows, 3) + ["", shapes_line(run, "TFLOP/s") + " " + machine(run, page), "",
                                              staircase_image(run, page)])


def staircase_image(run, page):
    return (f"![TFLOP/s of every GPU stage and sub-step at {col(*KEY)}, beside PyTorch's SDPA, with the mma.sync "
            f"ceiling, the goal and the speed of light]({rel(page, plot_path(run))})")


def cpu_rows(page):
    """(rows, line) of steps 1 and 2 from the CPU record, at their own shape."""
    with open(os.path.join(ROOT, CPU_RECORD)) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    want = [("1", "the textbook on the CPU (fp32, every intermediate stored)", "step1_cpu_reference", "", "fwd"),
            ("1", "the textbook on the CPU (its backward includes a forward)", "step1_cpu_reference", "", "bwd"),
            ("2", "online softmax on the CPU, FlashAttention 2's loop order", "step2_online_softmax", "fa2", "fwd")]
    rows, device, shape = [], "", None
    for label, what, name, variant, mode in want:
        r = next((r for r in recs if r["stage"] == name and (r.get("variant") or "") == variant and not r["causal"]
                  and r.get(f"{mode}_tflops")), None)
        if r:
            device, shape = r.get("device", ""), r
        rows.append([f"**{label}**", what, mode, fmt(r[f"{mode}_tflops"]) if r else "—", "—", "—"])
    line = (f"CPU rows: the default problem, d = {shape['d']}, N = {shape['Nq']} (B = {shape['B']}, H = {shape['Hq']}), "
            f"on an {device}, {CPU_MACHINE} ({link(page, CPU_RECORD)}; no larger shape was run there).") if shape else ""
    return rows, line


def block_scoreboard(run, page):
    rows, cpu_line = cpu_rows(page)
    for row in course_rows():
        r = run.get(row, *KEY)
        rows.append([f"**{row.label}**" if row.label != "peer" else "peer", row.what, row.mode,
                     fmt(r["tflops"]) if r else "—", pct(r["tflops"], run.ceiling) if r else "—",
                     pct(r["tflops"], run.sol) if r else "—"])
    key = next((r for r in run.records if (r["d"], r["N"], r["causal"]) == KEY and "Nq" not in r), None)
    head = ["step", "what runs", "pass", "TFLOP/s", f"% of the mma.sync ceiling ({run.ceiling:.0f})",
            f"% of SoL ({run.sol:.0f})"]
    goal = GOAL_FRACTION * run.sol
    lines = table(head, rows, 3) + [
        "",
        f"GPU rows: {col(*KEY)} (B = {key['B']}, Hq = {key['Hq']}), bf16, no mask. " + machine(run, page),
        cpu_line,
        f"The goal: {pct(GOAL_FRACTION, 1)} of the speed of light, {goal:.0f} TFLOP/s. The mma.sync ceiling is "
        f"{pct(run.ceiling, run.sol)} of it, and {pct(GOAL_FRACTION, 1)} of the ceiling is {GOAL_FRACTION * run.ceiling:.0f} TFLOP/s.",
        "", staircase_image(run, page)]
    return "\n".join(lines)


def times(x):
    """A ratio in words: 2 significant digits, grouped by thousands ("57 000")."""
    digits = max(0, len(str(int(x))) - 2)
    return f"{round(x, -digits):,.0f}".replace(",", " ")


def ahead(a, b):
    """"X % ahead of" / "X % behind" / "level with": a against b."""
    x = 100 * (a / b - 1)
    if abs(x) < 0.5:
        return "level with"
    return f"{abs(x):.1f} % {'ahead of' if x > 0 else 'behind'}"


def block_findings(run, page):
    def get(label):  # the forward of a course row at the scoreboard's point
        return run.get(next(row for row in course_rows() if row.label == label and row.mode == "fwd"), *KEY)
    out = []
    with open(os.path.join(ROOT, CPU_RECORD)) as f:
        cpu = [json.loads(line) for line in f if line.strip()]
    s1 = next((r for r in cpu if r["stage"] == "step1_cpu_reference" and not r["causal"]), None)
    s3, s4 = get("3"), get(sub(canonical.STEP4_SUBSTEPS[-1]))
    if s1 and s3 and s4:
        out.append(f"From step 1 to step {sub(canonical.STEP4_SUBSTEPS[-1])} the forward gets about "
                   f"{times(s4['tflops'] / s1['fwd_tflops'])} times faster in TFLOP/s, on different machines and shapes; "
                   f"from step 3 to step {sub(canonical.STEP4_SUBSTEPS[-1])}, on the same GPU and shape, about "
                   f"{times(s4['tflops'] / s3['tflops'])} times.")
    mma_fwd = [(row, run.get(row, *KEY)) for row in course_rows() if row.mode == "fwd" and row.name in (S3, S4, S6)]
    mma_bwd = [(row, run.get(row, *KEY)) for row in course_rows() if row.mode == "bwd" and row.name in (S5, S6)]
    mma_fwd, mma_bwd = [x for x in mma_fwd if x[1]], [x for x in mma_bwd if x[1]]
    if mma_fwd and mma_bwd:
        (fr, f), (br, b) = max(mma_fwd, key=lambda x: x[1]["tflops"]), max(mma_bwd, key=lambda x: x[1]["tflops"])
        bname = f"step {br.label}'s {br.variant} variant" if br.name == S5 else f"step {br.label}'s"
        out.append(f"The fastest forward of steps 3 to 6, step {fr.label}'s, is at {pct(f['tflops'], run.ceiling)} of the "
                   f"mma.sync ceiling and {pct(f['tflops'], run.sol)} of the speed of light. The backward's best, "
                   f"{bname}, is at {pct(b['tflops'], run.ceiling)} of the ceiling.")
    s7, s7a = get("7"), get(sub(canonical.STEP7_SUBSTEPS[0]))
    cudnn = run.get(Row("peer", "", CUDNN, None), *KEY)
    if s7 and cudnn:
        text = (f"Step 7's default reaches {pct(s7['tflops'], run.sol)} of the speed of light "
                f"({pct(s7['tflops'], GOAL_FRACTION * run.sol)} of the goal), {ahead(s7['tflops'], cudnn['tflops'])} "
                f"cuDNN timed in the same run at this point ({link(page, 'step7_hopper_wgmma/README.md', 'the chapter')} compares them)")
        if s7a and s4 and s7a["tflops"] - s4["tflops"] > s7["tflops"] - s7a["tflops"]:
            text += (f"; most of its gain over step {sub(canonical.STEP4_SUBSTEPS[-1])} comes from its first sub-step "
                     f"alone, `wgmma` in place of `mma.sync` ({sub(canonical.STEP7_SUBSTEPS[0])})")
        out.append(text + ".")
    cb = run.get(Row("peer", "", CUDNN, None, "bwd"), *KEY)
    if cudnn and cudnn["tflops"] > GOAL_FRACTION * run.ceiling:
        out.append(f"PyTorch's cuDNN backend runs at {pct(cudnn['tflops'], run.ceiling)} of the mma.sync ceiling in the "
                   f"forward" + (f" ({pct(cb['tflops'], run.ceiling)} in the backward)" if cb else "") +
                   " because it does not use `mma.sync`: its `wgmma` kernels are bounded by the speed of light instead.")
    return "\n".join(f"- {t}" for t in out)


def block_step3(run, page):
    row = Row("3", "", S3, None)
    cols = canonical.FWD_SEQS
    rows, ratios = [], {FLASH: [], CUDNN: []}
    for d in (64, 128):
        for causal in (False, True):
            cells = []
            for n in cols:
                r = run.get(row, d, n, causal)
                cells.append(f"{r['ms']:.1f} ms, {fmt(r['tflops'])} ({pct(r['tflops'], run.sol)})" if r else "—")
                for p in ratios:
                    q = run.get(Row("peer", "", p, None), d, n, causal)
                    if r and q:
                        ratios[p].append((q["tflops"] / r["tflops"], q["tflops"]))
            rows.append([f"d = {d}, {'causal' if causal else 'no mask'}"] + cells)
    head = ["step 3, forward"] + [f"N = {seq(n)} (B = {16384 // n})" for n in cols]
    lines = table(head, rows, 1) + ["", shapes_line(run, "Time, TFLOP/s (% of SoL); H = 2048 / d")]
    if ratios[FLASH]:
        f, c = ratios[FLASH], ratios[CUDNN]
        lines.append(f"PyTorch's SDPA in the same run at these points: its flash "
                     f"backend {min(x[0] for x in f):.0f} to {max(x[0] for x in f):.0f} times faster than step 3 "
                     f"({min(x[1] for x in f):.0f} to {max(x[1] for x in f):.0f} TFLOP/s), its cuDNN backend "
                     f"{min(x[0] for x in c):.0f} to {max(x[0] for x in c):.0f} times.")
    lines.append(machine(run, page))
    return "\n".join(lines)


def block_step4(run, page):
    cols = [(128, 4096, False), (128, 4096, True), (128, 16384, False), (64, 4096, False)]
    rows = []
    subrows = [Row("3", "", S3, None)] + [Row(sub(v), "", S4, v) for v in canonical.STEP4_SUBSTEPS]
    for row in subrows:
        idea, kernel = STEP4_IDEA[row.label]
        label = "step 3" if row.label == "3" else f"**{row.label}**"
        rows.append([label, idea, kernel] + [cell(run, run.get(row, *c)) for c in cols])
    for row in run.mods():
        idea, kernel = STEP4_IDEA["mods"]
        rows.append([f"**{row.label}**", idea.format(flags=row.what), kernel] + [cell(run, run.get(row, *c)) for c in cols])
    for p in (FLASH, CUDNN):
        rows.append(["peer", PEER_WHAT[p], "—"] + [cell(run, run.get(Row("peer", "", p, None), *c)) for c in cols])
    head = ["sub-step", "the idea", "kernel"] + [col(*c) for c in cols]
    lines = table(head, rows, 3) + ["", shapes_line(run, "Forward TFLOP/s (% of SoL); a window's FLOPs count "
                                                "its visible pairs only")]
    # Decoding: the split-KV sub-step, in bandwidth against the same run's copy roof.
    label = sub(canonical.STEP4_SPLIT_KV)
    drows = []
    for s in canonical.DECODE_POINTS:
        r = run.decode(S4, s)
        peers = [(p, run.decode(p, s)) for p in (FLASH, CUDNN)]
        peers = [(p, q) for p, q in peers if q]
        best = min(peers, key=lambda x: x[1]["ms"]) if peers else None
        roof = run.data.get("copy_gbps")
        drows.append([str(s[k]) for k in ("B", "Hkv", "Nq", "Nk", "d")] + (
            [f"{r['ms'] * 1e3:.1f}", f"{r['gbps']:.0f}", pct(r["gbps"], roof) if roof else "—"] if r else ["—"] * 3) + (
            [f"{best[1]['ms'] * 1e3:.1f} ({'cuDNN' if best[0] == CUDNN else 'flash'})",
             f"{best[1]['ms'] / r['ms']:.2f}" if r else "—"] if best else ["—", "—"]))
    variant = {r["variant"] for r in run.records if r["name"] == S4 and r["mode"] == "decode"}
    lines += [""] + table(["B", "Hkv", "Nq", "Nk", "d", f"{label} µs", f"{label} GB/s", "of the copy roof",
                           "faster SDPA µs", f"SDPA / {label}"], drows, 0)
    lines += ["", f"Decoding ({label}, `--variant {'` / `'.join(sorted(variant)) or canonical.STEP4_SPLIT_KV}`): a few "
              f"query rows against a long KV cache, bf16, Hq = 32, causal bottom-right; GB/s = the bytes of Q, K, V "
              f"and O / time; the roof is the same run's device copy, "
              + (f"{run.data['copy_gbps']:.0f} GB/s." if run.data.get("copy_gbps") else "not measured."),
              machine(run, page)]
    return "\n".join(lines)


def block_step5(run, page):
    cols = [(64, 4096, False), (64, 4096, True), (128, 4096, False), (128, 4096, True), (128, 16384, False)]
    rows = [[f"**{v}**"] + [cell(run, run.get(Row("5", "", S5, v, "bwd"), *c)) for c in cols]
            for v in canonical.STEP5_VARIANTS]
    rows += [[PEER_WHAT[p]] + [cell(run, run.get(Row("peer", "", p, None, "bwd"), *c)) for c in cols] for p in (FLASH, CUDNN)]
    head = ["backward"] + [col(*c) for c in cols]
    return "\n".join(table(head, rows, 1) + ["", shapes_line(run) + " " + machine(run, page)])


def block_step6(run, page):
    pts = [(s["d"], s["N"], s["causal"]) for s in canonical.STEP6_POINTS]
    pairs = [("forward", Row("4", "", S4, canonical.STEP4_SUBSTEPS[-1]), f"step 4's default (`{canonical.STEP4_SUBSTEPS[-1]}`)"),
             ("forward", Row("6", "", S6, canonical.STEP6_VARIANT), "step 6, tuned"),
             ("backward", Row("5", "", S5, canonical.STEP5_VARIANTS[0], "bwd"), f"step 5's default (`{canonical.STEP5_VARIANTS[0]}`)"),
             ("backward", Row("6", "", S6, canonical.STEP6_VARIANT, "bwd"), "step 6, tuned")]
    rows = []
    for mode, row, what in pairs:
        cells = []
        for c in pts:
            r = run.get(row, *c)
            cells.append(cell(run, r) + (f", `{r['config']}`" if r and r.get("config") else ""))
        rows.append([mode, what] + cells)
    head = ["pass", "what runs"] + [col(*c) for c in pts]
    return "\n".join(table(head, rows, 2) + [
        "", shapes_line(run, "TFLOP/s (% of SoL) and the configuration, where the run recorded it; step 6 tuned "
                             "each problem from an empty cache") + " " + machine(run, page)])


def block_step7(run, page):
    cols = [(128, 4096, False), (128, 16384, False), (64, 4096, False), (128, 4096, True)]
    subrows = [Row("4d", "step 4 (4d): `mma.sync`, a warp per 16 rows", S4, canonical.STEP4_SUBSTEPS[-1])]
    subrows += [Row(sub(v), f"**{sub(v)}**: {WHAT[sub(v)]}", S7, v) for v in canonical.STEP7_SUBSTEPS]
    subrows += [Row("7", f"**the default** (`{canonical.STEP7_DEFAULT}`)", S7, canonical.STEP7_DEFAULT)]
    def cfg(row, r):  # the default's cells name the configuration it picked, where the run recorded it
        return cell(run, r) + (f", `{r['config']}`" if r and r.get("config") and row.label == "7" else "")
    rows = [[row.what, STEP7_KERNEL[row.label]] + [cfg(row, run.get(row, *c)) for c in cols] for row in subrows]
    rows += [[PEER_WHAT[p], "—"] + [cell(run, run.get(Row("peer", "", p, None), *c)) for c in cols] for p in (CUDNN, FLASH)]
    head = ["sub-step", "kernel"] + [col(*c) for c in cols]
    return "\n".join(table(head, rows, 2) + ["", shapes_line(run, "Forward TFLOP/s (% of SoL)") + " " + machine(run, page)])


# page -> [(block name, function)], in the order they appear
BLOCKS = {
    "README.md": [("staircase", block_staircase)],
    "docs/index.md": [("scoreboard", block_scoreboard), ("findings", block_findings)],
    "step3_naive_kernel/README.md": [("step3", block_step3)],
    "step4_fused_pipelined/README.md": [("step4", block_step4)],
    "step5_backward/README.md": [("step5", block_step5)],
    "step6_autotune/README.md": [("step6", block_step6)],
    "step7_hopper_wgmma/README.md": [("step7", block_step7)],
}


# ---- --write, --check -------------------------------------------------------------------------------------------

def regenerate(page, text, run):
    """(the page with its blocks regenerated, [problems]): a block missing, unknown or twice is a problem."""
    want = dict(BLOCKS[page])
    found = [m.group(1) for m in BLOCK.finditer(text)]
    problems = [f"{page}: no block `{BEGIN.format(n)}` ... `{END}`" for n in want if n not in found]
    problems += [f"{page}: block `{n}` is not one pages.py writes here ({', '.join(want)})" for n in found if n not in want]
    problems += [f"{page}: block `{n}` appears {found.count(n)} times" for n in set(found) if found.count(n) > 1]

    def one(m):
        name = m.group(1)
        return f"{BEGIN.format(name)}\n{want[name](run, page)}\n{END}" if name in want else m.group(0)
    return BLOCK.sub(one, text), problems


def words(text):
    """(all words, prose words): prose leaves out code (fenced or indented), tables, images and HTML comments."""
    total = len(text.split())
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    prose, fence, prev_blank = [], False, True
    for line in text.split("\n"):
        if line.strip().startswith("```"):
            fence = not fence
            prev_blank = False
            continue
        code = fence or (line.startswith("    ") and (prev_blank or (prose and prose[-1] is None)))
        skip = code or line.lstrip().startswith("|") or line.lstrip().startswith("![")
        prose.append(None if code else ("" if skip else line))
        prev_blank = not line.strip()
    return total, len(" ".join(p for p in prose if p).split())


def plot(run, out, ref=None):
    """The staircase of run at KEY. ref: another run (the committed canonical one, beside a run of `./run.sh
    plots`), drawn as a dashed outline of each bar at its level; run's bars are then narrower, and a run on a
    GPU whose speed of light is unknown (run.sol None) draws no speed-of-light or goal line."""
    try:
        import matplotlib
    except ImportError:
        sys.exit(f"pages.py: this Python ({sys.executable}) has no matplotlib; run --plot with Debian's /usr/bin/python3 "
                 "(apt-get install python3-matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import palette

    fwd = [row for row in course_rows() if row.mode == "fwd"]
    bwd = [row for row in course_rows() if row.mode == "bwd"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True, gridspec_kw=dict(width_ratios=[len(fwd), len(bwd) + 1]))
    if run.sol:
        top = max(run.sol * 1.12, 100)
    else:  # no speed of light to scale to: the tallest bar or line
        highest = [r["tflops"] for x in (run, ref) if x for r in x.records if r.get("tflops") and "Nq" not in r]
        top = max(max(highest + [run.ceiling or 0]) * 1.18, 100)
    for ax, rows, title in ((axes[0], fwd, "forward"), (axes[1], bwd, "backward")):
        for i, row in enumerate(rows):
            r = run.get(row, *KEY)
            peer = row.name in palette.PEERS
            color = palette.PEERS[row.name][1] if peer else \
                palette.VARIANT_LINES.get(row.variant, {}).get("color", palette.stage_color(row.name))
            style = dict(color="white", edgecolor=color, hatch="//", linewidth=1.0) if peer else dict(color=color)
            was = ref.get(row, *KEY) if ref else None
            if was is not None:  # the reference's level: a dashed outline, above the bar so that it shows
                ax.bar(i, was["tflops"], width=0.8, fill=False, edgecolor="dimgray", linestyle="--", linewidth=0.8,
                       zorder=3)
            if r is None:
                ax.text(i, 8, "not\nrun", ha="center", va="bottom", fontsize=7, color="gray")
                continue
            ax.bar(i, r["tflops"], width=0.5 if ref else 0.72, **style)
            label = f"{r['tflops']:.0f}\n{pct(r['tflops'], run.sol)}" if run.sol else f"{r['tflops']:.0f}"
            ax.text(i, max(r["tflops"], was["tflops"] if was else 0) + top * 0.01, label, ha="center",
                    va="bottom", fontsize=6.5, linespacing=1.0)
        labels = [("SDPA\nflash" if row.name == FLASH else "SDPA\ncuDNN") if row.label == "peer" else
                  (f"5\n{row.variant[:6]}" if row.name == S5 else row.label) for row in rows]
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
        ax.set_xlim(-0.6, len(rows) - 0.4)
        ax.set_title(title, fontsize=9)
        lines = [(run.sol, dict(color="black", linestyle=":"), f"speed of light {run.sol:.0f}"),
                 (GOAL_FRACTION * run.sol, dict(color="dimgray", linestyle="-."), f"goal {GOAL_FRACTION * run.sol:.0f}")] \
            if run.sol else []
        if run.ceiling:
            lines.append((run.ceiling, dict(color=palette.CEILING_COLOR, linestyle="--"), f"mma.sync ceiling {run.ceiling:.0f}"))
        for y, st, text in lines:
            ax.axhline(y, linewidth=1.0, **st)
            if ax is axes[0]:
                ax.text(-0.5, y + top * 0.006, text, fontsize=7, color=st["color"], va="bottom")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylim(0, top)
    axes[0].set_ylabel("TFLOP/s (labels: % of the speed of light)" if run.sol else "TFLOP/s")
    fig.suptitle(f"The staircase: every stage at {col(*KEY)}, bf16, no mask; {run.gpu} (one run, {run.data['date'][:10]})",
                 fontsize=10)
    note = ("Steps 3-6 and SDPA flash use mma.sync (bounded by the red line); step 7 and cuDNN use wgmma "
            "(bounded by the speed of light). ")
    if ref:
        note = (f"Bars: this run. Dashed outlines: the {ref.gpu}, {ref.path} ({ref.data['date'][:10]})."
                + ("" if run.sol else " No speed-of-light line: this GPU's dense bf16 peak is not in canonical.py.")
                + "\n" + note)
    fig.text(0.01, 0.01, note + f"Drawn by docs/bench/pages.py from {run.path}.", fontsize=7)
    fig.subplots_adjust(left=0.07, right=0.99, top=0.9, bottom=0.14, wspace=0.03)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    if shutil.which("optipng"):
        subprocess.run(["optipng", "-quiet", "-o5", "-strip", "all", out], check=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite the generated blocks of the pages")
    g.add_argument("--check", action="store_true", help="exit 1 with a diff where a block is not what the file gives")
    g.add_argument("--words", action="store_true", help="print each page's words: all, and prose")
    ap.add_argument("--plot", action="store_true", help="draw docs/results/staircase-<gpu>.png (with --write: both)")
    ap.add_argument("--gpu", default=GPU, help=f"the GPU kind: docs/results/canonical-GPU.json (default: {GPU})")
    a = ap.parse_args()
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", a.gpu):
        ap.error(f"--gpu {a.gpu!r}: lower-case letters, digits and dashes, as in canonical-<gpu>.json")
    if a.words:
        pages = ["README.md", "docs/index.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "step*", "README.md")))
        for page in pages:
            with open(os.path.join(ROOT, page)) as f:
                total, prose = words(f.read())
            print(f"{prose:6d} prose {total:6d} all  {page}")
        return 0
    run = Run(a.gpu)
    if a.plot:
        out = os.path.join(ROOT, plot_path(run))
        plot(run, out)
        print(f"pages.py: wrote {plot_path(run)} ({os.path.getsize(out) // 1024} KB)")
        if not a.write:
            return 0
    problems, changed = [], []
    for page in BLOCKS:
        with open(os.path.join(ROOT, page)) as f:
            old = f.read()
        new, probs = regenerate(page, old, run)
        problems += probs
        if new == old:
            continue
        changed.append(page)
        if a.write:
            with open(os.path.join(ROOT, page), "w") as f:
                f.write(new)
        elif a.check:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), page, page + " (generated)"))
    if not a.write and not a.check:
        for page, blocks in BLOCKS.items():
            for name, fn in blocks:
                print(f"{BEGIN.format(name)}   [{page}]\n{fn(run, page)}\n{END}\n")
    for p in problems:
        print(f"pages.py: {p}", file=sys.stderr)
    if a.write:
        print(f"pages.py: {len(changed)} page(s) rewritten from {run.path}" + (f": {', '.join(changed)}" if changed else ""))
    if a.check:
        if changed:
            print(f"pages.py: {len(changed)} page(s) differ from {run.path}: run /usr/bin/python3 docs/bench/pages.py --write")
        else:
            print(f"pages.py: every generated block is what {run.path} gives" if not problems else "", end="\n" if not problems else "")
        return 1 if changed or problems else 0
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
