// FlashAttention, step by step — step 4: a configuration's set-up and launch (step4_fused_pipelined/prepare.cuh)
//
// What it adds: from a configuration (kernel_traits.h) and a problem to a closure that launches its kernels,
// with everything that is not the kernel's work done once, outside any timed region: the tensor maps, the
// shared-memory opt-in, the choice among a configuration's kernels (dropout, packed heads, score modifiers),
// and for 4f the number of splits and the workspace. prepare_named<T, D> looks a configuration up by name;
// instances_*.cu compile it once per dtype and head dim, so a parallel build spreads the kernels over cores.
#pragma once
#include <algorithm>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "gpu/config_list.h"
#include "gpu/cuda_util.h"
#include "gpu/gpu_types.h"
#include "gpu/tma.h"
#include "step4_fused_pipelined/combine.cuh"
#include "step4_fused_pipelined/configs.h"
#include "step4_fused_pipelined/kernel_4a_threads.cuh"
#include "step4_fused_pipelined/kernel_4c_cp_async.cuh"
#include "step4_fused_pipelined/kernel_4d_tma.cuh"
#include "step4_fused_pipelined/kernel_4f_split_kv.cuh"
#include "step4_fused_pipelined/packed_batch.h"
#include "step4_fused_pipelined/score_mod.cuh"

namespace fa::step4 {

// A KV cache on the device (paged_kv.h): each sequence's length, and with --page-size the pool of pages, its
// block table and the pages filled from the dense K and V (copies, once, outside any timed region). The
// pool's unused tail rows hold a large finite value, so that a key the mask failed to hide would show.
struct DeviceKvCache {
  KvCache kv;
  std::shared_ptr<DeviceBuffer> seqlens, table, k, v;  // what kv points into
  const void* k_base = nullptr;                          // the tensors the maps address: the pool, or dense K, V
  const void* v_base = nullptr;
  int64_t BH = 0, N = 0;                                 // their [BH, N, d] shape
};
template <class Tr>
DeviceKvCache make_device_kv_cache(const Problem& p, const AttnParams& params) {
  DeviceKvCache c;
  c.kv.Hkv = int(p.Hkv);
  c.k_base = params.k, c.v_base = params.v, c.BH = p.B * p.Hkv, c.N = p.Nk;
  if (!p.cache_seqlens.empty()) {
    std::vector<int> lens(p.cache_seqlens.begin(), p.cache_seqlens.end());
    c.seqlens = std::make_shared<DeviceBuffer>(lens.size() * sizeof(int));
    CUDA_CHECK(cudaMemcpy(c.seqlens->get(), lens.data(), lens.size() * sizeof(int), cudaMemcpyHostToDevice));
    c.kv.seqlens = c.seqlens->template as<int>();
  }
  if (p.page_size == 0) return c;
  if (p.page_size % Tr::Bc != 0)
    throw std::invalid_argument("--page-size " + std::to_string(p.page_size) + ": " + Tr::name() + " reads K and V in tiles of " +
                                std::to_string(Tr::Bc) + " keys, and a tile must not straddle two pages: give a multiple of " +
                                std::to_string(Tr::Bc));
  const PageTable t = make_page_table(p, p.seed ^ 0x9e3779b97f4a7c15ull);
  c.table = std::make_shared<DeviceBuffer>(t.table.size() * sizeof(int32_t));
  CUDA_CHECK(cudaMemcpy(c.table->get(), t.table.data(), t.table.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  c.kv.block_table = c.table->template as<int>();
  c.kv.pages_per_seq = t.pages_per_seq;
  c.kv.page_size = int(p.page_size);
  const size_t row = size_t(p.d) * sizeof(typename Tr::T), page = size_t(p.Hkv) * size_t(p.page_size) * row;
  for (auto* pool : {&c.k, &c.v}) {
    *pool = std::make_shared<DeviceBuffer>(size_t(t.pages) * page);
    CUDA_CHECK(cudaMemset((*pool)->get(), 0x7b, (*pool)->bytes()));  // 0x7b7b: 1.3e36 in bf16, 60768 in fp16
  }
  // Logical page n of sequence b -> its physical page: the rows of every KV head, one 2-D copy (heads are rows).
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t n = 0; n * p.page_size < p.kv_len(b); ++n) {
      const int64_t keys = std::min(p.page_size, p.kv_len(b) - n * p.page_size);
      const size_t from = size_t((b * p.Hkv * p.Nk + n * p.page_size)) * row;
      const size_t to = size_t(t.table[size_t(b * t.pages_per_seq + n)]) * page;
      for (const auto& [pool, dense] : {std::pair{c.k.get(), params.k}, std::pair{c.v.get(), params.v}})
        CUDA_CHECK(cudaMemcpy2D(static_cast<char*>(pool->get()) + to, size_t(p.page_size) * row,
                                static_cast<const char*>(dense) + from, size_t(p.Nk) * row, size_t(keys) * row,
                                size_t(p.Hkv), cudaMemcpyDeviceToDevice));
    }
  c.k_base = c.k->get(), c.v_base = c.v->get(), c.BH = int64_t(t.pages) * p.Hkv, c.N = p.page_size;
  return c;
}

// 4f's set-up: the packed view (grouped query heads, without dropout), the number of splits (--splits or
// choose_splits), the workspace, the KV cache (Kv: ContiguousKv, or a KvCache and its buffers), and a
// closure that launches the split kernel, then the merge.
template <class Tr, class Kv>
std::function<void()> prepare_split(const Problem& p, const AttnParams& params, const Kv& kv, const void* k_base,
                                    const void* v_base, int64_t kv_BH, int64_t kv_N, std::shared_ptr<void> keep) {
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
  decltype(&split_kv_forward<Tr, false, false, CausalMask, Kv>) kernel = nullptr;
  if constexpr (std::is_same_v<Kv, KvCache>) {  // decoding from a cache: the plain mask, no dropout (launch.cu)
    kernel = packed ? split_kv_forward<Tr, false, true, CausalMask, Kv> : split_kv_forward<Tr, false, false, CausalMask, Kv>;
  } else {
    dispatch_mods(mods_kind(p), [&](auto mods) {  // plain, or the score modifiers' kernel (score_mod.cuh)
      constexpr int kMods = decltype(mods)::value;
      using Mask = MaskFor<kMods>;
      kernel = params.dropout.threshold ? split_kv_forward<Tr, true, false, Mask>
               : packed                 ? split_kv_forward<Tr, false, true, Mask>
                                        : split_kv_forward<Tr, false, false, Mask>;
    });
  }
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  int sms = 0, dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  // All of K, or a window's band (splits.h): never fewer than a tile walks, so the splits cover every visible tile.
  const int kv_tiles = split_kv_tiles(p.Nq, p.Nk, p.causal, p.window_left, p.window_right, Tr::Br, Tr::Bc);
  const int splits = p.splits > 0 ? int(p.splits) : choose_splits(blocks, kv_tiles, Tr::Bc, sms);
  sp.tiles_per_split = (kv_tiles + splits - 1) / splits;  // the last splits may get none: they write the identity
  sp.rows_total = p.B * p.Hq * p.Nq;
  // One split writes O and the LSE itself; more write their partial results to a workspace, merged by the
  // last split of each tile when the tiles are short (an arrival counter per tile, zeroed here and reset by
  // the kernel), else by the combine kernel.
  std::shared_ptr<DeviceBuffer> workspace;
  const bool merge_in_kernel = splits > 1 && sp.view.Nq <= kMergeInKernelRows;
  if (splits > 1) {
    const size_t floats = size_t(splits) * size_t(sp.rows_total) * (Tr::D + 1);
    const size_t counters = merge_in_kernel ? size_t(blocks) : 0;
    workspace = std::make_shared<DeviceBuffer>(floats * sizeof(float) + counters * sizeof(int));
    sp.o_part = workspace->template as<float>();
    sp.lse_part = sp.o_part + size_t(splits) * size_t(sp.rows_total) * Tr::D;
    if (merge_in_kernel) {
      sp.arrivals = reinterpret_cast<int*>(sp.o_part + floats);
      CUDA_CHECK(cudaMemset(sp.arrivals, 0, counters * sizeof(int)));
    }
  }
  const CUtensorMap tq = make_tensor_map_bhnd(params.q, p.dtype, p.B * sp.view.Hq, sp.view.Nq, Tr::D, Tr::Br, true);
  const CUtensorMap tk = make_tensor_map_bhnd(k_base, p.dtype, kv_BH, kv_N, Tr::D, Tr::Bc, true);
  const CUtensorMap tv = make_tensor_map_bhnd(v_base, p.dtype, kv_BH, kv_N, Tr::D, Tr::Bc, true);
  const unsigned combine_blocks = unsigned((sp.rows_total + kCombineRowsPerBlock - 1) / kCombineRowsPerBlock);
  return [=] {
    kernel<<<dim3(unsigned(blocks), unsigned(splits)), Tr::kThreads, kSmem>>>(tq, tk, tv, params, sp, kv);
    CUDA_CHECK_LAUNCH();
    if (splits == 1 || merge_in_kernel) return;  // O is complete
    // The combine, a programmatic dependent launch: it may start while the splits run, and waits
    // (griddepcontrol.wait) for them to finish before it reads the workspace.
    cudaLaunchAttribute dependent{};
    dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    dependent.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t combine{};
    combine.gridDim = dim3(combine_blocks);
    combine.blockDim = dim3(32 * kCombineRowsPerBlock);
    combine.attrs = &dependent;
    combine.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&combine, combine_splits<T, Tr::D>, static_cast<const float*>(sp.o_part),
                                  static_cast<const float*>(sp.lse_part), splits, sp.rows_total,
                                  static_cast<T*>(params.o), params.lse));
    (void)workspace;  // the closure owns the workspace and the cache
    (void)keep;
  };
}
template <class Tr>
std::function<void()> prepare_split(const Problem& p, const AttnParams& params) {
  if (!p.has_kv_cache())
    return prepare_split<Tr>(p, params, ContiguousKv{}, params.k, params.v, p.B * p.Hkv, p.Nk, nullptr);
  auto c = std::make_shared<DeviceKvCache>(make_device_kv_cache<Tr>(p, params));
  return prepare_split<Tr>(p, params, c->kv, c->k_base, c->v_base, c->BH, c->N, c);
}

// 4g's set-up: a packed batch (packed_batch.h) through 4f's kernel, one split per tile. p is the batch as the
// grid sees it (B sequences, Nq = max_seqlen_q, Nk = max_seqlen_k); params point at the packed tensors; pb at
// the offsets on the device. The mask kernels: the plain one, the mask alone (a window), or every value
// modifier tested at run time (ALiBi, the softcap: one kernel for both, so a packed batch adds three per tile
// shape to the build, not five).
template <class Tr>
std::function<void()> prepare_packed(const Problem& p, const AttnParams& params, const PackedBatch& pb, int64_t total_q,
                                     int64_t total_k) {
  static_assert(Tr::kHasMods, "a packed batch runs 4f's kernel: TMA and swizzled tiles");
  constexpr size_t kSmem = kFwdSmemBytes<Tr>;
  require_smem_optin(kSmem, "this config");
  const int64_t blocks = (p.Nq + Tr::Br - 1) / Tr::Br * p.Hq * p.B;
  if (blocks > 0x7fffffff) throw std::invalid_argument("problem too large for a 1-D grid");
  SplitParams sp{};
  sp.view = params;
  sp.rows_total = total_q * p.Hq;
  sp.tiles_per_split = int((p.Nk + Tr::Bc - 1) / Tr::Bc);  // one split: every tile of the longest sequence
  const int kind = mods_kind(p);
  decltype(&split_kv_forward<Tr, false, false, CausalMask, PackedBatch>) kernel =
      kind == 0 ? split_kv_forward<Tr, false, false, CausalMask, PackedBatch>
      : kind == kModMask ? split_kv_forward<Tr, false, false, ScoreMods<kModMask>, PackedBatch>
                         : split_kv_forward<Tr, false, false, ScoreMods<kModAll>, PackedBatch>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  const CUtensorMap tq = make_tensor_map_packed(params.q, p.dtype, total_q, p.Hq, Tr::D, Tr::Br);
  const CUtensorMap tk = make_tensor_map_packed(params.k, p.dtype, total_k, p.Hkv, Tr::D, Tr::Bc);
  const CUtensorMap tv = make_tensor_map_packed(params.v, p.dtype, total_k, p.Hkv, Tr::D, Tr::Bc);
  return [=] {
    if (blocks == 0) return;
    kernel<<<dim3(unsigned(blocks), 1u), Tr::kThreads, kSmem>>>(tq, tk, tv, params, sp, pb);
    CUDA_CHECK_LAUNCH();
  };
}
// The same for the configuration named `name`, of the defaults' tiles (Configs::Packed).
template <typename T, int D>
std::function<void()> prepare_packed_named(const std::string& name, const Problem& p, const AttnParams& params,
                                           const PackedBatch& pb, int64_t total_q, int64_t total_k) {
  std::function<void()> f;
  if (!with_config_named(name, typename Configs<T, D>::Packed{},
                         [&](auto cfg) { f = prepare_packed<typename decltype(cfg)::type>(p, params, pb, total_q, total_k); }))
    throw std::invalid_argument("step 4 runs a packed batch at the defaults' tiles (--variant auto, sm90 or sm120), not " +
                                name);
  return f;
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
    if constexpr (Tr::kHasMods)  // the score modifiers' kernel (score_mod.cuh); launch.cu refuses them elsewhere
      dispatch_mods(mods_kind(p), [&](auto mods) {
        constexpr int kMods = decltype(mods)::value;
        using Mask = MaskFor<kMods>;  // 4e's mask type for these modifiers
        kernel = params.dropout.threshold ? fused_forward<Tr, true, Mask> : fused_forward<Tr, false, Mask>;
      });
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

// The set-up of the configuration named `name` for element type T and head dim D (configs.h).
template <typename T, int D>
std::function<void()> prepare_named(const std::string& name, const Problem& p, const AttnParams& params) {
  std::function<void()> f;
  if (!with_config_named(name, typename Configs<T, D>::All{}, [&](auto cfg) { f = prepare<typename decltype(cfg)::type>(p, params); }))
    throw std::invalid_argument("step 4 has no config " + name + " for d = " + std::to_string(D));
  return f;
}

}  // namespace fa::step4
