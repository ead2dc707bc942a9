// FlashAttention, step by step — step 7: variants, platform and runner (step7_hopper_wgmma/launch.cu)
//
// Variants: "auto" is the default configuration for the problem (configs.h, choose); "7a-wgmma", "7b-specialized", "7c-pingpong",
// "7d-persistent" are the chapter's sub-steps at the default's tiles; every configuration of configs.h is a variant by name.
// The stage runs only on an sm_90 GPU: its platform says so anywhere else, and the grids skip it with that
// reason. --backward runs step 5's backward (deterministic) from this forward's O and LSE.
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "core/padded_head_dim.h"
#include "core/varlen.h"
#include "gpu/config_list.h"
#include "gpu/cuda_util.h"
#include "gpu/gpu_types.h"
#include "gpu/platform.h"
#include "step4_fused_pipelined/fused.h"
#include "step5_backward/backward.h"
#include "step7_hopper_wgmma/configs.h"
#include "step7_hopper_wgmma/hopper.h"

namespace fa::step7 {

// The set-up of configuration `name` (prepare.cuh), compiled once per dtype and head dim (instances_*.cu).
template <typename T, int D>
std::function<void()> prepare_named(const std::string& name, const Problem& p, const AttnParams& params);
extern template std::function<void()> prepare_named<__nv_bfloat16, 64>(const std::string&, const Problem&, const AttnParams&);
extern template std::function<void()> prepare_named<__nv_bfloat16, 128>(const std::string&, const Problem&, const AttnParams&);
extern template std::function<void()> prepare_named<__half, 64>(const std::string&, const Problem&, const AttnParams&);
extern template std::function<void()> prepare_named<__half, 128>(const std::string&, const Problem&, const AttnParams&);

// 7e's set-up of a packed batch at 7c's default tiles (prepare.cuh), compiled once per dtype and head dim
// (instances_packed_*.cu).
template <typename T, int D>
std::function<void()> prepare_packed(const Problem& p, const AttnParams& params, const step4::PackedBatch& pb,
                                     int64_t total_q, int64_t total_k);
#define FA_STEP7_PACKED(T, D)                                                                                    \
  extern template std::function<void()> prepare_packed<T, D>(const Problem&, const AttnParams&, const step4::PackedBatch&, \
                                                             int64_t, int64_t);
FA_STEP7_PACKED(__nv_bfloat16, 64)
FA_STEP7_PACKED(__nv_bfloat16, 128)
FA_STEP7_PACKED(__half, 64)
FA_STEP7_PACKED(__half, 128)
#undef FA_STEP7_PACKED

namespace {

// The CUDA platform, narrowed to the GPUs whose code step 7 carries: sm_90 alone (wgmma and setmaxnreg are
// sm_90a instructions; an sm_100 or sm_120 card has neither).
const Platform& hopper_platform() {
  static const NarrowedPlatform platform(9, 9, "step 7 needs an sm_90 GPU (Hopper: wgmma, setmaxnreg)");
  return platform;
}

const std::pair<const char*, Design> kSubsteps[] = {
    {"7a-wgmma", Design::kWgmma},
    {"7b-specialized", Design::kSpecialized},
    {"7c-pingpong", Design::kPingPong},
    {"7d-persistent", Design::kPersistent}};

template <int D>
std::string resolve(const Problem& p, const std::string& variant) {
  using C = Configs<__nv_bfloat16, D>;
  for (const auto& [name, design] : kSubsteps)
    if (variant == name) return tiles_name(substep(C::kDefault, design));
  if (variant == "auto") return tiles_name(C::choose(p.causal, p.Nk));
  return variant;
}

std::string config_of(const Problem& p, const std::string& variant, int /*cc_major: one architecture*/) {
  return p.d == 64 ? resolve<64>(p, variant) : resolve<128>(p, variant);
}

}  // namespace

std::function<void()> make_forward(const Problem& p, const AttnParams& params, const std::string& variant) {
  const std::string name = config_of(p, variant, 9);
  std::function<void()> f;
  dispatch_dtype</*kAllowFp32=*/false>(p.dtype, [&](auto t) {
    dispatch_head_dim(int(p.d), [&](auto dim) { f = prepare_named<decltype(t), decltype(dim)::value>(name, p, params); });
  });
  return f;
}

// 7e: a packed batch in 7c's kernel at the default tiles, one launch (kernel_7e_packed.cuh).
std::function<void()> make_packed_forward(const Problem& grid, const AttnParams& params, const step4::PackedBatch& pb,
                                          int64_t total_q, int64_t total_k, const std::string& variant) {
  if (variant != "auto" && variant != "7c-pingpong")
    throw std::invalid_argument("step 7 runs a packed batch in 7c's kernel at the default tiles (7e): --variant auto "
                                "or 7c-pingpong, not " + variant);
  std::function<void()> f;
  dispatch_dtype</*kAllowFp32=*/false>(grid.dtype, [&](auto t) {
    dispatch_head_dim(int(grid.d), [&](auto dim) {
      f = prepare_packed<decltype(t), decltype(dim)::value>(grid, params, pb, total_q, total_k);
    });
  });
  return f;
}

// The zero-copy path (Stage::run_device): 7e's forward on the caller's tensors; the backward is step 5's.
std::string run_device(const Problem& p, const Varlen& v, const DeviceBatch& t, const std::string& variant) {
  if (p.backward) return step5::run_device(p, v, t, "deterministic");
  if (variant != "auto" && variant != "7c-pingpong") return "--variant " + variant + " is not 7e's";
  return step4::run_packed_on_device(p, v, t, variant, make_packed_forward);
}

Stage stage() {
  Stage s;
  s.name = "step7_hopper_wgmma";
  s.title = "Hopper forward: wgmma, producer warpgroup + setmaxnreg, ping-pong consumers (sm_90a)";
  s.platform = &hopper_platform();
  s.has_backward = true;
  // A packed batch (core/varlen.h): 7e's forward, one launch, then step 5's packed backward.
  s.has_varlen = true;
  s.make_varlen = [](const Problem& p, const Varlen& v, const Inputs& packed, const std::string& variant) {
    return step5::make_packed_runner(p, v, packed, step5::with_forward("deterministic", variant), make_packed_forward);
  };
  s.run_device = run_device;  // 7e and step 5's packed backward on the caller's tensors (the C interface)
  s.backward_from = "step5_backward";
  s.variants = {"auto", "7a-wgmma", "7b-specialized", "7c-pingpong", "7d-persistent"};
  s.tuning_variants = config_names(Configs<__nv_bfloat16, 64>::All{});
  s.tuning_exclusion = [](const std::string& config) -> std::string {
    const std::optional<HopperTiles> tiles = tiles_named(config);
    if (tiles && (tiles->design == Design::kWgmma || tiles->design == Design::kSpecialized))  // 7a, 7b
      return "a sub-step of step 7's chapter, slower than 7c and 7d by design";
    return "";
  };
  // What it runs (core/stage.h, Supports): bf16 and fp16, d 64 and 128, no dropout and no score modifiers
  // (has_score_mods stays false); the backward (step 5's) in every variant.
  s.supports.dtypes = {DType::bf16, DType::fp16};
  s.supports.head_dims = {64, 128};
  s.supports.dropout = false;
  s.supports.score_mods = {};
  s.config_of = config_of;
  s.launch_shape = [](const Problem& p, const std::string& v) {
    Stage::LaunchShape shape;
    with_problem_config<Configs>(p, v, "step 7", [&](auto cfg) {
      using Tr = typename decltype(cfg)::type;
      shape = {kSmemBytes<Tr>, Tr::kThreads};
    });
    return shape;
  };
  s.unsupported = [](const Problem& p, const std::string& v) -> std::string {
    if (std::string why = step4::unsupported(p); !why.empty()) return why;  // d, dtype, scale: as step 4
    if (p.dropout > 0) return "dropout (step 7's forward, like FlashAttention 3's, has none: use step 4 or 5)";
    if (p.has_score_mods()) return "score modifiers (bias, ALiBi, window, softcap): step 7's kernels have none";
    try {
      with_problem_config<Configs>(p, config_of(p, v, 9), "step 7", [](auto) {});
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  s.make = [](const Problem& p, const Inputs& in, const std::string& v) -> std::unique_ptr<Runner> {
    // Step 5's runner: this stage's forward (the part after "/fwd="), and with --backward step 5's backward.
    return step5::make_runner(p, in, step5::with_forward("deterministic", v), make_forward);
  };
  return with_padded_head_dims(s);  // d = 32, 96, ...: on the next compiled head dim, zero-padded (core/padded_head_dim.h)
}

}  // namespace fa::step7
