#!/usr/bin/env bash
# FlashAttention, step by step — docs/bench/device_ab.sh: on a lent GPU machine, build this tree and an older
# one side by side (sm_90 only), then check and time them (the structure change was proved this way:
# docs/results/structure.md).
#
#   docs/bench/device_ab.sh OLD_SRC OLD_REV NEW_REV check      build both; ptxas report; ctest -j 8; sanitizers
#                                                             (SAN_FILTER: the tests they run, a gtest filter)
#   docs/bench/device_ab.sh OLD_SRC OLD_REV NEW_REV ab ARGS...  build both if needed; ab_builds.py ARGS (--seqs ...)
#
# OLD_TARGETS: what the old tree builds (default: step 4 and step 5; step 7's A/B: step7_hopper_wgmma, and pass
# --passes fwd --fwd-stage step7_hopper_wgmma to ab).
# OLD_SRC is a copy of the old sources (e.g. `git archive OLD_REV | tar -x -C build-src-OLD_REV`, carried to the
# machine); builds go to build-OLD_REV and build. Output goes to $OUT (the device tool's folder) or ./out.
set -uo pipefail
old_src=${1:?old source dir}; old_rev=${2:?old rev}; new_rev=${3:?new rev}; what=${4:?check or ab}; shift 4
out=${OUT:-out}; mkdir -p "$out"
deps=$PWD/.deps/usr
t0=$(date +%s)
old_targets=${OLD_TARGETS:-step4_fused_pipelined step5_backward}
first=${old_targets%% *}
if [ ! -x build-$old_rev/$first/$first ] || [ ! -x build/$first/$first ]; then
  ( cd "$old_src" && FA_GIT_REV=$old_rev cmake -S . -B ../build-$old_rev -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$deps" -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null &&
    cmake --build ../build-$old_rev -j 6 --target $old_targets > /dev/null 2>&1
    echo "old build rc=$?" ) &
  FA_GIT_REV=$new_rev cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$deps" \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DFA_PTXAS_VERBOSE=ON > /dev/null &&
    FA_GIT_REV=$new_rev cmake --build build -j 10 > "$out/build-$new_rev.log" 2>&1
  echo "new build rc=$?"
  wait
  echo "built in $(( $(date +%s) - t0 )) s"
  python3 docs/bench/ptxas_report.py "$out/build-$new_rev.log" > "$out/ptxas-$new_rev-sm90.txt"
  rm -f "$out/build-$new_rev.log"
fi
case "$what" in
  check)
    t1=$(date +%s)
    ctest --test-dir build -j 8 > "$out/ctest-$new_rev.log" 2>&1
    echo "ctest rc=$? in $(( $(date +%s) - t1 )) s"; tail -n 3 "$out/ctest-$new_rev.log"
    f=${SAN_FILTER:-'All/GpuConfigs.*Nq100_Nk300*:All/GpuConfigs.*step5*Nq300_Nk300*:All/GpuConfigs.*step4*Br64_Bc64_W4_S2_B*Nq300_Nk300*'}
    for tool in memcheck racecheck synccheck; do
      ( timeout 300 compute-sanitizer --tool $tool --error-exitcode 1 build/tests/fa_gpu_tests --gtest_filter="$f" \
          --gtest_brief=1 > "$out/san-$tool.log" 2>&1; echo "$tool rc=$?" >> "$out/san-$tool.log" ) &
    done
    wait
    for tool in memcheck racecheck synccheck; do
      echo "== $tool"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|rc=" "$out/san-$tool.log"; rm -f "$out/san-$tool.log"
    done | tee "$out/sanitize-$new_rev.txt"
    echo "$(build/tests/fa_gpu_tests --gtest_list_tests --gtest_filter="$f" | grep -c '^  ') tests under each tool" | tee -a "$out/sanitize-$new_rev.txt" ;;
  ab)
    PYTHONUNBUFFERED=1 python3 docs/bench/ab_builds.py --a build-$old_rev --b build --out "$out/ab-$new_rev${TAG:-}.jsonl" \
      "$@" 2>&1 | tail -n 16 ;;
esac
