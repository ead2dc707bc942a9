// FlashAttention, step by step — core/random.cpp
#include "core/random.h"

#include <random>

#include "core/dtype.h"

namespace fa {

Tensor random_tensor(std::vector<int64_t> shape, uint64_t seed, uint64_t stream, float mean, DType round) {
  Tensor t(std::move(shape));
  std::mt19937_64 gen(seed * 0x9E3779B97F4A7C15ull + stream * 0xD1B54A32D192ED03ull + 1);
  std::normal_distribution<float> normal(mean, 1.0f);
  for (auto& x : t.data) x = round_to(round, normal(gen));
  return t;
}

void round_tensor(Tensor& x, DType t) {
  for (auto& v : x.data) v = round_to(t, v);
}

Inputs random_inputs(const Problem& p) {
  Inputs in;
  in.q = random_tensor({p.B, p.Hq, p.Nq, p.d}, p.seed, 1, 0.3f, p.dtype);
  in.k = random_tensor({p.B, p.Hkv, p.Nk, p.d}, p.seed, 2, 0.3f, p.dtype);
  in.v = random_tensor({p.B, p.Hkv, p.Nk, p.d}, p.seed, 3, 0.5f, p.dtype);
  if (p.backward) in.dout = random_tensor({p.B, p.Hq, p.Nq, p.d}, p.seed, 4, 0.5f, p.dtype);
  return in;
}

}  // namespace fa
