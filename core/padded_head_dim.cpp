// FlashAttention, step by step — core/padded_head_dim.cpp
#include "core/padded_head_dim.h"

#include <algorithm>
#include <memory>
#include <string>

#include "core/varlen.h"

namespace fa {

int64_t padded_head_dim(int64_t d, const std::vector<int64_t>& compiled) {
  if (d <= 0 || d % 8 != 0) return 0;
  int64_t best = 0;
  for (int64_t D : compiled)
    if (D >= d && (best == 0 || D < best)) best = D;
  return best;
}

Tensor resize_last_dim(const Tensor& x, int64_t D) {
  if (x.shape.empty()) return x;
  const int64_t d = x.shape.back(), rows = d > 0 ? int64_t(x.size()) / d : 0, keep = std::min(d, D);
  std::vector<int64_t> shape = x.shape;
  shape.back() = D;
  Tensor y(shape);
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(x.data.begin() + r * d, keep, y.data.begin() + r * D);
  return y;
}

namespace {

Problem with_head_dim(Problem p, int64_t D) {
  p.d = D;  // the scale stays the problem's own (1 / sqrt(d) by default): it was set before
  return p;
}

Inputs padded(const Inputs& in, int64_t D) {
  Inputs out = in;
  for (Tensor* t : {&out.q, &out.k, &out.v, &out.dout})
    if (!t->shape.empty()) *t = resize_last_dim(*t, D);
  return out;
}

// The stage's runner on the padded problem; outputs() crops O, dQ, dK and dV back to d. It owns the padded
// inputs, which the inner runner may keep a reference to.
class PaddedRunner final : public Runner {
 public:
  template <class Make>
  PaddedRunner(const Inputs& in, int64_t d, int64_t D, const Make& make) : in_(std::make_unique<Inputs>(padded(in, D))), d_(d) {
    inner_ = make(*in_);
  }
  void run() override { inner_->run(); }
  void run_backward() override { inner_->run_backward(); }
  Outputs outputs() override {
    Outputs out = inner_->outputs();
    for (Tensor* t : {&out.o, &out.dq, &out.dk, &out.dv})
      if (!t->shape.empty()) *t = resize_last_dim(*t, d_);
    return out;
  }

 private:
  std::unique_ptr<Inputs> in_;
  int64_t d_;
  std::unique_ptr<Runner> inner_;
};

}  // namespace

Stage with_padded_head_dims(Stage s) {
  const std::vector<int64_t> compiled = s.supports.head_dims;
  if (compiled.empty()) return s;  // any head dim already
  const int64_t largest = *std::max_element(compiled.begin(), compiled.end());
  auto is_compiled = [compiled](int64_t d) { return std::find(compiled.begin(), compiled.end(), d) != compiled.end(); };
  auto dims = [compiled] {
    std::string n;
    for (int64_t D : compiled) n += (n.empty() ? "" : " and ") + std::to_string(D);
    return n;
  }();
  // The problem the kernels run: p itself, or p at the next compiled head dim.
  auto run_as = [=](const Problem& p) { return is_compiled(p.d) ? p : with_head_dim(p, padded_head_dim(p.d, compiled)); };

  s.supports.head_dims.clear();
  for (int64_t d = 8; d <= largest; d += 8) s.supports.head_dims.push_back(d);
  s.unsupported = [inner = s.unsupported, is_compiled, run_as, compiled, largest, dims, name = s.name](const Problem& p,
                                                                                                  const std::string& v) {
    if (!is_compiled(p.d) && padded_head_dim(p.d, compiled) == 0)
      return "head dim " + std::to_string(p.d) + ": " + name + "'s kernels are compiled for d = " + dims +
             ", and a multiple of 8 up to " + std::to_string(largest) + " runs on the next of them, zero-padded";
    return inner ? inner(run_as(p), v) : std::string();
  };
  if (s.make)
    s.make = [inner = s.make, is_compiled, compiled](const Problem& p, const Inputs& in,
                                                     const std::string& v) -> std::unique_ptr<Runner> {
      if (is_compiled(p.d)) return inner(p, in, v);
      const Problem q = with_head_dim(p, padded_head_dim(p.d, compiled));
      return std::make_unique<PaddedRunner>(in, p.d, q.d, [&](const Inputs& x) { return inner(q, x, v); });
    };
  if (s.make_varlen)
    s.make_varlen = [inner = s.make_varlen, is_compiled, compiled](const Problem& p, const Varlen& vl, const Inputs& in,
                                                                   const std::string& v) -> std::unique_ptr<Runner> {
      if (is_compiled(p.d)) return inner(p, vl, in, v);
      const Problem q = with_head_dim(p, padded_head_dim(p.d, compiled));
      return std::make_unique<PaddedRunner>(in, p.d, q.d, [&](const Inputs& x) { return inner(q, vl, x, v); });
    };
  if (s.config_of)
    s.config_of = [inner = s.config_of, run_as](const Problem& p, const std::string& v, int cc) { return inner(run_as(p), v, cc); };
  if (s.launch_shape)
    s.launch_shape = [inner = s.launch_shape, run_as](const Problem& p, const std::string& v) { return inner(run_as(p), v); };
  if (s.tuning_splits)
    s.tuning_splits = [inner = s.tuning_splits, run_as](const Problem& p, const std::string& c) { return inner(run_as(p), c); };
  return s;
}

}  // namespace fa
