// FlashAttention, step by step — core/random.cpp
#include "core/random.h"

#include <algorithm>
#include <random>

#include "core/dtype.h"
#include "core/parallel.h"

namespace fa {

// Chunks of 2^20 elements, each from a generator of its own, filled in parallel: a decode problem's KV cache
// has billions of elements. Chunk 0's generator is the one a whole tensor used before chunks existed, so
// every tensor of up to 2^20 elements (every default problem) keeps its values.
constexpr int64_t kChunk = int64_t(1) << 20;

Tensor random_tensor(std::vector<int64_t> shape, uint64_t seed, uint64_t stream, float mean, DType round) {
  Tensor t(std::move(shape));
  const int64_t n = int64_t(t.data.size()), chunks = (n + kChunk - 1) / kChunk;
  parallel_for_2d(chunks, 1, [&](int64_t c, int64_t) {
    std::mt19937_64 gen(seed * 0x9E3779B97F4A7C15ull + stream * 0xD1B54A32D192ED03ull + 1 + uint64_t(c) * 0x94D049BB133111EBull);
    std::normal_distribution<float> normal(mean, 1.0f);
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) t.data[size_t(i)] = round_to(round, normal(gen));
  });
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
