#!/usr/bin/env bash
# FlashAttention, step by step — set up, build and run: ./run.sh tour | test | plots | build | help.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(cmake ninja-build g++ libeigen3-dev googletest libgtest-dev librandom123-dev libcli11-dev
          nlohmann-json3-dev python3-matplotlib python3-numpy time)
BUILD_DIR=${BUILD_DIR:-build}
# The filters below print as lines arrive, but mawk (Debian's awk) reads a pipe a block at a time, so their
# lines would come in bursts, minutes late: -W interactive makes it read line by line. Other awks stream.
AWK=(awk)
[[ $(awk -W version 2>&1 || true) == *mawk* ]] && AWK=(awk -W interactive)

# How long a first build takes on a 2-core machine without a GPU (measured; the README's "No NVIDIA GPU?"
# quotes the same), said in the help and before a build compiles GPU stages that no GPU here can run, so
# that the choice comes before the wait, not after it.
BUILD_TIME_CPU_ONLY="4 min"
BUILD_TIME_WITH_GPU="9 to 11 min"

usage() {
  cat <<EOF
usage: ./run.sh COMMAND [ARGS]

  tour [FLAGS]   build, then run every stage on its default problem: one table of error, time, throughput
                 (FLAGS go to the tour, e.g. --seq 2048; ./run.sh tour --help lists them)
  test [ARGS]    build, then run the GoogleTest suite through ctest (ARGS go to ctest, e.g. -R Step1);
                 without a usable GPU the GPU tests are left out (--with-gpu-tests runs them, each skipped)
  plots [FLAGS]  build, time the stages and PyTorch's SDPA on this GPU (about 2 min on an H100, --full 4.5),
                 and draw the staircase and the plots over N beside the committed H100 run, into plots/<gpu>/;
                 --dry-run lists the points and the time without a GPU (./run.sh plots --help lists the flags)
  build          only install the missing Debian packages, configure and build
  help           this text

Environment:
  BUILD_DIR       the build folder (default: build)
  PYTHON          the Python that runs plots' sweep, and times the PyTorch peers (default: python3)
  CMAKE_ARGS      extra configure flags: -DFA_WITH_CUDA=OFF builds the CPU stages only (a first build on
                  2 cores: $BUILD_TIME_CPU_ONLY; with the GPU stages: $BUILD_TIME_WITH_GPU);
                  -DCMAKE_CUDA_ARCHITECTURES=90 the GPU stages for an H100 or H200, =120 for an
                  RTX 50-series card (the default: the GPU nvidia-smi finds; without one, sm_120 and,
                  for step 7, sm_90a)
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

# Why no GPU here can run the GPU stages; nothing where one can. Before a build there is no tour to ask
# (run_tests asks it), so nvidia-smi answers, by the rule of gpu/platform.cpp: a GPU of sm_80 or later.
why_no_gpu() {
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null) || gpus=""  # captured, not piped: grep -q would cut nvidia-smi short
  if ! grep -q '^GPU' <<<"$gpus"; then
    echo "no NVIDIA GPU or driver on this machine"
    return
  fi
  local caps
  caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null) || return 0  # an old driver: trust it
  grep -qE '^ *([89]|1[0-9])\.' <<<"$caps" || echo "no GPU of sm_80 or later here (compute capability $(echo $caps))"
}

# CMake's standard output is hidden: its notices and warnings, and the compilers' messages, are what is
# printed, with the build's progress, so that a long build is never silent.
build() {
  ensure_packages
  local args=(-S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release)
  [ -n "${FA_DEPS_PREFIX:-}" ] && args+=("-DCMAKE_PREFIX_PATH=$FA_DEPS_PREFIX")
  # shellcheck disable=SC2206
  [ -n "${CMAKE_ARGS:-}" ] && args+=($CMAKE_ARGS)
  # A first configure looks for nvcc and tries it: seconds to a minute, which should not pass in silence.
  [ -f "$BUILD_DIR/CMakeCache.txt" ] || echo "run.sh: configuring $BUILD_DIR/ (CMake)"
  cmake "${args[@]}" >/dev/null
  # The progress lines below are parsed: a user's own NINJA_STATUS would break them.
  export NINJA_STATUS="[%f/%t] "
  # ninja's dry run says what the build will do, at once, before it starts: how many files it compiles, and
  # how many of them are CUDA (most of a first build's time). The git revision stamp runs at every build,
  # and a dry run, which cannot see that it left the header as it was, counts the one file that includes it
  # (harness/eval.cpp): a build of at most one C++ file is quick and stays as quiet as before.
  local plan compiles cuda why
  plan=$(ninja -C "$BUILD_DIR" -n 2>/dev/null) || plan=""
  compiles=$(grep -c '^\[[0-9/]*\] Building ' <<<"$plan" || true)
  cuda=$(grep -c '^\[[0-9/]*\] Building CUDA object' <<<"$plan" || true)
  if [ "$compiles" -le 1 ] && [ "$cuda" -eq 0 ]; then
    cmake --build "$BUILD_DIR" -j "$(nproc)" -- --quiet
    return
  fi
  local files="files"; [ "$compiles" -eq 1 ] && files="file"
  echo "run.sh: building in $BUILD_DIR/: $compiles $files to compile, $cuda of them CUDA"
  if [ "$cuda" -gt 0 ]; then
    why=$(why_no_gpu)
    [ -n "$why" ] && echo "run.sh: $why, yet the GPU stages are compiled (a first build on 2 cores:" \
      "$BUILD_TIME_WITH_GPU); CMAKE_ARGS=-DFA_WITH_CUDA=OFF ./run.sh ${COMMAND:-build} builds the CPU stages only" \
      "($BUILD_TIME_CPU_ONLY)"
  fi
  if [ -t 1 ]; then
    cmake --build "$BUILD_DIR" -j "$(nproc)"  # on a terminal, ninja's [n/N] line rewrites itself
  else
    # In a log (CI), a line per compiled file would be hundreds: a line every 10 % of the steps instead,
    # with the time so far; everything else (warnings, errors, FAILED: and its command) passes through.
    local start=$SECONDS
    cmake --build "$BUILD_DIR" -j "$(nproc)" | "${AWK[@]}" -v start="$(date +%s)" '
      match($0, /^\[[0-9]+\/[0-9]+\] /) {
        split(substr($0, 2, RLENGTH - 3), nt, "/")
        tenth = int(10 * nt[1] / nt[2])
        if (tenth > shown && tenth < 10) {
          shown = tenth
          "date +%s" | getline now; close("date +%s")
          t = now - start
          printf "run.sh: built %d of %d steps (%d %%) in %s\n", nt[1], nt[2], int(100 * nt[1] / nt[2]),
                 t < 60 ? t " s" : int(t / 60) " min " t % 60 " s"
          fflush()
        }
        next
      }
      { print; fflush() }'
    # The last step may never be printed (ninja drops steps it finds up to date on the way), and a failed
    # build stops here (set -e): the end is said once, on success.
    local t=$((SECONDS - start))
    echo "run.sh: built in $([ $t -lt 60 ] && echo "$t s" || echo "$((t / 60)) min $((t % 60)) s")"
  fi
}

# ctest in the build folder. Running tests in parallel, it announces each one twice ("Start", then the
# result): only the result is kept, and of the passing ones a line every 25 (a run has hundreds).
ctest_quiet() {
  (cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" "$@") | "${AWK[@]}" '
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

# ./run.sh plots: docs/bench/own_plots.py does the work. Its help and dry run need no build and no GPU; its
# arguments are checked before the build, and a machine without a GPU that can run the stages is told so
# before the build too, not ten minutes later.
plots() {
  local py=${PYTHON:-python3} a why
  for a in "$@"; do
    case $a in -h | --help | --dry-run | --replot | --replot=*) exec "$py" docs/bench/own_plots.py --build "$BUILD_DIR" "$@" ;; esac
  done
  "$py" docs/bench/own_plots.py --build "$BUILD_DIR" --check-args "$@"  # exit 2 on a bad argument
  why=$(why_no_gpu)
  if [ -n "$why" ]; then
    echo "run.sh plots: $why, and the plots time the GPU stages (./run.sh plots --dry-run lists what it would run)" >&2
    exit 2
  fi
  build
  exec "$py" docs/bench/own_plots.py --build "$BUILD_DIR" "$@"
}

COMMAND=${1:-}  # named in the no-GPU hint, so that its command line can be copied as it is
case "${1:-}" in
  tour)  shift; build; "$BUILD_DIR/flashattention_tour" "$@" ;;
  test)  shift; build; run_tests "$@" ;;
  plots) shift; plots "$@" ;;
  build) build ;;
  help | -h | --help) usage ;;
  "") usage; exit 2 ;;
  *) { echo "run.sh: unknown command '$1'"; usage; } >&2; exit 2 ;;
esac
