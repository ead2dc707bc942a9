#!/usr/bin/env bash
# FlashAttention, step by step — docs/bench/ncu_substeps.sh: the Nsight Compute counters behind step 4's sub-steps.
#
#   docs/bench/ncu_substeps.sh BUILD OUT_DIR [N]
#
# Profiles one forward launch of step 3, of each sub-step of step 4 (4a-padded .. 4d-tma) and of the
# plain-row ablation (Br64-Bc64-W4-S2-noswizzle), at bf16, non-causal, d = 64 and 128, the sweep's shape
# for N (default 4096: B = 16384 / N, Hq = 2048 / d). One plain run per kernel (no warm-up: ncu replays
# the launch with the clocks left alone, --clock-control none). Writes OUT_DIR/ncu-substeps.csv (ncu's
# raw CSV, every kernel and metric) and prints one table. The chapter's "counter that explains it"
# comes from here:
#   tensor pipe active %    step 3 -> 4a: the products move from the fp32 cores to the tensor cores
#   shared bank conflicts   4a/4b against the plain rows: padding and the swizzle both remove them
#   stalls per issue        4b -> 4c: warps no longer wait at the barrier for their copies
#   instructions executed   4c -> 4d: TMA takes the copies' address arithmetic off the threads
set -uo pipefail
build=${1:?build dir}; out=${2:?out dir}; n=${3:-4096}
mkdir -p "$out"
command -v ncu > /dev/null || { echo "ncu_substeps.sh: ncu not found" >&2; exit 2; }
wanted=(gpu__time_duration.sum
        sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
        sm__inst_executed_pipe_fma.sum
        l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
        l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
        l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
        smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
        smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
        smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio
        smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio
        smsp__inst_executed.sum
        sm__warps_active.avg.pct_of_peak_sustained_active
        launch__registers_per_thread
        launch__shared_mem_per_block_dynamic)
# Keep the metrics this ncu knows (their base name, before the roll-up suffix), so one unknown name does
# not fail the whole run.
known=$(ncu --query-metrics 2>/dev/null | awk '{print $1}')
metrics=()
for m in "${wanted[@]}"; do
  base=${m%%.*}
  if grep -qx "$base" <<< "$known" || [[ $base == launch__* ]]; then metrics+=("$m"); else echo "(ncu has no $base)"; fi
done
list=$(IFS=,; echo "${metrics[*]}")
rm -f "$out/ncu-substeps.csv"
runs=("step3_naive_kernel:" "step4_fused_pipelined:4a-padded" "step4_fused_pipelined:4b-swizzle"
      "step4_fused_pipelined:4c-cp-async" "step4_fused_pipelined:4d-tma"
      "step4_fused_pipelined:Br64-Bc64-W4-S2-noswizzle")
for d in 64 128; do
  for r in "${runs[@]}"; do
    stage=${r%%:*}; variant=${r#*:}
    args=(--batch $((16384 / n)) --heads $((2048 / d)) --seq "$n" --dim "$d" --dtype bf16)
    [ -n "$variant" ] && args+=(--variant "$variant")
    # The kernel of the run; every kernel name of the course's forward contains "forward".
    ncu --clock-control none --csv --metrics "$list" -k regex:forward --launch-count 1 \
        "$build/$stage/$stage" "${args[@]}" > "$out/ncu-one.csv" 2> "$out/ncu-one.err" ||
      { echo "ncu failed for $r d=$d: $(tail -n 2 "$out/ncu-one.err")"; continue; }
    # ncu's CSV rows start with "ID"; tag each with the run.
    grep '^"' "$out/ncu-one.csv" | sed "s|^|\"$stage\",\"${variant:-default}\",\"$d\",|" >> "$out/ncu-substeps.csv"
  done
done
rm -f "$out/ncu-one.csv" "$out/ncu-one.err"
python3 - "$out/ncu-substeps.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next((r for r in rows if r[3] == "ID"), None)
if not hdr:
    sys.exit("no ncu rows")
col = {h: i for i, h in enumerate(hdr)}
table = {}
for r in rows:
    if r[3] == "ID":
        continue
    key = (r[2], r[1] if r[0] != "step3_naive_kernel" else "step3")
    table.setdefault(key, {})[r[col["Metric Name"]]] = (r[col["Metric Value"]], r[col["Metric Unit"]])
metrics = sorted({m for v in table.values() for m in v})
for m in metrics:
    print(m)
    for key, v in table.items():
        if m in v:
            print(f"   d={key[0]:>3} {key[1]:<28} {v[m][0]:>16} {v[m][1]}")
PY
