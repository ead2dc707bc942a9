#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/plot_decode.py: the decode sweep's plot and table.

    plot_decode.py RESULT.json [--out PNG]     the figure: RESULT.png beside the JSON (or PNG)
    plot_decode.py RESULT.json --table         markdown: per point, the stage's GB/s, the faster SDPA
                                               backend's, their ratio, and the stage's % of the roof

RESULT.json is written by `docs/bench/sweep.py --decode`. The figure has one panel per (Nq, Hkv) row and
head dim column, GB/s against the KV length Nk (log scale): one line per stage or peer and batch size B.
Colour and line come from palette.py (a stage's colour, peers dashed with hollow markers; runs of one
stage with different --stage-flags, such as --splits N, keep its colour and change the line); the marker
says B. The dashed red line is the roof: the GPU's device-to-device copy bandwidth, measured in the same
run. GB/s is the record's gbps: bytes read and written / time, K and V once per KV head, or at Hq heads
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
    """matplotlib keyword arguments of an implementation's lines (the marker is B's, set per line)."""
    kind, name, variant, flags = key
    st = palette.line_style(kind, name, variant)
    if kind == "stage":
        runs = sorted(k[3] for k in keys if k[:3] == key[:3])
        if len(runs) > 1:
            st["linestyle"] = palette.DECODE_FLAG_LINES[runs.index(flags) % len(palette.DECODE_FLAG_LINES)]
    st.pop("marker", None)
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

    width, height = max(10.0, 6.4 * len(ds)), 3.6 * len(rows) + 1.2
    fig, axes = plt.subplots(len(rows), len(ds), figsize=(width, height), squeeze=False, sharex=True, sharey=True)
    for i, (key, lab) in enumerate(impls.items()):
        pts = by_point(data, key)
        for b in batches:
            for (nq, hkv) in rows:
                for d in ds:
                    xs = [n for n in nks if (pts.get((d, nq, hkv, b, n)) or {}).get("gbps")]
                    ax = axes[rows.index((nq, hkv))][ds.index(d)]
                    ax.plot(xs, [pts[(d, nq, hkv, b, n)]["gbps"] for n in xs], linewidth=1.4, markersize=5.5,
                            marker=palette.batch_marker(b, batches), zorder=3 - i / len(impls),
                            **style(key, impls))
    hq = data.get("Hq", 32)
    for row, (nq, hkv) in enumerate(rows):
        for col, d in enumerate(ds):
            ax = axes[row][col]
            if roof:
                ax.axhline(roof, color=palette.CEILING_COLOR, linestyle="--", linewidth=1.2)
            ax.set_xscale("log", base=2)
            ax.set_xticks(nks, [nk_label(n) for n in nks])
            ax.minorticks_off()
            ax.set_ylim(0, max(values) * 1.08)
            ax.grid(True, alpha=0.3)
            ax.set_title(panel_title(d, nq, hkv, hq), fontsize=10)
            if row == len(rows) - 1:
                ax.set_xlabel("KV length Nk")
            if col == 0:
                ax.set_ylabel("GB/s")
    # The legend in two parts: what the colour and line say, then what the marker says.
    handles = [Line2D([], [], **style(k, impls), label=lab) for k, lab in impls.items()]
    handles += [Line2D([], [], color="dimgray", linestyle="none", marker=palette.batch_marker(b, batches),
                       label=f"B = {b}") for b in batches]
    if roof:
        handles.append(Line2D([], [], color=palette.CEILING_COLOR, linestyle="--",
                              label=f"copy bandwidth ({roof:.0f} GB/s)"))
    ncol = min(4, len(handles))
    notes = [f"Measured {data['date']}, build {data.get('build_git') or data['git']}, torch {data.get('torch')}. "
             "GB/s = (Q + K + V read, O written) bytes / time, K and V once per KV head; "
             "causal bottom-right (input_pos = Nk - Nq)."]
    notes += ([f"Roof: {data['copy_method']}."] if roof else ["No roof: the run had no PyTorch with CUDA."])
    for run in sorted({r["run"] for r in data["records"] if r.get("run")}):  # parts merged in (merge.py)
        notes.append(f"Measured {run}: the points with " + run_points(data["records"], run) + ".")
    notes += peer_notes(data, impls)
    # Bottom to top: the notes, wrapped to the figure's width, then the legend; heights in figure fractions.
    notes = [line for n in notes for line in textwrap.wrap(n, int(width * 72 / 7.5 * 1.9))]
    note_h, legend_row_h = 7.5 * 1.5 / 72 / height, 9 * 1.9 / 72 / height
    fig.text(0.01, 0.006, "\n".join(notes), fontsize=7.5, va="bottom", ha="left", linespacing=1.5)
    legend_y = 0.012 + note_h * len(notes)
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, legend_y), ncol=ncol, frameon=False,
               fontsize=9)
    fig.suptitle(f"{data['gpu']}: decode forward, {data['dtype']}, Hq = {hq}: GB/s against the KV length")
    legend_rows = (len(handles) + ncol - 1) // ncol
    fig.tight_layout(rect=(0, legend_y + legend_row_h * legend_rows, 1, 0.985))
    fig.savefig(path, dpi=110)
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
