// FlashAttention, step by step — core/metrics.cpp
#include "core/metrics.h"

#include <algorithm>
#include <cmath>

namespace fa {

template <typename R>
static ErrorStats compare_impl(const Tensor& got, const TensorT<R>& ref) {
  ErrorStats e;
  if (got.shape != ref.shape) {
    e.ok_shape = false;
    return e;
  }
  double num = 0, den = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    const double g = got.data[k], r = double(ref.data[k]);
    if (is_poison(got.data[k])) { ++e.unwritten; continue; }
    if (std::isnan(r)) { ++e.ref_nan; continue; }
    if (std::isnan(g)) { ++e.nan; continue; }
    if (std::isinf(r) || std::isinf(g)) {
      if (g != r) ++e.mismatched_inf;
      continue;
    }
    const double diff = std::fabs(g - r);
    e.max_abs = std::max(e.max_abs, diff);
    e.ref_max = std::max(e.ref_max, std::fabs(r));
    num += diff * diff;
    den += r * r;
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

ErrorStats compare(const Tensor& got, const TensorT<double>& ref) { return compare_impl(got, ref); }
ErrorStats compare(const Tensor& got, const Tensor& ref) { return compare_impl(got, ref); }

Verdict tolerance_rule(const ErrorStats& stage, const ErrorStats& baseline) {
  const double eps = 1e-5 * std::max(1.0, stage.ref_max);
  const double tol = 2.0 * baseline.max_abs + eps;
  const bool every_element_compared =
      stage.ok_shape && stage.unwritten == 0 && stage.nan == 0 && stage.ref_nan == 0 && stage.mismatched_inf == 0;
  const bool pass = every_element_compared && stage.max_abs <= tol;
  return {pass, tol};
}

}  // namespace fa
