// FlashAttention, step by step — core/dtype.h
// Rounding float32 to bf16 / fp16 on the host (round to nearest, ties to even), so that the CPU
// reference sees exactly the values a GPU kernel stores. Bit-compatible with CUDA's
// __float2bfloat16_rn and __float2half_rn.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/problem.h"

namespace fa {

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// bf16 is the top 16 bits of a float32: round the low 16 bits away.
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_bits_to_float(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

// fp16: 1 sign, 5 exponent, 10 mantissa bits; subnormals below 2^-14, overflow to inf above 65504.
uint16_t float_to_fp16_bits(float f);
float fp16_bits_to_float(uint16_t h);

inline float round_to(DType t, float x) {
  switch (t) {
    case DType::bf16: return bf16_bits_to_float(float_to_bf16_bits(x));
    case DType::fp16: return fp16_bits_to_float(float_to_fp16_bits(x));
    case DType::fp32: return x;
  }
  return x;
}

// Bytes of one element of the stage's storage type.
inline int dtype_bytes(DType t) { return t == DType::fp32 ? 4 : 2; }

}  // namespace fa
