#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/plot_memory.py: the memory of the CPU stages, measured against N.

    plot_memory.py measure BUILD_DIR OUT.jsonl [--seqs 256 512 ...] [--dim 64]
    plot_memory.py plot IN.jsonl [--out FILE.png]

measure  runs each CPU program once per sequence length N (B = 1, one head, Nq = Nk = N, d = 64, a bare
         run: one forward, or one forward and one backward, no --check) under GNU time (/usr/bin/time),
         and records its peak resident set size (time's %M, the kernel's ru_maxrss) as one JSON line:
         step 1 forward and backward; step 2's 3pass, 2pass, online, fa1, fa2 forward and fa2's backward.
         Each program is also run once with --list-variants, which computes nothing: its RSS is the
         program's own (code, libraries, OpenMP), the floor under every other number.
plot     draws peak RSS against N, log-log, one line per program, with the floor dashed, and writes a PNG
         (default: IN with .png). Colours from palette.py, as in every plot of the course.

Step 1's [N, N] matrices, 4 bytes per element, are what the lines should show: step 1 holds four of them
(S, P, Z, Pd) in its forward and seven in its backward, 3pass and 2pass one (S, then P; E, then A),
the online and tiled variants none. Runs under /usr/bin/python3 (Debian's matplotlib) for `plot`;
`measure` needs only the standard library.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import palette  # noqa: E402  (docs/bench/palette.py: the course's colours)

TIME = "/usr/bin/time"  # GNU time: %M is the peak RSS of the program it runs, in KiB
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (program, variant, backward): what is measured, in the order of the legend.
RUNS = [
    ("step1_cpu_reference", "", False),
    ("step1_cpu_reference", "", True),
    ("step2_online_softmax", "3pass", False),
    ("step2_online_softmax", "2pass", False),
    ("step2_online_softmax", "online", False),
    ("step2_online_softmax", "fa1", False),
    ("step2_online_softmax", "fa2", False),
    ("step2_online_softmax", "fa2", True),
]


def machine():
    """The machine in words: lscpu's model name and CPU count, the memory, the kernel."""
    info = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            info[key.strip()] = value.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    cpu = info.get("Model name", platform.processor() or "unknown CPU")
    hyper = f" ({info['Hypervisor vendor']} virtual machine)" if "Hypervisor vendor" in info else ""
    return (f"{cpu}{hyper}, {info.get('CPU(s)', '?')} CPUs, {mem_kib / 2**20:.1f} GiB RAM, "
            f"Linux {platform.release()}")


def build_info(build):
    """CMake's build type and the compiler's first line of --version, from BUILD_DIR's cache."""
    cache = {}
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            if "=" in line and not line.startswith(("#", "//")):
                key, _, value = line.rstrip("\n").partition("=")
                cache[key.split(":")[0]] = value
    compiler = cache.get("CMAKE_CXX_COMPILER", "c++")
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        version = compiler
    return f"{cache.get('CMAKE_BUILD_TYPE', '?')}, {version}, CUDA {cache.get('FA_WITH_CUDA', '?')}"


def git_revision():
    try:
        return subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def peak_rss(cmd):
    """Runs cmd under GNU time; returns its peak RSS in KiB and its wall time in seconds.

    Not os.wait4 on a child of this script: Linux counts in a process's ru_maxrss the resident pages of
    the process it was forked from, before the exec, and Python's 13 MiB would hide the small runs.
    GNU time is a small program: the child it forks and measures starts from about 2 MiB."""
    with tempfile.NamedTemporaryFile("r") as report, tempfile.TemporaryFile() as err:
        timed = [TIME, "-f", "%M %e", "-o", report.name] + cmd
        status = subprocess.run(timed, stdout=subprocess.DEVNULL, stderr=err).returncode
        if status != 0:
            err.seek(0)
            raise SystemExit(f"plot_memory.py: {' '.join(cmd)} exited {status}: "
                             f"{err.read().decode(errors='replace').strip()}")
        kib, wall = report.read().split()[-2:]  # the last line: "%M %e"
    return int(kib), float(wall)


def measure(args):
    if not os.access(TIME, os.X_OK):
        raise SystemExit(f"plot_memory.py: measure needs GNU time, {TIME} (apt-get install time)")
    exe = {name: os.path.join(args.build, name, name) for name, _, _ in RUNS}  # build/step1_.../step1_...
    for path in exe.values():
        if not os.access(path, os.X_OK):
            raise SystemExit(f"plot_memory.py: {path} is not built (cmake --build {args.build})")
    common = {"date": datetime.date.today().isoformat(), "machine": machine(), "build": build_info(args.build),
              "git": git_revision(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "(unset)")}
    records = []
    for name in dict.fromkeys(n for n, _, _ in RUNS):  # the floor: the program, computing nothing
        kib, wall = peak_rss([exe[name], "--list-variants"])
        records.append(dict(common, program=name, variant="", backward=False, N=0, d=args.dim,
                            what="--list-variants (computes nothing)", peak_rss_kib=kib, wall_s=round(wall, 3)))
        print(f"{name:22s} {'floor':8s} {'':3s} {'':>6s} {kib / 1024:9.1f} MiB", flush=True)
    for n in args.seqs:
        for name, variant, backward in RUNS:
            cmd = [exe[name], "--batch", "1", "--heads", "1", "--seq", str(n), "--dim", str(args.dim)]
            cmd += ["--variant", variant] if variant else []
            cmd += ["--backward"] if backward else []
            kib, wall = peak_rss(cmd)
            records.append(dict(common, program=name, variant=variant, backward=backward, N=n, d=args.dim,
                                what=" ".join(cmd[1:]), peak_rss_kib=kib, wall_s=round(wall, 3)))
            print(f"{name:22s} {variant:8s} {'bwd' if backward else 'fwd':3s} {n:6d} {kib / 1024:9.1f} MiB "
                  f"{wall:7.2f} s", flush=True)
    with open(args.out, "w") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    print(f"wrote {len(records)} records to {args.out}")


def label(r):
    step = "step 1" if r["program"].startswith("step1") else "step 2 " + r["variant"]
    return step + (" backward" if r["backward"] else "")


def plot(args):
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(f"plot_memory.py: this Python ({sys.executable}) has no matplotlib; run it with "
                         "Debian's /usr/bin/python3 (apt-get install python3-matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(args.table) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if not records:
        raise SystemExit(f"{args.table}: no records")
    series = {}
    for r in records:
        if r["N"] > 0:
            series.setdefault((r["program"], r["variant"], r["backward"]), []).append(r)
    floor = max(r["peak_rss_kib"] for r in records if r["N"] == 0) / 1024
    step2_lines = {"3pass": "o", "2pass": "s", "online": "^", "fa1": "v", "fa2": "D"}
    fig, ax = plt.subplots(figsize=(8.5, 5.4))
    for (program, variant, backward), rs in series.items():
        rs.sort(key=lambda r: r["N"])
        style = dict(color=palette.stage_color(program), marker=step2_lines.get(variant, "o"),
                     linestyle="--" if backward else "-", markerfacecolor="none" if backward else None)
        ax.plot([r["N"] for r in rs], [r["peak_rss_kib"] / 1024 for r in rs], label=label(rs[0]), **style)
    ns = sorted({r["N"] for r in records if r["N"] > 0})
    ax.axhline(floor, color="gray", linestyle=":", linewidth=1)
    ax.text(ns[-1], floor * 0.82, f"the program computing nothing: {floor:.1f} MiB", fontsize=8, color="gray",
            ha="right", va="top")
    # The values at the largest N, one label per distinct height; where lines lie on top of each other
    # (3pass and 2pass; online, fa1 and fa2) the label names them all, so that none is looked for in vain.
    groups = []  # [(MiB, [labels])], highest first
    for rs in sorted(series.values(), key=lambda rs: -rs[-1]["peak_rss_kib"]):
        mib = rs[-1]["peak_rss_kib"] / 1024
        near = next((g for g in groups if abs(mib / g[0] - 1) <= 0.1 and g[2] == rs[-1]["N"]), None)
        if near:
            near[1].append(label(rs[0]))
        else:
            groups.append((mib, [label(rs[0])], rs[-1]["N"]))
    for mib, names, n in groups:
        text = f"{mib:.0f} MiB" if mib >= 100 else f"{mib:.1f} MiB"
        if len(names) > 1:  # "step 2 3pass, step 2 2pass" -> "step 2: 3pass, 2pass (on top of each other)"
            common = "step 2 " if all(x.startswith("step 2 ") for x in names) else ""
            text += f"\n{common.strip() + ': ' if common else ''}" \
                + ", ".join(x[len(common):] for x in names) + " (on top of each other)"
        ax.annotate(text, (n, mib), xytext=(6, 0), textcoords="offset points", fontsize=7.5, va="center",
                    linespacing=1.2)
    # A guide of slope 2: 4 bytes x N^2, one [N, N] float matrix.
    ax.plot(ns, [4 * n * n / 2**20 for n in ns], color="black", linewidth=0.8, linestyle=(0, (1, 3)),
            label="one [N, N] float matrix (4 N² bytes)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ns)
    ax.set_xticklabels([str(n) for n in ns])
    ax.set_xlim(ns[0] / 1.3, ns[-1] * 5.5)  # room for the labels at the right
    ax.set_xlabel("N = Nq = Nk (B = 1, one head, d = 64)")
    ax.set_ylabel("peak resident memory [MiB]")
    first = records[0]
    ax.set_title(f"Peak RSS of one run against N, {first['date']}\n{first['machine']}", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out = args.out or os.path.splitext(args.table)[0] + ".png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="run the CPU programs and record their peak RSS")
    m.add_argument("build", help="a build directory (build/)")
    m.add_argument("out", help="JSON lines to write")
    m.add_argument("--seqs", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    m.add_argument("--dim", type=int, default=64)
    p = sub.add_parser("plot", help="draw the records of `measure`")
    p.add_argument("table", help="JSON lines from `measure`")
    p.add_argument("--out", help="PNG to write (default: TABLE with .png)")
    args = ap.parse_args()
    measure(args) if args.command == "measure" else plot(args)


if __name__ == "__main__":
    main()
