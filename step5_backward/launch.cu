// FlashAttention, step by step — step 5: configurations, launch and runner (step5_backward/launch.cu)
//
// Two variants of the backward, each a few launches on the default stream, in order (each needs the last):
//   deterministic (default)                              atomic (FlashAttention 2's single kernel)
//   preprocess  D = rowsum(dO * O)                       preprocess, then dQacc = 0 (memset)
//   dK/dV  grid ceil(Nk / Bc) * Hkv * B                  dK/dV, which also adds dS K into dQacc (fp32)
//   dQ     grid ceil(Nq / Br) * Hq * B                   convert  dQ = scale * dQacc
// The deterministic variant has one writer per output element, so two runs give the same bits; the
// atomic one computes S and dP once instead of twice (5 products instead of 7), but its fp32 additions
// land in whatever order the blocks reach them. The forward is step 4's (make_forward), run in training
// mode: it writes O and the LSE the backward reads.
#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "backward.h"
#include "common/dtype.h"
#include "common/gpu_types.h"
#include "common/tma.h"
#include "dkdv.cuh"
#include "dq.cuh"
#include "preprocess.cuh"
#include "step4_fused_pipelined/fused.h"
#include "traits.h"

namespace fa::step5 {

namespace {

// One backward configuration: the dK/dV kernel's tiles and, for the deterministic variant, the dQ
// kernel's (void for the atomic variant, whose dK/dV kernel also produces dQ).
template <class KV, class QD = void>
struct BwdConfig {
  using DkDv = KV;
  using Dq = QD;
  static constexpr bool kAtomic = KV::kAtomicDq;
  static_assert(kAtomic == std::is_void_v<QD>, "the atomic variant has no dQ kernel; the deterministic one needs one");
  static constexpr size_t smem_bytes() {
    if constexpr (kAtomic) return KV::kSmemBytes;
    else return std::max(KV::kSmemBytes, QD::kSmemBytes);
  }
  static constexpr size_t kSmemBytes = smem_bytes();  // the larger of its kernels'
};

template <class... Cfg>
struct ConfigList {};

template <typename T, int D>
struct Configs {
  // Deterministic. d = 128 takes half-height Q/dO tiles (Bq = 32) in the dK/dV kernel and half-width K/V
  // tiles in the dQ kernel, so that dK and dV (128 fp32 registers per thread) or Q, dO and dQ leave room
  // for S and dP. 8 warps own 128 keys: K and V of a block are read from L2 half as often as with 4.
  static constexpr int kBq = D == 64 ? 64 : 32;
  //                          T  D  Warps Bq   Stages         T  D  Warps Bc   Stages
  using Det4 = BwdConfig<DkDvTraits<T, D, 4, kBq, 2>, DqTraits<T, D, 4, kBq, 2>>;
  using Det8 = BwdConfig<DkDvTraits<T, D, 8, kBq, 2>, DqTraits<T, D, 4, kBq, 2>>;
  using Det8Q8 = BwdConfig<DkDvTraits<T, D, 8, kBq, 2>, DqTraits<T, D, 8, kBq, 2>>;
  using Det8S3 = BwdConfig<DkDvTraits<T, D, 8, kBq, 3>, DqTraits<T, D, 4, kBq, 3>>;
  // Atomic: 8 warps x 16 keys, as FlashAttention 2 (Bc = 128 halves the dQ atomics of Bc = 64).
  //                          T  D  Warps Bq         Stages AtomicDq
  using Atomic = BwdConfig<DkDvTraits<T, D, 8, kBq, 2, true>>;
  using AtomicHalf = BwdConfig<DkDvTraits<T, D, 8, kBq / 2, 2, true>>;
  using Atomic4 = BwdConfig<DkDvTraits<T, D, 4, kBq, 2, true>>;

  using Deterministic = Det8;
  using AtomicSm90 = Atomic;
  using AtomicSm120 = std::conditional_t<Atomic::kSmemBytes <= kSm120SmemBytes, Atomic, AtomicHalf>;
  static_assert(Deterministic::kSmemBytes <= kSm120SmemBytes && AtomicSm120::kSmemBytes <= kSm120SmemBytes,
                "the defaults for sm_120 must fit in its 99 KB of shared memory per block");
  // Every configuration --variant can name (step 6 sweeps them).
  using All = ConfigList<Det4, Det8, Det8Q8, Det8S3, Atomic, AtomicHalf, Atomic4>;
};

template <class Cfg>
std::string config_name() {
  using KV = typename Cfg::DkDv;
  std::string name = "kv" + std::to_string(KV::Bc) + "x" + std::to_string(KV::Bq) + "-S" + std::to_string(KV::kStages);
  if constexpr (Cfg::kAtomic) return name + "-atomic";
  else
    return name + "-q" + std::to_string(Cfg::Dq::Br) + "x" + std::to_string(Cfg::Dq::Bc) + "-S" +
           std::to_string(Cfg::Dq::kStages);
}

template <class... Cfg>
std::vector<std::string> config_names(ConfigList<Cfg...>) {
  return {config_name<Cfg>()...};
}

int compute_capability_major() {
  int dev = 0, major = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major;
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

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  int dev = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (size_t(optin) < bytes)
    throw std::runtime_error("a backward kernel needs " + std::to_string(bytes) +
                             " bytes of shared memory per block; the device allows " + std::to_string(optin));
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

unsigned grid_size(int64_t blocks) {
  if (blocks > 0x7fffffff) throw std::invalid_argument("problem too large for a 1-D grid");
  return unsigned(blocks);
}

// Set-up, outside any timed region: tensor maps (one per operand and box height), shared-memory opt-ins,
// and the closure that launches the kernels.
template <class Cfg>
std::function<void()> prepare(const Problem& p, const BwdParams& bp) {
  using KV = typename Cfg::DkDv;
  using T = typename KV::T;
  constexpr int D = KV::D;
  const AttnParams& a = bp.a;
  const int64_t BHq = p.B * p.Hq, BHkv = p.B * p.Hkv;
  // dK/dV kernel: Q and dO in boxes of Bq rows, K and V in boxes of Bc rows.
  const CUtensorMap kv_q = make_tensor_map_bhnd(a.q, p.dtype, BHq, p.Nq, D, KV::Bq);
  const CUtensorMap kv_do = make_tensor_map_bhnd(bp.dout, p.dtype, BHq, p.Nq, D, KV::Bq);
  const CUtensorMap kv_k = make_tensor_map_bhnd(a.k, p.dtype, BHkv, p.Nk, D, KV::Bc);
  const CUtensorMap kv_v = make_tensor_map_bhnd(a.v, p.dtype, BHkv, p.Nk, D, KV::Bc);
  const bool drop = a.dropout.threshold != 0;
  auto dkdv = drop ? dkdv_kernel<KV, true> : dkdv_kernel<KV, false>;
  allow_smem(dkdv, KV::kSmemBytes);

  const int64_t rows = BHq * p.Nq;
  const unsigned pre_blocks = grid_size((rows + kPreprocessWarps - 1) / kPreprocessWarps);
  const unsigned kv_blocks = grid_size((p.Nk + KV::Bc - 1) / KV::Bc * BHkv);
  auto preprocess = [=] {
    preprocess_kernel<T><<<pre_blocks, 32 * kPreprocessWarps>>>(static_cast<const T*>(a.o),
                                                                 static_cast<const T*>(bp.dout), bp.dsum, rows, D);
    CUDA_CHECK_LAUNCH();
  };
  if constexpr (Cfg::kAtomic) {
    const int64_t elems = rows * D;
    const unsigned cvt_blocks = grid_size((elems / 2 + kConvertThreads - 1) / kConvertThreads);
    return [=] {
      preprocess();
      CUDA_CHECK(cudaMemsetAsync(bp.dq_accum, 0, size_t(elems) * sizeof(float)));  // atomics add into zeros
      dkdv<<<kv_blocks, KV::kThreads, KV::kSmemBytes>>>(kv_q, kv_do, kv_k, kv_v, bp);
      CUDA_CHECK_LAUNCH();
      convert_dq_kernel<T><<<cvt_blocks, kConvertThreads>>>(bp.dq_accum, static_cast<T*>(bp.dq), elems, a.scale);
      CUDA_CHECK_LAUNCH();
    };
  } else {
    using DQ = typename Cfg::Dq;
    // dQ kernel: Q and dO in boxes of Br rows, K and V in boxes of Bc rows.
    const CUtensorMap dq_q = make_tensor_map_bhnd(a.q, p.dtype, BHq, p.Nq, D, DQ::Br);
    const CUtensorMap dq_do = make_tensor_map_bhnd(bp.dout, p.dtype, BHq, p.Nq, D, DQ::Br);
    const CUtensorMap dq_k = make_tensor_map_bhnd(a.k, p.dtype, BHkv, p.Nk, D, DQ::Bc);
    const CUtensorMap dq_v = make_tensor_map_bhnd(a.v, p.dtype, BHkv, p.Nk, D, DQ::Bc);
    auto dq = drop ? dq_kernel<DQ, true> : dq_kernel<DQ, false>;
    allow_smem(dq, DQ::kSmemBytes);
    const unsigned q_blocks = grid_size((p.Nq + DQ::Br - 1) / DQ::Br * BHq);
    return [=] {
      preprocess();
      dkdv<<<kv_blocks, KV::kThreads, KV::kSmemBytes>>>(kv_q, kv_do, kv_k, kv_v, bp);
      CUDA_CHECK_LAUNCH();
      dq<<<q_blocks, DQ::kThreads, DQ::kSmemBytes>>>(dq_q, dq_do, dq_k, dq_v, bp);
      CUDA_CHECK_LAUNCH();
    };
  }
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
      with_config(resolve_config<T, D>(variant), D, typename Configs<T, D>::All{}, f);
    });
  });
}

// Step 4's runner state (Q, K, V, O, LSE on the device) plus dO, D and the three gradients (and the atomic
// variant's fp32 dQ accumulator), all poisoned with NaN so that an element no kernel writes fails the check.
class BackwardRunner final : public GpuRunner {
 public:
  BackwardRunner(const Problem& p, const Inputs& in, const std::string& variant)
      : GpuRunner(p, in), forward_(step4::make_forward(p, params_)) {
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
