// FlashAttention, step by step — gpu/gpu_runner.cpp
#include "gpu/gpu_runner.h"

#include <cmath>

#include "core/dtype.h"

namespace fa {

GpuRunner::GpuRunner(const Problem& p, const Inputs& in) : p_(p) {
  q_ = upload(in.q, p.dtype);
  k_ = upload(in.k, p.dtype);
  v_ = upload(in.v, p.dtype);
  o_ = DeviceBuffer(in.q.size() * size_t(dtype_bytes(p.dtype)));
  lse_ = DeviceBuffer(size_t(p.B * p.Hq * p.Nq) * sizeof(float));
  o_.poison();
  lse_.poison();
  params_.q = q_.get();
  params_.k = k_.get();
  params_.v = v_.get();
  params_.o = o_.get();
  params_.lse = lse_.as<float>();
  params_.B = int(p.B);
  params_.Hq = int(p.Hq);
  params_.Hkv = int(p.Hkv);
  params_.Nq = int(p.Nq);
  params_.Nk = int(p.Nk);
  params_.d = int(p.d);
  params_.group = int(p.group());
  params_.causal = p.causal;
  params_.input_pos = p.input_pos;
  params_.scale = p.scale;
  params_.scale_log2 = float(double(p.scale) * 1.4426950408889634);
  params_.dropout = make_dropout(p.dropout, p.seed);
  // Score modifiers: the bias as float32 with the strides of its broadcast, ALiBi's slopes always as an
  // array (the given ones or the standard series), so that a kernel reads its head's slope once.
  if (!p.has_score_mods()) return;
  ModParams mp{};
  mp.mod = score_mod_of(p);
  if (p.bias) {
    bias_ = upload(in.bias, DType::fp32);
    mp.bias = bias_.as<float>();
    mp.bias_stride_h = in.bias.shape[1] == 1 ? 0 : p.Nq * p.Nk;
    mp.bias_stride_b = in.bias.shape[0] == 1 ? 0 : in.bias.shape[1] * p.Nq * p.Nk;
  }
  if (p.alibi) {
    Tensor slopes = in.alibi_slopes;
    if (slopes.data.empty()) {
      slopes = Tensor({p.Hq});
      for (int64_t h = 0; h < p.Hq; ++h) slopes.data[size_t(h)] = alibi_slope(h, p.Hq);
    }
    slopes_ = upload(slopes, DType::fp32);
    mp.mod.slopes = slopes_.as<float>();
  }
  mods_ = DeviceBuffer(sizeof(ModParams));
  CUDA_CHECK(cudaMemcpy(mods_.get(), &mp, sizeof(mp), cudaMemcpyHostToDevice));
  params_.mods = mods_.as<ModParams>();
}

Outputs GpuRunner::outputs() {
  CUDA_CHECK(cudaDeviceSynchronize());
  Outputs out;
  out.o = download(o_, p_.dtype, {p_.B, p_.Hq, p_.Nq, p_.d});
  out.lse = download_f32(lse_, {p_.B, p_.Hq, p_.Nq});
  return out;
}

}  // namespace fa
