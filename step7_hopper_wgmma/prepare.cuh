// FlashAttention, step by step — step 7: a configuration's set-up and launch (step7_hopper_wgmma/prepare.cuh)
//
// From a configuration (kernel_traits.h) and a problem to a closure that launches its kernel, with the tensor
// maps and the shared-memory opt-in done once, outside any timed region (step 4's prepare.cuh does the same).
// instances_*.cu compile prepare_named once per dtype and head dim.
#pragma once
#include <algorithm>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "gpu/config_list.h"
#include "gpu/cuda_util.h"
#include "gpu/gpu_types.h"
#include "gpu/tma.h"
#include "step7_hopper_wgmma/configs.h"
#include "step7_hopper_wgmma/kernel_7a_wgmma.cuh"
#include "step7_hopper_wgmma/kernel_7b_warp_specialized.cuh"
#include "step7_hopper_wgmma/kernel_7c_pingpong.cuh"
#include "step7_hopper_wgmma/kernel_7d_persistent.cuh"
#include "step7_hopper_wgmma/kernel_7e_packed.cuh"

namespace fa::step7 {

// The kernel of a configuration's sub-step (only that one is compiled).
template <class Tr>
constexpr auto kernel_of() {
  if constexpr (Tr::kDesign == Design::kWgmma) return forward_7a<Tr>;
  else if constexpr (Tr::kDesign == Design::kSpecialized) return forward_7b<Tr>;
  else if constexpr (Tr::kDesign == Design::kPingPong) return forward_7c<Tr>;
  else return forward_7d<Tr>;
}

template <class Tr>
std::function<void()> prepare(const Problem& p, const AttnParams& params) {
  constexpr size_t kSmem = kSmemBytes<Tr>;
  require_smem_optin(kSmem, "this config");
  const int64_t blocks = (p.Nq + Tr::Br - 1) / Tr::Br * p.Hq * p.B;
  if (blocks > 0x7fffffff) throw std::invalid_argument("problem too large for a 1-D grid");
  const CUtensorMap tq = make_tensor_map_bhnd(params.q, p.dtype, p.B * p.Hq, p.Nq, Tr::D, Tr::Br);
  const CUtensorMap tk = make_tensor_map_bhnd(params.k, p.dtype, p.B * p.Hkv, p.Nk, Tr::D, Tr::Bc);
  const CUtensorMap tv = make_tensor_map_bhnd(params.v, p.dtype, p.B * p.Hkv, p.Nk, Tr::D, Tr::Bc);
  const CUtensorMap to = make_tensor_map_bhnd(params.o, p.dtype, p.B * p.Hq, p.Nq, Tr::D, 16);  // a warp's rows
  auto kernel = kernel_of<Tr>();
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  if constexpr (Tr::kDesign == Design::kPersistent) {  // 7d: one block per SM, taking tiles from a counter
    int sms = 0, dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int64_t grid = std::min<int64_t>(blocks, sms);
    auto counter = std::make_shared<DeviceBuffer>(sizeof(TileCounter));  // zeroed here, reset by the kernel
    CUDA_CHECK(cudaMemset(counter->get(), 0, sizeof(TileCounter)));
    return [=] {
      kernel<<<unsigned(grid), Tr::kThreads, kSmem>>>(tq, tk, tv, to, params, counter->template as<TileCounter>());
      CUDA_CHECK_LAUNCH();
    };
  } else {  // one block per query tile
    return [=] {
      kernel<<<unsigned(blocks), Tr::kThreads, kSmem>>>(tq, tk, tv, to, params);
      CUDA_CHECK_LAUNCH();
    };
  }
}

// 7e's set-up: a packed batch (kernel_7e_packed.cuh) at 7c's default tiles. p is the batch as the grid sees
// it (B sequences, Nq = max_seqlen_q, Nk = max_seqlen_k); params point at the packed tensors, pb at the offsets.
template <typename T, int D>
std::function<void()> prepare_packed(const Problem& p, const AttnParams& params, const step4::PackedBatch& pb,
                                     int64_t total_q, int64_t total_k) {
  using Tr = typename Configs<T, D>::Default;
  constexpr size_t kSmem = kSmemBytes<Tr>;
  require_smem_optin(kSmem, "7e's kernel");
  const int64_t blocks = (p.Nq + Tr::Br - 1) / Tr::Br * p.Hq * p.B;
  if (blocks > 0x7fffffff) throw std::invalid_argument("problem too large for a 1-D grid");
  const CUtensorMap tq = make_tensor_map_packed(params.q, p.dtype, total_q, p.Hq, D, Tr::Br);
  const CUtensorMap tk = make_tensor_map_packed(params.k, p.dtype, total_k, p.Hkv, D, Tr::Bc);
  const CUtensorMap tv = make_tensor_map_packed(params.v, p.dtype, total_k, p.Hkv, D, Tr::Bc);
  CUDA_CHECK(cudaFuncSetAttribute(forward_7e<Tr>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  return [=] {
    if (blocks == 0) return;
    forward_7e<Tr><<<unsigned(blocks), Tr::kThreads, kSmem>>>(tq, tk, tv, params, pb);
    CUDA_CHECK_LAUNCH();
  };
}

// The set-up of the configuration named `name` for element type T and head dim D (configs.h).
template <typename T, int D>
std::function<void()> prepare_named(const std::string& name, const Problem& p, const AttnParams& params) {
  std::function<void()> f;
  if (!with_config_named(name, typename Configs<T, D>::All{}, [&](auto cfg) { f = prepare<typename decltype(cfg)::type>(p, params); }))
    throw std::invalid_argument("step 7 has no config " + name + " for d = " + std::to_string(D));
  return f;
}

}  // namespace fa::step7
