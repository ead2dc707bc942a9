#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/plot.py: plots and tables from a sweep JSON (docs/bench/sweep.py).

    plot.py RESULT.json [--out-dir DIR]           PNGs: RESULT-fwd.png and, with backward data, RESULT-bwd.png
    plot.py RESULT.json --table                   print the results as markdown tables
    plot.py RESULT.json --update-readme README.md rewrite the tables between the README's markers
                                                  <!-- results:begin --> and <!-- results:end -->

Each figure has four panels (d = 64, 128 x non-causal, causal) of TFLOP/s against the sequence length:
one solid line per stage (a second variant keeps the colour, with its own line and marker), a dashed line
per PyTorch peer, and one dashed red line: the mma.sync ceiling measured in this run (the JSON's
mma_peak_tflops), labelled with its value. In the colours of palette.py, which every plot of the course
shares. When the values span more than a factor of 10 (step 3 beside step 4) the TFLOP/s axis is
logarithmic, and says so. Under the legend, wrapped to the figure's width: a note where a wgmma kernel
(cuDNN, step 7) passes the mma.sync line, a note for each pair of lines that lie on top of each other, and
one line per run that gave the figure's records: its build, its date and what it measured. A mode with no
stage record (peers only) gets no figure. Numbers in tables and README are generated from the JSON,
never typed.
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import palette  # noqa: E402  (docs/bench/palette.py: the course's colours)

MODES = {"fwd": "forward", "bwd": "backward"}
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def load(path):
    with open(path) as f:
        return json.load(f)


def panels(data):
    """(d, causal) pairs present, in order: d ascending, non-causal first."""
    return sorted({(r["d"], r["causal"]) for r in data["records"]})


def run_of(data, r):
    """(build, date) of the run a record came from: the `run` merge.py gave it ("DATE build GIT", or an
    older merge's bare "GIT", whose date was not kept), else the file's own build and date."""
    run = r.get("run")
    if not run:
        return data.get("build_git") or data["git"], data["date"]
    m = re.fullmatch(r"(.+) build (\S+)", run)
    return (m[2], m[1]) if m else (run, None)


def series(data, mode):
    """{(label, kind): {(d, causal): {N: tflops or None}}} for one mode: stages in tutorial order, then peers."""
    return {(lab, s["kind"]): s["points"] for lab, s in series_info(data, mode).items()}


def series_info(data, mode):
    """{label: {kind, name, variant, points: {(d, causal): {N: tflops}}, runs: {(build, date): {N}},
    run_ds: {(build, date): {d}}}}."""
    recs = [r for r in data["records"] if r["mode"] == mode]
    variants = {}
    for r in recs:
        variants.setdefault(r["name"], set()).add(r["variant"])

    def label(r):
        if r["kind"] == "peer":
            return palette.peer_label(r["name"])
        return r["name"] + (f" ({r['variant']})" if len(variants[r["name"]]) > 1 or "against" in r else "")

    out = {}

    def add(lab, r, variant, tflops):
        s = out.setdefault(lab, dict(kind=r["kind"], name=r["name"], variant=variant, points={}, runs={},
                                     run_ds={}))
        s["points"].setdefault((r["d"], r["causal"]), {})[r["N"]] = tflops
        s["runs"].setdefault(run_of(data, r), set()).add(r["N"])
        s["run_ds"].setdefault(run_of(data, r), set()).add(r["d"])

    for r in sorted(recs, key=lambda r: (r["kind"] == "peer", r["name"], r["variant"])):
        add(label(r), r, r["variant"], r["tflops"])
        if r.get("against_ms") and r["ms"]:  # the --bench-against variant, timed in the same rounds
            add(f"{r['name']} ({r['against']})", r, r["against"], r["tflops"] * r["ms"] / r["against_ms"])
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


def has_stage(data, mode):
    """A figure needs a stage of the course: peers alone (a step 7 run that timed SDPA's backward too) get none."""
    return any(r["mode"] == mode and r["tflops"] and r["kind"] == "stage" for r in data["records"])


def panel_title(d, causal):
    return f"d = {d}, {'causal' if causal else 'non-causal'}"


def seq_label(n):
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


# ---- figures ------------------------------------------------------------------------------------

def legend_entry(s, mode):
    """(label, style) of a series in the figures: the palette's colour of its stage or peer. Step 6's
    `default` variant runs another stage's kernels untuned, so it is drawn and named as that stage."""
    owner = palette.DEFAULT_CONFIGURATION_OF.get((s["name"], mode))
    if s["kind"] == "stage" and owner and s["variant"] == "default":  # wide and pale: visible under the tuned line
        return f"{owner} (default configuration)", dict(palette.line_style("stage", owner), linewidth=5, alpha=0.45)
    return None, palette.line_style(s["kind"], s["name"], s["variant"])


def figure_styles(info, mode):
    """{label: style} of the figure's series, no two alike: a stage variant whose line and marker another
    series of the figure already has (step 7's 7c with other tiles beside 7c itself) takes the next of
    palette.OTHER_VARIANT_LINES, in its stage's colour."""
    out, seen, spare = {}, set(), iter(palette.OTHER_VARIANT_LINES * 4)
    # The variants palette.py names first, so that they keep their own lines (7c-pingpong its stage's).
    for lab, s in sorted(info.items(), key=lambda item: item[1]["variant"] not in palette.VARIANT_LINES):
        st = legend_entry(s, mode)[1]
        look = lambda st: (st.get("color"), str(st.get("linestyle")), st.get("marker"), st.get("markerfacecolor"))
        while look(st) in seen and s["kind"] == "stage":
            st = {k: v for k, v in st.items() if k not in ("markerfacecolor", "markersize")}
            st.update(next(spare))
        seen.add(look(st))
        out[lab] = st
    return {lab: out[lab] for lab in info}


def seq_range(ns, seqs):
    """"N = 512-2k" for a run of consecutive sweep lengths, "N = 512, 4k" otherwise."""
    idx = sorted(seqs.index(n) for n in ns)
    if idx == list(range(idx[0], idx[-1] + 1)) and len(idx) > 2:
        return f"N = {seq_label(seqs[idx[0]])}-{seq_label(seqs[idx[-1]])}"
    return "N = " + ", ".join(seq_label(seqs[i]) for i in idx)


def run_lines(info, labels, seqs, ds):
    """One line per run of the figure: its build and date, the head dims and lengths it measured, and the
    series it gave ("every series" where it gave all of the figure's)."""
    runs = {}
    for lab, s in info.items():
        for run, ns in s["runs"].items():
            runs.setdefault(run, {})[labels[lab]] = frozenset(ns)
    run_ds = {}
    for s in info.values():
        for run, dd in s["run_ds"].items():
            run_ds.setdefault(run, set()).update(dd)
    lines = []
    for build, date in sorted(runs, key=lambda run: (run[1] is None, run[1] or "", run[0])):  # undated last
        given = runs[(build, date)]
        head = f"build {build} ({date or 'date not recorded'})"
        dd = sorted(run_ds.get((build, date), ds))
        if dd != sorted(ds):
            head += ", d = " + ", ".join(map(str, dd))
        everything = len(given) == len(labels)
        if len(set(given.values())) == 1:  # every series of the run at the same lengths: say them once
            ns = next(iter(given.values()))
            lines.append(head + ("" if ns == set(seqs) else f", {seq_range(ns, seqs)}") + ": "
                         + ("every series" if everything else ", ".join(given)))
        else:
            lines.append(head + ": " + ", ".join(l + ("" if ns == set(seqs) else f" at {seq_range(ns, seqs)}")
                                                   for l, ns in given.items()))
    return lines


def coinciding(info, labels, tolerance=0.03):
    """Notes on pairs of series that lie on top of each other (within `tolerance` at every length of a
    panel), so that a reader looking for two lines finds where the second is."""
    notes = []
    names = list(info)
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            pa, pb = info[names[a]]["points"], info[names[b]]["points"]
            where = []
            for panel in sorted(set(pa) & set(pb)):
                ns = [n for n in pa[panel] if pa[panel][n] and pb[panel].get(n)]
                if ns and all(abs(pa[panel][n] / pb[panel][n] - 1) <= tolerance for n in ns):
                    where.append(panel)
            if where:
                every = len(where) == len(set(pa) & set(pb))
                place = "in every panel" if every else "at " + "; ".join(panel_title(*p) for p in where)
                notes.append(f"{labels[names[a]]} and {labels[names[b]]} lie on top of each other "
                             f"(within {tolerance:.0%} at every N) {place}: each keeps its own marker.")
    return notes


def above_ceiling(info, labels, peak):
    """The note where a series passes the mma.sync line: it multiplies with wgmma, another instruction."""
    over = [lab for lab, s in info.items()
            if any(v and v > peak for pts in s["points"].values() for v in pts.values())]
    if not over:
        return []
    wgmma = [labels[lab] for lab in over if info[lab]["name"] in palette.WGMMA]
    other = [labels[lab] for lab in over if info[lab]["name"] not in palette.WGMMA]
    notes = []
    if wgmma:
        notes.append(f"Above the red mma.sync line: {', '.join(wgmma)}. "
                     f"{'They multiply' if len(wgmma) > 1 else 'It multiplies'} with wgmma (Hopper's warpgroup MMA), "
                     "not mma.sync, and wgmma has a higher ceiling: the red line bounds mma.sync kernels only.")
    if other:
        notes.append(f"Above the red line: {', '.join(other)} (within the spread of one run's timing).")
    return notes


def tflops_values(info):
    return [v for s in info.values() for pts in s["points"].values() for v in pts.values() if v]


def use_log_scale(info):
    """A log axis when the figure's values span more than a factor of 10 (step 3 beside step 4): on a
    linear axis the slow stage would be a flat line on the floor."""
    values = tflops_values(info)
    return bool(values) and max(values) > 10 * min(values)


def plot(data, mode, path, ref=None, ref_what=None):
    """One figure of data's mode. ref: another run of the same shapes (the committed canonical run, beside a run
    of `./run.sh plots`): each series of data that ref has too is drawn again from ref, faint and dotted, and
    ref_what says in the legend what they are."""
    try:
        import matplotlib
    except ImportError:
        sys.exit(f"plot.py: this Python ({sys.executable}) has no matplotlib; run it with Debian's "
                 "/usr/bin/python3 (apt-get install python3-matplotlib), or use --table, which needs none")
    matplotlib.use("Agg")
    import textwrap
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    grid = panels(data)
    ds, causals = sorted({d for d, _ in grid}), sorted({c for _, c in grid})
    seqs = sorted({r["N"] for r in data["records"]})
    peak = data.get("mma_peak_tflops")  # the ceiling measured in the run this file records: one per figure
    info = series_info(data, mode)
    ref_info = {}
    if ref:  # ref's series that data has, under data's labels (a label depends on the variants a file has)
        of_ref = {(s["kind"], s["name"], s["variant"]): s for s in series_info(ref, mode).values()}
        ref_info = {lab: of_ref[(s["kind"], s["name"], s["variant"])] for lab, s in info.items()
                    if (s["kind"], s["name"], s["variant"]) in of_ref}
    log = use_log_scale(info) if not ref_info else use_log_scale({**{("ref", k): v for k, v in ref_info.items()}, **info})
    labels = {lab: legend_entry(s, mode)[0] or lab for lab, s in info.items()}
    styles = figure_styles(info, mode)
    values = tflops_values(info) + tflops_values(ref_info) + ([peak] if peak else [])
    ceiling_label = f"mma.sync bf16 ceiling, measured in this run: {peak:.0f} TFLOP/s" if peak else None
    # Under the legend: what to know when reading the lines, then one line per run; every line wrapped to
    # the figure's width (fontsize 8: about 5.1 points a character at most), so that none is cut at the right.
    width = 6.2 * len(causals)
    notes = (above_ceiling(info, labels, peak) if peak else []) + coinciding(info, labels)
    text = notes + ["Runs, all on " + data["gpu"] + ":"] + run_lines(info, labels, seqs, ds)
    if ref_info:
        text.append(f"Faint dotted lines: {ref_what or 'another run'}, on the {ref['gpu']} ({ref['date']}).")
    lines = [w for t in text for w in textwrap.wrap(t, int(width * 72 / 5.1), subsequent_indent="    ")]
    n_names = len(info) + (1 if peak else 0) + (1 if ref_info else 0)
    ncol = min(3, n_names)
    legend_rows = (n_names + ncol - 1) // ncol
    line_in, leg_in = 8 * 1.45 / 72, 9 * 2.0 / 72  # inches: one line of the notes, one row of the legend
    height = 4.4 * len(ds) + 0.15 + line_in * len(lines) + leg_in * legend_rows

    fig, axes = plt.subplots(len(ds), len(causals), figsize=(width, height),
                             squeeze=False, sharex=True, sharey=log)
    for i, (lab, s) in enumerate(info.items()):
        for (d, causal), pts in s["points"].items():
            ax = axes[ds.index(d)][causals.index(causal)]
            xs = [n for n in sorted(pts) if pts[n]]
            style = dict(linewidth=1.6, markersize=5, zorder=3 - i / len(info))  # the first series on top
            ax.plot(xs, [pts[n] for n in xs], label=labels[lab], **dict(style, **styles[lab]))
            was = ref_info.get(lab, {}).get("points", {}).get((d, causal), {})
            xs = [n for n in sorted(was) if was[n]]
            if xs:
                ax.plot(xs, [was[n] for n in xs], label="_nolegend_", **dict(
                    styles[lab], linestyle=":", linewidth=1.0, markersize=3.5, alpha=0.45, zorder=2 - i / len(info)))
    for row, d in enumerate(ds):
        for col, causal in enumerate(causals):
            ax = axes[row][col]
            if peak:
                ax.axhline(peak, color=palette.CEILING_COLOR, linestyle="--", linewidth=1.2, label=ceiling_label)
                ax.annotate(f"mma.sync ceiling {peak:.0f}, measured in this run", xy=(0.01, peak),
                            xycoords=ax.get_yaxis_transform(), xytext=(0, 2), textcoords="offset points",
                            fontsize=7.5, color=palette.CEILING_COLOR, va="bottom", ha="left")
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqs, [seq_label(n) for n in seqs])
            ax.minorticks_off()
            if log:  # decades with 2 and 5 between them, written as plain numbers
                ax.set_yscale("log")
                ax.set_ylim(min(values) / 1.6, max(values) * 1.6)
                ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.yaxis.set_minor_locator(NullLocator())
            else:
                ax.set_ylim(0, max(values) * 1.1)
            ax.grid(True, alpha=0.3)
            ax.set_title(panel_title(d, causal))
            if row == len(ds) - 1:
                ax.set_xlabel(f"sequence length N (B*N = {data['tokens']}, Hq*d = {data['width']})")
            ax.set_ylabel("TFLOP/s, log scale" if log else "TFLOP/s")
    if ref_info:  # one legend entry for every faint line
        axes[0][0].plot([], [], color="dimgray", linestyle=":", marker="o", markersize=3.5, linewidth=1.0, alpha=0.6,
                        label=f"faint, dotted: the {ref['gpu']}, for comparison")
    handles, names = [], []
    for ax in axes.flat:  # a series may be missing from a panel: collect every label once
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in names:
                handles.append(h)
                names.append(l)
    # Bottom to top: the notes and runs, then the legend; heights in figure fractions.
    line_h, leg_h = line_in / height, leg_in / height
    fig.text(0.01, 0.008, "\n".join(lines), fontsize=8, va="bottom", ha="left", linespacing=1.45)
    legend_y = 0.014 + line_h * len(lines)
    fig.legend(handles, names, loc="lower center", bbox_to_anchor=(0.5, legend_y), ncol=ncol, frameon=False,
               fontsize=9)
    fig.suptitle(f"{data['gpu']}: {MODES[mode]} pass, {data['dtype']}, TFLOP/s"
                 + (" on a log scale (every stage visible)" if log else ""))
    fig.tight_layout(rect=(0, legend_y + leg_h * legend_rows, 1, 1))
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
    if data.get("sweep") == "decode":  # GB/s against Nk, not TFLOP/s against N: another plot
        sys.exit(f"plot.py: {a.json} is a decode sweep (sweep.py --decode): use docs/bench/plot_decode.py")
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
        if has_stage(data, mode):
            path = os.path.join(out_dir, f"{stem}-{mode}.png")
            plot(data, mode, path)
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
