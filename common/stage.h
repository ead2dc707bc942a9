// FlashAttention, step by step — common/stage.h
// The one entry-point signature every stage implements, and the registry that the CLI, the tests, the
// tour and the benchmarks iterate.
//
// A stage turns a Problem and its float32 inputs (already rounded to the dtype) into a Runner:
//   construction  = set-up (device allocation, upload, tensor maps): never timed
//   run()         = the forward pass, the work being taught and timed
//   run_backward()= the backward pass (stages with a backward; called after run(), timed on its own)
//   outputs()     = waits for the work and returns float32 outputs: O, LSE, and dQ, dK, dV for a backward
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "problem.h"
#include "tensor.h"

namespace fa {

struct Inputs {
  Tensor q;     // [B, Hq, Nq, d]
  Tensor k, v;  // [B, Hkv, Nk, d]
  Tensor dout;  // [B, Hq, Nq, d], only for a backward run
};

struct Outputs {
  Tensor o;           // [B, Hq, Nq, d]
  Tensor lse;         // [B, Hq, Nq], natural log; -inf for a row that sees no key
  Tensor dq, dk, dv;  // like q, k, v; filled by a backward run
};

class Runner {
 public:
  virtual ~Runner() = default;
  virtual void run() = 0;           // the forward pass
  virtual void run_backward() {}    // the backward pass, after run(); only for stages with has_backward
  virtual Outputs outputs() = 0;
};

struct Stage {
  std::string name;         // the folder and executable name, e.g. "step3_naive_kernel"
  std::string title;        // one line for tables
  bool gpu = false;         // needs a CUDA device
  bool has_backward = false;
  std::vector<std::string> variants;  // selectable with --variant; the first is the default; all are tested
  // Further configurations --variant accepts (tile sizes, stages, ...): what step 6's autotuner sweeps.
  std::vector<std::string> tuning_variants;
  // Why the autotuner must not pick tuning variant `config` in place of the default although it may run
  // (e.g. it changes what the default guarantees), or "" when it may; unset: every one may.
  std::function<std::string(const std::string& config)> tuning_exclusion;
  // Per block: shared memory (bytes) and threads of a variant on problem p. Step 6 filters on these
  // against the device's limits before timing anything.
  struct LaunchShape {
    size_t smem_bytes = 0;
    int threads = 0;
  };
  std::function<LaunchShape(const Problem& p, const std::string& variant)> launch_shape;
  // The tuning variant the default variant runs on this device for p (what the autotuner must beat).
  std::function<std::string(const Problem& p)> default_config;
  // "" when the stage can run `p`, otherwise the reason (e.g. "head dim 96 is not supported").
  std::function<std::string(const Problem& p, const std::string& variant)> unsupported;
  std::function<std::unique_ptr<Runner>(const Problem& p, const Inputs& in, const std::string& variant)> make;
};

// Every stage compiled into this build, in tutorial order.
const std::vector<Stage>& stages();
const Stage& find_stage(const std::string& name);  // throws std::invalid_argument if unknown

// Why GPU stages cannot run here ("" when a CUDA device is usable): not built with CUDA, or no device.
std::string gpu_unavailable_reason();

}  // namespace fa
