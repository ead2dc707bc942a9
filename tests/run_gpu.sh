#!/usr/bin/env bash
# Build and prove the GPU stages on a GPU machine that has no package registry (the lent H100):
# dependencies come unpacked in .deps/ (../shared/device/fetch-deps.sh), the build targets sm_90 only.
#
#   tests/run_gpu.sh build                 configure + build into build/
#   tests/run_gpu.sh test [ctest args]     the whole suite (CPU and GPU tests)
#   tests/run_gpu.sh sanitize FILTER       compute-sanitizer memcheck, racecheck (and synccheck) on the
#                                          GPU tests matching the gtest FILTER
set -euo pipefail
cd "$(dirname "$0")/.."
export FA_DEPS_PREFIX=${FA_DEPS_PREFIX:-$PWD/.deps/usr}
export CMAKE_ARGS=${CMAKE_ARGS:--DCMAKE_CUDA_ARCHITECTURES=90}
export OMP_WAIT_POLICY=PASSIVE

case "${1:-}" in
  build) ./run.sh build ;;
  test) shift; ./run.sh test "$@" ;;
  sanitize)
    filter=${2:?gtest filter}
    for tool in memcheck racecheck synccheck; do
      echo "== compute-sanitizer --tool $tool ($filter)"
      compute-sanitizer --tool "$tool" --error-exitcode 1 build/tests/fa_gpu_tests --gtest_filter="$filter" \
        --gtest_brief=1 2>&1 | tail -n 4
    done ;;
  *) sed -n '2,10p' "$0"; exit 2 ;;
esac
