#!/usr/bin/env bash
# FlashAttention, step by step — docs/bench/configs.sh: time every configuration of one stage.
#
#   docs/bench/configs.sh BUILD STAGE OUT.jsonl [N] [extra stage flags, e.g. --backward]
#
# For d = 64 and 128 (Hq * d = 2048, B * N = 16384, bf16, as in sweep.py), causal and not, runs the stage
# with --variant NAME for each name `STAGE --list-variants` prints: first --check against step 1 on a small
# problem with tails and GQA (a configuration that fails is reported and not timed), then --bench,
# appending one JSON record per run to OUT.jsonl; a configuration built for the other head dim only is
# skipped with its reason. The table at the end is what the optimisation histories (docs/history/step4.md,
# step5.md) quote.
set -uo pipefail
build=${1:?build dir}; stage=${2:?stage}; out=${3:?out.jsonl}; n=${4:-4096}; shift 4 2>/dev/null || shift $#
exe=$build/$stage/$stage
[ -x "$exe" ] || { echo "configs.sh: $exe not found (build first)" >&2; exit 2; }
for d in 64 128; do
  for causal in "" --causal; do
    for v in $("$exe" --list-variants | sed -n 's/^  //p'); do  # the names, without the group labels
      if ! msg=$("$exe" --check --batch 1 --heads 4 --kv-heads 2 --seq 300 --dim "$d" $causal --variant "$v" "$@" 2>&1); then
        echo "skip d=$d $causal $v: $(echo "$msg" | grep -m1 -E 'FAIL|error' || echo "$msg" | tail -n 1)"
        continue
      fi
      msg=$("$exe" --bench --json "$out" --batch $((16384 / n)) --heads $((2048 / d)) --seq "$n" --dim "$d" \
            $causal --variant "$v" "$@" 2>&1) || echo "skip d=$d $causal $v: $(echo "$msg" | tail -n 1)"
    done
  done
done
/usr/bin/env python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{'d':>4} {'causal':>6} {'variant':<28} {'fwd TF/s':>9} {'bwd TF/s':>9}")
for r in rows:
    f = lambda k: f"{r[k]:9.1f}" if r.get(k) else f"{'-':>9}"
    print(f"{r['d']:>4} {str(r['causal']):>6} {r['variant']:<28} {f('fwd_tflops')} {f('bwd_tflops')}")
PY
