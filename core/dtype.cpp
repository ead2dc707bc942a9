// FlashAttention, step by step — core/dtype.cpp
#include "core/dtype.h"

#include <cmath>

namespace fa {

uint16_t float_to_fp16_bits(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // Subnormal (or zero) in fp16: value = m * 2^-24. Scaling by 2^24 is exact in float; rint rounds to
    // nearest-even under the default rounding mode.
    const float m = std::nearbyint(f32_from_bits(a) * 16777216.0f);
    return uint16_t(sign | uint16_t(m));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  uint32_t r = a - 0x38000000u;
  r += 0x0fffu + ((r >> 13) & 1u);
  return uint16_t(sign | uint16_t(r >> 13));
}

float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return (sign ? -1.0f : 1.0f) * float(m) * 5.9604644775390625e-08f;  // m * 2^-24
  if (e == 31) return f32_from_bits(sign | 0x7f800000u | (m << 13));
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace fa
