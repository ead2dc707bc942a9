// FlashAttention, step by step — core/stage.h
// The contract between a stage and the harness: the inputs and outputs of one run, the Runner a stage
// makes, the Stage record the harness reads (with Supports: what the stage declares it runs), the Platform
// a GPU stage runs on, and the Oracle that --check compares with. The harness (harness/) knows stages only
// through these types; each stage's main() hands its own Stage to it, and only the registry
// (harness/registry.h) lists them all.
//
// A stage turns a Problem and its float32 inputs (already rounded to the dtype) into a Runner:
//   construction  = set-up (device allocation, upload, tensor maps): never timed
//   run()         = the forward pass, the work being taught and timed
//   run_backward()= the backward pass (stages with a backward; called after run(), timed on its own)
//   outputs()     = waits for the work and returns float32 outputs: O, LSE, and dQ, dK, dV for a backward
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/problem.h"
#include "core/tensor.h"

namespace fa {

struct Varlen;  // a packed variable-length batch (core/varlen.h)

// A packed batch (core/varlen.h's layout) whose tensors already live on the device, in the problem's dtype:
// what Stage::run_device reads and writes. A dense [B, N, H, d] batch is one too (B sequences of N tokens).
struct DeviceBatch {
  const void *q, *k, *v;  // [total_q, Hq, d], [total_k, Hkv, d], contiguous, 16-byte aligned
  void* o;                // [total_q, Hq, d]: written by a forward, read by a backward
  float* lse;             // [Hq, total_q]: likewise
  const void* dout;       // a backward's: dO like O
  void *dq, *dk, *dv;     // a backward's outputs, like Q, K, V
};

struct Inputs {
  Tensor q;     // [B, Hq, Nq, d]
  Tensor k, v;  // [B, Hkv, Nk, d]
  Tensor dout;  // [B, Hq, Nq, d], only for a backward run
  Tensor bias;  // [B or 1, Hq or 1, Nq, Nk] float32, added to the scores; empty unless Problem::bias
  Tensor alibi_slopes;  // [Hq] float32 with Problem::alibi; empty: the standard slopes (core/score_mod.h)
};

template <typename T>
struct OutputsT {
  TensorT<T> o;           // [B, Hq, Nq, d]
  TensorT<T> lse;         // [B, Hq, Nq], natural log; -inf for a row that sees no key
  TensorT<T> dq, dk, dv;  // like q, k, v; filled by a backward run
  TensorT<T> dbias;       // like the bias (summed over its broadcast dims); a backward run with a bias
};
using Outputs = OutputsT<float>;

class Runner {
 public:
  virtual ~Runner() = default;
  virtual void run() = 0;           // the forward pass
  virtual void run_backward() {}    // the backward pass, after run(); only for stages with has_backward
  virtual Outputs outputs() = 0;
};

// The device a GPU stage runs on, as the harness needs it: whether it is there, its name, and a timer.
// The CUDA layer implements it (gpu/platform.h); a CPU stage has none, so the harness itself never calls
// CUDA and the CPU executables carry no GPU code.
class Platform {
 public:
  virtual ~Platform() = default;
  virtual std::string unavailable_reason() const = 0;  // "" when a device is usable
  virtual std::string device_name() const = 0;         // "NVIDIA H100 80GB HBM3"
  virtual std::string runtime_version() const = 0;     // "13.0"
  virtual int compute_capability_major() const = 0;    // 9 on an H100, 12 on an RTX 50-series card
  // Milliseconds of one call of `work`, timed with device events; with `cold_l2`, the L2 cache is flushed
  // first (outside the timed region), so the run starts from cold K/V as in a real model step.
  virtual double time_ms(const std::function<void()>& work, bool cold_l2) const = 0;
};

// What a stage declares it runs, as data: the storage types and head dims it compiles, and which of its
// variants (and tuning configurations, by name) take dropout, the score modifiers, --splits and a backward.
// The test grids (tests/gpu_grid.h) list a (variant, case) only where the declaration says yes, so a case a
// stage cannot run is never listed, and a listed case it refuses is a failure, not a skip. unsupported()
// stays what a run asks; a host-side test checks on every grid case that the two agree (declares(), below).
// Not declared: limits of size (grid dimensions, 2^30 keys) and a scale <= 0, which no grid reaches.
struct Supports {
  std::vector<DType> dtypes = {DType::fp32, DType::fp16, DType::bf16};
  std::vector<int64_t> head_dims;  // empty: any head dim
  bool dropout = true;             // in every variant, forward and backward
  // Variants and configurations, by name ("*": every one), that take the score modifiers, --splits and
  // --backward; each also needs the stage's flag (has_score_mods, has_splits, has_backward).
  std::vector<std::string> score_mods = {"*"}, splits = {"*"}, backward = {"*"};
  // ... and a KV cache (--cache-seqlens, --page-size; with has_kv_cache): a decoding feature, so forward
  // only, without dropout or score modifiers, wherever a stage takes it. kv_pages: it takes the cache in
  // pages too (--page-size: a GPU layout; step 1, the oracle, reads the lengths of a dense cache only).
  std::vector<std::string> kv_cache = {"*"};
  bool kv_pages = true;
};

struct Stage {
  std::string name;         // the folder and executable name, e.g. "step3_naive_kernel"
  std::string title;        // one line for tables
  const Platform* platform = nullptr;  // the GPU a stage needs, or nullptr for a CPU stage
  bool has_backward = false;
  bool has_splits = false;  // takes --splits (split-KV decoding: step 4's forward)
  bool has_score_mods = false;  // takes --bias, --alibi, --window, --softcap (core/score_mod.h)
  bool has_kv_cache = false;    // takes --cache-seqlens (and --page-size where kv_pages): step 4's 4f, step 1
  // Runs a packed variable-length batch (--cu-seqlens-q, --cu-seqlens-k; core/varlen.h) through
  // make_varlen_runner: the stage's own make_varlen where it has one (a kernel that reads the offsets
  // itself), else the varlen loop, which runs the stage's make() on each sequence as a dense problem.
  bool has_varlen = false;
  std::function<std::unique_ptr<Runner>(const Problem& p, const Varlen& v, const Inputs& packed,
                                        const std::string& variant)>
      make_varlen;
  // The zero-copy path (the C interface's device calls, capi/): one pass of a packed batch whose tensors are on
  // the device: with p.backward the backward, from the O and LSE given, otherwise the forward. Queued on the
  // default stream, nothing copied; the only allocations (the offsets, a backward's D) are stream-ordered.
  // Returns "" once queued, or why this call is not for it (a head dim without kernels, a modifier), before
  // touching anything: the caller then copies through a Runner. Unset: Runners only. Steps 4, 5 and 7 set it.
  std::function<std::string(const Problem& p, const Varlen& v, const DeviceBatch& t, const std::string& variant)>
      run_device;
  // Stages that run another stage's kernels for a pass name it here (step 5's forward is step 4's), so a
  // test grid checks those kernels once, under the stage that owns them.
  std::string forward_from, backward_from;
  std::vector<std::string> variants;  // selectable with --variant; the first is the default; all are tested
  // Further configurations --variant accepts (tile sizes, stages, ...): what step 6's autotuner sweeps and
  // the configuration test checks, every one of them.
  std::vector<std::string> tuning_variants;
  // Why the autotuner must not pick tuning variant `config` in place of the default although it may run
  // (e.g. it changes what the default guarantees), or "" when it may; unset: every one may.
  std::function<std::string(const std::string& config)> tuning_exclusion;
  // The split counts (--splits) step 6 times configuration `config` with on p, beside the stage's own
  // choice; empty where `config` has no split-KV path or p is not a decode (step 4: a 4f configuration and
  // a head's query rows shorter than a tile). Unset: none.
  std::function<std::vector<int64_t>(const Problem& p, const std::string& config)> tuning_splits;
  // Per block: shared memory (bytes) and threads of a variant on problem p. Step 6 filters on these
  // against the device's limits before timing anything.
  struct LaunchShape {
    size_t smem_bytes = 0;
    int threads = 0;
  };
  std::function<LaunchShape(const Problem& p, const std::string& variant)> launch_shape;
  // The tuning configuration that `variant` runs for p on a GPU of compute capability `cc_major` (9: the
  // H100, 12: an RTX 50-series card): for the tuner, what the default must be beaten by; for the test grids,
  // which names run the same kernels. Unset for stages without configurations.
  std::function<std::string(const Problem& p, const std::string& variant, int cc_major)> config_of;
  // "" when the stage can run `p`, otherwise the reason (e.g. "head dim 96 is not supported").
  std::function<std::string(const Problem& p, const std::string& variant)> unsupported;
  Supports supports;  // what unsupported() accepts, as data: the test grids list their cases from it
  std::function<std::unique_ptr<Runner>(const Problem& p, const Inputs& in, const std::string& variant)> make;
  // Bytes of host memory a run of `variant` on p allocates: its working buffers and its outputs. The CPU
  // stages set it, so that the harness refuses a problem that does not fit before allocating anything;
  // unset for the GPU stages, whose host side holds only the downloaded outputs.
  std::function<double(const Problem& p, const std::string& variant)> host_bytes;

  bool gpu() const { return platform != nullptr; }
};

// Does stage s declare that `variant` runs p (Supports)? The flags come first: a feature the stage does
// not take at all (has_backward, has_splits, has_score_mods, has_kv_cache) is refused by the command line before the
// stage is asked.
inline bool declares(const Stage& s, const Problem& p, const std::string& variant) {
  const Supports& d = s.supports;
  auto named = [&](const std::vector<std::string>& names) {
    return std::find(names.begin(), names.end(), "*") != names.end() ||
           std::find(names.begin(), names.end(), variant) != names.end();
  };
  if (std::find(d.dtypes.begin(), d.dtypes.end(), p.dtype) == d.dtypes.end()) return false;
  if (!d.head_dims.empty() && std::find(d.head_dims.begin(), d.head_dims.end(), p.d) == d.head_dims.end()) return false;
  if (p.dropout > 0 && !d.dropout) return false;
  if (p.backward && !(s.has_backward && named(d.backward))) return false;
  if (p.splits > 0 && !(s.has_splits && named(d.splits))) return false;
  if (p.has_score_mods() && !(s.has_score_mods && named(d.score_mods))) return false;
  if (p.has_kv_cache() && !(s.has_kv_cache && named(d.kv_cache) && !p.backward && p.dropout == 0 && !p.has_score_mods()))
    return false;
  if (p.page_size > 0 && !d.kv_pages) return false;
  return true;
}

// What --check compares a stage with (step 1 provides it): attention in fp64, and the naive computation
// in the problem's own precision, rounded as an eager framework would (the baseline of the tolerance rule).
struct Oracle {
  std::function<OutputsT<double>(const Problem& p, const Inputs& in)> exact;
  std::function<Outputs(const Problem& p, const Inputs& in)> naive_low_precision;
  // Bytes of host memory a check of p allocates: both computations and their outputs, at their peak.
  std::function<double(const Problem& p)> host_bytes;
};

}  // namespace fa
