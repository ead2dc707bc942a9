// FlashAttention, step by step — gpu/gpu_runner.cpp
#include "gpu/gpu_runner.h"

#include <cmath>

#include "core/dtype.h"

namespace fa {

AttnParams attn_params_of(const Problem& p) {
  AttnParams a{};
  a.B = int(p.B);
  a.Hq = int(p.Hq);
  a.Hkv = int(p.Hkv);
  a.Nq = int(p.Nq);
  a.Nk = int(p.Nk);
  a.d = int(p.d);
  a.group = int(p.group());
  a.causal = p.causal;
  a.input_pos = p.input_pos;
  a.scale = p.scale;
  a.scale_log2 = float(double(p.scale) * 1.4426950408889634);
  a.dropout = make_dropout(p.dropout, p.seed);
  return a;
}

GpuRunner::GpuRunner(const Problem& p, const Inputs& in) : p_(p) {
  q_ = upload(in.q, p.dtype);
  k_ = upload(in.k, p.dtype);
  v_ = upload(in.v, p.dtype);
  o_ = DeviceBuffer(in.q.size() * size_t(dtype_bytes(p.dtype)));
  lse_ = DeviceBuffer(size_t(p.B * p.Hq * p.Nq) * sizeof(float));
  o_.poison();
  lse_.poison();
  params_ = attn_params_of(p);
  params_.q = q_.get();
  params_.k = k_.get();
  params_.v = v_.get();
  params_.o = o_.get();
  params_.lse = lse_.as<float>();
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
