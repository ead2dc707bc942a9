#!/usr/bin/env bash
# FlashAttention, step by step — set up, build and run.
#
#   ./run.sh tour     build, then run every stage on its default problem: one table of error, time, throughput
#   ./run.sh test     build, then run the whole GoogleTest suite through ctest (what CI runs)
#   ./run.sh build    only install what is missing, configure and build
#
# Missing Debian packages are installed when run as root; otherwise the exact apt-get line is printed.
# Environment: BUILD_DIR (default build), CMAKE_ARGS (extra configure flags, e.g.
# -DCMAKE_CUDA_ARCHITECTURES=90), FA_DEPS_PREFIX (dependencies unpacked under a prefix instead of
# installed: skips the package check; used on the GPU machine, see docs/reproduce.md).
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(cmake ninja-build g++ libeigen3-dev googletest libgtest-dev librandom123-dev libcli11-dev
          nlohmann-json3-dev python3-matplotlib python3-numpy)
BUILD_DIR=${BUILD_DIR:-build}

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

build() {
  ensure_packages
  local args=(-S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release)
  [ -n "${FA_DEPS_PREFIX:-}" ] && args+=("-DCMAKE_PREFIX_PATH=$FA_DEPS_PREFIX")
  # shellcheck disable=SC2206
  [ -n "${CMAKE_ARGS:-}" ] && args+=($CMAKE_ARGS)
  cmake "${args[@]}" >/dev/null
  cmake --build "$BUILD_DIR" -j "$(nproc)"
}

case "${1:-}" in
  tour)  shift; build; "$BUILD_DIR/flashattention_tour" "$@" ;;
  test)  shift; build; ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "$@" ;;
  build) build ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
