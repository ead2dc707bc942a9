#!/usr/bin/env python3
# FlashAttention, step by step — docs/bench/sass_summary.py: instruction counts of kernels in SASS.
#
#   cuobjdump -sass LIB_OR_EXE > k.sass; docs/bench/sass_summary.py k.sass [SUBSTRING ...]
#
# One line per kernel whose mangled name contains every SUBSTRING: the instruction count and the most
# frequent opcodes (LDSM = ldmatrix, HMMA = mma.sync, MUFU = exp2, SYNCS = mbarrier), to compare two
# builds of the same kernel without reading the whole listing.
import collections
import re
import sys

kernels, cur = {}, None
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"Function : (\S+)", line)
    if m:
        cur = m.group(1)
        kernels[cur] = []
        continue
    m = re.search(r"/\*[0-9a-f]{4,5}\*/\s+(.*?);", line)
    if cur and m:
        ins = m.group(1).strip()
        if ins.startswith("@"):
            ins = ins.split(" ", 1)[1].strip()
        kernels[cur].append(re.split(r"[ .]", ins)[0])
for name, ops in sorted(kernels.items()):
    if all(s in name for s in sys.argv[2:]):
        top = collections.Counter(ops).most_common(12)
        print(f"{len(ops):6d}  {name[:110]}\n        " + " ".join(f"{k}:{v}" for k, v in top))
