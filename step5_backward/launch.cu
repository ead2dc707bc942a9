// FlashAttention, step by step — step 5: variants and runner (step5_backward/launch.cu)
//
// Two variants of the backward, each a few launches (prepare.cuh), in order (each needs the last):
//   deterministic (default)                              atomic (FlashAttention 2's single kernel)
//   preprocess  D = rowsum(dO * O)                       preprocess, then dQacc = 0 (memset)
//   dK/dV  grid ceil(Nk / Bc) * Hkv * B    } side by     dK/dV, which also adds dS K into dQacc (fp32)
//   dQ     grid ceil(Nq / Br) * Hq * B     } side        convert  dQ = scale * dQacc
// The deterministic variant has one writer per output element, so two runs give the same bits; the
// atomic one computes S and dP once instead of twice (5 products instead of 7), but its fp32 additions
// land in whatever order the blocks reach them. The forward is step 4's (make_forward), run in training
// mode: it writes O and the LSE the backward reads. Configurations and their names: configs.h.
// Score modifiers (core/score_mod.h) run in the deterministic configurations and the atomic variant's
// defaults, kernels compiled with kMods (one kernel per kind: step 4's mods_kind). With a bias, the dK/dV
// (or atomic) kernel writes dS_pre, which is dBias (device.cuh, DBiasRows): straight into dBias for a full
// bias; for a broadcast one, the deterministic variant stores every (b, h) into a fp32 [B, Hq, Nq, Nk]
// workspace summed afterwards in a fixed order, the atomic variant adds into dBias with atomics. A small
// kernel then sums (and zeroes what the mask hides: preprocess.cuh, finish_dbias_kernel); nothing of Nq x Nk
// size is cleared with a memset but the atomic variant's dBias.
#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/padded_head_dim.h"
#include "core/varlen.h"
#include "gpu/gpu_runner.h"
#include "gpu/gpu_types.h"
#include "gpu/platform.h"
#include "step4_fused_pipelined/fused.h"
#include "step5_backward/backward.h"
#include "step5_backward/configs.h"
#include "step5_backward/device.cuh"
#include "step5_backward/packed_rows.h"
#include "step5_backward/preprocess.cuh"
#include "step4_fused_pipelined/packed_batch.h"

namespace fa::step5 {

// Set-up of the configuration named `name` (prepare.cuh); instances_*.cu compile one per dtype and head dim.
template <typename T, int D>
std::function<void()> prepare_named(const std::string& name, const Problem& p, const BwdParams& bp);
template <typename T, int D>
std::function<void()> prepare_packed_named(const std::string& name, const Problem& p, const BwdParams& bp,
                                           const PackedRows& rows, int64_t total_q, int64_t total_k);

std::string with_forward(const std::string& variant, const std::string& forward) {
  return variant + "/fwd=" + forward;
}

namespace {

// "<variant>/fwd=<forward>" -> {variant, forward}; a plain variant runs step 4's default forward.
std::pair<std::string, std::string> split_variant(const std::string& v) {
  const size_t at = v.find("/fwd=");
  return at == std::string::npos ? std::make_pair(v, std::string("auto"))
                                 : std::make_pair(v.substr(0, at), v.substr(at + 5));
}

// The configuration name `variant` stands for at head dim D on compute capability cc_major.
template <int D>
std::string resolve(const std::string& variant, int cc_major) {
  using C = Configs<__nv_bfloat16, D>;
  if (variant == "deterministic") return C::Deterministic::name();
  if (variant == "atomic") return cc_major >= 12 ? C::AtomicSm120::name() : C::AtomicSm90::name();
  if (variant == "atomic-sm120") return C::AtomicSm120::name();
  return variant;
}

std::string config_of(const Problem& p, const std::string& variant, int cc_major) {
  const std::string v = split_variant(variant).first;
  return p.d == 64 ? resolve<64>(v, cc_major) : resolve<128>(v, cc_major);
}


// The launch closure of configuration `name` for p.
std::function<void()> prepare_config(const Problem& p, const std::string& name, const BwdParams& bp) {
  std::function<void()> f;
  dispatch_dtype</*kAllowFp32=*/false>(p.dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_head_dim(int(p.d), [&](auto dim) { f = prepare_named<T, decltype(dim)::value>(name, p, bp); });
  });
  return f;
}

// Step 4's runner state (Q, K, V, O, LSE on the device) plus dO, D and the three gradients (and the atomic
// variant's fp32 dQ accumulator, and with a bias dBias), all poisoned with NaN so that an element no kernel
// writes fails the check.
class BackwardRunner final : public GpuRunner {
 public:
  BackwardRunner(const Problem& p, const Inputs& in, const std::string& variant, const ForwardFactory& forward)
      : GpuRunner(p, in), forward_(forward(p, params_, split_variant(variant).second)) {
    if (in.dout.size() != in.q.size()) return;  // a forward-only run (no --backward): no dO to set up
    const size_t bytes = size_t(dtype_bytes(p.dtype));
    do_ = upload(in.dout, p.dtype);
    dsum_ = DeviceBuffer(size_t(p.B * p.Hq * p.Nq) * sizeof(float));
    dq_ = DeviceBuffer(in.q.size() * bytes);
    dk_ = DeviceBuffer(in.k.size() * bytes);
    dv_ = DeviceBuffer(in.v.size() * bytes);
    for (DeviceBuffer* b : {&dsum_, &dq_, &dk_, &dv_}) b->poison();
    const std::string config = config_of(p, variant, compute_capability_major());
    bool atomic = false;
    with_problem_config<Configs>(p, config, "step 5", [&](auto cfg) {
      if constexpr (decltype(cfg)::type::kAtomic) {
        atomic = true;
        dq_accum_ = DeviceBuffer(in.q.size() * sizeof(float));
        dq_accum_.poison();  // the memset inside the timed backward must clear it
      }
    });
    if (p.bias) {  // dBias, with the bias's shape; the deterministic variant sums a broadcast one from dS_pre
      bias_shape_ = in.bias.shape;
      dbias_ = DeviceBuffer(in.bias.size() * sizeof(float));
      dbias_.poison();
      const bool broadcast = bias_shape_[0] != p.B || bias_shape_[1] != p.Hq;
      dbias_adds_ = broadcast && atomic;  // the atomic kernel adds into dBias, zeroed first
      if (broadcast && !atomic) {         // poisoned: the finish reads only what the kernel wrote
        ds_pre_ = DeviceBuffer(size_t(p.B * p.Hq * p.Nq * p.Nk) * sizeof(float));
        ds_pre_.poison();
      }
    }
    float* ds_pre = ds_pre_.get() ? ds_pre_.as<float>() : dbias_.as<float>();  // nullptr without a bias
    backward_ = prepare_config(p, config, BwdParams{params_, do_.get(), dsum_.as<float>(), dq_.get(),
                                                    dq_accum_.as<float>(), dk_.get(), dv_.get(), ds_pre});
  }
  void run() override { forward_(); }
  void run_backward() override {
    if (!backward_) throw std::logic_error("step5_backward: run_backward() needs dO (a problem with backward set)");
    if (dbias_adds_) CUDA_CHECK(cudaMemsetAsync(dbias_.get(), 0, dbias_.bytes()));  // the atomics add into zeros
    backward_();
    // dBias: a broadcast bias's sum of dS_pre, or a full one's zeros where the mask hides a score (the
    // kernels skip those tiles); nothing to do without a mask.
    const bool masked = p_.causal || p_.window_left >= 0 || p_.window_right >= 0;
    if (p_.bias && !dbias_adds_ && (ds_pre_.get() || masked)) {
      const int64_t rows = bias_shape_[0] * bias_shape_[1] * p_.Nq;
      finish_dbias_kernel<float><<<unsigned(rows), kDBiasThreads>>>(
          ds_pre_.get() ? ds_pre_.as<float>() : dbias_.as<float>(), dbias_.as<float>(), score_mod_of(p_), int(p_.B),
          int(p_.Hq), int(bias_shape_[0]), int(bias_shape_[1]), int(p_.Nq), int(p_.Nk));
      CUDA_CHECK_LAUNCH();
    }
  }
  Outputs outputs() override {
    Outputs out = GpuRunner::outputs();  // synchronises
    if (backward_) {
      out.dq = download(dq_, p_.dtype, {p_.B, p_.Hq, p_.Nq, p_.d});
      out.dk = download(dk_, p_.dtype, {p_.B, p_.Hkv, p_.Nk, p_.d});
      out.dv = download(dv_, p_.dtype, {p_.B, p_.Hkv, p_.Nk, p_.d});
      if (p_.bias) out.dbias = download_f32(dbias_, bias_shape_);
    }
    return out;
  }

 private:
  std::function<void()> forward_, backward_;
  DeviceBuffer do_, dsum_, dq_, dq_accum_, dk_, dv_;
  DeviceBuffer dbias_, ds_pre_;      // with a bias: dBias; dS_pre [B, Hq, Nq, Nk] to sum (deterministic, broadcast)
  std::vector<int64_t> bias_shape_;  // [B or 1, Hq or 1, Nq, Nk]
  bool dbias_adds_ = false;          // the atomic kernel adds a broadcast bias's dS_pre into dBias
};

// A packed batch (core/varlen.h): step 4g's forward and the deterministic kernels over PackedRows
// (packed_rows.h), each pass one launch per kernel; the outputs in the packed layout, poisoned first.
class PackedBackwardRunner final : public GpuRunner {
 public:
  PackedBackwardRunner(const Problem& p, const Varlen& v, const Inputs& packed, const std::string& variant,
                       const PackedForwardFactory& forward)
      : GpuRunner(packed_grid_problem(p, v), with_a_row(p, packed)), total_q_(v.total_q()), total_k_(v.total_k()) {
    const std::vector<int32_t> words = step4::packed_words(v);
    cu_ = DeviceBuffer(words.size() * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpy(cu_.get(), words.data(), cu_.bytes(), cudaMemcpyHostToDevice));
    const PackedRows rows = step4::packed_batch_at<PackedRows>(cu_.as<int>(), v, p.Hq, p.Hkv);
    const auto [bwd, fwd] = split_variant(variant);
    forward_ = forward(p_, params_, rows, total_q_, total_k_, fwd);
    if (!p.backward) return;
    const Inputs in = with_a_row(p, packed);
    const size_t bytes = size_t(dtype_bytes(p.dtype));
    do_ = upload(in.dout, p.dtype);
    dsum_ = DeviceBuffer(in.q.size() / size_t(p.d) * sizeof(float));  // [Hq, total_q]
    dq_ = DeviceBuffer(in.q.size() * bytes);
    dk_ = DeviceBuffer(in.k.size() * bytes);
    dv_ = DeviceBuffer(in.v.size() * bytes);
    for (DeviceBuffer* b : {&dsum_, &dq_, &dk_, &dv_}) b->poison();
    const std::string config = config_of(p_, bwd, compute_capability_major());
    const BwdParams bp{params_, do_.get(), dsum_.as<float>(), dq_.get(), nullptr, dk_.get(), dv_.get(), nullptr};
    dispatch_dtype</*kAllowFp32=*/false>(p.dtype, [&](auto t) {
      dispatch_head_dim(int(p.d), [&](auto dim) {
        backward_ = prepare_packed_named<decltype(t), decltype(dim)::value>(config, p_, bp, rows, total_q_, total_k_);
      });
    });
  }
  void run() override { forward_(); }
  void run_backward() override {
    if (!backward_) throw std::logic_error("step5_backward: run_backward() needs dO (a problem with backward set)");
    backward_();
  }
  Outputs outputs() override {
    CUDA_CHECK(cudaDeviceSynchronize());
    Outputs out;
    out.o = download(o_, p_.dtype, {total_q_, p_.Hq, p_.d});
    out.lse = download_f32(lse_, {p_.Hq, total_q_});
    if (backward_) {
      out.dq = download(dq_, p_.dtype, {total_q_, p_.Hq, p_.d});
      out.dk = download(dk_, p_.dtype, {total_k_, p_.Hkv, p_.d});
      out.dv = download(dv_, p_.dtype, {total_k_, p_.Hkv, p_.d});
    }
    return out;
  }

 private:
  int64_t total_q_, total_k_;
  DeviceBuffer cu_, do_, dsum_, dq_, dk_, dv_;
  std::function<void()> forward_, backward_;
};

}  // namespace

// The zero-copy path (Stage::run_device): the forward is 4g's (step 4's run_device); the backward runs the
// packed kernels on the caller's tensors, from the O and LSE it gives, with D in stream-ordered memory.
std::string run_device(const Problem& p, const Varlen& v, const DeviceBatch& t, const std::string& variant) {
  const auto [bwd, fwd] = split_variant(variant);
  if (!p.backward) return step4::run_device(p, v, t, fwd);
  if (bwd != "deterministic") return "--variant " + bwd + " is not the packed kernels' (deterministic)";
  if (std::string why = step4::packed_device_refusal(p, v); !why.empty()) return why;
  const Problem grid = packed_grid_problem(p, v);
  const StreamBuffer words(step4::packed_words(v)), dsum(size_t(v.total_q() * p.Hq) * sizeof(float));
  AttnParams a = attn_params_of(grid);
  a.q = t.q, a.k = t.k, a.v = t.v, a.o = t.o, a.lse = t.lse;
  const BwdParams bp{a, t.dout, dsum.as<float>(), t.dq, nullptr, t.dk, t.dv, nullptr};
  const PackedRows rows = step4::packed_batch_at<PackedRows>(words.as<int>(), v, p.Hq, p.Hkv);
  const std::string config = config_of(grid, bwd, compute_capability_major());
  dispatch_dtype</*kAllowFp32=*/false>(p.dtype, [&](auto t_) {
    dispatch_head_dim(int(p.d), [&](auto dim) {
      prepare_packed_named<decltype(t_), decltype(dim)::value>(config, grid, bp, rows, v.total_q(), v.total_k())();
    });
  });
  return "";  // dsum and words are freed behind the kernels: the dQ kernel's stream joined the default one
}

std::unique_ptr<Runner> make_runner(const Problem& p, const Inputs& in, const std::string& variant,
                                    const ForwardFactory& forward) {
  return std::make_unique<BackwardRunner>(p, in, variant, forward);
}

std::unique_ptr<Runner> make_packed_runner(const Problem& p, const Varlen& v, const Inputs& packed,
                                           const std::string& variant, const PackedForwardFactory& forward) {
  return std::make_unique<PackedBackwardRunner>(p, v, packed, variant, forward);
}

Stage stage() {
  Stage s;
  s.name = "step5_backward";
  s.title = "backward: dK/dV + dQ kernels (deterministic) or one kernel with atomic dQ; TMA ring, mma.sync";
  s.platform = &tma_platform();  // every kernel loads through TMA: sm_90 and later (gpu/platform.h)
  s.has_backward = true;
  // A packed batch (core/varlen.h): step 4g's forward, then the deterministic kernels over the packed rows
  // (packed_rows.h), one launch each.
  s.has_varlen = true;
  s.make_varlen = [](const Problem& p, const Varlen& v, const Inputs& packed, const std::string& variant) -> std::unique_ptr<Runner> {
    return make_packed_runner(p, v, packed, variant, step4::make_packed_forward);
  };
  // "atomic-sm120" runs the atomic variant's sm_120 tiles on any GPU (the H100 test grid).
  s.variants = {"deterministic", "atomic", "atomic-sm120"};
  s.tuning_variants = config_names(Configs<__nv_bfloat16, 64>::All{});
  for (const std::string& n : config_names(Configs<__nv_bfloat16, 128>::All{}))
    if (std::find(s.tuning_variants.begin(), s.tuning_variants.end(), n) == s.tuning_variants.end())
      s.tuning_variants.push_back(n);
  // The default is deterministic (two runs, same bits), and tuning must not trade that for speed: the
  // atomic configurations (kAtomic, configs.h) are no candidates for step 6.
  s.tuning_exclusion = [](const std::string& config) {
    return is_atomic(config) ? std::string("atomic dQ: results vary from run to run, the default is deterministic")
                             : std::string();
  };
  s.forward_from = "step4_fused_pipelined";
  s.config_of = config_of;
  s.launch_shape = [](const Problem& p, const std::string& v) {
    Stage::LaunchShape shape;
    with_problem_config<Configs>(p, v, "step 5", [&](auto cfg) {
      using Cfg = typename decltype(cfg)::type;
      shape = {Cfg::kSmemBytes, Cfg::kThreads};
    });
    return shape;
  };
  s.has_score_mods = true;  // in the deterministic configurations and the atomic variant's defaults (configs.h)
  // What it runs (core/stage.h, Supports): as step 4, bf16 and fp16, d 64 and 128, dropout; the modifiers in
  // every variant and the configurations compiled with them (kHasMods). A "<variant>/fwd=<forward>" (step 6's
  // and 7's) is not declared: it is no variant of its own.
  s.supports.dtypes = {DType::bf16, DType::fp16};
  s.supports.head_dims = {64, 128};
  s.supports.score_mods = s.variants;
  for (const auto& names : {config_names_with_mods(Configs<__nv_bfloat16, 64>::All{}),
                            config_names_with_mods(Configs<__nv_bfloat16, 128>::All{})})
    for (const std::string& n : names)
      if (std::find(s.supports.score_mods.begin(), s.supports.score_mods.end(), n) == s.supports.score_mods.end())
        s.supports.score_mods.push_back(n);
  s.unsupported = [](const Problem& p, const std::string& v) {
    if (std::string why = step4::unsupported(p); !why.empty()) return why;  // its kernels' limits are step 4's
    if (!p.has_score_mods()) return std::string();
    if (!resolves_to_mods<Configs>(p, v, config_of, "step 5"))
      return std::string("score modifiers run in the deterministic configurations and the atomic variant's "
                         "defaults (atomic, atomic-sm120); the other atomic configurations are ablations compiled without them");
    // The training forward is step 4's, in the configuration after "/fwd=": it must take them too.
    const std::string fwd = split_variant(v).second;
    if (std::string why = step4::stage().unsupported(p, fwd); !why.empty()) return "its forward (step 4, " + fwd + "): " + why;
    return std::string();
  };
  s.make = [](const Problem& p, const Inputs& in, const std::string& v) -> std::unique_ptr<Runner> {
    return make_runner(p, in, v, step4::make_forward);
  };
  s.run_device = run_device;  // the packed kernels on the caller's tensors (the C interface's zero-copy path)
  return with_padded_head_dims(s);  // d = 32, 96, ...: on the next compiled head dim, zero-padded (core/padded_head_dim.h)
}

}  // namespace fa::step5
