// FlashAttention, step by step — step 5: set-up and launch of one configuration (step5_backward/prepare.cuh)
//
// prepare<Cfg> builds the tensor maps and shared-memory opt-ins of configuration Cfg (configs.h) outside
// any timed region and returns the closure that launches its kernels; prepare_named<T, D> does that for
// the configuration of Configs<T, D>::All with a given name. Included by the instances_*.cu files only,
// each instantiating prepare_named (so every kernel of the list) for one dtype and head dim.
#pragma once
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "gpu/cuda_util.h"
#include "gpu/gpu_types.h"
#include "gpu/tma.h"
#include "step5_backward/atomic.cuh"
#include "step5_backward/configs.h"
#include "step5_backward/dkdv.cuh"
#include "step5_backward/dq.cuh"
#include "step5_backward/preprocess.cuh"

namespace fa::step5 {

template <class Kernel>
inline void allow_smem(Kernel kernel, size_t bytes) {
  require_smem_optin(bytes, "a backward kernel");
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

inline unsigned grid_size(int64_t blocks) {
  if (blocks > 0x7fffffff) throw std::invalid_argument("problem too large for a 1-D grid");
  return unsigned(blocks);
}

// A second stream and the two events that fork it from, and join it back to, the default stream.
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  SideStream() {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  }
  ~SideStream() {  // errors here cannot be reported (a destructor); the handles are released either way
    cudaEventDestroy(join);
    cudaEventDestroy(fork);
    cudaStreamDestroy(stream);
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
};

// Set-up, outside any timed region: tensor maps (one per operand and box height), shared-memory opt-ins,
// and the closure that launches the kernels: those compiled with score modifiers when p has any (only
// configurations with kHasMods have them: launch.cu refuses the others).
template <class Cfg>
std::function<void()> prepare(const Problem& p, const BwdParams& bp) {
  using KV = typename Cfg::DkDv;
  using T = typename KV::T;
  constexpr int D = KV::D;
  const AttnParams& a = bp.a;
  if (p.has_score_mods() && !Cfg::kHasMods)
    throw std::invalid_argument("step 5's configuration " + Cfg::name() + " is compiled without score modifiers");
  const bool drop = a.dropout.threshold != 0;
  // The instance kernel_of(dropout, kMods) of a kernel for p: the plain one (step 4's CausalMask), or, in a
  // configuration with score modifiers, the mask type step 4's mods_kind(p) picks (score_mod.cuh, MaskFor: the
  // mask alone, the mask with one value modifier known at compile time, or with any of them).
  auto pick = [&](auto kernel_of) {
    auto kernel = drop ? kernel_of(std::true_type{}, std::integral_constant<int, 0>{})
                       : kernel_of(std::false_type{}, std::integral_constant<int, 0>{});
    if constexpr (Cfg::kHasMods)
      step4::dispatch_mods(step4::mods_kind(p), [&](auto mods) {
        kernel = drop ? kernel_of(std::true_type{}, mods) : kernel_of(std::false_type{}, mods);
      });
    return kernel;
  };
  const int64_t BHq = p.B * p.Hq, BHkv = p.B * p.Hkv;
  // dK/dV kernel: Q and dO in boxes of Bq rows, K and V in boxes of Bc rows.
  const CUtensorMap kv_q = make_tensor_map_bhnd(a.q, p.dtype, BHq, p.Nq, D, KV::Bq);
  const CUtensorMap kv_do = make_tensor_map_bhnd(bp.dout, p.dtype, BHq, p.Nq, D, KV::Bq);
  const CUtensorMap kv_k = make_tensor_map_bhnd(a.k, p.dtype, BHkv, p.Nk, D, KV::Bc);
  const CUtensorMap kv_v = make_tensor_map_bhnd(a.v, p.dtype, BHkv, p.Nk, D, KV::Bc);

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
    constexpr size_t kSmem = AtomicSmem<KV>::kBytes();
    auto kernel = pick([](auto drop_, auto mods) { return atomic_kernel<KV, decltype(drop_)::value, step4::MaskFor<decltype(mods)::value>>; });
    allow_smem(kernel, kSmem);
    return [=] {
      preprocess();
      CUDA_CHECK(cudaMemsetAsync(bp.dq_accum, 0, size_t(elems) * sizeof(float)));  // atomics add into zeros
      kernel<<<kv_blocks, KV::kThreads, kSmem>>>(kv_q, kv_do, kv_k, kv_v, bp);
      CUDA_CHECK_LAUNCH();
      convert_dq_kernel<T><<<cvt_blocks, kConvertThreads>>>(bp.dq_accum, static_cast<T*>(bp.dq), elems, a.scale);
      CUDA_CHECK_LAUNCH();
    };
  } else {
    using DQ = typename Cfg::Dq;
    constexpr size_t kKvSmem = DkDvSmem<KV>::kBytes(), kQSmem = DqSmem<DQ>::kBytes();
    auto dkdv = pick([](auto drop_, auto mods) { return dkdv_kernel<KV, decltype(drop_)::value, step4::MaskFor<decltype(mods)::value>>; });
    allow_smem(dkdv, kKvSmem);
    // dQ kernel: Q and dO in boxes of Br rows, K and V in boxes of Bc rows.
    const CUtensorMap dq_q = make_tensor_map_bhnd(a.q, p.dtype, BHq, p.Nq, D, DQ::Br);
    const CUtensorMap dq_do = make_tensor_map_bhnd(bp.dout, p.dtype, BHq, p.Nq, D, DQ::Br);
    const CUtensorMap dq_k = make_tensor_map_bhnd(a.k, p.dtype, BHkv, p.Nk, D, DQ::Bc);
    const CUtensorMap dq_v = make_tensor_map_bhnd(a.v, p.dtype, BHkv, p.Nk, D, DQ::Bc);
    auto dq = pick([](auto drop_, auto mods) { return dq_kernel<DQ, decltype(drop_)::value, step4::MaskFor<decltype(mods)::value>>; });
    allow_smem(dq, kQSmem);
    const unsigned q_blocks = grid_size((p.Nq + DQ::Br - 1) / DQ::Br * BHq);
    // The two kernels are independent (each needs only D): the dQ kernel runs on a second stream, forked
    // after the preprocess and joined before the backward ends, so that its blocks fill the SMs beside
    // (and after) the dK/dV kernel's instead of waiting for its tail. Each output still has one writer.
    auto side = std::make_shared<SideStream>();
    return [=] {
      preprocess();
      CUDA_CHECK(cudaEventRecord(side->fork, 0));
      CUDA_CHECK(cudaStreamWaitEvent(side->stream, side->fork, 0));
      dkdv<<<kv_blocks, KV::kThreads, kKvSmem>>>(kv_q, kv_do, kv_k, kv_v, bp, DenseRows{});
      CUDA_CHECK_LAUNCH();
      dq<<<q_blocks, DQ::kThreads, kQSmem, side->stream>>>(dq_q, dq_do, dq_k, dq_v, bp, DenseRows{});
      CUDA_CHECK_LAUNCH();
      CUDA_CHECK(cudaEventRecord(side->join, side->stream));
      CUDA_CHECK(cudaStreamWaitEvent(0, side->join, 0));  // the default stream (and its timer) waits for dQ
    };
  }
}

// A packed batch's backward (packed_rows.h): the deterministic kernels with PackedRows, one launch each, at
// the grids of the longest sequences (p: B sequences, Nq = max_seqlen_q, Nk = max_seqlen_k); Q, dO [total_q,
// Hq, d] and K, V [total_k, Hkv, d] through tensor maps over the packed layout (gpu/tma.h). The mask kernels
// are 4g's: the plain one, the mask alone, or every value modifier tested at run time.
template <class Cfg>
std::function<void()> prepare_packed(const Problem& p, const BwdParams& bp, const PackedRows& rows, int64_t total_q,
                                     int64_t total_k) {
  static_assert(!Cfg::kAtomic && Cfg::kHasMods, "a packed batch runs the deterministic kernels");
  using KV = typename Cfg::DkDv;
  using DQ = typename Cfg::Dq;
  using T = typename KV::T;
  constexpr int D = KV::D;
  const AttnParams& a = bp.a;
  const int kind = step4::mods_kind(p);
  auto pick = [&](auto kernel_of) {
    return kind == 0          ? kernel_of(std::type_identity<step4::CausalMask>{})
           : kind == kModMask ? kernel_of(std::type_identity<step4::ScoreMods<kModMask>>{})
                              : kernel_of(std::type_identity<step4::ScoreMods<step4::kModAll>>{});
  };
  auto dkdv = pick([](auto m) { return dkdv_kernel<KV, false, typename decltype(m)::type, PackedRows>; });
  auto dq = pick([](auto m) { return dq_kernel<DQ, false, typename decltype(m)::type, PackedRows>; });
  constexpr size_t kKvSmem = DkDvSmem<KV>::kBytes(), kQSmem = DqSmem<DQ>::kBytes();
  allow_smem(dkdv, kKvSmem);
  allow_smem(dq, kQSmem);
  const CUtensorMap kv_q = make_tensor_map_packed(a.q, p.dtype, total_q, p.Hq, D, KV::Bq);
  const CUtensorMap kv_do = make_tensor_map_packed(bp.dout, p.dtype, total_q, p.Hq, D, KV::Bq);
  const CUtensorMap kv_k = make_tensor_map_packed(a.k, p.dtype, total_k, p.Hkv, D, KV::Bc);
  const CUtensorMap kv_v = make_tensor_map_packed(a.v, p.dtype, total_k, p.Hkv, D, KV::Bc);
  const CUtensorMap dq_q = make_tensor_map_packed(a.q, p.dtype, total_q, p.Hq, D, DQ::Br);
  const CUtensorMap dq_do = make_tensor_map_packed(bp.dout, p.dtype, total_q, p.Hq, D, DQ::Br);
  const CUtensorMap dq_k = make_tensor_map_packed(a.k, p.dtype, total_k, p.Hkv, D, DQ::Bc);
  const CUtensorMap dq_v = make_tensor_map_packed(a.v, p.dtype, total_k, p.Hkv, D, DQ::Bc);
  const int64_t rows_o = total_q * p.Hq;
  const unsigned pre_blocks = grid_size((rows_o + kPreprocessWarps - 1) / kPreprocessWarps);
  const unsigned kv_blocks = grid_size((p.Nk + KV::Bc - 1) / KV::Bc * p.B * p.Hkv);
  const unsigned q_blocks = grid_size((p.Nq + DQ::Br - 1) / DQ::Br * p.B * p.Hq);
  const int Hq = int(p.Hq);
  auto side = std::make_shared<SideStream>();
  return [=] {
    if (rows_o > 0) {
      preprocess_kernel<T, true><<<pre_blocks, 32 * kPreprocessWarps>>>(static_cast<const T*>(a.o),
                                                                        static_cast<const T*>(bp.dout), bp.dsum, rows_o, D, Hq);
      CUDA_CHECK_LAUNCH();
    }
    CUDA_CHECK(cudaEventRecord(side->fork, 0));
    CUDA_CHECK(cudaStreamWaitEvent(side->stream, side->fork, 0));
    if (kv_blocks > 0) {  // every key row of dK and dV written (zeros for a sequence with no query)
      dkdv<<<kv_blocks, KV::kThreads, kKvSmem>>>(kv_q, kv_do, kv_k, kv_v, bp, rows);
      CUDA_CHECK_LAUNCH();
    }
    if (q_blocks > 0) {
      dq<<<q_blocks, DQ::kThreads, kQSmem, side->stream>>>(dq_q, dq_do, dq_k, dq_v, bp, rows);
      CUDA_CHECK_LAUNCH();
    }
    CUDA_CHECK(cudaEventRecord(side->join, side->stream));
    CUDA_CHECK(cudaStreamWaitEvent(0, side->join, 0));
  };
}
template <typename T, int D>
std::function<void()> prepare_packed_named(const std::string& name, const Problem& p, const BwdParams& bp,
                                           const PackedRows& rows, int64_t total_q, int64_t total_k) {
  std::function<void()> f;
  if (!with_config_named(name, typename Configs<T, D>::Packed{},
                         [&](auto cfg) { f = prepare_packed<typename decltype(cfg)::type>(p, bp, rows, total_q, total_k); }))
    throw std::invalid_argument("step 5 runs a packed batch in its deterministic default (--variant deterministic), not " + name);
  return f;
}

// The closure of the configuration of Configs<T, D>::All named `name` (launch.cu declares this; the
// instances_*.cu files instantiate it, and with it every kernel of the list).
template <typename T, int D>
std::function<void()> prepare_named(const std::string& name, const Problem& p, const BwdParams& bp) {
  std::function<void()> f;
  if (!with_config_named(name, typename Configs<T, D>::All{},
                         [&](auto cfg) { f = prepare<typename decltype(cfg)::type>(p, bp); }))
    throw std::invalid_argument("step 5 has no config " + name + " for d = " + std::to_string(D));
  return f;
}

}  // namespace fa::step5
