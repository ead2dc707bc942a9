// FlashAttention, step by step — capi/zero_copy.cpp (capi/zero_copy.h)
#include "capi/zero_copy.h"

#include <cstdint>
#include <vector>

#ifdef FA_WITH_CUDA
#include "gpu/cuda_util.h"
#endif

namespace fa::capi {

Varlen dense_as_packed(const Problem& p) {
  if (p.B * p.Nq > INT32_MAX || p.B * p.Nk > INT32_MAX) return {};
  std::vector<int64_t> lq(size_t(p.B), p.Nq), lk(size_t(p.B), p.Nk);
  return varlen_from_lengths(lq, lk);
}

#ifdef FA_WITH_CUDA
namespace {

// A [B', N, H, d] view in the packed layout (contiguous), its first element 16-byte aligned (TMA's rule).
bool packed(const fs_tensor& t) {
  const int64_t want[4] = {t.size[1] * t.size[2] * t.size[3], t.size[2] * t.size[3], t.size[3], 1};
  for (int k = 0; k < 4; ++k)
    if (t.size[k] > 1 && t.stride[k] != want[k]) return false;
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
}

// The LSE view [B', H, N] against the packed [H, B' * N]: in place, or how to copy it row by row.
struct LseRoute {
  enum Kind { kInPlace, kPerBatch, kPerHead, kNone } kind = kNone;
};
LseRoute lse_route(const fs_tensor& l) {
  const int64_t B = l.size[0], H = l.size[1], N = l.size[2];
  auto fits = [](int64_t size, int64_t stride, int64_t want) { return size == 1 || stride == want; };
  if (fits(B, l.stride[0], N) && fits(H, l.stride[1], B * N) && fits(N, l.stride[2], 1)) return {LseRoute::kInPlace};
  if (!fits(N, l.stride[2], 1) || l.stride[0] < 0 || l.stride[1] < 0) return {};
  if (H == 1 || l.stride[1] >= N) return {LseRoute::kPerBatch};  // per sequence b: H rows of N, pitch stride[1]
  if (B == 1 || l.stride[0] >= N) return {LseRoute::kPerHead};   // per head h: B rows of N, pitch stride[0]
  return {};
}

// Between the packed scratch [H, B' * N] and the view: `to_view` (after a forward) or back (before a backward).
void copy_lse(const fs_tensor& l, LseRoute r, float* scratch, bool to_view) {
  const int64_t B = l.size[0], H = l.size[1], N = l.size[2];
  float* view = static_cast<float*>(l.data);
  auto copy2d = [&](float* packed_at, size_t packed_pitch, float* view_at, size_t view_pitch, int64_t rows) {
    if (to_view)
      CUDA_CHECK(cudaMemcpy2DAsync(view_at, view_pitch, packed_at, packed_pitch, size_t(N) * 4, size_t(rows),
                                   cudaMemcpyDeviceToDevice, cudaStreamLegacy));
    else
      CUDA_CHECK(cudaMemcpy2DAsync(packed_at, packed_pitch, view_at, view_pitch, size_t(N) * 4, size_t(rows),
                                   cudaMemcpyDeviceToDevice, cudaStreamLegacy));
  };
  if (r.kind == LseRoute::kPerBatch)
    for (int64_t b = 0; b < B; ++b)
      copy2d(scratch + b * N, size_t(B * N) * 4, view + b * l.stride[0], size_t(H == 1 ? N : l.stride[1]) * 4, H);
  else
    for (int64_t h = 0; h < H; ++h)
      copy2d(scratch + h * B * N, size_t(N) * 4, view + h * l.stride[1], size_t(B == 1 ? N : l.stride[0]) * 4, B);
}

}  // namespace

bool run_zero_copy(const Stage& s, const std::string& variant, const Problem& p, const Varlen& v, fs_dtype dtype,
                   const CallTensors& t) {
  if (!s.run_device || v.batch() <= 0 || (dtype != FS_BF16 && dtype != FS_FP16)) return false;
  for (const fs_tensor* x : {t.q, t.k, t.v, t.o, t.dout, t.dq, t.dk, t.dv})
    if (x && !packed(*x)) return false;
  const LseRoute route = lse_route(*t.lse);
  if (route.kind == LseRoute::kNone) return false;
  const size_t lse_bytes = size_t(t.lse->size[0] * t.lse->size[1] * t.lse->size[2]) * sizeof(float);
  const StreamBuffer scratch(route.kind == LseRoute::kInPlace ? 0 : lse_bytes);
  float* lse = route.kind == LseRoute::kInPlace ? static_cast<float*>(t.lse->data) : scratch.as<float>();
  if (p.backward && route.kind != LseRoute::kInPlace) copy_lse(*t.lse, route, lse, /*to_view=*/false);
  DeviceBatch b{t.q->data, t.k->data, t.v->data, t.o->data, lse, t.dout ? t.dout->data : nullptr,
                t.dq ? t.dq->data : nullptr, t.dk ? t.dk->data : nullptr, t.dv ? t.dv->data : nullptr};
  if (!s.run_device(p, v, b, variant).empty()) return false;  // (a backward's scratch copy is freed unread)
  if (!p.backward && route.kind != LseRoute::kInPlace) copy_lse(*t.lse, route, lse, /*to_view=*/true);
  return true;
}
#else
bool run_zero_copy(const Stage&, const std::string&, const Problem&, const Varlen&, fs_dtype, const CallTensors&) {
  return false;
}
#endif

}  // namespace fa::capi
