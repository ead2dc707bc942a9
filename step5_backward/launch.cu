// FlashAttention, step by step — step 5: configurations, launch and runner (step5_backward/launch.cu)
//
// The backward of step 5 is three launches on the default stream, in this order (each needs the last):
//   preprocess  D = rowsum(dO * O)                         grid: B * Hq * Nq rows, one warp each
//   dK/dV       one block per (key tile, KV head, batch)   grid: ceil(Nk / Bc) * Hkv * B
//   dQ          one block per (query tile, head, batch)    grid: ceil(Nq / Br) * Hq * B
// No atomics anywhere: every output element has one writer, so two runs give the same bits.
// The forward is step 4's (make_forward), run in training mode: it writes O and the LSE the backward reads.
// One configuration per head dim, chosen to fit sm_120's 99 KB per block, so sm_90 and sm_120 run the
// same tiles.
#include <algorithm>
#include <functional>
#include <stdexcept>

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

template <typename T, int D>
struct Configs {
  // dK/dV: 4 warps x 16 keys; d = 128 takes half-height Q/dO tiles, so that dK and dV (128 fp32 registers
  // per thread at d = 128) leave room for S^T and dP^T.
  //                        T  D  Warps  Bq                Stages
  using DkDv = DkDvTraits<T, D, 4, D == 64 ? 64 : 32, 2>;
  // dQ: 4 warps x 16 rows with Q and dO in registers; d = 128 takes half-width K/V tiles for the same reason.
  //                    T  D  Warps  Bc                Stages
  using Dq = DqTraits<T, D, 4, D == 64 ? 64 : 32, 2>;
  static_assert(DkDv::kFitsSm120 && Dq::kFitsSm120, "the configs must fit in sm_120's 99 KB of shared memory per block");
};

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
// and the closure that launches the three kernels.
template <typename T, int D>
std::function<void()> prepare(const Problem& p, const BwdParams& bp) {
  using KV = typename Configs<T, D>::DkDv;
  using DQ = typename Configs<T, D>::Dq;
  const AttnParams& a = bp.a;
  const int64_t BHq = p.B * p.Hq, BHkv = p.B * p.Hkv;
  // dK/dV kernel: Q and dO in boxes of Bq rows, K and V in boxes of Bc rows.
  const CUtensorMap kv_q = make_tensor_map_bhnd(a.q, p.dtype, BHq, p.Nq, D, KV::Bq);
  const CUtensorMap kv_do = make_tensor_map_bhnd(bp.dout, p.dtype, BHq, p.Nq, D, KV::Bq);
  const CUtensorMap kv_k = make_tensor_map_bhnd(a.k, p.dtype, BHkv, p.Nk, D, KV::Bc);
  const CUtensorMap kv_v = make_tensor_map_bhnd(a.v, p.dtype, BHkv, p.Nk, D, KV::Bc);
  // dQ kernel: Q and dO in boxes of Br rows, K and V in boxes of Bc rows.
  const CUtensorMap dq_q = make_tensor_map_bhnd(a.q, p.dtype, BHq, p.Nq, D, DQ::Br);
  const CUtensorMap dq_do = make_tensor_map_bhnd(bp.dout, p.dtype, BHq, p.Nq, D, DQ::Br);
  const CUtensorMap dq_k = make_tensor_map_bhnd(a.k, p.dtype, BHkv, p.Nk, D, DQ::Bc);
  const CUtensorMap dq_v = make_tensor_map_bhnd(a.v, p.dtype, BHkv, p.Nk, D, DQ::Bc);

  const bool drop = a.dropout.threshold != 0;
  auto dkdv = drop ? dkdv_kernel<KV, true> : dkdv_kernel<KV, false>;
  auto dq = drop ? dq_kernel<DQ, true> : dq_kernel<DQ, false>;
  allow_smem(dkdv, KV::kSmemBytes);
  allow_smem(dq, DQ::kSmemBytes);

  const int64_t rows = BHq * p.Nq;
  const unsigned pre_blocks = grid_size((rows + kPreprocessWarps - 1) / kPreprocessWarps);
  const unsigned kv_blocks = grid_size((p.Nk + KV::Bc - 1) / KV::Bc * BHkv);
  const unsigned q_blocks = grid_size((p.Nq + DQ::Br - 1) / DQ::Br * BHq);
  return [=] {
    preprocess_kernel<T><<<pre_blocks, 32 * kPreprocessWarps>>>(static_cast<const T*>(a.o),
                                                                 static_cast<const T*>(bp.dout), bp.dsum, rows, D);
    CUDA_CHECK_LAUNCH();
    dkdv<<<kv_blocks, KV::kThreads, KV::kSmemBytes>>>(kv_q, kv_do, kv_k, kv_v, bp);
    CUDA_CHECK_LAUNCH();
    dq<<<q_blocks, DQ::kThreads, DQ::kSmemBytes>>>(dq_q, dq_do, dq_k, dq_v, bp);
    CUDA_CHECK_LAUNCH();
  };
}

std::function<void()> make_backward(const Problem& p, const BwdParams& bp) {
  std::function<void()> f;
  dispatch_dtype</*kAllowFp32=*/false>(p.dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_head_dim(int(p.d), [&](auto dim) { f = prepare<T, decltype(dim)::value>(p, bp); });
  });
  return f;
}

// Step 4's runner state (Q, K, V, O, LSE on the device) plus dO, D and the three gradients, all poisoned
// with NaN so that an element no kernel writes fails the check.
class BackwardRunner final : public GpuRunner {
 public:
  BackwardRunner(const Problem& p, const Inputs& in) : GpuRunner(p, in), forward_(step4::make_forward(p, params_)) {
    if (in.dout.size() != in.q.size()) return;  // a forward-only run (no --backward): no dO to set up
    const size_t bytes = size_t(dtype_bytes(p.dtype));
    do_ = upload(in.dout, p.dtype);
    dsum_ = DeviceBuffer(size_t(p.B * p.Hq * p.Nq) * sizeof(float));
    dq_ = DeviceBuffer(in.q.size() * bytes);
    dk_ = DeviceBuffer(in.k.size() * bytes);
    dv_ = DeviceBuffer(in.v.size() * bytes);
    for (DeviceBuffer* b : {&dsum_, &dq_, &dk_, &dv_}) b->poison();
    backward_ = make_backward(p, BwdParams{params_, do_.get(), dsum_.as<float>(), dq_.get(), dk_.get(), dv_.get()});
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
  DeviceBuffer do_, dsum_, dq_, dk_, dv_;
};

}  // namespace

Stage stage() {
  Stage s;
  s.name = "step5_backward";
  s.title = "backward: dK/dV kernel + dQ kernel (deterministic), TMA ring, mma.sync";
  s.gpu = true;
  s.has_backward = true;
  s.variants = {"deterministic"};
  s.unsupported = [](const Problem& p, const std::string&) {
    if (p.dtype == DType::fp32) return std::string("fp32 storage (tensor cores take bf16 or fp16)");
    if (!(p.scale > 0)) return std::string("a scale <= 0 (step 4's forward keeps its running max in raw score units)");
    if (p.Nq >= (1 << 30) || p.Nk >= (1 << 30)) return std::string("sequences of 2^30 or more");
    return head_dim_unsupported(p.d);
  };
  s.make = [](const Problem& p, const Inputs& in, const std::string&) -> std::unique_ptr<Runner> {
    return std::make_unique<BackwardRunner>(p, in);
  };
  return s;
}

}  // namespace fa::step5
