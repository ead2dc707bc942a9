// FlashAttention, step by step — step 4: configurations and launch (step4_fused_pipelined/launch.cu)
//
// The default tiles per head dim and per architecture. sm_120 (RTX 50-series) gives a block 99 KB of
// shared memory, so its configs are checked against that at compile time; sm_90 (H100) allows 227 KB.
// Variants: "auto" picks by the device's compute capability; "sm90" and "sm120" force one, so the
// sm_120 configs run in the H100 test grid too.
#include <functional>
#include <stdexcept>

#include "common/gpu_types.h"
#include "common/tma.h"
#include "fused.h"
#include "kernel.cuh"

namespace fa::step4 {

// A compile-time list of configurations; each can be picked by name at run time (--variant), so
// comparing tile sizes never means editing source.
template <class... Tr>
struct ConfigList {};

template <typename T, int D>
struct Configs {
  // H100 (measured, docs/results/step4.md): d = 128 wants long K/V tiles (Bc = 128: fewer trips of the
  // loop, more math per barrier); d = 64 wants two blocks of 4 warps per SM, which desynchronise.
  //                    T  D  Br              Bc               Warps           Stages
  using Sm90 = FwdTraits<T, D, D == 64 ? 64 : 128, D == 64 ? 64 : 128, D == 64 ? 4 : 8, 2>;
  // RTX 50-series: 99 KB per block. The best of the configs that fit, as measured on the H100.
  using Sm120 = FwdTraits<T, D, 64, 64, 4, 2>;
  static_assert(Sm120::kFitsSm120, "the sm_120 default must fit in sm_120's 99 KB of shared memory per block");
  // Every configuration --variant can name (step 6 sweeps them): tile sizes, warps, pipeline depth.
  using All = ConfigList<FwdTraits<T, D, 128, 64, 8, 1>, FwdTraits<T, D, 128, 64, 8, 2>, FwdTraits<T, D, 128, 64, 8, 3>,
                         FwdTraits<T, D, 128, 128, 8, 2>, FwdTraits<T, D, 64, 64, 4, 2>, FwdTraits<T, D, 64, 64, 4, 3>,
                         FwdTraits<T, D, 64, 128, 4, 2>, FwdTraits<T, D, 64, 64, 4, 2, /*Swizzle=*/false>>;
};

template <class Tr>
std::string config_name() {
  return "Br" + std::to_string(Tr::Br) + "-Bc" + std::to_string(Tr::Bc) + "-W" + std::to_string(Tr::kWarps) +
         "-S" + std::to_string(Tr::kStages) + (Tr::kSwizzle ? "" : "-noswizzle");
}

template <class... Tr>
std::vector<std::string> config_names(ConfigList<Tr...>) {
  return {config_name<Tr>()...};
}

template <class... Tr>
Stage::LaunchShape config_shape(const std::string& name, ConfigList<Tr...>) {
  Stage::LaunchShape shape;
  ((name == config_name<Tr>() ? (shape = {Tr::kSmemBytes, Tr::kThreads}, true) : false) || ...);
  if (!shape.threads) throw std::invalid_argument("step 4 has no config " + name);
  return shape;
}

namespace {

// Set-up, outside any timed region: tensor maps, the shared-memory opt-in, the launch closure.
template <class Tr>
std::function<void()> prepare(const Problem& p, const AttnParams& params) {
  require_smem_optin(Tr::kSmemBytes, "this config");
  const CUtensorMap tq = make_tensor_map_bhnd(params.q, p.dtype, p.B * p.Hq, p.Nq, Tr::D, Tr::Br, Tr::kSwizzle);
  const CUtensorMap tk = make_tensor_map_bhnd(params.k, p.dtype, p.B * p.Hkv, p.Nk, Tr::D, Tr::Bc, Tr::kSwizzle);
  const CUtensorMap tv = make_tensor_map_bhnd(params.v, p.dtype, p.B * p.Hkv, p.Nk, Tr::D, Tr::Bc, Tr::kSwizzle);
  const CUtensorMap to = make_tensor_map_bhnd(params.o, p.dtype, p.B * p.Hq, p.Nq, Tr::D, 16, Tr::kSwizzle);  // a warp's rows
  auto kernel = params.dropout.threshold ? fused_forward<Tr, true> : fused_forward<Tr, false>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tr::kSmemBytes)));
  const int64_t blocks = (p.Nq + Tr::Br - 1) / Tr::Br * p.Hq * p.B;
  if (blocks > 0x7fffffff) throw std::invalid_argument("problem too large for a 1-D grid");
  return [=] {
    kernel<<<unsigned(blocks), Tr::kThreads, Tr::kSmemBytes>>>(tq, tk, tv, to, params);
    CUDA_CHECK_LAUNCH();
  };
}

template <class... Tr>
std::function<void()> prepare_named(const std::string& name, const Problem& p, const AttnParams& params,
                                    ConfigList<Tr...>) {
  std::function<void()> f;
  ((name == config_name<Tr>() ? (f = prepare<Tr>(p, params), true) : false) || ...);
  if (!f) throw std::invalid_argument("step 4 has no config " + name);
  return f;
}

class FusedRunner final : public GpuRunner {
 public:
  FusedRunner(const Problem& p, const Inputs& in, const std::string& variant)
      : GpuRunner(p, in), launch_(make_forward(p, params_, variant)) {}
  void run() override { launch_(); }

 private:
  std::function<void()> launch_;
};

}  // namespace

std::function<void()> make_forward(const Problem& p, const AttnParams& params, const std::string& variant) {
  const std::string cfg = variant != "auto" ? variant : compute_capability_major() >= 12 ? "sm120" : "sm90";
  std::function<void()> f;
  dispatch_dtype</*kAllowFp32=*/false>(p.dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_head_dim(int(p.d), [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      if (cfg == "sm120") f = prepare<typename Configs<T, D>::Sm120>(p, params);
      else if (cfg == "sm90") f = prepare<typename Configs<T, D>::Sm90>(p, params);
      else f = prepare_named(cfg, p, params, typename Configs<T, D>::All{});
    });
  });
  return f;
}

Stage stage() {
  Stage s;
  s.name = "step4_fused_pipelined";
  s.title = "fused forward: TMA ring of K/V stages, swizzled smem, mma.sync, P in registers";
  s.gpu = true;
  s.variants = {"auto", "sm90", "sm120"};
  s.tuning_variants = config_names(Configs<__nv_bfloat16, 64>::All{});
  s.default_config = [](const Problem& p) {
    const bool sm120 = compute_capability_major() >= 12;
    return p.d == 64 ? (sm120 ? config_name<Configs<__nv_bfloat16, 64>::Sm120>() : config_name<Configs<__nv_bfloat16, 64>::Sm90>())
                     : (sm120 ? config_name<Configs<__nv_bfloat16, 128>::Sm120>() : config_name<Configs<__nv_bfloat16, 128>::Sm90>());
  };
  s.launch_shape = [](const Problem& p, const std::string& v) {
    return p.d == 64 ? config_shape(v, Configs<__nv_bfloat16, 64>::All{})
                     : config_shape(v, Configs<__nv_bfloat16, 128>::All{});
  };
  s.unsupported = [](const Problem& p, const std::string&) {
    if (p.dtype == DType::fp32) return std::string("fp32 storage (tensor cores take bf16 or fp16)");
    if (!(p.scale > 0)) return std::string("a scale <= 0 (the running max is kept in raw score units)");
    if (p.Nq >= (1 << 30) || p.Nk >= (1 << 30)) return std::string("sequences of 2^30 or more");
    return head_dim_unsupported(p.d);
  };
  s.make = [](const Problem& p, const Inputs& in, const std::string& v) -> std::unique_ptr<Runner> {
    return std::make_unique<FusedRunner>(p, in, v);
  };
  return s;
}

}  // namespace fa::step4
