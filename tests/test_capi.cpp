// FlashAttention, step by step — tests of the C interface (capi/flash_step.h) on the CPU stages.
// Through libflash_step.so as a program sees it: forward and backward in fp64 against step 1's reference
// (the same values, to rounding), in fp32 for every CPU stage under the tolerance rule (core/metrics.h),
// GQA and causal with Nq != Nk, strided views (packed QKV, negative strides, outputs with gaps left
// untouched), the default stage, and every error path: its status and its message, per thread.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "capi/flash_step.h"
#include "core/random.h"
#include "core/varlen.h"
#include "harness/registry.h"
#include "step1_cpu_reference/reference.h"

namespace fa {
namespace {

// A host buffer of T holding a [B, N, H, d] tensor (or [B, H, Nq] for the LSE), and its view.
template <typename T>
struct Buffer {
  std::vector<T> data;
  fs_tensor view{};
};

// The stages' [B, H, N, d] tensor `t` as a contiguous [B, N, H, d] buffer of T.
template <typename T>
Buffer<T> to_api(const Tensor& t) {
  const int64_t B = t.shape[0], H = t.shape[1], N = t.shape[2], d = t.shape[3];
  Buffer<T> b;
  b.data.resize(t.size());
  for (int64_t i = 0; i < B; ++i)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t x = 0; x < d; ++x) b.data[((i * N + n) * H + h) * d + x] = T(t.data[((i * H + h) * N + n) * d + x]);
  b.view = fs_contiguous(b.data.data(), B, N, H, d);
  return b;
}

// An output buffer: [B, N, H, d], or [B, H, Nq] when lse; filled with NaN.
template <typename T>
Buffer<T> output(int64_t B, int64_t N, int64_t H, int64_t d, bool lse = false) {
  Buffer<T> b;
  b.data.assign(size_t(B * N * H * (lse ? 1 : d)), T(NAN));
  b.view = lse ? fs_contiguous_lse(b.data.data(), B, H, N) : fs_contiguous(b.data.data(), B, N, H, d);
  return b;
}

// Reads a strided [B, N, H, d] view back as the stages' [B, H, N, d] (the LSE view [B, H, Nq] as is).
template <typename T>
TensorT<double> from_api(const fs_tensor& v) {
  const T* base = static_cast<const T*>(v.data);
  if (v.ndim == 3) {
    TensorT<double> t({v.size[0], v.size[1], v.size[2]});
    size_t i = 0;
    for (int64_t b = 0; b < v.size[0]; ++b)
      for (int64_t h = 0; h < v.size[1]; ++h)
        for (int64_t n = 0; n < v.size[2]; ++n) t.data[i++] = base[b * v.stride[0] + h * v.stride[1] + n * v.stride[2]];
    return t;
  }
  TensorT<double> t({v.size[0], v.size[2], v.size[1], v.size[3]});
  size_t i = 0;
  for (int64_t b = 0; b < v.size[0]; ++b)
    for (int64_t h = 0; h < v.size[2]; ++h)
      for (int64_t n = 0; n < v.size[1]; ++n)
        for (int64_t x = 0; x < v.size[3]; ++x)
          t.data[i++] = base[b * v.stride[0] + n * v.stride[1] + h * v.stride[2] + x * v.stride[3]];
  return t;
}

Tensor to_float(const TensorT<double>& t) {
  Tensor f(t.shape);
  for (size_t i = 0; i < t.size(); ++i) f.data[i] = float(t.data[i]);
  return f;
}

// max |a - b| over finite pairs; infinite entries must match exactly (an LSE of a row that sees no key).
double max_diff(const TensorT<double>& a, const TensorT<double>& b) {
  EXPECT_EQ(a.shape, b.shape);
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isinf(a.data[i]) || std::isinf(b.data[i])) {
      EXPECT_EQ(a.data[i], b.data[i]) << "element " << i;
      continue;
    }
    m = std::max(m, std::abs(a.data[i] - b.data[i]));
    EXPECT_FALSE(std::isnan(a.data[i])) << "element " << i;
  }
  return m;
}

// A problem with GQA (4 query heads on 2 KV heads) and Nq != Nk, so that a causal mask leaves rows unseen.
Problem small_problem(bool causal, bool backward) {
  Problem p;
  p.B = 2;
  p.Hq = 4;
  p.Hkv = 2;
  p.Nq = 37;
  p.Nk = 29;
  p.d = 16;
  p.causal = causal;
  p.input_pos = p.Nk - p.Nq;  // -8: the first 8 query rows see no key when causal
  p.scale = 0.3f;
  p.dtype = DType::fp32;
  p.backward = backward;
  p.seed = 7;
  return p;
}

fs_options options_of(const Problem& p, fs_dtype dtype, const char* stage = nullptr, const char* variant = nullptr) {
  fs_options o = fs_default_options();
  o.causal = p.causal;
  o.softmax_scale = p.scale;
  o.dtype = dtype;
  o.stage = stage;
  o.variant = variant;
  return o;
}

TEST(Capi, VersionAndStages) {
  EXPECT_EQ(fs_version(), FS_VERSION);
  EXPECT_EQ(FS_VERSION, FS_VERSION_MAJOR * 1000 + FS_VERSION_MINOR);
  ASSERT_GE(fs_stage_count(), 2);
  EXPECT_STREQ(fs_stage_name(0), "step1_cpu_reference");
  EXPECT_STREQ(fs_stage_name(1), "step2_online_softmax");
  EXPECT_EQ(fs_stage_memory(0), FS_HOST);
  EXPECT_EQ(fs_stage_name(fs_stage_count()), nullptr);
  EXPECT_NE(std::string(fs_last_error()).find("no stage"), std::string::npos) << fs_last_error();
  EXPECT_EQ(std::string(fs_gpu_unavailable_reason()), gpu_unavailable_reason());
}

// fp64: step 1's reference through the interface, against step 1 itself: the same values, to rounding.
TEST(Capi, ForwardFp64IsStep1) {
  for (bool causal : {false, true}) {
    const Problem p = small_problem(causal, false);
    const Inputs in = random_inputs(p);
    const auto ref = step1::attention<double>(p, in, false);
    auto q = to_api<double>(in.q), k = to_api<double>(in.k), v = to_api<double>(in.v);
    auto o = output<double>(p.B, p.Nq, p.Hq, p.d), lse = output<double>(p.B, p.Nq, p.Hq, p.d, true);
    const fs_options opt = options_of(p, FS_FP64);
    ASSERT_EQ(fs_forward(&opt, &q.view, &k.view, &v.view, &o.view, &lse.view), FS_OK) << fs_last_error();
    EXPECT_STREQ(fs_last_error(), "");
    EXPECT_EQ(fs_last_call_copied(), -1);  // host memory: neither in place on a device nor copied to one
    EXPECT_LE(max_diff(from_api<double>(o.view), ref.o), 1e-12) << "causal " << causal;
    EXPECT_LE(max_diff(from_api<double>(lse.view), ref.lse), 1e-12) << "causal " << causal;
  }
}

TEST(Capi, BackwardFp64IsStep1) {
  for (bool causal : {false, true}) {
    const Problem p = small_problem(causal, true);
    const Inputs in = random_inputs(p);
    const auto ref = step1::attention<double>(p, in, true);
    auto q = to_api<double>(in.q), k = to_api<double>(in.k), v = to_api<double>(in.v), dout = to_api<double>(in.dout);
    auto o = output<double>(p.B, p.Nq, p.Hq, p.d), lse = output<double>(p.B, p.Nq, p.Hq, p.d, true);
    const fs_options opt = options_of(p, FS_FP64);
    ASSERT_EQ(fs_forward(&opt, &q.view, &k.view, &v.view, &o.view, &lse.view), FS_OK) << fs_last_error();
    auto dq = output<double>(p.B, p.Nq, p.Hq, p.d), dk = output<double>(p.B, p.Nk, p.Hkv, p.d),
         dv = output<double>(p.B, p.Nk, p.Hkv, p.d);
    ASSERT_EQ(fs_backward(&opt, &q.view, &k.view, &v.view, &o.view, &lse.view, &dout.view, &dq.view, &dk.view, &dv.view),
              FS_OK)
        << fs_last_error();
    EXPECT_LE(max_diff(from_api<double>(dq.view), ref.dq), 1e-12) << "causal " << causal;
    EXPECT_LE(max_diff(from_api<double>(dk.view), ref.dk), 1e-12) << "causal " << causal;
    EXPECT_LE(max_diff(from_api<double>(dv.view), ref.dv), 1e-12) << "causal " << causal;
  }
}

// fp32: every CPU stage (and step 2's variants), forward and backward, under the tolerance rule against step 1
// in fp64, the check --check makes.
TEST(Capi, Fp32StagesPassTheToleranceRule) {
  struct Run {
    const char* stage;
    const char* variant;
    bool backward;
  };
  const Run runs[] = {{"step1_cpu_reference", nullptr, true}, {"step2_online_softmax", nullptr, false},
                      {"step2_online_softmax", "online", false}, {"step2_online_softmax", "fa1", true},
                      {"step2_online_softmax", "fa2", true},     {nullptr, nullptr, true}};
  for (const Run& r : runs)
    for (bool causal : {false, true}) {
      const std::string what = std::string(r.stage ? r.stage : "default") + " " + (r.variant ? r.variant : "") +
                               (causal ? " causal" : "");
      const Problem p = small_problem(causal, r.backward);
      const Inputs in = random_inputs(p);
      auto q = to_api<float>(in.q), k = to_api<float>(in.k), v = to_api<float>(in.v);
      auto o = output<float>(p.B, p.Nq, p.Hq, p.d), lse = output<float>(p.B, p.Nq, p.Hq, p.d, true);
      const fs_options opt = options_of(p, FS_FP32, r.stage, r.variant);
      ASSERT_EQ(fs_forward(&opt, &q.view, &k.view, &v.view, &o.view, &lse.view), FS_OK) << what << ": " << fs_last_error();
      Outputs got;
      got.o = to_float(from_api<float>(o.view));
      got.lse = to_float(from_api<float>(lse.view));
      if (r.backward) {
        auto dout = to_api<float>(in.dout);
        auto dq = output<float>(p.B, p.Nq, p.Hq, p.d), dk = output<float>(p.B, p.Nk, p.Hkv, p.d),
             dv = output<float>(p.B, p.Nk, p.Hkv, p.d);
        ASSERT_EQ(fs_backward(&opt, &q.view, &k.view, &v.view, &o.view, &lse.view, &dout.view, &dq.view, &dk.view,
                              &dv.view),
                  FS_OK)
            << what << ": " << fs_last_error();
        got.dq = to_float(from_api<float>(dq.view));
        got.dk = to_float(from_api<float>(dk.view));
        got.dv = to_float(from_api<float>(dv.view));
      }
      const CheckReport rep = check_against_reference(p, in, got);
      for (int i = 0; i < rep.n; ++i)
        EXPECT_TRUE(rep.verdict[i].pass) << what << ": " << CheckReport::name(i) << " error " << rep.stage[i].max_abs
                                         << " > tolerance " << rep.verdict[i].tolerance;
    }
}

// Strided views: Q, K, V packed in one [B, N, 3, H, d] buffer (as a fused QKV projection leaves them), K with
// a negative stride along N, O with gaps between its rows and the LSE transposed ([B, Hq, Nq] stored as
// [B, Nq, Hq]). The values are those of the contiguous call, and the gaps are left as they were.
TEST(Capi, StridedViewsGiveTheContiguousValues) {
  Problem p = small_problem(true, true);
  p.Nk = p.Nq;  // one packed buffer: Q, K, V of the same length and heads
  p.Hkv = p.Hq;
  p.input_pos = 0;
  const Inputs in = random_inputs(p);
  const int64_t B = p.B, N = p.Nq, H = p.Hq, d = p.d;
  auto q = to_api<float>(in.q), k = to_api<float>(in.k), v = to_api<float>(in.v), dout = to_api<float>(in.dout);
  const fs_options opt = options_of(p, FS_FP32, "step2_online_softmax", "fa2");
  auto o = output<float>(B, N, H, d), lse = output<float>(B, N, H, d, true);
  ASSERT_EQ(fs_forward(&opt, &q.view, &k.view, &v.view, &o.view, &lse.view), FS_OK) << fs_last_error();
  auto dq = output<float>(B, N, H, d), dk = output<float>(B, N, H, d), dv = output<float>(B, N, H, d);
  ASSERT_EQ(fs_backward(&opt, &q.view, &k.view, &v.view, &o.view, &lse.view, &dout.view, &dq.view, &dk.view, &dv.view), FS_OK)
      << fs_last_error();

  // packed [B, N, 3, H, d]; K stored with its rows reversed, reached through a negative stride
  std::vector<float> qkv(size_t(B * N * 3 * H * d));
  const int64_t sB = N * 3 * H * d, sN = 3 * H * d, sH = d;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < d; ++x) {
          const size_t c = size_t(((b * N + n) * H + h) * d + x);
          qkv[size_t(b * sB + n * sN + 0 * H * d + h * sH + x)] = q.data[c];
          qkv[size_t(b * sB + (N - 1 - n) * sN + 1 * H * d + h * sH + x)] = k.data[c];
          qkv[size_t(b * sB + n * sN + 2 * H * d + h * sH + x)] = v.data[c];
        }
  auto strided = [&](float* base, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    fs_tensor t = fs_contiguous(base, B, N, H, d);
    t.stride[0] = s0, t.stride[1] = s1, t.stride[2] = s2, t.stride[3] = s3;
    return t;
  };
  const fs_tensor qs = strided(qkv.data(), sB, sN, sH, 1);
  const fs_tensor ks = strided(qkv.data() + (N - 1) * sN + H * d, sB, -sN, sH, 1);
  const fs_tensor vs = strided(qkv.data() + 2 * H * d, sB, sN, sH, 1);
  // O with a gap of 3 floats after each head's row; the LSE [B, Hq, Nq] stored as [B, Nq, Hq]
  const float sentinel = 12345.0f;
  const int64_t oH = d + 3;
  std::vector<float> o_buf(size_t(B * N * H * oH), sentinel), lse_buf(size_t(B * N * H), sentinel);
  const fs_tensor os = strided(o_buf.data(), N * H * oH, H * oH, oH, 1);
  fs_tensor lses = fs_contiguous_lse(lse_buf.data(), B, H, N);
  lses.stride[1] = 1, lses.stride[2] = H;
  ASSERT_EQ(fs_forward(&opt, &qs, &ks, &vs, &os, &lses), FS_OK) << fs_last_error();
  EXPECT_EQ(max_diff(from_api<float>(os), from_api<float>(o.view)), 0.0);
  EXPECT_EQ(max_diff(from_api<float>(lses), from_api<float>(lse.view)), 0.0);
  for (size_t i = 0; i < o_buf.size(); ++i)
    if (int64_t(i) % oH >= d) {
      ASSERT_EQ(o_buf[i], sentinel) << "the gap at " << i << " was written";
    }

  // the gradients into a packed [B, N, 3, H, d] buffer of their own, dK through a negative stride too
  std::vector<float> dqkv(qkv.size(), sentinel);
  const fs_tensor dqs = strided(dqkv.data(), sB, sN, sH, 1);
  const fs_tensor dks = strided(dqkv.data() + (N - 1) * sN + H * d, sB, -sN, sH, 1);
  const fs_tensor dvs = strided(dqkv.data() + 2 * H * d, sB, sN, sH, 1);
  const fs_tensor douts = strided(dout.data.data(), N * H * d, H * d, d, 1);
  ASSERT_EQ(fs_backward(&opt, &qs, &ks, &vs, &os, &lses, &douts, &dqs, &dks, &dvs), FS_OK) << fs_last_error();
  EXPECT_EQ(max_diff(from_api<float>(dqs), from_api<float>(dq.view)), 0.0);
  EXPECT_EQ(max_diff(from_api<float>(dks), from_api<float>(dk.view)), 0.0);
  EXPECT_EQ(max_diff(from_api<float>(dvs), from_api<float>(dv.view)), 0.0);
}

TEST(Capi, DefaultStages) {
  const Problem p = small_problem(false, true);
  std::vector<float> buf(size_t(p.B * p.Nq * p.Hq * p.d));
  const fs_tensor q = fs_contiguous(buf.data(), p.B, p.Nq, p.Hq, p.d), k = fs_contiguous(buf.data(), p.B, p.Nk, p.Hkv, p.d);
  const char *stage = nullptr, *variant = nullptr;
  fs_options o = fs_default_options();
  ASSERT_EQ(fs_resolve(&o, &q, &k, 0, &stage, &variant), FS_OK) << fs_last_error();
  EXPECT_STREQ(stage, "step2_online_softmax");
  EXPECT_STREQ(variant, "fa2");
  ASSERT_EQ(fs_resolve(&o, &q, &k, 1, &stage, &variant), FS_OK) << fs_last_error();
  EXPECT_STREQ(stage, "step2_online_softmax");
  EXPECT_STREQ(variant, "fa2");
  o.dtype = FS_FP64;
  ASSERT_EQ(fs_resolve(&o, &q, &k, 1, &stage, &variant), FS_OK) << fs_last_error();
  EXPECT_STREQ(stage, "step1_cpu_reference");
  o.dtype = FS_FP32;
  o.stage = "step2_online_softmax";  // named without a variant: its first variant that runs the call
  ASSERT_EQ(fs_resolve(&o, &q, &k, 0, &stage, &variant), FS_OK) << fs_last_error();
  EXPECT_STREQ(variant, "3pass");
  ASSERT_EQ(fs_resolve(&o, &q, &k, 1, &stage, &variant), FS_OK) << fs_last_error();
  EXPECT_STREQ(variant, "fa1");
}

// Every refusal: its status, and a message that names the problem.
TEST(Capi, EveryErrorIsAStatusAndAMessage) {
  const Problem p = small_problem(false, true);
  const Inputs in = random_inputs(p);
  auto q = to_api<float>(in.q), k = to_api<float>(in.k), v = to_api<float>(in.v), dout = to_api<float>(in.dout);
  auto o = output<float>(p.B, p.Nq, p.Hq, p.d), lse = output<float>(p.B, p.Nq, p.Hq, p.d, true);
  auto dq = output<float>(p.B, p.Nq, p.Hq, p.d), dk = output<float>(p.B, p.Nk, p.Hkv, p.d),
       dv = output<float>(p.B, p.Nk, p.Hkv, p.d);
  const fs_options good = options_of(p, FS_FP32);

  // forward with one thing changed: (what, expected status, a piece of the message)
  struct Case {
    const char* what;
    fs_status status;
    const char* message;
    std::function<void(fs_options&, fs_tensor&, fs_tensor&, fs_tensor&, fs_tensor&, fs_tensor&)> change;
  };
  const std::vector<Case> cases = {
      {"q data NULL", FS_INVALID_ARGUMENT, "q->data is NULL", [](auto&, auto& q, auto&, auto&, auto&, auto&) { q.data = nullptr; }},
      {"o data NULL", FS_INVALID_ARGUMENT, "o->data is NULL", [](auto&, auto&, auto&, auto&, auto& o, auto&) { o.data = nullptr; }},
      {"lse ndim 4", FS_INVALID_ARGUMENT, "lse has ndim 4, expected 3", [](auto&, auto&, auto&, auto&, auto&, auto& l) { l.ndim = 4; }},
      {"q ndim 3", FS_INVALID_ARGUMENT, "q has ndim 3, expected 4", [](auto&, auto& q, auto&, auto&, auto&, auto&) { q.ndim = 3; }},
      {"size 0", FS_INVALID_ARGUMENT, "every size must be positive", [](auto&, auto& q, auto&, auto&, auto&, auto&) { q.size[1] = 0; }},
      {"k batch", FS_INVALID_ARGUMENT, "k has batch 3, q 2", [](auto&, auto&, auto& k, auto&, auto&, auto&) { k.size[0] = 3; }},
      {"k head dim", FS_INVALID_ARGUMENT, "k has head dim 8, q 16", [](auto&, auto&, auto& k, auto&, auto&, auto&) { k.size[3] = 8; }},
      {"GQA", FS_INVALID_ARGUMENT, "not a multiple of k's 3", [](auto&, auto&, auto& k, auto& v, auto&, auto&) { k.size[2] = v.size[2] = 3; }},
      {"v length", FS_INVALID_ARGUMENT, "v has size [2, 28, 2, 16], expected [2, 29, 2, 16]", [](auto&, auto&, auto&, auto& v, auto&, auto&) { v.size[1] = 28; }},
      {"o heads", FS_INVALID_ARGUMENT, "o has size [2, 37, 2, 16], expected [2, 37, 4, 16]", [](auto&, auto&, auto&, auto&, auto& o, auto&) { o.size[2] = 2; }},
      {"lse length", FS_INVALID_ARGUMENT, "lse has size [2, 4, 29], expected [2, 4, 37]", [](auto&, auto&, auto&, auto&, auto&, auto& l) { l.size[2] = 29; }},
      {"o overlaps", FS_INVALID_ARGUMENT, "o is an output with stride 0 along dimension 1", [](auto&, auto&, auto&, auto&, auto& o, auto&) { o.stride[1] = 0; }},
      {"scale < 0", FS_INVALID_ARGUMENT, "softmax_scale must be positive and finite", [](auto& op, auto&, auto&, auto&, auto&, auto&) { op.softmax_scale = -1; }},
      {"scale NaN", FS_INVALID_ARGUMENT, "softmax_scale must be positive and finite", [](auto& op, auto&, auto&, auto&, auto&, auto&) { op.softmax_scale = NAN; }},
      {"dtype 9", FS_INVALID_ARGUMENT, "options->dtype is 9", [](auto& op, auto&, auto&, auto&, auto&, auto&) { op.dtype = fs_dtype(9); }},
      {"memory 5", FS_INVALID_ARGUMENT, "options->memory is 5", [](auto& op, auto&, auto&, auto&, auto&, auto&) { op.memory = fs_memory(5); }},
      {"host bf16", FS_UNSUPPORTED, "host memory takes fp32 or fp64", [](auto& op, auto&, auto&, auto&, auto&, auto&) { op.dtype = FS_BF16; }},
      {"unknown stage", FS_UNKNOWN_STAGE, "no stage named 'step9'", [](auto& op, auto&, auto&, auto&, auto&, auto&) { op.stage = "step9"; }},
      {"unknown variant", FS_UNKNOWN_STAGE, "step2_online_softmax has no variant 'fa3' (its variants: 3pass",
       [](auto& op, auto&, auto&, auto&, auto&, auto&) { op.stage = "step2_online_softmax", op.variant = "fa3"; }},
      {"variant alone", FS_INVALID_ARGUMENT, "options->variant 'fa2' needs options->stage",
       [](auto& op, auto&, auto&, auto&, auto&, auto&) { op.variant = "fa2"; }},
      {"fp64 on step 2", FS_UNSUPPORTED, "step2_online_softmax computes in fp32",
       [](auto& op, auto&, auto&, auto&, auto&, auto&) { op.dtype = FS_FP64, op.stage = "step2_online_softmax"; }},
      {"device memory", gpu_unavailable_reason().empty() ? FS_INVALID_ARGUMENT : FS_UNAVAILABLE,
       gpu_unavailable_reason().empty() ? "q->data points to" : "device memory needs the GPU stages",
       [](auto& op, auto&, auto&, auto&, auto&, auto&) { op.memory = FS_DEVICE, op.dtype = FS_BF16; }},
  };
  for (const Case& c : cases) {
    fs_options op = good;
    fs_tensor qv = q.view, kv = k.view, vv = v.view, ov = o.view, lv = lse.view;
    c.change(op, qv, kv, vv, ov, lv);
    EXPECT_EQ(fs_forward(&op, &qv, &kv, &vv, &ov, &lv), c.status) << c.what;
    const std::string msg = fs_last_error();
    EXPECT_EQ(msg.rfind("fs_forward: ", 0), 0u) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.message), std::string::npos) << c.what << ": '" << msg << "' lacks '" << c.message << "'";
  }

  // NULL arguments, one at a time
  EXPECT_EQ(fs_forward(nullptr, &q.view, &k.view, &v.view, &o.view, &lse.view), FS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fs_last_error()).find("options is NULL"), std::string::npos) << fs_last_error();
  const char* names[] = {"q is NULL", "k is NULL", "v is NULL", "o is NULL", "lse is NULL"};
  for (int i = 0; i < 5; ++i) {
    const fs_tensor* t[5] = {&q.view, &k.view, &v.view, &o.view, &lse.view};
    t[i] = nullptr;
    EXPECT_EQ(fs_forward(&good, t[0], t[1], t[2], t[3], t[4]), FS_INVALID_ARGUMENT) << names[i];
    EXPECT_NE(std::string(fs_last_error()).find(names[i]), std::string::npos) << fs_last_error();
  }
  const char* bnames[] = {"q is NULL", "k is NULL", "v is NULL", "o is NULL", "lse is NULL",
                          "dout is NULL", "dq is NULL", "dk is NULL", "dv is NULL"};
  for (int i = 0; i < 9; ++i) {
    const fs_tensor* t[9] = {&q.view, &k.view, &v.view, &o.view, &lse.view, &dout.view, &dq.view, &dk.view, &dv.view};
    t[i] = nullptr;
    EXPECT_EQ(fs_backward(&good, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]), FS_INVALID_ARGUMENT) << bnames[i];
    const std::string msg = fs_last_error();
    EXPECT_EQ(msg.rfind("fs_backward: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(bnames[i]), std::string::npos) << msg;
  }

  // the backward's own checks: the gradients' shapes, a variant without a backward
  fs_tensor dk_bad = dk.view;
  dk_bad.size[2] = 4;
  EXPECT_EQ(fs_backward(&good, &q.view, &k.view, &v.view, &o.view, &lse.view, &dout.view, &dq.view, &dk_bad, &dv.view),
            FS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fs_last_error()).find("dk has size [2, 29, 4, 16], expected [2, 29, 2, 16]"), std::string::npos)
      << fs_last_error();
  fs_options no_backward = good;
  no_backward.stage = "step2_online_softmax";
  no_backward.variant = "online";
  EXPECT_EQ(fs_backward(&no_backward, &q.view, &k.view, &v.view, &o.view, &lse.view, &dout.view, &dq.view, &dk.view, &dv.view),
            FS_UNSUPPORTED);
  EXPECT_NE(std::string(fs_last_error()).find("step2_online_softmax --variant online cannot run this call"), std::string::npos)
      << fs_last_error();
  const char *stage = nullptr, *variant = nullptr;
  EXPECT_EQ(fs_resolve(&good, &q.view, &k.view, 0, nullptr, &variant), FS_INVALID_ARGUMENT);
  EXPECT_EQ(fs_resolve(&good, &q.view, &k.view, 0, &stage, &variant), FS_OK);

  // a GPU stage with host pointers (a build with the GPU stages)
  bool gpu_stages = false;
  for (const Stage& s : stages()) gpu_stages = gpu_stages || s.gpu();
  if (gpu_stages) {
    fs_options op = good;
    op.stage = "step4_fused_pipelined";
    EXPECT_EQ(fs_forward(&op, &q.view, &k.view, &v.view, &o.view, &lse.view), FS_UNSUPPORTED);
    EXPECT_NE(std::string(fs_last_error()).find("runs on the GPU: it takes device pointers"), std::string::npos)
        << fs_last_error();
  }
}

// A packed variable-length batch ([1, total, H, d] views, cu_seqlens): the same values as each sequence run
// alone through fs_forward / fs_backward (fp64: step 1 both ways), empty sequences included; and in fp32 on
// the default stage. Its own errors say what is wrong.
TEST(Capi, VarlenIsEachSequenceAlone) {
  Problem p = small_problem(true, true);
  const Varlen vl = varlen_from_lengths({5, 0, 7, 3}, {9, 4, 7, 0});
  p.B = vl.batch();
  const Inputs in = random_packed_inputs(p, vl);  // [total, H, d] row-major: a contiguous [1, total, H, d] view
  const int64_t Hq = p.Hq, Hkv = p.Hkv, d = p.d, tq = vl.total_q(), tk = vl.total_k();
  auto buffer = [](const Tensor& t, int64_t H, int64_t d_) {
    Buffer<double> b;
    b.data.assign(t.data.begin(), t.data.end());
    b.view = fs_contiguous(b.data.data(), 1, int64_t(t.size()) / (H * d_), H, d_);
    return b;
  };
  auto q = buffer(in.q, Hq, d), k = buffer(in.k, Hkv, d), v = buffer(in.v, Hkv, d), dout = buffer(in.dout, Hq, d);
  auto o = output<double>(1, tq, Hq, d), lse = output<double>(1, tq, Hq, d, true);
  auto dq = output<double>(1, tq, Hq, d), dk = output<double>(1, tk, Hkv, d), dv = output<double>(1, tk, Hkv, d);
  const fs_options opt = options_of(p, FS_FP64);
  std::vector<int32_t> cq = vl.cu_seqlens_q, ck = vl.cu_seqlens_k;
  ASSERT_EQ(fs_forward_varlen(&opt, &q.view, &k.view, &v.view, cq.data(), ck.data(), int32_t(p.B), &o.view, &lse.view), FS_OK)
      << fs_last_error();
  ASSERT_EQ(fs_backward_varlen(&opt, &q.view, &k.view, &v.view, cq.data(), ck.data(), int32_t(p.B), &o.view, &lse.view,
                               &dout.view, &dq.view, &dk.view, &dv.view), FS_OK) << fs_last_error();
  // Sequence b alone: its rows of each packed view (an offset, the same strides).
  auto rows = [](const Buffer<double>& b, int64_t r0, int64_t n) {
    fs_tensor t = b.view;
    t.data = const_cast<double*>(b.data.data()) + r0 * t.stride[1];
    t.size[1] = n;
    return t;
  };
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t q0 = cq[b], k0 = ck[b], Lq = vl.len_q(b), Lk = vl.len_k(b);
    if (Lq == 0) continue;
    const fs_tensor qb = rows(q, q0, Lq), ob_packed = rows(o, q0, Lq), dqb_packed = rows(dq, q0, Lq);
    if (Lk == 0) {  // no keys: O = 0, LSE = -inf, dQ = 0
      for (int64_t i = 0; i < Lq * Hq * d; ++i) EXPECT_EQ(o.data[size_t(q0 * Hq * d + i)], 0.0) << "sequence " << b;
      for (int64_t h = 0; h < Hq; ++h) EXPECT_EQ(lse.data[size_t(h * tq + q0)], -INFINITY) << "sequence " << b;
      continue;
    }
    const fs_tensor kb = rows(k, k0, Lk), vb = rows(v, k0, Lk), dob = rows(dout, q0, Lq);
    auto ob = output<double>(1, Lq, Hq, d), lb = output<double>(1, Lq, Hq, d, true);
    auto dqb = output<double>(1, Lq, Hq, d), dkb = output<double>(1, Lk, Hkv, d), dvb = output<double>(1, Lk, Hkv, d);
    ASSERT_EQ(fs_forward(&opt, &qb, &kb, &vb, &ob.view, &lb.view), FS_OK) << fs_last_error();
    ASSERT_EQ(fs_backward(&opt, &qb, &kb, &vb, &ob.view, &lb.view, &dob, &dqb.view, &dkb.view, &dvb.view), FS_OK);
    EXPECT_LE(max_diff(from_api<double>(ob_packed), from_api<double>(ob.view)), 1e-12) << "O of sequence " << b;
    EXPECT_LE(max_diff(from_api<double>(dqb_packed), from_api<double>(dqb.view)), 1e-12) << "dQ of sequence " << b;
    EXPECT_LE(max_diff(from_api<double>(rows(dk, k0, Lk)), from_api<double>(dkb.view)), 1e-12) << "dK of sequence " << b;
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Lq; ++i)
        EXPECT_NEAR(lse.data[size_t(h * tq + q0 + i)], lb.data[size_t(h * Lq + i)], 1e-12) << "LSE of sequence " << b;
  }
  // fp32 on the default stage: it runs (the values are step 2's varlen tests' business)
  std::vector<float> qf(in.q.data), kf(in.k.data), vf(in.v.data), of(size_t(tq * Hq * d)), lf(size_t(Hq * tq));
  fs_tensor qv = fs_contiguous(qf.data(), 1, tq, Hq, d), kv = fs_contiguous(kf.data(), 1, tk, Hkv, d),
            vv = fs_contiguous(vf.data(), 1, tk, Hkv, d), ov = fs_contiguous(of.data(), 1, tq, Hq, d),
            lv = fs_contiguous_lse(lf.data(), 1, Hq, tq);
  const fs_options f32 = options_of(p, FS_FP32);
  EXPECT_EQ(fs_forward_varlen(&f32, &qv, &kv, &vv, cq.data(), ck.data(), int32_t(p.B), &ov, &lv), FS_OK) << fs_last_error();
  // errors
  EXPECT_EQ(fs_forward_varlen(&f32, &qv, &kv, &vv, cq.data(), ck.data(), 3, &ov, &lv), FS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fs_last_error()).find("cu_seqlens_q ends at"), std::string::npos) << fs_last_error();
  fs_tensor q2 = qv;
  q2.size[0] = 2;
  EXPECT_EQ(fs_forward_varlen(&f32, &q2, &kv, &vv, cq.data(), ck.data(), int32_t(p.B), &ov, &lv), FS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fs_last_error()).find("[1, total, H, d]"), std::string::npos) << fs_last_error();
  std::vector<int32_t> bad = cq;
  bad[2] = bad[1] - 1;  // decreasing
  EXPECT_EQ(fs_forward_varlen(&f32, &qv, &kv, &vv, bad.data(), ck.data(), int32_t(p.B), &ov, &lv), FS_INVALID_ARGUMENT);
  fs_options on_step3 = f32;
  on_step3.stage = "step1_cpu_reference";
  on_step3.dtype = FS_FP32;
  EXPECT_EQ(fs_forward_varlen(&on_step3, &qv, &kv, &vv, cq.data(), ck.data(), int32_t(p.B), &ov, &lv), FS_OK) << fs_last_error();
}

// Decoding from a KV cache on the host (step 1, fp64): a ragged cache gives each sequence what the dense call
// gives it on its own keys, and the same cache in shuffled pages (FlashAttention's layout, a block table) the
// same values; the checks of the arguments, the table included. (The GPU run: python/tests/test_torch.py.)
TEST(Capi, KvCacheIsEachSequenceOnItsKeys) {
  Problem p = small_problem(true, false);
  p.Nq = 3, p.Nk = 32;  // a capacity of 32 keys: 4 pages of 8
  p.input_pos = p.Nk - p.Nq;
  const Inputs in = random_inputs(p);
  auto q = to_api<double>(in.q), k = to_api<double>(in.k), v = to_api<double>(in.v);
  auto o = output<double>(p.B, p.Nq, p.Hq, p.d), lse = output<double>(p.B, p.Nq, p.Hq, p.d, true);
  const fs_options opt = options_of(p, FS_FP64);
  const std::vector<int32_t> lens = {20, 7};
  ASSERT_EQ(fs_forward_kvcache(&opt, &q.view, &k.view, &v.view, lens.data(), nullptr, 0, &o.view, &lse.view), FS_OK)
      << fs_last_error();
  for (int64_t b = 0; b < p.B; ++b) {  // sequence b alone: its queries against its first lens[b] keys
    auto rows = [&](const fs_tensor& t, int64_t n) {
      fs_tensor s_ = t;
      s_.data = static_cast<double*>(t.data) + b * t.stride[0];
      s_.size[0] = 1, s_.size[1] = n;
      return s_;
    };
    const fs_tensor qb = rows(q.view, p.Nq), kb = rows(k.view, lens[size_t(b)]), vb = rows(v.view, lens[size_t(b)]);
    auto ob = output<double>(1, p.Nq, p.Hq, p.d), lb = output<double>(1, p.Nq, p.Hq, p.d, true);
    ASSERT_EQ(fs_forward(&opt, &qb, &kb, &vb, &ob.view, &lb.view), FS_OK) << fs_last_error();
    EXPECT_LE(max_diff(from_api<double>(rows(o.view, p.Nq)), from_api<double>(ob.view)), 1e-12) << "sequence " << b;
  }
  // The same cache in pages of 8 keys: pool [pages, 8, Hkv, d], logical page n of sequence b at table[b][n].
  const int64_t P = 8, per_seq = p.Nk / P, pages = p.B * per_seq + 1;  // a spare page: page 0 is never used
  std::vector<double> kp(size_t(pages * P * p.Hkv * p.d), NAN), vp(kp.size(), NAN);
  std::vector<int32_t> table(size_t(p.B * per_seq));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t n = 0; n < per_seq; ++n) {
      const int64_t page = 1 + (n * p.B + b);  // interleaved: a sequence's pages are not neighbours
      table[size_t(b * per_seq + n)] = int32_t(page);
      const size_t row = size_t(p.Hkv * p.d);
      for (int64_t r = 0; r < P; ++r)
        for (size_t e = 0; e < row; ++e) {
          kp[size_t((page * P + r)) * row + e] = k.data[size_t((b * p.Nk + n * P + r)) * row + e];
          vp[size_t((page * P + r)) * row + e] = v.data[size_t((b * p.Nk + n * P + r)) * row + e];
        }
    }
  const fs_tensor kpv = fs_contiguous(kp.data(), pages, P, p.Hkv, p.d), vpv = fs_contiguous(vp.data(), pages, P, p.Hkv, p.d);
  auto op = output<double>(p.B, p.Nq, p.Hq, p.d), lp = output<double>(p.B, p.Nq, p.Hq, p.d, true);
  ASSERT_EQ(fs_forward_kvcache(&opt, &q.view, &kpv, &vpv, lens.data(), table.data(), int32_t(per_seq), &op.view, &lp.view),
            FS_OK) << fs_last_error();
  EXPECT_EQ(max_diff(from_api<double>(op.view), from_api<double>(o.view)), 0.0) << "paged against ragged";
  EXPECT_EQ(max_diff(from_api<double>(lp.view), from_api<double>(lse.view)), 0.0);

  // the checks
  std::vector<int32_t> bad = table;
  bad[1] = int32_t(pages);  // sequence 0's second page (keys 8 .. 15: within its 20)
  EXPECT_EQ(fs_forward_kvcache(&opt, &q.view, &kpv, &vpv, lens.data(), bad.data(), int32_t(per_seq), &op.view, &lp.view),
            FS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fs_last_error()).find("block_table[0][1] is 9, not a page of k_cache (0 .. 8)"), std::string::npos)
      << fs_last_error();
  bad = table;
  bad[3] = -1;  // sequence 0's fourth page (keys 24 .. 31: past its 20): never read
  EXPECT_EQ(fs_forward_kvcache(&opt, &q.view, &kpv, &vpv, lens.data(), bad.data(), int32_t(per_seq), &op.view, &lp.view),
            FS_OK) << fs_last_error();
  EXPECT_EQ(fs_forward_kvcache(&opt, &q.view, &kpv, &vpv, lens.data(), table.data(), 0, &op.view, &lp.view),
            FS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fs_last_error()).find("pages_per_seq must be positive"), std::string::npos) << fs_last_error();
  fs_tensor v_short = v.view;
  v_short.size[1] -= 1;
  EXPECT_EQ(fs_forward_kvcache(&opt, &q.view, &k.view, &v_short, lens.data(), nullptr, 0, &o.view, &lse.view),
            FS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fs_last_error()).find("v_cache has size"), std::string::npos) << fs_last_error();
  const std::vector<int32_t> too_long(size_t(p.B), int32_t(p.Nk + 1));
  EXPECT_EQ(fs_forward_kvcache(&opt, &q.view, &k.view, &v.view, too_long.data(), nullptr, 0, &o.view, &lse.view),
            FS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fs_last_error()).find("cache's capacity"), std::string::npos) << fs_last_error();
  fs_options on_step2 = options_of(p, FS_FP32, "step2_online_softmax");
  std::vector<float> qf(in.q.data), kf(in.k.data), vf(in.v.data), of(size_t(p.B * p.Nq * p.Hq * p.d)), lf(size_t(p.B * p.Hq * p.Nq));
  fs_tensor qv = fs_contiguous(qf.data(), p.B, p.Nq, p.Hq, p.d), kv = fs_contiguous(kf.data(), p.B, p.Nk, p.Hkv, p.d),
            vv = fs_contiguous(vf.data(), p.B, p.Nk, p.Hkv, p.d), ov = fs_contiguous(of.data(), p.B, p.Nq, p.Hq, p.d),
            lv = fs_contiguous_lse(lf.data(), p.B, p.Hq, p.Nq);
  EXPECT_EQ(fs_forward_kvcache(&on_step2, &qv, &kv, &vv, lens.data(), nullptr, 0, &ov, &lv), FS_UNSUPPORTED);
  EXPECT_NE(std::string(fs_last_error()).find("it reads no KV cache"), std::string::npos) << fs_last_error();
}

// The last error belongs to the thread that made the call, and a call that succeeds clears it.
TEST(Capi, LastErrorIsPerThread) {
  const fs_options o = fs_default_options();
  EXPECT_EQ(fs_forward(&o, nullptr, nullptr, nullptr, nullptr, nullptr), FS_INVALID_ARGUMENT);
  const std::string mine = fs_last_error();
  std::string theirs = "unset";
  std::thread([&] { theirs = fs_last_error(); }).join();
  EXPECT_EQ(theirs, "");
  EXPECT_EQ(std::string(fs_last_error()), mine);
  EXPECT_EQ(fs_version(), FS_VERSION);  // calls that cannot fail leave it as it is
  EXPECT_EQ(std::string(fs_last_error()), mine);
  EXPECT_GE(fs_stage_count(), 2);
  EXPECT_STREQ(fs_last_error(), "");
}

}  // namespace
}  // namespace fa
