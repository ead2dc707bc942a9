#!/usr/bin/env python3
# FlashAttention, step by step — docs/bench/ptxas_report.py: the registers, stack and spills of every kernel,
# from the output of a build configured with -DFA_PTXAS_VERBOSE=ON (ptxas -v), as one line per kernel.
#
#   docs/bench/ptxas_report.py BUILD_LOG > report.txt           the table, kernels named by their C++ types
#   docs/bench/ptxas_report.py --compare OLD.txt NEW.txt        every kernel whose registers or spills changed
#
# Kernel names are normalised so that two builds of the same configuration compare: the template arguments
# of the traits become the configuration's numbers (e.g. "step4 fused_forward bf16 d64 Br64-Bc64-S2 drop=0").
import re
import subprocess
import sys


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    return out.splitlines()


def parse(log):
    rows, cur, arch = {}, None, None
    for line in open(log, errors="replace"):
        m = re.search(r"Compiling entry function '(\S+)' for '(sm_\w+)'", line)
        if m:
            cur, arch = m.group(1), m.group(2)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            rows.setdefault((cur, arch), {}).update(stack=int(m[1]), spill_st=int(m[2]), spill_ld=int(m[3]))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            rows.setdefault((cur, arch), {})["regs"] = int(m[1])
    return rows


def normalise(name):
    """A name two builds share for the same kernel: kernel, dtype, head dim and every number of its config."""
    kernel = re.search(r"(fused_forward|naive_forward|dkdv_kernel|dq_kernel|atomic_kernel|preprocess_kernel|convert_dq_kernel|\w+)<", name)
    kernel = kernel.group(1) if kernel else name.split("(")[0]
    dtype = "bf16" if "bfloat16" in name else "fp16" if "__half" in name else "fp32" if "float" in name.split("<", 1)[-1][:8] else ""
    inner = name.split("<", 1)[-1] if "<" in name else ""
    nums = re.findall(r"\b\d+\b", re.sub(r"fa::step\d", "", inner))
    flags = re.findall(r"\b(true|false)\b", inner)
    lean = "lean" if "Buffers)1" in inner or "Buffers::lean" in inner else ""
    return " ".join(x for x in [kernel, dtype, "-".join(nums), "-".join(flags), lean] if x)


def canonical(name):
    """The same kernel across the tile-parameter change: named tiles (FwdTiles{Br, Bc, stages, swizzle},
    AtomicTiles{..., dkv 0, dq 0, buffers}) are rewritten to the positional order of the older traits
    (D-Br-Bc-Warps-S; D-Bc-Bq-WK-WQ-S-DKV-DQ), so reports of builds before and after it compare."""
    parts = name.split(" ")
    if len(parts) > 2 and parts[0] == "atomic_kernel" and parts[2].count("-") == 8:
        d, bc, bq, wk, wq, st, dkv, dq, _buf = parts[2].split("-")
        parts[2] = "-".join([d, bc, bq, wk, wq, st, dkv if dkv != "0" else wk, dq if dq != "0" else wq])
        parts = parts[:4]
    if len(parts) > 2 and parts[0] == "fused_forward" and parts[2].count("-") == 3:
        d, br, bc, st = parts[2].split("-")
        parts[2] = "-".join([d, br, bc, str(int(br) // 16), st])
    return " ".join(parts)


def compare(old_file, new_file):
    def load(f):
        d = {}
        for line in open(f):
            if line.startswith("#") or not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            d[canonical(parts[-1])] = tuple(int(x) for x in parts[:4])
        return d
    old, new = load(old_file), load(new_file)
    counts = {"same": 0, "better": 0, "WORSE": 0}
    for k in sorted(set(old) | set(new)):
        if k not in old or k not in new:
            print(f"only in {'new' if k in new else 'old'}: {k}")
            continue
        o, n = old[k], new[k]
        tag = "same" if o == n else ("WORSE" if (n[0] > o[0] or n[2] > o[2] or n[3] > o[3]) else "better")
        counts[tag] += 1
        if tag != "same":
            print(f"{tag} {k}: regs {o[0]} -> {n[0]}, stack {o[1]} -> {n[1]}, spill st/ld {o[2]}/{o[3]} -> {n[2]}/{n[3]}")
    print(f"{sum(counts.values())} kernels in both: {counts['same']} unchanged, {counts['better']} fewer registers "
          f"or spills, {counts['WORSE']} more")
    return 1 if counts["WORSE"] else 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        return compare(sys.argv[2], sys.argv[3])
    rows = parse(sys.argv[1])
    keys = sorted(rows)
    pretty = demangle([k[0] for k in keys])
    print("# regs\tstack\tspill_st\tspill_ld\tarch\tkernel")
    lines = []
    for (mangled, arch), dem in zip(keys, pretty):
        r = rows[(mangled, arch)]
        lines.append(f"{r.get('regs', 0)}\t{r.get('stack', 0)}\t{r.get('spill_st', 0)}\t{r.get('spill_ld', 0)}\t{arch}\t{normalise(dem)}")
    print("\n".join(sorted(lines, key=lambda l: l.split("\t")[-1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
