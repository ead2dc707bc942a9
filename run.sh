#!/usr/bin/env bash
# FlashAttention, step by step — set up, build and run: ./run.sh tour | test | build | help.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(cmake ninja-build g++ libeigen3-dev googletest libgtest-dev librandom123-dev libcli11-dev
          nlohmann-json3-dev python3-matplotlib python3-numpy time)
BUILD_DIR=${BUILD_DIR:-build}

usage() {
  cat <<'EOF'
usage: ./run.sh COMMAND [ARGS]

  tour [FLAGS]   build, then run every stage on its default problem: one table of error, time, throughput
                 (FLAGS go to the tour, e.g. --seq 2048; ./run.sh tour --help lists them)
  test [ARGS]    build, then run the GoogleTest suite through ctest (ARGS go to ctest, e.g. -R Step1);
                 without a usable GPU the GPU tests are left out (--with-gpu-tests runs them, each skipped)
  build          only install the missing Debian packages, configure and build
  help           this text

Environment:
  BUILD_DIR       the build folder (default: build)
  CMAKE_ARGS      extra configure flags: -DFA_WITH_CUDA=OFF builds the CPU stages only (a much shorter
                  build), -DCMAKE_CUDA_ARCHITECTURES=90 the GPU stages for the H100 only
  FA_DEPS_PREFIX  the dependencies are unpacked under this prefix, not installed: skips the package check
                  (docs/reproduce.md)

Run as root, run.sh installs the missing Debian packages; otherwise it prints the apt-get line for them.
EOF
}

ensure_packages() {
  [ -n "${FA_DEPS_PREFIX:-}" ] && return 0
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -eq 0 ]; then
    echo "run.sh: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "run.sh: missing Debian packages; install them with:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
}

# Quiet on purpose: CMake's notices and warnings, and the compilers' messages, are all that is printed.
build() {
  ensure_packages
  local args=(-S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release)
  [ -n "${FA_DEPS_PREFIX:-}" ] && args+=("-DCMAKE_PREFIX_PATH=$FA_DEPS_PREFIX")
  # shellcheck disable=SC2206
  [ -n "${CMAKE_ARGS:-}" ] && args+=($CMAKE_ARGS)
  cmake "${args[@]}" >/dev/null
  echo "run.sh: building in $BUILD_DIR/ (a first build with the GPU stages takes minutes)"
  cmake --build "$BUILD_DIR" -j "$(nproc)" -- --quiet  # ninja without its line per compiled file
}

# ctest in the build folder. Running tests in parallel, it announces each one twice ("Start", then the
# result): only the result is kept, and of the passing ones a line every 25 (a run has hundreds).
ctest_quiet() {
  (cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" "$@") | awk '
    /^ *Start / { next }                                   # announced twice: keep only the result
    / Passed +[0-9.]+ sec$/ { if (++n % 25 == 0) printf "  ... %d tests passed so far\n", n; fflush(); next }
    { print; fflush() }                                    # failures, skips, output and the summary'
}

# Where no GPU can run the GPU stages, the tests labelled "gpu" (tests/CMakeLists.txt) are left out, and
# one line says how many and why, instead of hundreds of "Skipped" lines.
run_tests() {
  local args=() with_gpu_tests=0
  for a in "$@"; do
    if [ "$a" = --with-gpu-tests ]; then with_gpu_tests=1; else args+=("$a"); fi
  done
  local why status=0
  why=$("$BUILD_DIR/flashattention_tour" --gpu-status 2>&1) || status=$?
  if [ "$with_gpu_tests" -eq 1 ] || [ "$status" -ne 1 ]; then  # exit code 1: no usable GPU, and why
    ctest_quiet "${args[@]}"
    return
  fi
  local left_out rc=0
  left_out=$(cd "$BUILD_DIR" && ctest -N -L gpu "${args[@]}" | sed -n 's/^Total Tests: //p')
  ctest_quiet -LE gpu "${args[@]}" || rc=$?
  if [ "${left_out:-0}" -gt 0 ]; then
    echo "run.sh: $left_out GPU tests left out: $why (./run.sh test --with-gpu-tests runs them, each reported as skipped)"
  else
    echo "run.sh: no GPU tests run: $why"
  fi
  return $rc
}

case "${1:-}" in
  tour)  shift; build; "$BUILD_DIR/flashattention_tour" "$@" ;;
  test)  shift; build; run_tests "$@" ;;
  build) build ;;
  help | -h | --help) usage ;;
  "") usage; exit 2 ;;
  *) { echo "run.sh: unknown command '$1'"; usage; } >&2; exit 2 ;;
esac
