#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/plot.py: plots and tables from a sweep JSON (docs/bench/sweep.py).

    plot.py RESULT.json [--out-dir DIR]           PNGs: RESULT-fwd.png and, with backward data, RESULT-bwd.png
    plot.py RESULT.json --table                   print the results as markdown tables
    plot.py RESULT.json --update-readme README.md rewrite the tables between the README's markers
                                                  <!-- results:begin --> and <!-- results:end -->

Each figure has four panels (d = 64, 128 x non-causal, causal) of TFLOP/s against the sequence length:
one solid line per stage (and variant), a dashed line per PyTorch peer, and a dashed grey line for the
measured mma.sync ceiling. Numbers in tables and README are generated from the JSON, never typed.
"""
import argparse
import itertools
import json
import os
import re
import sys

MODES = {"fwd": "forward", "bwd": "backward"}
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
PEER_LABELS = {"torch_sdpa_flash": "PyTorch SDPA (flash)", "torch_sdpa_cudnn": "PyTorch SDPA (cuDNN)"}


def load(path):
    with open(path) as f:
        return json.load(f)


def panels(data):
    """(d, causal) pairs present, in order: d ascending, non-causal first."""
    return sorted({(r["d"], r["causal"]) for r in data["records"]})


def series(data, mode):
    """{label: {(d, causal): {N: tflops or None}}} for one mode: stages in tutorial order, then peers."""
    recs = [r for r in data["records"] if r["mode"] == mode]
    variants = {}
    for r in recs:
        variants.setdefault(r["name"], set()).add(r["variant"])

    def label(r):
        if r["kind"] == "peer":
            return PEER_LABELS.get(r["name"], r["name"])
        return r["name"] + (f" ({r['variant']})" if len(variants[r["name"]]) > 1 or "against" in r else "")

    out = {}
    for r in sorted(recs, key=lambda r: (r["kind"] == "peer", r["name"], r["variant"])):
        out.setdefault((label(r), r["kind"]), {}).setdefault((r["d"], r["causal"]), {})[r["N"]] = r["tflops"]
        if r.get("against_ms") and r["ms"]:  # the --bench-against variant, timed in the same rounds
            against = (f"{r['name']} ({r['against']})", r["kind"])
            out.setdefault(against, {}).setdefault((r["d"], r["causal"]), {})[r["N"]] = r["tflops"] * r["ms"] / r["against_ms"]
    return out


def ratio_tables(data):
    """Markdown: main run / --bench-against variant per mode, panel and N, where the records have both.
    "=" marks points where both ran the same configurations (step 6 kept the default)."""
    recs = [r for r in data["records"] if r.get("against_ms") and r.get("ms")]
    if not recs:
        return []
    seqs = sorted({r["N"] for r in recs})
    lines = []
    for mode in MODES:
        mine = [r for r in recs if r["mode"] == mode]
        if not mine:
            continue
        r0 = mine[0]
        lines += ["", f"**{MODES[mode]}: {r0['name']} {r0['variant']} / {r0['against']}, time ratio "
                  f"(> 1: {r0['variant']} faster)**", "",
                  "| | " + " | ".join(f"N={seq_label(n)}" for n in seqs) + " |", "|---|" + "---:|" * len(seqs)]
        for d, causal in sorted({(r["d"], r["causal"]) for r in mine}):
            cells = []
            for n in seqs:
                r = next((r for r in mine if (r["d"], r["causal"], r["N"]) == (d, causal, n)), None)
                if r is None:
                    cells.append("—")
                    continue
                same = r.get("config") is not None and r.get("config") == r.get("default_config")
                cells.append(f"{r['against_ms'] / r['ms']:.3f}" + (" =" if same else f" ({r['config']})" if r.get("config") else ""))
            lines.append(f"| {panel_title(d, causal)} | " + " | ".join(cells) + " |")
    return lines


def has_data(data, mode):
    return any(r["mode"] == mode and r["tflops"] for r in data["records"])


def panel_title(d, causal):
    return f"d = {d}, {'causal' if causal else 'non-causal'}"


def seq_label(n):
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


# ---- figures ------------------------------------------------------------------------------------

def line_styles(data, colors):
    """One style per series, the same in the forward and backward figures: stages solid, peers dashed."""
    stage_colors = itertools.cycle(colors)
    peer_styles = itertools.cycle([("black", "s"), ("dimgray", "^"), ("saddlebrown", "D")])
    styles = {}
    for lab, kind in {k: None for mode in MODES for k in series(data, mode)}:
        if kind == "peer":
            color, marker = next(peer_styles)
            styles[lab] = dict(color=color, marker=marker, linestyle="--", markerfacecolor="none")
        else:
            styles[lab] = dict(color=next(stage_colors), marker="o", linestyle="-")
    return styles


def plot(data, mode, path):
    try:
        import matplotlib
    except ImportError:
        sys.exit(f"plot.py: this Python ({sys.executable}) has no matplotlib; run it with Debian's "
                 "/usr/bin/python3 (apt-get install python3-matplotlib), or use --table, which needs none")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = panels(data)
    ds, causals = sorted({d for d, _ in grid}), sorted({c for _, c in grid})
    fig, axes = plt.subplots(len(ds), len(causals), figsize=(6.2 * len(causals), 4.4 * len(ds)),
                             squeeze=False, sharex=True)
    seqs = sorted({r["N"] for r in data["records"]})
    peak = data.get("mma_peak_tflops")
    styles = line_styles(data, plt.get_cmap("tab10").colors)
    for (lab, _), by_panel in series(data, mode).items():
        for (d, causal), pts in by_panel.items():
            ax = axes[ds.index(d)][causals.index(causal)]
            xs = [n for n in sorted(pts) if pts[n]]
            ax.plot(xs, [pts[n] for n in xs], label=lab, linewidth=1.6, markersize=5, **styles[lab])
    for row, d in enumerate(ds):
        for col, causal in enumerate(causals):
            ax = axes[row][col]
            if peak:
                ax.axhline(peak, color="firebrick", linestyle="--", linewidth=1.2,
                           label=f"mma.sync bf16 peak ({peak:.0f})")
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqs, [seq_label(n) for n in seqs])
            ax.minorticks_off()
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.set_title(panel_title(d, causal))
            if row == len(ds) - 1:
                ax.set_xlabel(f"sequence length N (B*N = {data['tokens']}, Hq*d = {data['width']})")
            ax.set_ylabel("TFLOP/s")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes.flat:  # a series may be missing from the first panel: collect every label once
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), frameon=False)
    runs = sorted({r["run"] for r in data["records"] if r["mode"] == mode and r.get("run")})
    when = f"runs at git {', '.join(runs)} (merged)" if runs else f"{data['date']} (git {data['git']})"
    fig.suptitle(f"{data['gpu']}: {MODES[mode]} pass, {data['dtype']} - {when}")
    fig.tight_layout(rect=(0, 0.04 + 0.03 * ((len(labels) - 1) // 4), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- markdown -----------------------------------------------------------------------------------

def fmt(v):
    return f"{v:.1f}" if v else "—"


def tables(data, source):
    """The results as markdown: one table per mode and panel, stage and peer rows, one column per N."""
    seqs = sorted({r["N"] for r in data["records"]})
    peak = data.get("mma_peak_tflops")
    lines = [f"TFLOP/s on {data['gpu']}, {data['dtype']}, B*N = {data['tokens']}, Hq*d = {data['width']}, "
             f"measured {data['date']} at git {data['git']}"
             + (f"; mma.sync bf16 ceiling {peak:.0f} TFLOP/s" if peak else "")
             + f". Generated by `docs/bench/plot.py` from [{os.path.basename(source)}]({source});"
             + " — = failed or not run."
             + (f" Runs: {data['note']}" if data.get("note") else "")]
    for mode in MODES:
        if not has_data(data, mode):
            continue
        ser = series(data, mode)
        for d, causal in panels(data):
            lines += ["", f"**{MODES[mode]}, {panel_title(d, causal)}**", "",
                      "| | " + " | ".join(f"N={seq_label(n)}" for n in seqs) + " |",
                      "|---|" + "---:|" * len(seqs)]
            for (lab, _), by_panel in ser.items():
                pts = by_panel.get((d, causal), {})
                lines.append(f"| {lab} | " + " | ".join(fmt(pts.get(n)) for n in seqs) + " |")
    return "\n".join(lines + ratio_tables(data))


def update_readme(readme, text):
    if not os.path.isfile(readme):
        sys.exit(f"plot.py: {readme} does not exist")
    with open(readme) as f:
        old = f.read()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(old):
        sys.exit(f"plot.py: {readme} has no {BEGIN} ... {END} markers")
    new = pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", old, count=1)
    with open(readme, "w") as f:
        f.write(new)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="a sweep result written by docs/bench/sweep.py")
    ap.add_argument("--out-dir", help="where the PNGs go (default: beside the JSON)")
    ap.add_argument("--table", action="store_true", help="print markdown tables instead of plotting")
    ap.add_argument("--update-readme", metavar="FILE", help="rewrite FILE's results table instead of plotting")
    a = ap.parse_args()
    data = load(a.json)
    if a.table or a.update_readme:
        base = os.path.dirname(os.path.abspath(a.update_readme)) if a.update_readme else os.getcwd()
        text = tables(data, os.path.relpath(os.path.abspath(a.json), base))
        if a.table:
            print(text)
        if a.update_readme:
            update_readme(a.update_readme, text)
            print(f"updated {a.update_readme}")
        return
    out_dir = a.out_dir or os.path.dirname(os.path.abspath(a.json))
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(a.json))[0]
    for mode in MODES:
        if has_data(data, mode):
            path = os.path.join(out_dir, f"{stem}-{mode}.png")
            plot(data, mode, path)
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
