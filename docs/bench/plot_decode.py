#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/plot_decode.py: the decode sweep's plot and table.

    plot_decode.py RESULT.json [--out PNG]     the figure: RESULT.png beside the JSON (or PNG)
    plot_decode.py RESULT.json --table         markdown: per point, the stage's GB/s, the faster SDPA
                                               backend's, their ratio, and the stage's % of the roof

RESULT.json is written by `docs/bench/sweep.py --decode`. The figure has one column per batch size B and
one row per (Nq, Hkv), each panel titled with all three; in a panel, GB/s against the KV cache length Nk,
once per head dim d (two groups of Nk ticks, side by side): one line per stage or peer and d. Colour,
line and marker come from palette.py (a stage's colour, peers dashed with hollow markers; runs of one
stage with different --stage-flags, such as --splits N, keep its colour and change the line). The dashed
red line is the roof: the GPU's device-to-device copy bandwidth, measured in the same run, labelled with
its value. GB/s is the record's gbps: bytes read and written / time, K and V once per KV head, or at Hq heads
for a peer that was given them repeated (its gqa field), so that a line is what the kernel really moved.
The table's ratio is a time ratio (SDPA time / stage time, > 1: the stage is faster). Needs matplotlib
for the figure only: run it with Debian's /usr/bin/python3.
"""
import argparse
import json
import os
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import palette  # noqa: E402  (docs/bench/palette.py: the course's colours)


def load(path):
    with open(path) as f:
        data = json.load(f)
    if data.get("sweep") != "decode":
        sys.exit(f"plot_decode.py: {path} is not a decode sweep (sweep.py --decode); docs/bench/plot.py draws it")
    data["records"] = [r for r in data["records"] if r["mode"] == "decode"]
    return data


def impl_key(r):
    """What one line is (before B): a peer, or a stage with its variant and --stage-flags."""
    return (r["kind"], r["name"], r["variant"], r.get("stage_flags", ""))


def implementations(data):
    """{impl_key: legend label}: stages first (by name, variant, flags), then the peers."""
    keys = sorted({impl_key(r) for r in data["records"]}, key=lambda k: (k[0] == "peer", k[1], k[2], k[3]))
    variants = {}
    for kind, name, variant, _ in keys:
        variants.setdefault(name, set()).add(variant)
    repeated = {impl_key(r) for r in data["records"] if r.get("gqa") == "repeat_interleave"}

    def label(k):
        kind, name, variant, flags = k
        if kind == "peer":
            lab = palette.peer_label(name)
        else:
            lab = name + (f" ({variant})" if len(variants[name]) > 1 else "") + (f" {flags}" if flags else "")
        return lab + (" †" if k in repeated else "")
    return {k: label(k) for k in keys}


def point(r):
    return (r["d"], r["Nq"], r["Hkv"], r["B"], r["Nk"])


def by_point(data, key):
    return {point(r): r for r in data["records"] if impl_key(r) == key}


def style(key, keys):
    """matplotlib keyword arguments of an implementation's lines: the palette's colour, line and marker of its
    stage or peer; runs of one stage with different --stage-flags keep its colour and change the line."""
    kind, name, variant, flags = key
    st = palette.line_style(kind, name, variant)
    if kind == "stage":
        runs = sorted(k[3] for k in keys if k[:3] == key[:3])
        if len(runs) > 1:
            st["linestyle"] = palette.DECODE_FLAG_LINES[runs.index(flags) % len(palette.DECODE_FLAG_LINES)]
    return st


def nk_label(n):
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def panel_title(d, nq, hkv, hq):
    group = f"{hq // hkv} query heads per KV head" if hkv < hq else "no GQA"
    return f"d = {d}, Nq = {nq}, Hkv = {hkv} ({group})"


def peer_notes(data, impls):
    """What the figure and table must say about how the peers were given GQA and the causal mask."""
    notes = []
    for k, lab in impls.items():
        recs = [r for r in data["records"] if impl_key(r) == k and k[0] == "peer"]
        masks = sorted({r["mask"] for r in recs if r.get("mask") and r["Nq"] > 1})
        rep = sum(1 for r in recs if r.get("gqa") == "repeat_interleave")
        if masks:
            notes.append(f"{lab.rstrip(' †')}: bottom-right causal at Nq > 1 as {', '.join(masks)}")
        if rep:
            notes.append(f"† {lab.rstrip(' †')} refused enable_gqa at {rep} points and was given K/V repeated to "
                         "Hq heads: its GB/s counts the repeated K/V it read")
    return notes


# ---- the figure ---------------------------------------------------------------------------------

def plot(data, path):
    try:
        import matplotlib
    except ImportError:
        sys.exit(f"plot_decode.py: this Python ({sys.executable}) has no matplotlib; run it with Debian's "
                 "/usr/bin/python3 (apt-get install python3-matplotlib), or use --table, which needs none")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    recs = data["records"]
    ds = sorted({r["d"] for r in recs})
    rows = sorted({(r["Nq"], r["Hkv"]) for r in recs})
    nks = sorted({r["Nk"] for r in recs})
    batches = sorted({r["B"] for r in recs})
    impls = implementations(data)
    roof = data.get("copy_gbps")
    values = [r["gbps"] for r in recs if r.get("gbps")] + ([roof] if roof else [])
    if not values:
        sys.exit("plot_decode.py: no record has a time: nothing to plot")
    hq = data.get("Hq", 32)

    # One column per batch size B, one row per (Nq, Hkv); in a panel, the KV length Nk along x, once per
    # head dim d (a group of Nk ticks each, side by side): every panel holds one line per implementation
    # and d, and its title says B, Nq and Hkv.
    gap = 0.8
    xpos = {(d, n): i * (len(nks) - 1 + gap) + j for i, d in enumerate(ds) for j, n in enumerate(nks)}
    notes = [f"Measured {data['date']}, build {data.get('build_git') or data['git']}, torch {data.get('torch')}. "
             "GB/s = (Q + K + V read, O written) bytes / time, K and V once per KV head; "
             "causal bottom-right (input_pos = Nk - Nq)."]
    notes += ([f"Roof: {data['copy_method']}."] if roof else ["No roof: the run had no PyTorch with CUDA."])
    for run in sorted({r["run"] for r in data["records"] if r.get("run")}):  # parts merged in (merge.py)
        notes.append(f"Measured {run}: the points with " + run_points(data["records"], run) + ".")
    notes += peer_notes(data, impls)
    handles = [Line2D([], [], linewidth=1.5, **style(k, impls), label=lab) for k, lab in impls.items()]
    if roof:
        handles.append(Line2D([], [], color=palette.CEILING_COLOR, linestyle="--",
                              label=f"roof: copy bandwidth, measured in this run: {roof:.0f} GB/s"))
    width = max(10.0, 4.7 * len(batches))
    notes = [line for n in notes for line in textwrap.wrap(n, int(width * 72 / 7.5 * 1.75))]
    ncol = min(4, len(handles))
    legend_rows = (len(handles) + ncol - 1) // ncol
    note_in, legend_row_in = 7.5 * 1.5 / 72, 9 * 2.0 / 72
    height = 3.0 * len(rows) + 1.0 + note_in * len(notes) + legend_row_in * legend_rows

    fig, axes = plt.subplots(len(rows), len(batches), figsize=(width, height), squeeze=False, sharex=True,
                             sharey=True)
    for i, (key, lab) in enumerate(impls.items()):
        pts = by_point(data, key)
        st = style(key, impls)
        for b in batches:
            for (nq, hkv) in rows:
                ax = axes[rows.index((nq, hkv))][batches.index(b)]
                for d in ds:  # one line per head dim: the groups are not joined
                    xs = [n for n in nks if (pts.get((d, nq, hkv, b, n)) or {}).get("gbps")]
                    ax.plot([xpos[(d, n)] for n in xs], [pts[(d, nq, hkv, b, n)]["gbps"] for n in xs],
                            linewidth=1.5, zorder=3 - i / len(impls), **st)
    top = max(values) * 1.12
    for row, (nq, hkv) in enumerate(rows):
        for col, b in enumerate(batches):
            ax = axes[row][col]
            if roof:
                ax.axhline(roof, color=palette.CEILING_COLOR, linestyle="--", linewidth=1.1)
                if row == 0 and col == 0:  # under the line, at the right: above it are the d labels
                    ax.annotate(f"roof {roof:.0f} GB/s, measured in this run", xy=(0.99, roof),
                                xycoords=ax.get_yaxis_transform(), xytext=(0, -3), textcoords="offset points",
                                fontsize=7.5, color=palette.CEILING_COLOR, va="top", ha="right")
            for i in range(1, len(ds)):  # a thin rule between the head dims
                ax.axvline(i * (len(nks) - 1 + gap) - gap / 2, color="gray", linewidth=0.8)
            ax.set_xticks([xpos[(d, n)] for d in ds for n in nks], [nk_label(n) for d in ds for n in nks])
            ax.set_xlim(-0.35, xpos[(ds[-1], nks[-1])] + 0.35)
            ax.set_ylim(0, top)
            ax.grid(True, alpha=0.3)
            group = f"{hq // hkv} query heads per KV head" if hkv < hq else "no GQA"
            ax.set_title(f"B = {b}, Nq = {nq}, Hkv = {hkv} ({group})", fontsize=9.5)
            for d in ds:  # which head dim each group of ticks is, at the top of the panel, above the roof
                mid = (xpos[(d, nks[0])] + xpos[(d, nks[-1])]) / 2
                ax.text(mid, 0.985, f"d = {d}", transform=ax.get_xaxis_transform(), ha="center", va="top",
                        fontsize=8.5, color="dimgray")
            if row == len(rows) - 1:
                ax.set_xlabel("KV cache length Nk (left group d = %s, right d = %s)" % (ds[0], ds[-1])
                              if len(ds) == 2 else "KV cache length Nk", fontsize=9)
            if col == 0:
                ax.set_ylabel("GB/s")
    for col, b in enumerate(batches):  # the batch size, large, over its column
        axes[0][col].annotate(f"batch B = {b}", xy=(0.5, 1), xycoords="axes fraction", xytext=(0, 18),
                              textcoords="offset points", ha="center", va="bottom", fontsize=12,
                              fontweight="bold")
    # Bottom to top: the notes, wrapped to the figure's width, then the legend; heights in figure fractions.
    note_h, legend_row_h = note_in / height, legend_row_in / height
    fig.text(0.01, 0.006, "\n".join(notes), fontsize=7.5, va="bottom", ha="left", linespacing=1.5)
    legend_y = 0.012 + note_h * len(notes)
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, legend_y), ncol=ncol, frameon=False,
               fontsize=9)
    fig.suptitle(f"{data['gpu']}: decode forward, {data['dtype']}, Hq = {hq}: GB/s against the KV cache length, "
                 "one column per batch size")
    fig.tight_layout(rect=(0, legend_y + legend_row_h * legend_rows, 1, 0.975), h_pad=1.2)
    fig.savefig(path, dpi=92)  # under 300 KB
    plt.close(fig)


def run_points(records, run):
    """Which points of the figure a merged run measured: its (B, Hkv) pairs, each with the (Nk, d) it did or
    did not measure where the run holds only some of that pair's points."""
    out = []
    for b, h in sorted({(r["B"], r["Hkv"]) for r in records if r.get("run") == run}):
        pair_records = [r for r in records if (r["B"], r["Hkv"]) == (b, h)]
        mine = {(r["Nk"], r["d"]) for r in pair_records if r.get("run") == run}
        rest = {(r["Nk"], r["d"]) for r in pair_records} - mine
        pair = f"B = {b}, Hkv = {h}"
        if rest:
            few, word = (mine, "at") if len(mine) <= len(rest) else (rest, "but")
            pair += f" {word} " + ", ".join(f"Nk = {nk_label(n)}, d = {d}" for n, d in sorted(few))
        out.append(pair)
    return "; ".join(out)


# ---- the table ----------------------------------------------------------------------------------

def fmt(v, spec=".0f"):
    return format(v, spec) if v else "—"


def table(data, source):
    """Markdown: one table per stage run (one row per point), or the peers alone when no stage ran."""
    impls = implementations(data)
    stages = [k for k in impls if k[0] == "stage"]
    peers = [k for k in impls if k[0] == "peer"]
    peer_pts = {k: by_point(data, k) for k in peers}
    roof = data.get("copy_gbps")
    hq = data.get("Hq", 32)
    all_points = sorted({point(r) for r in data["records"]})
    lines = [f"Decode forward on {data['gpu']}, {data['dtype']}, Hq = {hq}, causal bottom-right, measured "
             f"{data['date']}, build {data.get('build_git') or data['git']}"
             + (f"; roof: copy bandwidth {roof:.0f} GB/s, measured in the same run" if roof else "; no roof measured")
             + ". GB/s = (Q + K + V read, O written) bytes / time, K and V once per KV head. SDPA: the faster of "
             + ", ".join(impls[k] for k in peers) + " at each point; ratio = SDPA time / stage time "
             "(> 1: the stage is faster). Generated by `docs/bench/plot_decode.py` from "
             f"[{os.path.basename(source)}]({source}); — = failed or not run."]
    lines += [f"{n}." for n in peer_notes(data, impls)]

    def best_peer(p):
        timed = [(peer_pts[k][p]["ms"], k) for k in peers if p in peer_pts[k] and peer_pts[k][p]["ms"]]
        return min(timed) if timed else (None, None)

    def short(r):  # "flash", "cuDNN †": the backend, marked where it was given K/V repeated
        return palette.peer_label(r["name"]).replace("PyTorch SDPA (", "").rstrip(")") \
            + (" †" if r.get("gqa") == "repeat_interleave" else "")

    head = "| d | Nq | Hkv | B | Nk |"
    for key in stages:
        mine = by_point(data, key)
        lines += ["", f"**{impls[key]}**", "",
                  head + " stage GB/s | SDPA GB/s | SDPA | SDPA / stage time | stage % of roof |",
                  "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
        for p in sorted(mine):  # the points this stage run measured (or failed at)
            r = mine[p]
            ms, k = best_peer(p)
            peer = peer_pts[k][p] if k else {}
            ratio = f"{ms / r['ms']:.2f}" if ms and r.get("ms") else "—"
            pct = f"{100 * r['gbps'] / roof:.0f}%" if roof and r.get("gbps") else "—"
            lines.append(f"| {p[0]} | {p[1]} | {p[2]} | {p[3]} | {nk_label(p[4])} | {fmt(r.get('gbps'))} | "
                         f"{fmt(peer.get('gbps'))} | {short(peer) if k else '—'} | {ratio} | {pct} |")
    if not stages and peers:
        lines += ["", "**PyTorch SDPA, the faster backend**", "",
                  head + " SDPA GB/s | SDPA | % of roof |", "|---:|---:|---:|---:|---:|---:|---|---:|"]
        for p in all_points:
            ms, k = best_peer(p)
            peer = peer_pts[k][p] if k else {}
            pct = f"{100 * peer['gbps'] / roof:.0f}%" if roof and k else "—"
            lines.append(f"| {p[0]} | {p[1]} | {p[2]} | {p[3]} | {nk_label(p[4])} | {fmt(peer.get('gbps'))} | "
                         f"{short(peer) if k else '—'} | {pct} |")
    failed = {}
    for r in data["records"]:
        if r.get("error"):
            failed.setdefault((impls[impl_key(r)], r["error"]), []).append(r)
    if failed:
        lines += [""] + [f"Failed: {lab} at {len(rs)} point(s): {err}" for (lab, err), rs in failed.items()]
    if data.get("skipped"):
        lines += ["", "Not run: " + "; ".join(
            f"B={s['B']} Hkv={s['Hkv']} Nq={s['Nq']} Nk={nk_label(s['Nk'])} d={s['d']} ({s['reason']})"
            for s in data["skipped"]) + "."]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="a decode sweep written by docs/bench/sweep.py --decode")
    ap.add_argument("--out", help="the PNG (default: beside the JSON, with its name)")
    ap.add_argument("--table", action="store_true", help="print a markdown table instead of plotting")
    a = ap.parse_args()
    data = load(a.json)
    if a.table:
        print(table(data, os.path.relpath(os.path.abspath(a.json), os.getcwd())))
        return
    out = a.out or os.path.splitext(os.path.abspath(a.json))[0] + ".png"
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    plot(data, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
