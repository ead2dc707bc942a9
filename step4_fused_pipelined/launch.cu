// FlashAttention, step by step — step 4: configurations and launch (step4_fused_pipelined/launch.cu)
//
// Variants: "auto" picks the default of the device's architecture (configs.h); "sm90" and "sm120" force
// one, so the sm_120 default runs on the H100 too; "4a-padded" .. "4d-tma" are the chapter's sub-steps at
// the tiles of the device's default (4d is the default); every configuration of configs.h is a variant by name.
#include <algorithm>
#include <functional>
#include <memory>
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
#include "step4_fused_pipelined/kernel_4e_split_kv.cuh"
#include "step4_fused_pipelined/combine.cuh"

namespace fa::step4 {
namespace {

// FlashAttention's choice of the number of splits: none when the blocks already fill the GPU's block slots
// (SMs x blocks per SM); otherwise the fewest splits whose waves of blocks fill the slots to within 85 % of
// the best, skipping counts that do not change how many K/V tiles each split walks.
int choose_splits(int64_t blocks, int kv_tiles, int64_t slots) {
  if (blocks >= 0.8 * double(slots)) return 1;
  const int max_splits = int(std::min<int64_t>({128, kv_tiles, slots}));
  auto efficiency = [&](int s) {
    const int64_t waves = (blocks * s + slots - 1) / slots;
    return double(blocks * s) / double(waves * slots);
  };
  double best = 0;
  for (int s = 1; s <= max_splits; ++s) best = std::max(best, efficiency(s));
  auto tiles_per = [&](int s) { return (kv_tiles + s - 1) / s; };
  for (int s = 1; s <= max_splits; ++s)
    if ((s == 1 || tiles_per(s) != tiles_per(s - 1)) && efficiency(s) >= 0.85 * best) return s;
  return 1;
}

// 4e's set-up: the packed view (grouped query heads, without dropout), the number of splits (--splits or
// choose_splits), the workspace, and a closure that launches the split kernel, then the merge.
template <class Tr>
std::function<void()> prepare_split(const Problem& p, const AttnParams& params) {
  constexpr size_t kSmem = kFwdSmemBytes<Tr>;
  require_smem_optin(kSmem, "this config");
  using T = typename Tr::T;
  const bool packed = p.group() > 1 && !params.dropout.threshold;
  SplitParams sp{};
  sp.view = params;
  if (packed) {  // [B, Hq, Nq, d] = [B, Hkv, g * Nq, d]: the g heads of a group are neighbours
    sp.view.Hq = p.Hkv;
    sp.view.Nq = int(p.group() * p.Nq);
    sp.view.group = 1;
  }
  const int64_t blocks = (sp.view.Nq + Tr::Br - 1) / Tr::Br * sp.view.Hq * p.B;
  if (blocks > 0x7fffffff) throw std::invalid_argument("problem too large for a 1-D grid");
  auto pick = [](auto dropout, auto pack) { return split_kv_forward<Tr, decltype(dropout)::value, decltype(pack)::value>; };
  auto kernel = params.dropout.threshold ? pick(std::true_type{}, std::false_type{})
                : packed                 ? pick(std::false_type{}, std::true_type{})
                                         : pick(std::false_type{}, std::false_type{});
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  int per_sm = 0, sms = 0, dev = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Tr::kThreads, kSmem));
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int kv_tiles = int((p.Nk + Tr::Bc - 1) / Tr::Bc);
  const int splits = p.splits > 0 ? int(p.splits) : choose_splits(blocks, kv_tiles, int64_t(sms) * std::max(per_sm, 1));
  sp.tiles_per_split = (kv_tiles + splits - 1) / splits;  // the last splits may get none: they write the identity
  sp.rows_total = p.B * p.Hq * p.Nq;
  auto workspace = std::make_shared<DeviceBuffer>(size_t(splits) * size_t(sp.rows_total) * (Tr::D + 1) * sizeof(float));
  sp.o_part = workspace->template as<float>();
  sp.lse_part = sp.o_part + size_t(splits) * size_t(sp.rows_total) * Tr::D;
  const CUtensorMap tq = make_tensor_map_bhnd(params.q, p.dtype, p.B * sp.view.Hq, sp.view.Nq, Tr::D, Tr::Br, true);
  const CUtensorMap tk = make_tensor_map_bhnd(params.k, p.dtype, p.B * p.Hkv, p.Nk, Tr::D, Tr::Bc, true);
  const CUtensorMap tv = make_tensor_map_bhnd(params.v, p.dtype, p.B * p.Hkv, p.Nk, Tr::D, Tr::Bc, true);
  const unsigned combine_blocks = unsigned((sp.rows_total + kCombineRowsPerBlock - 1) / kCombineRowsPerBlock);
  return [=] {
    kernel<<<dim3(unsigned(blocks), unsigned(splits)), Tr::kThreads, kSmem>>>(tq, tk, tv, params, sp);
    CUDA_CHECK_LAUNCH();
    // The merge reads what every split wrote: the launches are ordered on the stream.
    combine_splits<T, Tr::D><<<combine_blocks, 32 * kCombineRowsPerBlock>>>(
        sp.o_part, sp.lse_part, splits, sp.rows_total, static_cast<T*>(params.o), params.lse);
    CUDA_CHECK_LAUNCH();
    (void)workspace;  // the closure owns the workspace
  };
}

// 4a-4d's set-up, outside any timed region: tensor maps, the shared-memory opt-in, the launch closure.
template <class Tr>
std::function<void()> prepare_tiles(const Problem& p, const AttnParams& params) {
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

// Any configuration's set-up, outside any timed region: tensor maps, the shared-memory opt-in, the launch closure.
template <class Tr>
std::function<void()> prepare(const Problem& p, const AttnParams& params) {
  if constexpr (Tr::kSplitKv) return prepare_split<Tr>(p, params);
  else return prepare_tiles<Tr>(p, params);
}

// The chapter's sub-steps, in order: each variant runs the default's tiles with that sub-step's kernel.
const std::pair<const char*, Substep> kSubsteps[] = {
    {"4a-padded", Substep::k4a}, {"4b-swizzle", Substep::k4b}, {"4c-cp-async", Substep::k4c}, {"4d-tma", Substep::k4d}};

// Decoding: a head's query rows fill less than one tile of the defaults, or --splits asks for split-KV.
bool decodes(const Problem& p) { return p.splits > 0 || p.Nq < 64; }

template <int D>
std::string resolve(const Problem& p, const std::string& variant, int cc_major) {
  using C = Configs<__nv_bfloat16, D>;
  if (variant == "4e-split-kv" || (variant == "auto" && decodes(p))) return C::Decode::name();
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
  return p.d == 64 ? resolve<64>(p, variant, cc_major) : resolve<128>(p, variant, cc_major);
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
  s.variants = {"auto", "sm90", "sm120", "4a-padded", "4b-swizzle", "4c-cp-async", "4d-tma", "4e-split-kv"};
  s.has_splits = true;
  s.tuning_variants = config_names(Configs<__nv_bfloat16, 64>::All{});
  // The chapter's sub-steps 4a-4c and the block-order ablation are lessons, slower than 4d by design: step 6
  // does not spend time on them (the configuration test still checks every one).
  s.tuning_exclusion = [](const std::string& config) -> std::string {
    for (const char* lesson : {"4a-", "4b-", "4c-"})
      if (config.rfind(lesson, 0) == 0) return "a sub-step of step 4's chapter, slower than 4d by design";
    if (config.size() > 9 && config.compare(config.size() - 9, 9, "-headfast") == 0)
      return "the block-order ablation of step 4's chapter";
    return "";
  };
  s.config_of = config_of;
  s.launch_shape = [](const Problem& p, const std::string& v) {
    Stage::LaunchShape shape;
    with_problem_config<Configs>(p, v, "step 4", [&](auto cfg) {
      using Tr = typename decltype(cfg)::type;
      shape = {kFwdSmemBytes<Tr>, Tr::kThreads};
    });
    return shape;
  };
  s.unsupported = [](const Problem& p, const std::string& v) {
    // Whether v runs 4e does not depend on the architecture (auto with --splits always does): no GPU needed.
    if (p.splits > 0 && config_of(p, v, /*cc_major=*/9).rfind("4e-", 0) != 0)
      return std::string("--splits needs the split-KV kernel: --variant auto, 4e-split-kv or a 4e- configuration");
    return unsupported(p);
  };
  s.make = [](const Problem& p, const Inputs& in, const std::string& v) -> std::unique_ptr<Runner> {
    return std::make_unique<FusedRunner>(p, in, v);
  };
  return s;
}

}  // namespace fa::step4
