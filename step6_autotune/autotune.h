// FlashAttention, step by step — step 6: the autotuner (step6_autotune/autotune.h)
//
// What it adds over step 5: nothing new on the GPU. Steps 4 and 5 compile a list of configurations
// (tile sizes Br and Bc, warps, pipeline stages), each selectable by name; which one is fastest depends on
// the GPU, the head dim, the mask and the sequence length (docs/history/step4.md: Bc = 128 wins at
// d = 128 on an H100, two 4-warp blocks win at d = 64). The autotuner
//   1. filters the list by what the device allows (shared memory per block, threads per block),
//   2. times each survivor on the user's problem (fresh inputs, warm-up, median of CUDA-event timings),
//      after a quick check that it computes what the default configuration computes,
//   3. caches the winner in a JSON file keyed by GPU, compute capability, dtype, head dim, causal, GQA
//      group, the score modifiers that are on and a sequence-length bucket, so later runs time nothing.
// DISABLE_AUTOTUNE=1 (or FMHA_DISABLE_AUTOTUNE=1) skips all of it and uses the default configuration.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/stage.h"

namespace fa::step6 {

struct DeviceLimits {
  std::string name;       // "NVIDIA H100 80GB HBM3"
  int cc_major = 0, cc_minor = 0;
  size_t smem_optin = 0;  // shared memory one block may use with the opt-in attribute
  int max_threads = 0;    // threads per block
};
DeviceLimits current_device();  // from the CUDA runtime

// The stage's tuning variants that can run p (the stage's `unsupported`: step 4's lesson configurations
// have no score modifiers) and fit `dev`; `rejected` gets "name: reason" for the others.
std::vector<std::string> feasible_variants(const Stage& s, const Problem& p, const DeviceLimits& dev,
                                           std::vector<std::string>* rejected = nullptr);

// "gpu|cc|stage|fwd|dtype|d|causal|group[|dropout][|mods][|decode]|N<=bucket": the cache key of a problem. Dropout
// and the score modifiers compile other kernels (and a bias is traffic of its own), so they tune apart; the
// key of a problem without them is what it always was. [|mods] names each modifier that is on:
//   |biasBH   a bias and its shape: B or 1, H or 1 (a broadcast dimension), as `bias_shape` [B|1, Hq|1, Nq, Nk]
//             says; without bias_shape, a full [B, Hq, ...] one
//   |alibi    ALiBi (its slopes change no work)
//   |softcap  a softcap (its value changes no work)
//   |win<=L,<=R  a sliding window, each side bucketed like N (-1: unbounded; causal caps R at 0)
// [|decode] is there where the stage tunes split counts for p (Stage::tuning_splits): how many splits pay
// depends on how many blocks the problem has without them, so the key adds B * Hkv and the rows of a KV
// head's queries (group * Nq), each bucketed like N: |decode:BHkv<=X,rows<=Y.
std::string cache_key(const Stage& s, const Problem& p, const DeviceLimits& dev,
                      const std::vector<int64_t>& bias_shape = {});

// The winner of a timed table: the fastest configuration, unless the default's own time (if it is in the
// table) is within `margin` of it, in which case the default stays. Timings of one GPU move by about 2%
// from run to run (docs/history/step4.md), so a smaller win is noise, not a reason to switch.
constexpr double kKeepDefaultMargin = 0.03;
std::string pick(const std::vector<std::pair<std::string, double>>& table, const std::string& default_config,
                 double margin = kKeepDefaultMargin);

bool autotune_disabled();          // DISABLE_AUTOTUNE or FMHA_DISABLE_AUTOTUNE set to a non-zero value
std::string default_cache_path();  // $XDG_CACHE_HOME or ~/.cache, /flashattention-step-by-step/autotune.json

struct Choice {
  std::string variant;  // the configuration to run
  int64_t splits = 0;   // and its split count (--splits), where the stage tunes one; 0: the stage's own choice
  std::string source;   // "default (DISABLE_AUTOTUNE)", "cache", "tuned now"
  std::vector<std::pair<std::string, double>> table;  // every timed config ("name splits=N") and its TFLOP/s (tuned now)
};

class Autotuner {
 public:
  explicit Autotuner(std::string cache_file = default_cache_path());
  // The configuration for `p`: the default if disabled, the cached one if any (unless `force`),
  // otherwise tuned now (and cached). Progress goes to stderr. With p.bias, `bias_shape` is the bias's
  // shape (Inputs::bias.shape; empty: a full one): the tuning runs draw a random bias of that shape.
  Choice choose(const Stage& s, const Problem& p, bool force = false, const std::vector<int64_t>& bias_shape = {});
  // Only what is cached: "" if nothing is.
  std::string cached(const Stage& s, const Problem& p, const std::vector<int64_t>& bias_shape = {}) const;
  void clear();  // removes the cache file
  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

// The configuration the stage's default variant runs for p on `dev`: what a candidate must beat.
std::string default_config(const Stage& s, const Problem& p, const DeviceLimits& dev);

// p without the backward: what step 4's forward is tuned on (a backward run tunes both passes).
Problem forward_only(Problem p);

// p as the choice runs it: with the tuned split count, unless p already asks for one (--splits).
Problem with_splits(Problem p, const Choice& c);

// The registry entry "step6_autotune": step 4's forward and (with a backward) step 5's backward, each in
// its tuned configuration (tuned in make(), outside any timed region), cached in `cache_file`.
Stage stage(const std::string& cache_file = default_cache_path());

}  // namespace fa::step6
