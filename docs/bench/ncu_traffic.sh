#!/usr/bin/env bash
# FlashAttention, step by step — docs/bench/ncu_traffic.sh: the forward's memory traffic, measured.
#
#   docs/bench/ncu_traffic.sh BUILD OUT_DIR
#
# For step 3, step 4's default and step 4's block-order ablation (Br128-Bc128-W8-S2-headfast), bf16,
# d = 128, non-causal, N = 4096 and 16384 (the sweep's shapes: B = 16384 / N, Hq = 16), one launch under
# Nsight Compute (--clock-control none): the bytes read from and written to DRAM (HBM), the bytes that
# crossed L2, and L2's hit rate. The chapters compare them with the analytical model: step 4 should read Q,
# K, V about once and write O once, and S and P should never reach memory. Then times the ablation against
# the default with --bench-against (alternating rounds in one process: a same-run A/B).
# Writes OUT_DIR/ncu-traffic.csv (ncu's raw CSV, tagged) and OUT_DIR/order-ab.jsonl, and prints a table.
set -uo pipefail
build=${1:?build dir}; out=${2:?out dir}
mkdir -p "$out"
command -v ncu > /dev/null || { echo "ncu_traffic.sh: ncu not found" >&2; exit 2; }
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct
rm -f "$out/ncu-traffic.csv" "$out/order-ab.jsonl"
for n in 4096 16384; do
  for r in "step3_naive_kernel:" "step4_fused_pipelined:4d-tma" "step4_fused_pipelined:Br128-Bc128-W8-S2-headfast"; do
    stage=${r%%:*}; variant=${r#*:}
    args=(--batch $((16384 / n)) --heads 16 --seq "$n" --dim 128 --dtype bf16)
    [ -n "$variant" ] && args+=(--variant "$variant")
    [ "$stage" = step3_naive_kernel ] && [ "$n" = 16384 ] && continue  # 0.7 s a launch, times the replays
    ncu --clock-control none --csv --metrics "$metrics" -k regex:forward --launch-count 1 \
        "$build/$stage/$stage" "${args[@]}" > "$out/one.csv" 2> "$out/one.err" ||
      { echo "ncu failed for $r N=$n: $(tail -n 2 "$out/one.err")"; continue; }
    grep '^"' "$out/one.csv" | sed "s|^|\"$stage\",\"${variant:-default}\",\"$n\",|" >> "$out/ncu-traffic.csv"
  done
done
rm -f "$out/one.csv" "$out/one.err"
for n in 4096 16384; do
  for causal in "" --causal; do  # the two variants timed in alternating rounds in one process
    "$build/step4_fused_pipelined/step4_fused_pipelined" --bench --json "$out/order-ab.jsonl" --batch $((16384 / n)) \
      --heads 16 --seq "$n" --dim 128 $causal --variant Br128-Bc128-W8-S2-headfast --bench-against 4d-tma \
      > /dev/null || echo "bench failed: N=$n $causal"
  done
done
python3 - "$out/ncu-traffic.csv" "$out/order-ab.jsonl" <<'PY'
import csv, json, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(r for r in rows if r[3] == "ID")
col = {h: i for i, h in enumerate(hdr)}
table = {}
for r in rows:
    if r[3] != "ID":
        table.setdefault((r[2], r[1]), {})[r[col["Metric Name"]]] = (r[col["Metric Value"]], r[col["Metric Unit"]])
for (n, v), m in table.items():
    print(f"N={n:>5} {v:<30} " + "  ".join(f"{k.split('.')[0]}={val} {unit}" for k, (val, unit) in sorted(m.items())))
for r in (json.loads(l) for l in open(sys.argv[2]) if l.strip()):
    a = r["against"]
    print(f"bench N={r['Nq']:>5} causal={r['causal']!s:<5} {r['variant']}: {r['fwd_tflops']:.1f} TFLOP/s, "
          f"{a['variant']}: {a['fwd_tflops']:.1f} (time ratio default/ablation {r['fwd_ms'] and a['fwd_ms'] / r['fwd_ms']:.3f})")
PY
