// FlashAttention, step by step — step 4: configurations and launch (step4_fused_pipelined/launch.cu)
//
// Variants: "auto" picks the default of the device's architecture (configs.h); "sm90" and "sm120" force
// one, so the sm_120 default runs on the H100 too; "4a-padded" .. "4d-tma" are the chapter's sub-steps at
// the tiles of the device's default (4d is the default); every configuration of configs.h is a variant by name.
#include <functional>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "gpu/gpu_types.h"
#include "gpu/platform.h"
#include "gpu/tma.h"
#include "step4_fused_pipelined/configs.h"
#include "step4_fused_pipelined/fused.h"
#include "step4_fused_pipelined/kernel_4a_threads.cuh"
#include "step4_fused_pipelined/kernel_4c_cp_async.cuh"
#include "step4_fused_pipelined/kernel_4d_tma.cuh"

namespace fa::step4 {
namespace {

// Set-up, outside any timed region: tensor maps, the shared-memory opt-in, the launch closure.
template <class Tr>
std::function<void()> prepare(const Problem& p, const AttnParams& params) {
  constexpr size_t kSmem = kFwdSmemBytes<Tr>;
  require_smem_optin(kSmem, "this config");
  const int64_t blocks = (p.Nq + Tr::Br - 1) / Tr::Br * p.Hq * p.B;
  if (blocks > 0x7fffffff) throw std::invalid_argument("problem too large for a 1-D grid");
  if constexpr (Tr::kCopy != TileCopy::kTma) {  // 4a-4c: the threads copy; no tensor maps
    auto pick = [](auto dropout) {
      if constexpr (Tr::kCopy == TileCopy::kCpAsync) return forward_4c<Tr, decltype(dropout)::value>;
      else return forward_4a<Tr, decltype(dropout)::value>;
    };
    auto kernel = params.dropout.threshold ? pick(std::true_type{}) : pick(std::false_type{});
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    return [=] {
      kernel<<<unsigned(blocks), Tr::kThreads, kSmem>>>(params);
      CUDA_CHECK_LAUNCH();
    };
  } else {  // 4d: tensor maps for TMA
    constexpr bool swizzle = Tr::kLayout == SmemLayout::kSwizzle;  // else plain rows: the ablation
    const CUtensorMap tq = make_tensor_map_bhnd(params.q, p.dtype, p.B * p.Hq, p.Nq, Tr::D, Tr::Br, swizzle);
    const CUtensorMap tk = make_tensor_map_bhnd(params.k, p.dtype, p.B * p.Hkv, p.Nk, Tr::D, Tr::Bc, swizzle);
    const CUtensorMap tv = make_tensor_map_bhnd(params.v, p.dtype, p.B * p.Hkv, p.Nk, Tr::D, Tr::Bc, swizzle);
    const CUtensorMap to = make_tensor_map_bhnd(params.o, p.dtype, p.B * p.Hq, p.Nq, Tr::D, 16, swizzle);  // a warp's rows
    auto kernel = params.dropout.threshold ? fused_forward<Tr, true> : fused_forward<Tr, false>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    return [=] {
      kernel<<<unsigned(blocks), Tr::kThreads, kSmem>>>(tq, tk, tv, to, params);
      CUDA_CHECK_LAUNCH();
    };
  }
}

// The chapter's sub-steps, in order: each variant runs the default's tiles with that sub-step's kernel.
const std::pair<const char*, Substep> kSubsteps[] = {
    {"4a-padded", Substep::k4a}, {"4b-swizzle", Substep::k4b}, {"4c-cp-async", Substep::k4c}, {"4d-tma", Substep::k4d}};

template <int D>
std::string resolve(const std::string& variant, int cc_major) {
  using C = Configs<__nv_bfloat16, D>;
  const FwdTiles tiles = cc_major >= 12 ? C::kSm120 : C::kSm90;
  for (const auto& [name, step] : kSubsteps)
    if (variant == name) return tiles_name(substep(tiles, step));
  if (variant == "sm120" || (variant == "auto" && cc_major >= 12)) return C::Sm120::name();
  if (variant == "sm90" || variant == "auto") return C::Sm90::name();
  return variant;
}


class FusedRunner final : public GpuRunner {
 public:
  FusedRunner(const Problem& p, const Inputs& in, const std::string& variant)
      : GpuRunner(p, in), launch_(make_forward(p, params_, variant)) {}
  void run() override { launch_(); }

 private:
  std::function<void()> launch_;
};

std::string config_of(const Problem& p, const std::string& variant, int cc_major) {
  return p.d == 64 ? resolve<64>(variant, cc_major) : resolve<128>(variant, cc_major);
}

}  // namespace

std::string unsupported(const Problem& p) {
  if (p.dtype == DType::fp32) return "fp32 storage (tensor cores take bf16 or fp16)";
  if (!(p.scale > 0)) return "a scale <= 0 (step 4's forward keeps its running max in raw score units)";
  if (p.Nq >= (1 << 30) || p.Nk >= (1 << 30)) return "sequences of 2^30 or more";
  return head_dim_unsupported(p.d);
}

std::function<void()> make_forward(const Problem& p, const AttnParams& params, const std::string& variant) {
  std::function<void()> f;
  with_problem_config<Configs>(p, config_of(p, variant, compute_capability_major()), "step 4",
                               [&](auto cfg) { f = prepare<typename decltype(cfg)::type>(p, params); });
  return f;
}

Stage stage() {
  Stage s;
  s.name = "step4_fused_pipelined";
  s.title = "fused forward: TMA ring of K/V stages, swizzled smem, mma.sync, P in registers";
  s.platform = &cuda_platform();
  s.variants = {"auto", "sm90", "sm120", "4a-padded", "4b-swizzle", "4c-cp-async", "4d-tma"};
  s.tuning_variants = config_names(Configs<__nv_bfloat16, 64>::All{});
  s.config_of = config_of;
  s.launch_shape = [](const Problem& p, const std::string& v) {
    Stage::LaunchShape shape;
    with_problem_config<Configs>(p, v, "step 4", [&](auto cfg) {
      using Tr = typename decltype(cfg)::type;
      shape = {kFwdSmemBytes<Tr>, Tr::kThreads};
    });
    return shape;
  };
  s.unsupported = [](const Problem& p, const std::string&) { return unsupported(p); };
  s.make = [](const Problem& p, const Inputs& in, const std::string& v) -> std::unique_ptr<Runner> {
    return std::make_unique<FusedRunner>(p, in, v);
  };
  return s;
}

}  // namespace fa::step4
