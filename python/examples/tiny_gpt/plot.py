"""FlashAttention, step by step — python/examples/tiny_gpt/plot.py: the two loss curves of one train.py run.

    /usr/bin/python3 python/examples/tiny_gpt/plot.py RUN.json OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def smooth(xs, k=10):
    out, acc = [], []
    for x in xs:
        acc = (acc + [x])[-k:]
        out.append(sum(acc) / len(acc))
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot.py RUN.json OUT.png")
    rec = json.load(open(sys.argv[1]))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    # SDPA wide and grey underneath, the course's kernels dashed on top: where the curves agree, both show.
    for name, label, color, width, style in (("sdpa", "PyTorch SDPA", "#9a9a9a", 4.0, "-"),
                                             ("flash_step", "this course's kernels", "#c0392b", 1.4, "--")):
        r = rec[name]
        steps = range(1, len(r["loss"]) + 1)
        if len(steps) <= 500:  # each step's loss too, where there are few enough to see (longer: noise)
            ax.plot(steps, r["loss"], color=color, alpha=0.25, linewidth=0.8)
        ax.plot(steps, smooth(r["loss"], max(10, len(steps) // 100)), color=color, linewidth=width, linestyle=style,
                label=f"{label}: {r['tokens_per_s'] / 1e3:.0f} k tokens/s")
        ax.plot([s + 1 for s, _ in r["val"]], [v for _, v in r["val"]], "o", color=color,
                markersize=7 if name == "sdpa" else 3.5)
    ax.set_xlabel("step (16 x 256 tokens)" if rec["batch"] == 16 and rec["context"] == 256 else "step")
    ax.set_ylabel("cross-entropy (nats per byte, mean of the last\n" + f"{max(10, len(rec['sdpa']['loss']) // 100)} steps); dots: validation")
    ax.set_title(f"byte-level GPT, {rec['params'] / 1e6:.1f} M parameters, bf16, one seed ({rec['gpu']})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=100, pil_kwargs={"optimize": True})
    print(f"wrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
