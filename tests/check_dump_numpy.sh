#!/usr/bin/env bash
# A dump loads in NumPy with the documented shapes and dtypes. Skips (exit 77) when NumPy is missing.
set -euo pipefail
exe=$1
py=/usr/bin/python3
$py -c "import numpy" 2>/dev/null || { echo "NumPy not available under $py: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$exe" --batch 2 --heads 4 --kv-heads 2 --seq-q 5 --seq-k 7 --dim 8 --causal --dropout 0.1 --backward --dump "$dir" >/dev/null
$py - "$dir" <<'PY'
import sys, numpy as np
d = sys.argv[1]
want = {"o": (2, 4, 5, 8), "lse": (2, 4, 5), "dq": (2, 4, 5, 8), "dk": (2, 2, 7, 8), "dv": (2, 2, 7, 8),
        "dropout_mask": (2, 4, 5, 7)}
for name, shape in want.items():
    a = np.load(f"{d}/{name}.npy")
    assert a.shape == shape, (name, a.shape, shape)
    assert a.dtype == (np.uint8 if name == "dropout_mask" else np.float32), (name, a.dtype)
    assert a.flags["C_CONTIGUOUS"]
o, lse = np.load(f"{d}/o.npy"), np.load(f"{d}/lse.npy")
assert np.isfinite(o).all() and not np.isnan(lse).any()
m = np.load(f"{d}/dropout_mask.npy")
assert set(np.unique(m)) <= {0, 1} and 0.7 < m.mean() < 1.0, m.mean()
print("dump loads in NumPy with the documented shapes")
PY
