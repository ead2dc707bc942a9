#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/plot_ablation.py: the autotuner's ablation as a bar chart.

    plot_ablation.py TABLE.jsonl [--out FILE.png]

TABLE.jsonl holds one line per tuned problem, written by `step6_autotune --autotune --table-json FILE`:
every configuration the autotuner timed (Br, Bc, warps, pipeline stages) and its TFLOP/s. One panel per
problem; the bars are step 4's configurations in step 4's colour, the one step 6 chose in step 6's
(docs/bench/palette.py, shared with plot.py); the title names the device and the build of each run.
Runs under /usr/bin/python3 (Debian's matplotlib).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import palette  # noqa: E402  (docs/bench/palette.py: the course's colours)

try:
    import matplotlib
except ImportError:
    sys.exit(f"plot_ablation.py: this Python ({sys.executable}) has no matplotlib; run it with Debian's "
             "/usr/bin/python3 (apt-get install python3-matplotlib)")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

CONFIG_COLOR = palette.stage_color("step4_fused_pipelined")  # the kernels are step 4's
CHOSEN_COLOR = palette.stage_color("step6_autotune")         # the choice is step 6's


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table", help="JSON lines from step6_autotune --table-json")
    ap.add_argument("--out", help="PNG to write (default: TABLE with .png)")
    args = ap.parse_args()
    with open(args.table) as f:
        problems = [json.loads(line) for line in f if line.strip()]
    if not problems:
        raise SystemExit(f"{args.table}: no tables")
    fig, axes = plt.subplots(1, len(problems), figsize=(4.2 * len(problems), 4.6), squeeze=False, sharey=True)
    for ax, p in zip(axes[0], problems):
        names = [name for name, _ in p["table"]]
        values = [tf for _, tf in p["table"]]
        colors = [CHOSEN_COLOR if n == p["chosen"] else CONFIG_COLOR for n in names]
        bars = ax.bar(range(len(names)), values, color=colors)
        for b, v in zip(bars, values):
            ax.text(b.get_x() + b.get_width() / 2, v + 3, f"{v:.0f}", ha="center", fontsize=7)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"d = {p['d']}, N = {p['Nq']}, {'causal' if p['causal'] else 'non-causal'}", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("forward TFLOP/s")
    devices = sorted({p["device"] for p in problems})
    builds = sorted({p.get("git", "unknown") for p in problems})
    fig.suptitle(f"Step 6 ablation: every step 4 configuration (Br-Bc-warps-stages), {problems[0]['dtype']}, "
                 f"on {', '.join(devices)}, build {', '.join(builds)}", fontsize=10)
    fig.legend([Patch(color=CONFIG_COLOR), Patch(color=CHOSEN_COLOR)],
               ["step4_fused_pipelined configuration", "step6_autotune's choice"],
               loc="lower center", ncol=2, frameon=False, fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    out = args.out or os.path.splitext(args.table)[0] + ".png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
