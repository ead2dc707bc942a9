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

#include "core/dtype.h"
#include "gpu/gpu_types.h"
#include "gpu/platform.h"
#include "step4_fused_pipelined/fused.h"
#include "step5_backward/backward.h"
#include "step5_backward/configs.h"
#include "step5_backward/device.cuh"

namespace fa::step5 {

// Set-up of the configuration named `name` (prepare.cuh); instances_*.cu compile one per dtype and head dim.
template <typename T, int D>
std::function<void()> prepare_named(const std::string& name, const Problem& p, const BwdParams& bp);

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

// The configuration name `variant` stands for at head dim D on compute capability cc_major.
template <int D>
std::string resolve(const std::string& variant, int cc_major) {
  using C = Configs<__nv_bfloat16, D>;
  if (variant == "deterministic") return C::Deterministic::name();
  if (variant == "atomic") return cc_major >= 12 ? C::AtomicSm120::name() : C::AtomicSm90::name();
  if (variant == "atomic-sm120") return C::AtomicSm120::name();
  return variant;
}

std::string config_of(const Problem& p, const std::string& variant, int cc_major) {
  const std::string v = split_variant(variant).first;
  return p.d == 64 ? resolve<64>(v, cc_major) : resolve<128>(v, cc_major);
}


// The launch closure of configuration `name` for p.
std::function<void()> prepare_config(const Problem& p, const std::string& name, const BwdParams& bp) {
  std::function<void()> f;
  dispatch_dtype</*kAllowFp32=*/false>(p.dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_head_dim(int(p.d), [&](auto dim) { f = prepare_named<T, decltype(dim)::value>(name, p, bp); });
  });
  return f;
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
    const std::string config = config_of(p, variant, compute_capability_major());
    with_problem_config<Configs>(p, config, "step 5", [&](auto cfg) {
      if constexpr (decltype(cfg)::type::kAtomic) {
        dq_accum_ = DeviceBuffer(in.q.size() * sizeof(float));
        dq_accum_.poison();  // the memset inside the timed backward must clear it
      }
    });
    backward_ = prepare_config(p, config, BwdParams{params_, do_.get(), dsum_.as<float>(), dq_.get(),
                                                    dq_accum_.as<float>(), dk_.get(), dv_.get()});
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
  s.platform = &cuda_platform();
  s.has_backward = true;
  // "atomic-sm120" runs the atomic variant's sm_120 tiles on any GPU (the H100 test grid).
  s.variants = {"deterministic", "atomic", "atomic-sm120"};
  s.tuning_variants = config_names(Configs<__nv_bfloat16, 64>::All{});
  for (const std::string& n : config_names(Configs<__nv_bfloat16, 128>::All{}))
    if (std::find(s.tuning_variants.begin(), s.tuning_variants.end(), n) == s.tuning_variants.end())
      s.tuning_variants.push_back(n);
  // The default is deterministic (two runs, same bits), and tuning must not trade that for speed: the
  // atomic configurations (their names end in "-atomic") are no candidates for step 6.
  s.tuning_exclusion = [](const std::string& config) {
    const bool atomic = config.size() > 7 && config.substr(config.size() - 7) == "-atomic";
    return atomic ? std::string("atomic dQ: results vary from run to run, the default is deterministic") : std::string();
  };
  s.forward_from = "step4_fused_pipelined";
  s.config_of = config_of;
  s.launch_shape = [](const Problem& p, const std::string& v) {
    Stage::LaunchShape shape;
    with_problem_config<Configs>(p, v, "step 5", [&](auto cfg) {
      using Cfg = typename decltype(cfg)::type;
      shape = {Cfg::kSmemBytes, Cfg::kThreads};
    });
    return shape;
  };
  s.unsupported = [](const Problem& p, const std::string&) { return step4::unsupported(p); };  // its kernels' limits are step 4's
  s.make = [](const Problem& p, const Inputs& in, const std::string& v) -> std::unique_ptr<Runner> {
    return std::make_unique<BackwardRunner>(p, in, v);
  };
  return s;
}

}  // namespace fa::step5
