// FlashAttention, step by step — core/problem.cpp
#include "core/problem.h"

#include "core/score_mod.h"

#include <charconv>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace fa {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::fp32: return "fp32";
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "fp32") return DType::fp32;
  if (s == "fp16") return DType::fp16;
  if (s == "bf16") return DType::bf16;
  throw std::invalid_argument("unknown dtype '" + s + "' (expected bf16, fp16 or fp32)");
}

double Problem::flops_forward() const {
  if (has_window()) {  // the pairs the mask leaves, row by row (causal and window together)
    const ScoreMod m = score_mod_of(*this);
    double pairs = 0;
    for (int64_t i = 0; i < Nq; ++i) {
      int64_t lo, hi;
      visible_range(m, Nk, i, &lo, &hi);
      if (hi >= lo) pairs += double(hi - lo + 1);
    }
    return 4.0 * double(B) * double(Hq) * pairs * double(d);
  }
  double keys = double(B) * double(Nk);  // with a KV cache of ragged sequences, the keys each one holds
  if (!cache_seqlens.empty()) {
    keys = 0;
    for (int64_t n : cache_seqlens) keys += double(n);
  }
  const double f = 4.0 * double(Hq) * double(Nq) * keys * double(d);
  return causal ? f / 2 : f;
}

std::string float_str(float x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[32];
  const auto [end, error] = std::to_chars(buf, buf + sizeof buf, x);
  return error == std::errc() ? std::string(buf, end) : "?";
}

void Problem::validate() const {
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  if (B <= 0) fail("batch must be positive (got " + std::to_string(B) + ")");
  if (Hq <= 0) fail("heads must be positive (got " + std::to_string(Hq) + ")");
  if (Hkv <= 0) fail("kv-heads must be positive (got " + std::to_string(Hkv) + ")");
  if (Hq % Hkv != 0)
    fail("heads (" + std::to_string(Hq) + ") must be a multiple of kv-heads (" + std::to_string(Hkv) +
         ") for grouped-query attention");
  if (Nq <= 0 || Nk <= 0)
    fail("sequence lengths must be positive (got Nq=" + std::to_string(Nq) + ", Nk=" + std::to_string(Nk) + ")");
  if (d <= 0) fail("head dim must be positive (got " + std::to_string(d) + ")");
  if (!(dropout >= 0.0f && dropout < 1.0f))
    fail("dropout must be in [0, 1) (got " + float_str(dropout) + ")");
  // The softmax's temperature: a positive, finite factor (step 4's kernels keep the running max in raw score
  // units, which is right only for a positive scale; inf or NaN would turn every row into NaN).
  if (!(scale > 0.0f && std::isfinite(scale)))
    fail("scale must be a positive finite number (got " + float_str(scale) + ")");
  if (!(softcap >= 0.0f && std::isfinite(softcap)))
    fail("softcap must be a positive finite number, or 0 for none (got " + float_str(softcap) + ")");
  if (window_left < -1 || window_right < -1)
    fail("window sides must be -1 (unbounded) or a number of keys >= 0 (got " + std::to_string(window_left) + "," +
         std::to_string(window_right) + ")");
  if (!cache_seqlens.empty()) {
    if (int64_t(cache_seqlens.size()) != B)
      fail("cache-seqlens must give one length per sequence of the batch (got " + std::to_string(cache_seqlens.size()) +
           " for batch " + std::to_string(B) + ")");
    for (int64_t n : cache_seqlens)
      if (n < 0 || n > Nk)
        fail("each cache-seqlens entry must be in 0 .. Nk = " + std::to_string(Nk) + ", the cache's capacity (got " +
             std::to_string(n) + ")");
  }
  if (page_size < 0) fail("page-size must be a number of keys > 0, or 0 for a contiguous cache (got " + std::to_string(page_size) + ")");
  if (splits < 0 || splits > 1024) fail("splits must be in 0 .. 1024 (0: chosen from the shape; got " + std::to_string(splits) + ")");
  // Counted in double: the product of four large flags would overflow int64_t and could pass as small.
  const double max_elements = double(int64_t(1) << 34);
  if (double(B) * double(Hq) * double(Nq) * double(d) > max_elements ||
      double(B) * double(Hkv) * double(Nk) * double(d) > max_elements)
    fail("tensors over 2^34 elements are not supported");
}

std::string Problem::describe() const {
  std::ostringstream s;
  s << "B=" << B << " Hq=" << Hq << " Hkv=" << Hkv << " Nq=" << Nq << " Nk=" << Nk << " d=" << d
    << " " << dtype_name(dtype) << (causal ? " causal input_pos=" + std::to_string(input_pos) : "")
    << " scale=" << scale;
  if (dropout > 0) s << " dropout=" << float_str(dropout) << " seed=" << seed;
  if (splits > 0) s << " splits=" << splits;
  if (!cache_seqlens.empty()) {
    s << " cache_seqlens=";
    for (size_t b = 0; b < cache_seqlens.size(); ++b) s << (b ? "," : "") << cache_seqlens[b];
  }
  if (page_size > 0) s << " page_size=" << page_size;
  if (has_window()) s << " window=" << window_left << "," << window_right << (causal ? "" : " input_pos=" + std::to_string(input_pos));
  if (bias) s << " +bias";
  if (alibi) s << " +alibi";
  if (softcap > 0) s << " softcap=" << softcap;
  if (backward) s << " +backward";
  return s.str();
}

}  // namespace fa
