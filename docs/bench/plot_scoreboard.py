#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/plot_scoreboard.py: every stage of the course at one shape.

    plot_scoreboard.py [--out FILE.png]             the bar chart (default docs/results/scoreboard-h100.png)
    plot_scoreboard.py --table                      print the scoreboard as a markdown table
    plot_scoreboard.py --update-index docs/index.md rewrite the table between the page's markers
                                                    <!-- scoreboard:begin --> and <!-- scoreboard:end -->

One bar per row of ROWS below, on a logarithmic TFLOP/s axis (step 1 on the CPU and step 4 on the GPU
differ by a factor of about 50 000), in the colours of palette.py, and beside it the GPU bars again on a
linear scale, where the three vertical lines stand apart: the measured mma.sync bf16 ceiling (from
CEILING_FILE, labelled with its value, its run's date and the range the bars' own runs measured), the
H100's dense bf16 tensor peak and the course's goal (GOAL_FRACTION of that peak). Where a wgmma kernel
(step 7, PyTorch's cuDNN backend) passes the mma.sync line, its value says wgmma and a note under the
figure says why it can. Every number is read from a committed result file, never typed: a sweep
JSON of docs/bench/sweep.py (a "records" list) or the JSON lines a stage writes with --json (what
docs/results/cpu-*.jsonl and docs/results/raw/*configs*.jsonl hold). Runs under /usr/bin/python3
(Debian's matplotlib); --table and --update-index need only the standard library.

To add a stage or sub-step, add ONE line to ROWS: its label, what it runs, the result file, the stage's
name and pass, and (where the file holds several) its variant. A row whose file or record is missing is
shown as "not measured" instead of failing, so a row can be added before its sweep has run.
"""
import argparse
import json
import os
import re
import statistics
import sys
import textwrap
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import palette  # noqa: E402  (docs/bench/palette.py: the course's colours)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWEEP = "docs/results/sweep-h100-2026-11-24.json"       # steps 3, 4a-4d, 5 and the PyTorch peers
STEP6 = "docs/results/sweep-step6-h100-2026-11-22.json"  # step 6, tuned
CPU = "docs/results/cpu-2026-11-22.jsonl"                # steps 1 and 2, on a 2-core CPU
STEP7_SUB = "docs/results/sweep-step7-substeps-h100-2026-11-23-run1.json"  # step 7's sub-steps 7a-7c
STEP7 = "docs/results/sweep-step7-h100-2026-11-24-run12.json"  # step 7's default (`auto`), SDPA beside

CEILING_FILE = "docs/results/sweep-h100-2026-11-22.json"  # its mma_peak_tflops (650.55) is the course's one value of the ceiling
DENSE_PEAK = 989.0          # H100 SXM dense bf16 tensor-core peak, TFLOP/s (NVIDIA's data sheet)
GOAL_FRACTION = 0.80        # the course's goal: 80 % of that peak

# The shapes of the scoreboard. GPU rows: one point of the sweep (bf16, B*N = 16384, Hq*d = 2048).
# CPU rows: the default problem of every stage; the CPU record has no point at the GPU shape.
GPU_SHAPE = dict(d=128, N=4096, causal=False)
CPU_SHAPE = dict(d=64, N=1024, causal=False)


@dataclass
class Row:
    step: str                  # the label in the first column: "1", "4", "4a", "5", ...
    what: str                  # what runs, in a few words
    path: str                  # the result file, relative to the repository root
    name: str                  # the stage (or peer) name in the file: "step4_fused_pipelined", "torch_sdpa_flash"
    mode: str                  # "fwd" or "bwd"
    variant: str = None        # the record's variant; None: any (the file holds one)
    shape: dict = field(default_factory=lambda: GPU_SHAPE)
    machine: str = None        # appended to the file's device name, e.g. "2 cores"


ROWS = [
    Row("1", "the textbook on the CPU (fp32, every intermediate stored)", CPU, "step1_cpu_reference", "fwd",
        shape=CPU_SHAPE, machine="2 cores"),
    Row("1", "the textbook on the CPU (its backward includes a forward)", CPU, "step1_cpu_reference", "bwd",
        shape=CPU_SHAPE, machine="2 cores"),
    Row("2", "online softmax on the CPU, FlashAttention 2's loop order", CPU, "step2_online_softmax", "fwd",
        variant="fa2", shape=CPU_SHAPE, machine="2 cores"),
    Row("3", "first CUDA kernel: a warp per row, fp32 CUDA cores", SWEEP, "step3_naive_kernel", "fwd"),
    Row("4a", "tiles in shared memory (padded rows), mma.sync", SWEEP, "step4_fused_pipelined", "fwd",
        variant="4a-padded"),
    Row("4b", "the 128-byte swizzle instead of padding", SWEEP, "step4_fused_pipelined", "fwd", variant="4b-swizzle"),
    Row("4c", "cp.async: tile j+1 copied while tile j is computed", SWEEP, "step4_fused_pipelined", "fwd",
        variant="4c-cp-async"),
    Row("4d", "TMA into an mbarrier ring (step 4's default)", SWEEP, "step4_fused_pipelined", "fwd",
        variant="4d-tma"),
    Row("5", "deterministic: two kernels, no atomics", SWEEP, "step5_backward", "bwd", variant="deterministic"),
    Row("5", "atomic: FlashAttention 2's single kernel", SWEEP, "step5_backward", "bwd", variant="atomic"),
    Row("6", "autotuned: step 4's kernels", STEP6, "step6_autotune", "fwd", variant="tuned"),
    Row("6", "autotuned: step 5's deterministic kernels", STEP6, "step6_autotune", "bwd", variant="tuned"),
    Row("7a", "Hopper only: wgmma, a warpgroup per 64 rows", STEP7_SUB, "step7_hopper_wgmma", "fwd",
        variant="7a-wgmma"),
    Row("7b", "a producer warpgroup, setmaxnreg", STEP7_SUB, "step7_hopper_wgmma", "fwd", variant="7b-specialized"),
    Row("7c", "ping-pong, softmax under the next product", STEP7_SUB, "step7_hopper_wgmma", "fwd",
        variant="7c-pingpong"),
    Row("7", "step 7's default (here 7d: persistent, 128-key tiles)", STEP7, "step7_hopper_wgmma", "fwd", variant="auto"),
    Row("peer", "PyTorch SDPA cuDNN backend, in step 7's run", STEP7, "torch_sdpa_cudnn", "fwd"),
    Row("peer", "PyTorch SDPA flash backend (FlashAttention 2)", SWEEP, "torch_sdpa_flash", "fwd"),
    Row("peer", "PyTorch SDPA flash backend (FlashAttention 2)", SWEEP, "torch_sdpa_flash", "bwd"),
    Row("peer", "PyTorch SDPA cuDNN backend (Hopper wgmma)", SWEEP, "torch_sdpa_cudnn", "fwd"),
    Row("peer", "PyTorch SDPA cuDNN backend (Hopper wgmma)", SWEEP, "torch_sdpa_cudnn", "bwd"),
]

MODES = {"fwd": "forward", "bwd": "backward"}
BEGIN, END = "<!-- scoreboard:begin -->", "<!-- scoreboard:end -->"


# ---- reading the result files ---------------------------------------------------------------------

def read(path, _cache={}):
    """(file-level facts, [normalised records]) of a sweep JSON or a JSON-lines file; None if absent."""
    if path in _cache:
        return _cache[path]
    full = os.path.join(ROOT, path)
    if not os.path.isfile(full):
        _cache[path] = None
        return None
    with open(full) as f:
        text = f.read()
    recs = []
    if path.endswith(".jsonl"):
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        facts = {}
        for r in lines:
            recs += from_stage_record(r)
    else:
        data = json.loads(text)
        facts = {k: data.get(k) for k in ("gpu", "date", "build_git", "git", "mma_peak_tflops")}
        for r in data.get("records", []):
            recs.append(dict(name=r["name"], variant=r.get("variant") or "", d=r["d"], N=r["N"], B=r["B"],
                             Hq=r["Hq"], causal=r["causal"], mode=r["mode"], ms=r.get("ms"),
                             tflops=r.get("tflops"), device=data.get("gpu"),
                             run=run_name(r.get("run"), data)))
    _cache[path] = (facts, recs)
    return _cache[path]


def run_name(run, data):
    """"DATE build GIT" of a sweep record: merge.py's `run` field (an older merge kept the bare GIT), else
    the file's own date and build."""
    if not run:
        return f"{data.get('date')} build {data.get('build_git') or data.get('git')}"
    return run if " build " in run else f"build {run}"


def from_stage_record(r):
    """The forward and (with --backward) backward entries of one `--json` record of a stage."""
    if r.get("Nq") != r.get("Nk"):
        return []
    base = dict(name=r["stage"], variant=r.get("variant") or "", d=r["d"], N=r["Nq"], B=r["B"], Hq=r["Hq"],
                causal=r["causal"], device=r.get("device"), run=f"build {r.get('git')}")
    out = [dict(base, mode="fwd", ms=r.get("fwd_ms"), tflops=r.get("fwd_tflops"))]
    if r.get("backward"):
        out.append(dict(base, mode="bwd", ms=r.get("bwd_ms"), tflops=r.get("bwd_tflops")))
    return out


def lookup(row):
    """{tflops, ms, B, Hq, device, run, count} of a row (the median where several records match), or None."""
    got = read(row.path)
    if got is None:
        return None
    _, recs = got
    match = [r for r in recs if r["name"] == row.name and r["mode"] == row.mode and r.get("tflops")
             and (row.variant is None or r["variant"] == row.variant)
             and all(r[k] == v for k, v in row.shape.items())]
    if not match:
        return None
    best = sorted(match, key=lambda r: r["tflops"])[len(match) // 2]  # the median record (upper middle)
    return dict(best, tflops=statistics.median(r["tflops"] for r in match), count=len(match))


def ceiling():
    got = read(CEILING_FILE)
    return got[0].get("mma_peak_tflops") if got else None


def is_gpu(row, rec):
    """A GPU row gets the percentages of the ceiling and the peak (both the H100's); a CPU row does not."""
    return rec is not None and (rec.get("device") or "").startswith("NVIDIA")


# ---- the table ------------------------------------------------------------------------------------

def shape_text(shape, rec):
    s = f"d = {shape['d']}, N = {shape['N']}"
    if rec:
        s += f" (B = {rec['B']}, H = {rec['Hq']})"
    return s + (", causal" if shape["causal"] else "")


def fmt_tflops(v):
    return f"{v:.1f}" if v >= 1 else f"{v:.4f}"


def pct(v, of):
    """v as a percentage of `of`: whole percents, one decimal below 10 %."""
    x = 100 * v / of
    return f"{x:.1f} %" if x < 10 else f"{x:.0f} %"


def table(base="docs"):
    """The scoreboard in markdown; links relative to `base`, the folder of the page it goes into."""
    peak = ceiling()
    if not peak:
        sys.exit(f"plot_scoreboard.py: {CEILING_FILE} is missing or has no mma_peak_tflops")
    lines = [f"| step | what runs | pass | shape | machine | TFLOP/s | % of the mma.sync ceiling ({peak:.0f}) "
             f"| % of the dense bf16 peak ({DENSE_PEAK:.0f}) | source |",
             "|---|---|---|---|---|---:|---:|---:|---|"]
    for row in ROWS:
        rec = lookup(row)
        src = f"[{os.path.basename(row.path)}]({os.path.relpath(os.path.join(ROOT, row.path), os.path.join(ROOT, base))})"
        if rec is None:
            lines.append(f"| {row.step} | {row.what} | {row.mode} | {shape_text(row.shape, None)} | — | "
                         f"not measured | — | — | {src} |")
            continue
        machine = rec["device"] + (f", {row.machine}" if row.machine else "")
        gpu = is_gpu(row, rec)
        pct_ceiling = pct(rec["tflops"], peak) if gpu else "—"
        pct_peak = pct(rec["tflops"], DENSE_PEAK) if gpu else "—"
        lines.append(f"| {row.step} | {row.what} | {row.mode} | {shape_text(row.shape, rec)} | {machine} | "
                     f"{fmt_tflops(rec['tflops'])} | {pct_ceiling} | {pct_peak} | {src} |")
    goal = pct(GOAL_FRACTION * DENSE_PEAK, DENSE_PEAK)
    lines += ["", f"The goal: {goal} of the dense bf16 peak, {GOAL_FRACTION * DENSE_PEAK:.0f} TFLOP/s. The mma.sync "
              f"ceiling is {pct(peak, DENSE_PEAK)} of that peak, and {goal} of the ceiling is "
              f"{GOAL_FRACTION * peak:.0f} TFLOP/s. Generated by `docs/bench/plot_scoreboard.py` from the files in "
              "the last column."]
    return "\n".join(lines)


def update_index(page, text):
    with open(page) as f:
        old = f.read()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(old):
        sys.exit(f"plot_scoreboard.py: {page} has no {BEGIN} ... {END} markers")
    with open(page, "w") as f:
        f.write(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", old, count=1))


# ---- the figure -----------------------------------------------------------------------------------

def plot(out):
    try:
        import matplotlib
    except ImportError:
        sys.exit(f"plot_scoreboard.py: this Python ({sys.executable}) has no matplotlib; run it with Debian's "
                 "/usr/bin/python3 (apt-get install python3-matplotlib), or use --table, which needs none")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    peak = ceiling()
    rows = [(row, lookup(row)) for row in ROWS]
    rows = [(row, rec) for row, rec in rows if rec is not None]
    # The ceiling is CEILING_FILE's, the course's one value of it (the table in docs/index.md divides by it
    # too); the files of the bars measured their own, which the label gives as a range.
    own = sorted({round(read(p)[0]["mma_peak_tflops"]) for p in {row.path for row, _ in rows}
                  if read(p) and read(p)[0].get("mma_peak_tflops")})
    ceiling_date = (read(CEILING_FILE)[0].get("date") or "").split()[0]
    ceiling_label = (f"mma.sync bf16 ceiling, measured: {peak:.0f} TFLOP/s (the {ceiling_date} sweep; "
                     + (f"the runs of these bars measured {own[0]}-{own[-1]})" if len(own) > 1 else "")
                     ) if peak else None
    # Two axes sharing the rows: every bar on a log scale (left), and the GPU bars on a linear scale from 0
    # (right), where the three reference lines stand apart instead of bunching within a factor of 1.5.
    fig, (ax, lin) = plt.subplots(1, 2, figsize=(15, 0.42 * len(rows) + 4.6), sharey=True,
                                  gridspec_kw=dict(width_ratios=[1.25, 1], wspace=0.04))
    labels = []
    for i, (row, rec) in enumerate(rows):
        peer = row.name in palette.PEERS
        if peer:
            _, color, _ = palette.PEERS[row.name]
            style = dict(color="white", edgecolor=color, hatch="//", linewidth=1.2)
        else:
            style = dict(color=palette.stage_color(row.name), edgecolor="none")
        ax.barh(i, rec["tflops"], height=0.7, **style)
        gpu = is_gpu(row, rec)
        if gpu:
            lin.barh(i, rec["tflops"], height=0.7, **style)
        wg = "wgmma, " if gpu and row.name in palette.WGMMA and rec["tflops"] > peak else ""
        note = f"{fmt_tflops(rec['tflops'])}" + (f"  ({wg}{pct(rec['tflops'], peak)} of the mma.sync ceiling)"
                                                 if gpu and peak else "  (CPU, other shape)")
        lin.text(1.01, i, note, va="center", fontsize=8, transform=lin.get_yaxis_transform(), clip_on=False)
        labels.append(f"{'peer' if peer else 'step ' + row.step} {MODES[row.mode]}: {row.what}")
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    lo = min(rec["tflops"] for _, rec in rows)
    ax.set_xlim(lo / 3, DENSE_PEAK * 1.6)
    ax.xaxis.set_major_locator(LogLocator(base=10))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    lin.set_xlim(0, DENSE_PEAK * 1.08)
    lin.tick_params(axis="y", left=False)
    lines = [(peak, dict(color=palette.CEILING_COLOR, linestyle="--", linewidth=1.3), ceiling_label,
              f"mma.sync ceiling {peak:.0f}")] if peak else []
    lines += [(GOAL_FRACTION * DENSE_PEAK, dict(color="dimgray", linestyle="-.", linewidth=1.1),
               f"goal: {pct(GOAL_FRACTION, 1)} of the dense peak ({GOAL_FRACTION * DENSE_PEAK:.0f})",
               f"goal {GOAL_FRACTION * DENSE_PEAK:.0f}"),
              (DENSE_PEAK, dict(color="black", linestyle=":", linewidth=1.3),
               f"H100 dense bf16 peak ({DENSE_PEAK:.0f}, NVIDIA's data sheet)", f"dense peak {DENSE_PEAK:.0f}")]
    for k, (x, st, label, short) in enumerate(lines):  # each named over the linear axes, one above the other
        ax.axvline(x, **st)
        lin.axvline(x, label=label, **st)
        lin.annotate(short, xy=(x, 1), xycoords=lin.get_xaxis_transform(), xytext=(0, 3 + 11 * k),
                     textcoords="offset points", ha="center", va="bottom", fontsize=7.5, color=st["color"],
                     arrowprops=dict(arrowstyle="-", color=st["color"], linewidth=0.6, shrinkA=0, shrinkB=0))
    ax.set_xlabel("TFLOP/s, log scale: every row")
    lin.set_xlabel("TFLOP/s, linear: the GPU rows and the three lines")
    ax.grid(True, axis="x", alpha=0.3)
    lin.grid(True, axis="x", alpha=0.3)
    g, c = GPU_SHAPE, CPU_SHAPE
    fig.suptitle(f"Every stage of the course, bf16, {'causal' if g['causal'] else 'non-causal'}; "
                 f"GPU rows: d = {g['d']}, N = {g['N']}; CPU rows: d = {c['d']}, N = {c['N']} "
                 "(the CPU record has no larger shape)", fontsize=10)
    runs = {}  # source file -> the runs its rows came from
    for row, rec in rows:
        runs.setdefault(row.path, {})[rec["run"]] = rec["device"] + (f", {row.machine}" if row.machine else "")
    src = [f"{path}: " + "; ".join(f"{dev}, {run}" for run, dev in by_run.items()) for path, by_run in runs.items()]
    over = sorted({f"step {row.step}" if row.name not in palette.PEERS else palette.peer_label(row.name)
                   for row, rec in rows if peak and is_gpu(row, rec) and rec["tflops"] > peak
                   and row.name in palette.WGMMA}, key=lambda x: (x.startswith("PyTorch"), x))
    notes = ["TFLOP/s with FlashAttention's FLOP count (backward = 2.5 x forward)."]
    if over:
        notes.append(f"Past the red mma.sync line: {', '.join(over)}. They multiply with wgmma (Hopper's warpgroup "
                     "MMA), not mma.sync: wgmma's ceiling is higher, bounded by the dense peak; the red line bounds "
                     "steps 3-6 and PyTorch's flash backend, which use mma.sync.")
    text = [w for t in notes + ["Sources:"] + src for w in textwrap.wrap(t, 190, subsequent_indent="    ")]
    fig.text(0.01, 0.01, "\n".join(text), fontsize=7, va="bottom", ha="left", linespacing=1.4)
    lin.legend(loc="upper center", bbox_to_anchor=(0.1, -0.07), ncol=1, fontsize=8, frameon=False)
    height = fig.get_size_inches()[1]
    # Left: the row labels; right: the column of values beside the axes; bottom: the legend and sources.
    fig.subplots_adjust(left=0.31, right=0.76, top=1 - 1.0 / height,
                        bottom=(1.05 + 0.5 + 0.14 * len(text)) / height)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "scoreboard-h100.png"),
                    help="the PNG to write")
    ap.add_argument("--table", action="store_true", help="print the markdown table instead of plotting")
    ap.add_argument("--update-index", metavar="FILE", help="rewrite FILE's scoreboard table instead of plotting")
    a = ap.parse_args()
    if a.table or a.update_index:
        page = os.path.abspath(a.update_index) if a.update_index else os.path.join(ROOT, "docs", "index.md")
        text = table(os.path.relpath(os.path.dirname(page), ROOT))
        if a.table:
            print(text)
        if a.update_index:
            update_index(a.update_index, text)
        return
    plot(a.out)
    print(f"plot_scoreboard.py: wrote {os.path.relpath(a.out)}")


if __name__ == "__main__":
    main()
