// FlashAttention, step by step — step 4: configurations and launch (step4_fused_pipelined/launch.cu)
//
// Variants: "auto" picks the default of the device's architecture (configs.h); "sm90", "sm120" and "sm80"
// force one, so the sm_120 and sm_8x defaults run on the H100 too; "4a-padded" .. "4d-tma" are the chapter's
// sub-steps at the tiles of the device's default (4d is the default); every configuration of configs.h is a
// variant by name. On sm_8x (no TMA) a variant that resolves to a TMA kernel is refused with the reason.
#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/padded_head_dim.h"
#include "core/varlen.h"
#include "gpu/gpu_runner.h"
#include "gpu/gpu_types.h"
#include "gpu/platform.h"
#include "gpu/tma.h"
#include "step4_fused_pipelined/configs.h"
#include "step4_fused_pipelined/fused.h"
#include "step4_fused_pipelined/prepare.cuh"

namespace fa::step4 {

// The kernels of every configuration, compiled once per dtype and head dim (instances_*.cu).
extern template std::function<void()> prepare_named<__nv_bfloat16, 64>(const std::string&, const Problem&, const AttnParams&);
extern template std::function<void()> prepare_named<__nv_bfloat16, 128>(const std::string&, const Problem&, const AttnParams&);
extern template std::function<void()> prepare_named<__half, 64>(const std::string&, const Problem&, const AttnParams&);
extern template std::function<void()> prepare_named<__half, 128>(const std::string&, const Problem&, const AttnParams&);
// 4g's packed-batch kernels (instances_packed_*.cu).
#define FA_PACKED(T, D)                                                                                          \
  extern template std::function<void()> prepare_packed_named<T, D>(const std::string&, const Problem&,           \
                                                                   const AttnParams&, const PackedBatch&, int64_t, \
                                                                   int64_t);
FA_PACKED(__nv_bfloat16, 64)
FA_PACKED(__nv_bfloat16, 128)
FA_PACKED(__half, 64)
FA_PACKED(__half, 128)
#undef FA_PACKED

namespace {

// The chapter's sub-steps, in order: each variant runs the default's tiles with that sub-step's kernel.
// 4e is 4d's kernel with score_mod.cuh's mask type, chosen by the problem's modifiers (prepare.cuh): the same tiles.
const std::pair<const char*, Substep> kSubsteps[] = {{"4a-padded", Substep::k4a},
                                                     {"4b-swizzle", Substep::k4b},
                                                     {"4c-cp-async", Substep::k4c},
                                                     {"4d-tma", Substep::k4d},
                                                     {"4e-score-mods", Substep::k4d}};

// Decoding: a head's query rows fill less than one tile of the defaults, --splits asks for split-KV, or the
// keys come from a KV cache (paged_kv.h), which only the split-KV kernel reads.
bool decodes(const Problem& p) { return p.splits > 0 || p.Nq < 64 || p.has_kv_cache(); }

template <int D>
std::string resolve(const Problem& p, const std::string& variant, int cc_major) {
  using C = Configs<__nv_bfloat16, D>;
  // sm_8x has no TMA: its default is 4c's kernel, for decoding too; "sm80" forces it anywhere (the H100 grid).
  if (variant == "sm80" || (variant == "auto" && cc_major == 8)) return C::Sm80::name();
  if (variant == "4f-split-kv" || (variant == "auto" && decodes(p))) return C::Decode::name();
  const FwdTiles tiles = cc_major >= 12 ? C::kSm120 : cc_major == 8 ? C::k64 : C::kSm90;
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

// 4g: a packed batch (core/varlen.h) in one launch of 4f's kernel (packed_batch.h), at the tiles of the
// device's default ("auto"), or of the sm90 or sm120 default.
template <int D>
std::string packed_config(const std::string& variant, int cc_major) {
  using C = Configs<__nv_bfloat16, D>;
  if (variant == "sm120" || (variant == "auto" && cc_major >= 12)) return C::Sm120::name();
  if (variant == "sm90" || variant == "auto") return C::Sm90::name();
  return variant;  // prepare_packed_named says which it takes
}

class PackedRunner final : public GpuRunner {
 public:
  // p as the grid sees the batch: B sequences, Nq and Nk the longest (the harness's varlen problem). With
  // `count`, the blocks count the K/V tiles they walk (tiles_walked(); the scheduler's test).
  PackedRunner(const Problem& p, const Varlen& v, const Inputs& packed, const std::string& variant, bool count = false)
      : GpuRunner(packed_grid_problem(p, v), with_a_row(p, packed)), total_q_(v.total_q()) {
    const std::vector<int32_t> words = packed_words(v);  // the offsets of Q, then of K, then the tile counter
    cu_ = DeviceBuffer(words.size() * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpy(cu_.get(), words.data(), cu_.bytes(), cudaMemcpyHostToDevice));
    PackedBatch pb = packed_batch_at(cu_.as<int>(), v, p.Hq, p.Hkv);
    if (count) pb.tiles_visited = counter_ = cu_.as<int>() + words.size() - 1;
    launch_ = make_packed_forward(p_, params_, pb, v.total_q(), v.total_k(), variant);
  }
  void run() override { launch_(); }
  Outputs outputs() override {
    CUDA_CHECK(cudaDeviceSynchronize());
    Outputs out;
    out.o = download(o_, p_.dtype, {total_q_, p_.Hq, p_.d});
    out.lse = download_f32(lse_, {p_.Hq, total_q_});
    return out;
  }
  int64_t tiles_walked() const {
    int n = 0;
    CUDA_CHECK(cudaMemcpy(&n, counter_, sizeof(int), cudaMemcpyDeviceToHost));
    return n;
  }

 private:
  int64_t total_q_;
  DeviceBuffer cu_;
  int* counter_ = nullptr;
  std::function<void()> launch_;
};

}  // namespace

std::string unsupported(const Problem& p) {
  if (p.dtype == DType::fp32) return "fp32 storage (tensor cores take bf16 or fp16)";
  if (!(p.scale > 0)) return "a scale <= 0 (step 4's forward keeps its running max in raw score units)";
  if (p.Nq >= (1 << 30) || p.Nk >= (1 << 30)) return "sequences of 2^30 or more";
  return head_dim_unsupported(p.d);
}

std::function<void()> make_forward(const Problem& p, const AttnParams& params, const std::string& variant) {
  const int cc_major = compute_capability_major();
  const std::string name = config_of(p, variant, cc_major);
  if (cc_major < 9) {  // sm_8x: no TMA, so neither 4d-4f nor what needs them (the modifiers, --splits)
    const std::string here = "; on this sm_" + std::to_string(cc_major) + "x GPU step 4 runs 4a-padded, 4b-swizzle, " +
                             "4c-cp-async and sm80 (the default here), without score modifiers or --splits";
    if (const std::optional<FwdTiles> t = tiles_named(name); t && t->copy == TileCopy::kTma)
      throw std::invalid_argument("--variant " + variant + " runs " + name + ", which loads its tiles with TMA " +
                                  "(sm_90 and later)" + here);
    if (p.splits > 0 || p.has_score_mods() || p.has_kv_cache())
      throw std::invalid_argument(std::string(p.splits > 0 ? "--splits" : p.has_kv_cache() ? "a KV cache" : "the score modifiers") +
                                  " run in 4e's and 4f's kernels, which load their tiles with TMA (sm_90 and later)" + here);
  }
  std::function<void()> f;
  dispatch_dtype</*kAllowFp32=*/false>(p.dtype, [&](auto t) {
    dispatch_head_dim(int(p.d), [&](auto dim) { f = prepare_named<decltype(t), decltype(dim)::value>(name, p, params); });
  });
  return f;
}

std::function<void()> make_packed_forward(const Problem& grid, const AttnParams& params, const PackedBatch& pb,
                                          int64_t total_q, int64_t total_k, const std::string& variant) {
  const int cc_major = compute_capability_major();
  if (cc_major < 9)
    throw std::invalid_argument("a packed batch runs in 4f's kernel, which loads its tiles with TMA (sm_90 and later)");
  const std::string name = grid.d == 64 ? packed_config<64>(variant, cc_major) : packed_config<128>(variant, cc_major);
  std::function<void()> f;
  dispatch_dtype</*kAllowFp32=*/false>(grid.dtype, [&](auto t) {
    dispatch_head_dim(int(grid.d), [&](auto dim) {
      f = prepare_packed_named<decltype(t), decltype(dim)::value>(name, grid, params, pb, total_q, total_k);
    });
  });
  return f;
}

std::string packed_device_refusal(const Problem& p, const Varlen& v) {
  if (std::string why = unsupported(p); !why.empty()) return why;
  if (p.d != 64 && p.d != 128) return "head dim " + std::to_string(p.d) + " runs zero-padded, on copies";
  if (p.dropout > 0 || p.has_score_mods()) return "dropout and the score modifiers need their device buffers";
  if (v.total_q() == 0 || v.total_k() == 0) return "a batch without queries or keys";
  if (compute_capability_major() < 9) return "a packed batch's kernels load their tiles with TMA (sm_90 and later)";
  return "";
}

std::string run_packed_on_device(const Problem& p, const Varlen& v, const DeviceBatch& t, const std::string& variant,
                                 const PackedForward& forward) {
  if (p.backward) return "a forward's path";
  if (std::string why = packed_device_refusal(p, v); !why.empty()) return why;
  const Problem grid = packed_grid_problem(p, v);
  const StreamBuffer words(packed_words(v));
  AttnParams a = attn_params_of(grid);
  a.q = t.q, a.k = t.k, a.v = t.v, a.o = t.o, a.lse = t.lse;
  forward(grid, a, packed_batch_at(words.as<int>(), v, p.Hq, p.Hkv), v.total_q(), v.total_k(), variant)();
  return "";
}

std::string run_device(const Problem& p, const Varlen& v, const DeviceBatch& t, const std::string& variant) {
  if (p.backward) return "step 4 has no backward";
  if (variant != "auto" && variant != "sm90" && variant != "sm120") return "--variant " + variant + " is not 4g's";
  return run_packed_on_device(p, v, t, variant, make_packed_forward);
}

int64_t packed_tiles_walked(const Problem& p, const Varlen& v, const Inputs& packed, const std::string& variant) {
  PackedRunner r(p, v, packed, variant, /*count=*/true);
  r.run();
  CUDA_CHECK(cudaDeviceSynchronize());
  return r.tiles_walked();
}

Stage stage() {
  Stage s;
  s.name = "step4_fused_pipelined";
  s.title = "fused forward: TMA ring of K/V stages, swizzled smem, mma.sync, P in registers";
  s.platform = &cuda_platform();
  s.variants = {"auto",       "sm90",        "sm120",  "sm80",          "4a-padded",
                "4b-swizzle", "4c-cp-async", "4d-tma", "4e-score-mods", "4f-split-kv"};
  s.has_splits = true;
  s.has_score_mods = true;  // in 4e's and 4f's configurations (kernel_traits.h, kHasMods)
  s.has_kv_cache = true;    // in 4f's configurations (paged_kv.h)
  s.tuning_variants = config_names(Configs<__nv_bfloat16, 64>::All{});
  // The chapter's sub-steps 4a-4c and the block-order ablation are lessons, slower than 4d by design: step 6
  // does not spend time on them (the configuration test still checks every one).
  s.tuning_exclusion = [](const std::string& config) -> std::string {
    const std::optional<FwdTiles> tiles = tiles_named(config);
    if (tiles && tiles->copy != TileCopy::kTma)  // 4a-4c: the threads copy the tiles, or cp.async does
      return "a sub-step of step 4's chapter, slower than 4d by design";
    if (tiles && tiles->head_fast) return "the block-order ablation of step 4's chapter";
    return "";
  };
  // What it runs (core/stage.h, Supports): bf16 and fp16 (tensor cores), d 64 and 128, dropout everywhere;
  // the modifiers in the variants that resolve to 4e's and 4f's kernels and the configurations compiled with
  // them (kHasMods), but not in 4d-tma, the sub-step before them; --splits where the variant runs 4f.
  s.supports.dtypes = {DType::bf16, DType::fp16};
  s.supports.head_dims = {64, 128};
  s.supports.score_mods = {"auto", "sm90", "sm120", "4e-score-mods", "4f-split-kv"};
  for (const auto& names : {config_names_with_mods(Configs<__nv_bfloat16, 64>::All{}),
                            config_names_with_mods(Configs<__nv_bfloat16, 128>::All{})})
    for (const std::string& n : names)
      if (std::find(s.supports.score_mods.begin(), s.supports.score_mods.end(), n) == s.supports.score_mods.end())
        s.supports.score_mods.push_back(n);
  s.supports.splits = {"auto", "4f-split-kv"};
  for (const std::string& n : s.tuning_variants)
    if (is_split_kv(n)) s.supports.splits.push_back(n);
  s.supports.kv_cache = s.supports.splits;  // what reads a KV cache: the split-KV kernel
  s.config_of = config_of;
  // Step 6 times a decode in each 4f configuration with every split count of configs.h too, beside
  // choose_splits' own choice.
  s.tuning_splits = [](const Problem& p, const std::string& config) {
    std::vector<int64_t> counts;
    if (p.splits > 0 || !decodes(p) || !is_split_kv(config)) return counts;
    int64_t Bc = 0;
    with_problem_config<Configs>(p, config, "step 4", [&](auto cfg) { Bc = decltype(cfg)::type::Bc; });
    for (int n : split_counts((p.Nk + Bc - 1) / Bc)) counts.push_back(n);
    return counts;
  };
  s.launch_shape = [](const Problem& p, const std::string& v) {
    Stage::LaunchShape shape;
    with_problem_config<Configs>(p, v, "step 4", [&](auto cfg) {
      using Tr = typename decltype(cfg)::type;
      shape = {kFwdSmemBytes<Tr>, Tr::kThreads};
    });
    return shape;
  };
  s.unsupported = [](const Problem& p, const std::string& v) {
    // Whether v runs 4f does not depend on the architecture (auto with --splits always does): no GPU needed.
    if (p.splits > 0 && !is_split_kv(config_of(p, v, /*cc_major=*/9)))
      return std::string("--splits needs the split-KV kernel: --variant auto, 4f-split-kv or a 4f- configuration");
    if (p.has_kv_cache() && !is_split_kv(config_of(p, v, /*cc_major=*/9)))
      return std::string("a KV cache (--cache-seqlens, --page-size) is read by the split-KV kernel: --variant auto, "
                         "4f-split-kv or a 4f- configuration");
    if (p.has_kv_cache() && (p.dropout > 0 || p.has_score_mods()))
      return std::string("a KV cache is decoding's: 4f reads it without dropout and without score modifiers");
    if (std::string why = unsupported(p); !why.empty()) return why;
    if (p.has_score_mods() && v == "4d-tma")
      return std::string("4d-tma is the sub-step before the score modifiers (the plain mask, mask.h): run them with "
                         "--variant 4e-score-mods or auto");
    if (p.has_score_mods() && !resolves_to_mods<Configs>(p, v, config_of, "step 4"))
      return std::string("score modifiers run in 4e's and 4f's configurations (TMA, swizzled tiles); the "
                         "chapter's sub-steps 4a-4c and the ablations are compiled without them");
    return std::string();
  };
  s.make = [](const Problem& p, const Inputs& in, const std::string& v) -> std::unique_ptr<Runner> {
    return std::make_unique<FusedRunner>(p, in, v);
  };
  s.has_varlen = true;  // 4g: the forward of a packed batch, one launch (packed_batch.h)
  s.make_varlen = [](const Problem& p, const Varlen& v, const Inputs& packed, const std::string& variant) -> std::unique_ptr<Runner> {
    return std::make_unique<PackedRunner>(p, v, packed, variant);
  };
  s.run_device = run_device;  // the same kernel on the caller's tensors (the C interface's zero-copy path)
  return with_padded_head_dims(s);  // d = 32, 96, ...: on the next compiled head dim, zero-padded (core/padded_head_dim.h)
}

}  // namespace fa::step4
