// FlashAttention, step by step — step 5: variants and runner (step5_backward/launch.cu)
//
// Two variants of the backward, each a few launches (prepare.cuh), in order (each needs the last):
//   deterministic (default)                              atomic (FlashAttention 2's single kernel)
//   preprocess  D = rowsum(dO * O)                       preprocess, then dQacc = 0 (memset)
//   dK/dV  grid ceil(Nk / Bc) * Hkv * B    } side by     dK/dV, which also adds dS K into dQacc (fp32)
//   dQ     grid ceil(Nq / Br) * Hq * B     } side        convert  dQ = scale * dQacc
// The deterministic variant has one writer per output element, so two runs give the same bits; the
// atomic one computes S and dP once instead of twice (5 products instead of 7), but its fp32 additions
// land in whatever order the blocks reach them. The forward is step 4's (make_forward), run in training
// mode: it writes O and the LSE the backward reads. Configurations and their names: configs.h.
#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backward.h"
#include "common/dtype.h"
#include "common/gpu_types.h"
#include "configs.h"
#include "device.cuh"
#include "step4_fused_pipelined/fused.h"

namespace fa::step5 {

// Set-up of configuration Cfg (prepare.cuh); instances_*.cu compile one per dtype and head dim.
template <class Cfg>
std::function<void()> prepare(const Problem& p, const BwdParams& bp);

std::string with_forward(const std::string& variant, const std::string& forward) {
  return variant + "/fwd=" + forward;
}

namespace {

// "<variant>/fwd=<forward>" -> {variant, forward}; a plain variant runs step 4's default forward.
std::pair<std::string, std::string> split_variant(const std::string& v) {
  const size_t at = v.find("/fwd=");
  return at == std::string::npos ? std::make_pair(v, std::string("auto"))
                                 : std::make_pair(v.substr(0, at), v.substr(at + 5));
}

// The configuration name a variant stands for on this device and head dim.
template <typename T, int D>
std::string resolve_config(const std::string& variant) {
  using C = Configs<T, D>;
  if (variant == "deterministic") return config_name<typename C::Deterministic>();
  if (variant == "atomic")
    return compute_capability_major() >= 12 ? config_name<typename C::AtomicSm120>() : config_name<typename C::AtomicSm90>();
  if (variant == "atomic-sm120") return config_name<typename C::AtomicSm120>();
  return variant;
}

// Calls f with the BwdConfig named `name` in the list, or throws.
template <class F, class... Cfg>
void with_config(const std::string& name, int d, ConfigList<Cfg...>, F&& f) {
  const bool found = ((name == config_name<Cfg>() ? (f(Cfg{}), true) : false) || ...);
  if (!found) throw std::invalid_argument("step 5 has no config " + name + " for d = " + std::to_string(d));
}

// Calls f with the configuration `variant` resolves to for problem p.
template <class F>
void with_problem_config(const Problem& p, const std::string& variant, F&& f) {
  dispatch_dtype</*kAllowFp32=*/false>(p.dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_head_dim(int(p.d), [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      with_config(resolve_config<T, D>(split_variant(variant).first), D, typename Configs<T, D>::All{}, f);
    });
  });
}

// Step 4's runner state (Q, K, V, O, LSE on the device) plus dO, D and the three gradients (and the atomic
// variant's fp32 dQ accumulator), all poisoned with NaN so that an element no kernel writes fails the check.
class BackwardRunner final : public GpuRunner {
 public:
  BackwardRunner(const Problem& p, const Inputs& in, const std::string& variant)
      : GpuRunner(p, in), forward_(step4::make_forward(p, params_, split_variant(variant).second)) {
    if (in.dout.size() != in.q.size()) return;  // a forward-only run (no --backward): no dO to set up
    const size_t bytes = size_t(dtype_bytes(p.dtype));
    do_ = upload(in.dout, p.dtype);
    dsum_ = DeviceBuffer(size_t(p.B * p.Hq * p.Nq) * sizeof(float));
    dq_ = DeviceBuffer(in.q.size() * bytes);
    dk_ = DeviceBuffer(in.k.size() * bytes);
    dv_ = DeviceBuffer(in.v.size() * bytes);
    for (DeviceBuffer* b : {&dsum_, &dq_, &dk_, &dv_}) b->poison();
    with_problem_config(p, variant, [&](auto cfg) {
      using Cfg = decltype(cfg);
      if constexpr (Cfg::kAtomic) {
        dq_accum_ = DeviceBuffer(in.q.size() * sizeof(float));
        dq_accum_.poison();  // the memset inside the timed backward must clear it
      }
      backward_ = prepare<Cfg>(p, BwdParams{params_, do_.get(), dsum_.as<float>(), dq_.get(), dq_accum_.as<float>(),
                                            dk_.get(), dv_.get()});
    });
  }
  void run() override { forward_(); }
  void run_backward() override {
    if (!backward_) throw std::logic_error("step5_backward: run_backward() needs dO (a problem with backward set)");
    backward_();
  }
  Outputs outputs() override {
    Outputs out = GpuRunner::outputs();  // synchronises
    if (backward_) {
      out.dq = download(dq_, p_.dtype, {p_.B, p_.Hq, p_.Nq, p_.d});
      out.dk = download(dk_, p_.dtype, {p_.B, p_.Hkv, p_.Nk, p_.d});
      out.dv = download(dv_, p_.dtype, {p_.B, p_.Hkv, p_.Nk, p_.d});
    }
    return out;
  }

 private:
  std::function<void()> forward_, backward_;
  DeviceBuffer do_, dsum_, dq_, dq_accum_, dk_, dv_;
};

}  // namespace

Stage stage() {
  Stage s;
  s.name = "step5_backward";
  s.title = "backward: dK/dV + dQ kernels (deterministic) or one kernel with atomic dQ; TMA ring, mma.sync";
  s.gpu = true;
  s.has_backward = true;
  // "atomic-sm120" runs the atomic variant's sm_120 tiles on any GPU (the H100 test grid).
  s.variants = {"deterministic", "atomic", "atomic-sm120"};
  s.tuning_variants = config_names(Configs<__nv_bfloat16, 64>::All{});
  for (const std::string& n : config_names(Configs<__nv_bfloat16, 128>::All{}))
    if (std::find(s.tuning_variants.begin(), s.tuning_variants.end(), n) == s.tuning_variants.end())
      s.tuning_variants.push_back(n);
  // The default is deterministic (two runs, same bits), and tuning must not trade that for speed: the
  // atomic configurations (config_name ends their names in "-atomic") are no candidates for step 6.
  s.tuning_exclusion = [](const std::string& config) {
    const bool atomic = config.size() > 7 && config.substr(config.size() - 7) == "-atomic";
    return atomic ? std::string("atomic dQ: results vary from run to run, the default is deterministic") : std::string();
  };
  s.default_config = [](const Problem& p) {
    std::string name;
    with_problem_config(p, "deterministic", [&](auto cfg) { name = config_name<decltype(cfg)>(); });
    return name;
  };
  s.launch_shape = [](const Problem& p, const std::string& v) {
    Stage::LaunchShape shape;
    with_problem_config(p, v, [&](auto cfg) {
      using Cfg = decltype(cfg);
      shape = {Cfg::kSmemBytes, Cfg::DkDv::kThreads};
    });
    return shape;
  };
  s.unsupported = [](const Problem& p, const std::string&) {
    if (p.dtype == DType::fp32) return std::string("fp32 storage (tensor cores take bf16 or fp16)");
    if (!(p.scale > 0)) return std::string("a scale <= 0 (step 4's forward keeps its running max in raw score units)");
    if (p.Nq >= (1 << 30) || p.Nk >= (1 << 30)) return std::string("sequences of 2^30 or more");
    return head_dim_unsupported(p.d);
  };
  s.make = [](const Problem& p, const Inputs& in, const std::string& v) -> std::unique_ptr<Runner> {
    return std::make_unique<BackwardRunner>(p, in, v);
  };
  return s;
}

}  // namespace fa::step5
