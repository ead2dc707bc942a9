// FlashAttention, step by step — capi/flash_step.cpp
// The C interface (capi/flash_step.h) over the registry: checks a call's tensors and options, turns them
// into a Problem and the stages' Inputs, picks the stage and variant, runs it as the harness does
// (core/stage.h: make, run, run_backward, outputs) and writes the outputs back into the caller's views.
// Every failure becomes a status and a thread-local message at this boundary; nothing is thrown across it.
#include "capi/flash_step.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "capi/staging.h"
#include "capi/zero_copy.h"
#include "core/host_memory.h"
#include "core/varlen.h"
#include "harness/registry.h"

namespace fa::capi {
namespace {

thread_local std::string last_error;
thread_local int32_t last_copied = -1;  // fs_last_call_copied()

// A failure with the status the caller gets.
struct Failure : std::runtime_error {
  fs_status status;
  Failure(fs_status s, const std::string& what) : std::runtime_error(what), status(s) {}
};
[[noreturn]] void fail(fs_status s, const std::string& what) { throw Failure(s, what); }

void set_error(const char* call, const char* what) noexcept {
  try {
    last_error = std::string(call) + ": " + what;
  } catch (...) {  // no memory left even for the message: say the least
    last_error.clear();
  }
}

// Runs `body` and turns whatever it throws into a status and the message of fs_last_error().
template <typename F>
fs_status guarded(const char* call, F&& body) noexcept {
  try {
    body();
    last_error.clear();
    return FS_OK;
  } catch (const Failure& e) {
    set_error(call, e.what());
    return e.status;
  } catch (const std::bad_alloc&) {
    set_error(call, "out of host memory");
    return FS_OUT_OF_MEMORY;
  } catch (const std::exception& e) {  // a CUDA error says "out of memory" when the device has none left
    set_error(call, e.what());
    return std::strstr(e.what(), "out of memory") ? FS_OUT_OF_MEMORY : FS_RUNTIME_ERROR;
  } catch (...) {
    set_error(call, "an unknown error");
    return FS_RUNTIME_ERROR;
  }
}

std::string shape_of(const fs_tensor& t) {
  std::string s = "[";
  for (int k = 0; k < t.ndim; ++k) s += (k ? ", " : "") + std::to_string(t.size[k]);
  return s + "]";
}

// A tensor argument: present, of the right rank, with positive sizes; an output with no zero stride along
// a dimension of size > 1 (its elements would overlap).
const fs_tensor& tensor_arg(const fs_tensor* t, const char* name, int ndim, bool output) {
  if (!t) fail(FS_INVALID_ARGUMENT, std::string(name) + " is NULL");
  if (!t->data) fail(FS_INVALID_ARGUMENT, std::string(name) + "->data is NULL");
  if (t->ndim != ndim)
    fail(FS_INVALID_ARGUMENT, std::string(name) + " has ndim " + std::to_string(t->ndim) + ", expected " +
                                  std::to_string(ndim) + (ndim == 4 ? " ([B, N, H, d])" : " ([B, H, Nq])"));
  for (int k = 0; k < ndim; ++k) {
    if (t->size[k] <= 0)
      fail(FS_INVALID_ARGUMENT, std::string(name) + " has size " + shape_of(*t) + ": every size must be positive");
    if (output && t->size[k] > 1 && t->stride[k] == 0)
      fail(FS_INVALID_ARGUMENT, std::string(name) + " is an output with stride 0 along dimension " +
                                    std::to_string(k) + ": its elements would overlap");
  }
  return *t;
}

// `t` must have exactly the sizes `want` (described by `from`, e.g. "q's [B, Nq, Hq, d]").
void same_shape(const fs_tensor& t, const char* name, std::vector<int64_t> want, const std::string& from) {
  fs_tensor w{};
  w.ndim = int32_t(want.size());
  for (size_t k = 0; k < want.size(); ++k) w.size[k] = want[k];
  for (size_t k = 0; k < want.size(); ++k)
    if (t.size[k] != want[k])
      fail(FS_INVALID_ARGUMENT, std::string(name) + " has size " + shape_of(t) + ", expected " + shape_of(w) + " (" +
                                    from + ")");
}

std::string names_of(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& n : v) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::string stage_names(fs_memory m) {
  std::vector<std::string> v;
  for (const Stage& s : stages())
    if (s.gpu() == (m == FS_DEVICE)) v.push_back(s.name);
  return names_of(v);
}

// Why variant v of s cannot run p ("" when it can): the stage's own refusal, or what its declaration
// (core/stage.h, Supports) leaves out.
std::string why_not(const Stage& s, const Problem& p, const std::string& v) {
  if (p.backward && !s.has_backward) return "it has no backward pass";
  if (p.has_kv_cache() && !s.has_kv_cache) return "it reads no KV cache (step 4's split-KV kernel and step 1 do)";
  if (std::string why = s.unsupported(p, v); !why.empty()) return why;
  if (!declares(s, p, v)) {
    const Supports& d = s.supports;
    std::vector<std::string> dtypes, dims;
    for (DType t : d.dtypes) dtypes.push_back(dtype_name(t));
    for (int64_t x : d.head_dims) dims.push_back(std::to_string(x));
    if (std::find(d.dtypes.begin(), d.dtypes.end(), p.dtype) == d.dtypes.end())
      return std::string("dtype ") + dtype_name(p.dtype) + " (it takes " + names_of(dtypes) + ")";
    if (!d.head_dims.empty() && std::find(d.head_dims.begin(), d.head_dims.end(), p.d) == d.head_dims.end())
      return "head dim " + std::to_string(p.d) + " (it takes " + names_of(dims) + ")";
    return "variant " + v + " has no backward pass";
  }
  return "";
}

// One call, checked and resolved: the problem, and the stage and variant that run it.
struct Plan {
  Problem p;
  fs_dtype dtype = FS_FP32;
  fs_memory memory = FS_HOST;
  const Stage* stage = nullptr;
  std::string variant;
  bool fp64 = false;  // step 1's fp64 oracle (reference_oracle().exact), not a stage's Runner
};

constexpr const char* kReference = "step1_cpu_reference";
constexpr const char* kTuner = "step6_autotune";  // times candidates on its first call: named, never a default

// The default call runs the memory kind's latest stage that takes it (the latest is the fastest), in its
// default variant, except where another variant of it is faster: step 2's fa2 (on 2 cores, B = 1, H = 4,
// N = 512, d = 64, fp32: 22 ms forward, 36 ms backward, where its default 3pass takes 33 ms and step 1 135 ms).
std::vector<std::string> default_variants(const Stage& s) {
  std::vector<std::string> v = s.variants;
  if (s.name == "step2_online_softmax") v.insert(v.begin(), "fa2");
  return v;
}

void check_memory(const Plan& pl, const fs_tensor& t, const char* name);  // below

// Checks options, q and k (v, the outputs and the gradients are checked against them by the caller) and
// picks the stage and variant.
// `cache`, if given, adds a KV cache's lengths and page size to the problem before it is checked.
// `varlen`: a packed batch, which only a stage with a varlen path runs (Stage::has_varlen).
Plan plan_call(const fs_options* o, const fs_tensor* q_arg, const fs_tensor* k_arg, bool backward,
               const std::function<void(Problem&)>& cache = {}, bool varlen = false) {
  auto why_not = [varlen](const Stage& s, const Problem& p, const std::string& v) -> std::string {
    if (varlen && !s.has_varlen) return "it has no varlen path (steps 1, 2, 4, 5 and 7 have)";
    return capi::why_not(s, p, v);
  };
  if (!o) fail(FS_INVALID_ARGUMENT, "options is NULL (fs_default_options() gives the defaults)");
  const fs_tensor& q = tensor_arg(q_arg, "q", 4, false);
  const fs_tensor& k = tensor_arg(k_arg, "k", 4, false);
  Plan pl;
  if (o->memory != FS_HOST && o->memory != FS_DEVICE)
    fail(FS_INVALID_ARGUMENT, "options->memory is " + std::to_string(int(o->memory)) + ", not FS_HOST or FS_DEVICE");
  if (o->dtype != FS_FP32 && o->dtype != FS_FP64 && o->dtype != FS_FP16 && o->dtype != FS_BF16)
    fail(FS_INVALID_ARGUMENT, "options->dtype is " + std::to_string(int(o->dtype)) + ", not one of fs_dtype's");
  pl.memory = o->memory;
  pl.dtype = o->dtype;
  if (pl.memory == FS_HOST && pl.dtype != FS_FP32 && pl.dtype != FS_FP64)
    fail(FS_UNSUPPORTED, std::string("host memory takes fp32 or fp64 (the CPU stages), not ") + dtype_str(pl.dtype) +
                             "; bf16 and fp16 are for device memory (the GPU stages)");
  if (pl.memory == FS_DEVICE && pl.dtype == FS_FP64)
    fail(FS_UNSUPPORTED, "device memory takes bf16, fp16 or fp32 (the GPU stages), not fp64; fp64 is step 1's, on the host");

  Problem& p = pl.p;
  p.B = q.size[0];
  p.Nq = q.size[1];
  p.Hq = q.size[2];
  p.d = q.size[3];
  p.Nk = k.size[1];
  p.Hkv = k.size[2];
  if (k.size[0] != p.B) fail(FS_INVALID_ARGUMENT, "k has batch " + std::to_string(k.size[0]) + ", q " + std::to_string(p.B));
  if (k.size[3] != p.d)
    fail(FS_INVALID_ARGUMENT, "k has head dim " + std::to_string(k.size[3]) + ", q " + std::to_string(p.d));
  if (p.Hq % p.Hkv != 0)
    fail(FS_INVALID_ARGUMENT, "q's " + std::to_string(p.Hq) + " heads are not a multiple of k's " +
                                  std::to_string(p.Hkv) + " (grouped-query attention: Hkv divides Hq)");
  p.causal = o->causal != 0;
  p.input_pos = p.Nk - p.Nq;  // bottom-right, as flash_attn_func
  if (o->softmax_scale == 0) {
    p.scale = float(1.0 / std::sqrt(double(p.d)));
  } else {
    if (!(o->softmax_scale > 0 && std::isfinite(o->softmax_scale)))
      fail(FS_INVALID_ARGUMENT, "options->softmax_scale must be positive and finite, or 0 for 1/sqrt(d) (got " +
                                    std::to_string(o->softmax_scale) + ")");
    p.scale = float(o->softmax_scale);
  }
  p.dtype = pl.dtype == FS_BF16 ? DType::bf16 : pl.dtype == FS_FP16 ? DType::fp16 : DType::fp32;
  p.backward = backward;
  if (cache) cache(p);
  try {
    p.validate();
  } catch (const std::invalid_argument& e) {
    fail(FS_INVALID_ARGUMENT, e.what());
  }

  if (pl.memory == FS_DEVICE) {
    if (const std::string why = gpu_unavailable_reason(); !why.empty())
      fail(FS_UNAVAILABLE, "device memory needs the GPU stages, and " + why);
    check_memory(pl, *q_arg, "q");  // pointers in the wrong memory: said before which stage would take the call
    check_memory(pl, *k_arg, "k");
  }

  // The stage: the one named, or the first of the memory kind's stages, latest (fastest) first, that runs p.
  pl.fp64 = pl.dtype == FS_FP64;
  const std::string variant = o->variant ? o->variant : "";
  if (o->stage) {
    const std::string name = o->stage;
    for (const Stage& s : stages())
      if (s.name == name) pl.stage = &s;
    if (!pl.stage)
      fail(FS_UNKNOWN_STAGE, "no stage named '" + name + "' in this build (host: " + stage_names(FS_HOST) +
                                 "; device: " + (stage_names(FS_DEVICE).empty() ? gpu_unavailable_reason() : stage_names(FS_DEVICE)) + ")");
    const Stage& s = *pl.stage;
    if (s.gpu() != (pl.memory == FS_DEVICE))
      fail(FS_UNSUPPORTED, s.name + (s.gpu() ? " runs on the GPU: it takes device pointers (FS_DEVICE); host memory goes to "
                                             : " runs on the CPU: it takes host pointers (FS_HOST); device memory goes to ") +
                               stage_names(s.gpu() ? FS_HOST : FS_DEVICE));
    if (pl.fp64 && s.name != kReference)
      fail(FS_UNSUPPORTED, s.name + " computes in fp32: fp64 is step 1's reference (" + kReference + ")");
    if (!variant.empty()) {
      bool known = false;
      for (const auto* list : {&s.variants, &s.tuning_variants})
        known = known || std::find(list->begin(), list->end(), variant) != list->end();
      if (!known)
        fail(FS_UNKNOWN_STAGE, s.name + " has no variant '" + variant + "'" +
                                   (s.variants.empty() ? " (it has none)" : " (its variants: " + names_of(s.variants) + ")"));
    }
    if (s.platform)
      if (const std::string why = s.platform->unavailable_reason(); !why.empty())
        fail(FS_UNAVAILABLE, s.name + " cannot run here: " + why);
    if (pl.fp64) return pl;  // the oracle: every problem, no variants
    if (!variant.empty()) {
      if (const std::string why = why_not(s, p, variant); !why.empty())
        fail(FS_UNSUPPORTED, s.name + " --variant " + variant + " cannot run this call: " + why);
      pl.variant = variant;
      return pl;
    }
    if (s.variants.empty()) {
      if (const std::string why = why_not(s, p, ""); !why.empty())
        fail(FS_UNSUPPORTED, s.name + " cannot run this call: " + why);
      return pl;
    }
    for (const std::string& v : s.variants)
      if (why_not(s, p, v).empty()) {
        pl.variant = v;
        return pl;
      }
    fail(FS_UNSUPPORTED, s.name + " cannot run this call: " + why_not(s, p, s.variants[0]));
  }
  if (!variant.empty()) fail(FS_INVALID_ARGUMENT, "options->variant '" + variant + "' needs options->stage");
  if (pl.fp64) {
    pl.stage = &find_stage(kReference);
    return pl;
  }
  std::string reasons;
  // Latest first; a packed batch goes first to a stage with a scheduler of its own (one launch, Stage::make_varlen:
  // steps 7, 5 and 4), before the stages that loop over its sequences, and device memory first to a stage with a
  // zero-copy path (Stage::run_device: steps 7, 5 and 4), which runs on the caller's tensors where the others
  // copy them through the host (17x a tiny GPT's step time, python/examples/tiny_gpt).
  auto first = [&](const Stage& s) {
    return (varlen && s.has_varlen && s.make_varlen) || (pl.memory == FS_DEVICE && s.run_device);
  };
  std::vector<const Stage*> order;
  for (int pass = 0; pass < 2; ++pass)
    for (auto it = stages().rbegin(); it != stages().rend(); ++it)
      if (first(*it) == (pass == 0)) order.push_back(&*it);
  for (const Stage* candidate : order) {
    const Stage& s = *candidate;
    if (s.gpu() != (pl.memory == FS_DEVICE) || s.name == kTuner) continue;
    std::string why;
    if (s.platform) why = s.platform->unavailable_reason();
    if (why.empty() && s.variants.empty()) why = why_not(s, p, "");
    if (why.empty() && s.variants.empty()) {
      pl.stage = &s;
      return pl;
    }
    for (const std::string& v : default_variants(s)) {
      if (!why.empty()) break;
      if (why_not(s, p, v).empty()) {
        pl.stage = &s;
        pl.variant = v;
        return pl;
      }
    }
    if (why.empty()) why = why_not(s, p, s.variants[0]);
    reasons += (reasons.empty() ? "" : "; ") + s.name + ": " + why;
  }
  fail(FS_UNSUPPORTED, "no " + std::string(pl.memory == FS_DEVICE ? "GPU" : "CPU") + " stage runs this call (" + reasons + ")");
}

// Checks that a tensor of the call lives where options->memory says.
void check_memory(const Plan& pl, const fs_tensor& t, const char* name) {
  if (pl.memory != FS_DEVICE) return;
  if (const std::string why = device_pointer_problem(t.data); !why.empty())
    fail(FS_INVALID_ARGUMENT, std::string(name) + "->data points to " + why + ", but options->memory is FS_DEVICE");
}

// Refuses a host run that would not fit, before anything is allocated (as the command line does).
void check_host_memory(const Plan& pl) {
  const Problem& p = pl.p;
  const double staging = (input_elements(p) + output_elements(p)) * sizeof(float);
  double run = output_elements(p) * sizeof(float);
  if (pl.fp64) run = reference_oracle().host_bytes ? reference_oracle().host_bytes(p) : run;
  else if (pl.stage->host_bytes) run += pl.stage->host_bytes(p, pl.variant);
  try {
    require_host_memory(staging + run, pl.stage->name + " on this call");
  } catch (const std::runtime_error& e) {
    fail(FS_OUT_OF_MEMORY, e.what());
  }
}

// Runs the plan on inputs `in`: the fp64 oracle, or the stage's Runner as the harness runs it.
template <typename Write>
void run_plan(const Plan& pl, const Inputs& in, Write&& write) {
  if (pl.fp64) {
    write(reference_oracle().exact(pl.p, in));
    return;
  }
  std::unique_ptr<Runner> runner = pl.stage->make(pl.p, in, pl.variant);
  runner->run();
  if (pl.p.backward) runner->run_backward();
  write(runner->outputs());
}

// v, o and the LSE of a call, checked against q's and k's shapes: the forward writes o and the LSE, the
// backward reads them.
struct VOLse {
  const fs_tensor &v, &o, &lse;
};
// o [B, Nq, Hq, d] and the LSE [B, Hq, Nq] of a call, checked against q's shape.
std::pair<const fs_tensor&, const fs_tensor&> o_lse(const Plan& pl, const fs_tensor* o_arg, const fs_tensor* lse_arg,
                                                    bool written) {
  const Problem& p = pl.p;
  const fs_tensor& out = tensor_arg(o_arg, "o", 4, written);
  same_shape(out, "o", {p.B, p.Nq, p.Hq, p.d}, "q's [B, Nq, Hq, d]");
  const fs_tensor& lse = tensor_arg(lse_arg, "lse", 3, written);
  same_shape(lse, "lse", {p.B, p.Hq, p.Nq}, "[B, Hq, Nq] of q's");
  return {out, lse};
}
VOLse v_o_lse(const Plan& pl, const fs_tensor* v_arg, const fs_tensor* o_arg, const fs_tensor* lse_arg, bool written) {
  const Problem& p = pl.p;
  const fs_tensor& v = tensor_arg(v_arg, "v", 4, false);
  same_shape(v, "v", {p.B, p.Nk, p.Hkv, p.d}, "k's [B, Nk, Hkv, d]");
  const auto [out, lse] = o_lse(pl, o_arg, lse_arg, written);
  return {v, out, lse};
}

// A device call on the caller's tensors where the stage has a zero-copy path that takes it (capi/zero_copy.h):
// true once queued (fs_last_call_copied() then says 0); false when it must be copied through the host.
bool zero_copy(const Plan& pl, const Varlen& v, const CallTensors& t) {
  last_copied = pl.memory == FS_DEVICE ? 1 : -1;
  if (pl.memory != FS_DEVICE || pl.fp64 || !run_zero_copy(*pl.stage, pl.variant, pl.p, v, pl.dtype, t)) return false;
  last_copied = 0;
  return true;
}

// Every tensor of the call where options->memory says.
void check_memories(const Plan& pl, std::initializer_list<std::pair<const fs_tensor*, const char*>> tensors) {
  for (const auto& [t, name] : tensors) check_memory(pl, *t, name);
}

// A host run's memory, then Q, K and V gathered for the stage (the copy path).
Inputs gather_qkv(const Plan& pl, const fs_tensor& q, const fs_tensor& k, const fs_tensor& v) {
  if (pl.memory == FS_HOST) check_host_memory(pl);
  Inputs in;
  in.q = gather_bnhd(q, pl.dtype, pl.memory);
  in.k = gather_bnhd(k, pl.dtype, pl.memory);
  in.v = gather_bnhd(v, pl.dtype, pl.memory);
  return in;
}

void forward(const fs_options* o, const fs_tensor* q_arg, const fs_tensor* k_arg, const fs_tensor* v_arg,
             const fs_tensor* o_arg, const fs_tensor* lse_arg) {
  const Plan pl = plan_call(o, q_arg, k_arg, false);
  const fs_tensor &q = *q_arg, &k = *k_arg;
  const VOLse t = v_o_lse(pl, v_arg, o_arg, lse_arg, /*written=*/true);
  check_memories(pl, {{&q, "q"}, {&k, "k"}, {&t.v, "v"}, {&t.o, "o"}, {&t.lse, "lse"}});
  if (zero_copy(pl, dense_as_packed(pl.p), {&q, &k, &t.v, &t.o, &t.lse})) return;
  const Inputs in = gather_qkv(pl, q, k, t.v);
  run_plan(pl, in, [&](const auto& res) {
    scatter_bnhd(res.o, t.o, pl.dtype, pl.memory);
    scatter_lse(res.lse, t.lse, pl.memory);
  });
  if (pl.memory == FS_DEVICE) device_synchronize();
}

void backward(const fs_options* o, const fs_tensor* q_arg, const fs_tensor* k_arg, const fs_tensor* v_arg,
              const fs_tensor* o_arg, const fs_tensor* lse_arg, const fs_tensor* do_arg, const fs_tensor* dq_arg,
              const fs_tensor* dk_arg, const fs_tensor* dv_arg) {
  const Plan pl = plan_call(o, q_arg, k_arg, true);
  const Problem& p = pl.p;
  const fs_tensor &q = *q_arg, &k = *k_arg;
  const VOLse t = v_o_lse(pl, v_arg, o_arg, lse_arg, /*written=*/false);
  const fs_tensor& dout = tensor_arg(do_arg, "dout", 4, false);
  same_shape(dout, "dout", {p.B, p.Nq, p.Hq, p.d}, "q's [B, Nq, Hq, d]");
  const fs_tensor& dq = tensor_arg(dq_arg, "dq", 4, true);
  same_shape(dq, "dq", {p.B, p.Nq, p.Hq, p.d}, "q's [B, Nq, Hq, d]");
  const fs_tensor& dk = tensor_arg(dk_arg, "dk", 4, true);
  same_shape(dk, "dk", {p.B, p.Nk, p.Hkv, p.d}, "k's [B, Nk, Hkv, d]");
  const fs_tensor& dv = tensor_arg(dv_arg, "dv", 4, true);
  same_shape(dv, "dv", {p.B, p.Nk, p.Hkv, p.d}, "k's [B, Nk, Hkv, d]");
  check_memories(pl, {{&q, "q"}, {&k, "k"}, {&t.v, "v"}, {&t.o, "o"}, {&t.lse, "lse"}, {&dout, "dout"}, {&dq, "dq"},
                      {&dk, "dk"}, {&dv, "dv"}});
  if (zero_copy(pl, dense_as_packed(pl.p), {&q, &k, &t.v, &t.o, &t.lse, &dout, &dq, &dk, &dv})) return;
  Inputs in = gather_qkv(pl, q, k, t.v);
  in.dout = gather_bnhd(dout, pl.dtype, pl.memory);
  run_plan(pl, in, [&](const auto& res) {
    scatter_bnhd(res.dq, dq, pl.dtype, pl.memory);
    scatter_bnhd(res.dk, dk, pl.dtype, pl.memory);
    scatter_bnhd(res.dv, dv, pl.dtype, pl.memory);
  });
  if (pl.memory == FS_DEVICE) device_synchronize();
}

// Decoding from a KV cache (fs_forward_kvcache): the pages gathered into the dense cache [B, Hkv, Nk, d]
// (Nk = pages_per_seq * page_size) a stage takes; a sequence's pages past its length are not read.
Tensor unpage(const Tensor& pool, const int32_t* table, int64_t B, int64_t pages_per_seq, const Problem& p) {
  const int64_t pages = pool.shape[0], Hkv = pool.shape[1], P = pool.shape[2], d = pool.shape[3];
  Tensor dense({B, Hkv, pages_per_seq * P, d});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n * P < p.kv_len(b); ++n) {
      const int64_t page = table[b * pages_per_seq + n];
      if (page < 0 || page >= pages)
        fail(FS_INVALID_ARGUMENT, "block_table[" + std::to_string(b) + "][" + std::to_string(n) + "] is " +
                                      std::to_string(page) + ", not a page of k_cache (0 .. " + std::to_string(pages - 1) +
                                      "), and sequence " + std::to_string(b) + " holds " + std::to_string(p.kv_len(b)) + " keys");
      for (int64_t h = 0; h < Hkv; ++h)
        std::copy_n(pool.data.begin() + ((page * Hkv + h) * P) * d, P * d,
                    dense.data.begin() + ((b * Hkv + h) * pages_per_seq * P + n * P) * d);
    }
  return dense;
}

void forward_kvcache(const fs_options* o, const fs_tensor* q_arg, const fs_tensor* kc_arg, const fs_tensor* vc_arg,
                     const int32_t* cache_seqlens, const int32_t* block_table, int32_t pages_per_seq,
                     const fs_tensor* o_arg, const fs_tensor* lse_arg) {
  const fs_tensor& q = tensor_arg(q_arg, "q", 4, false);
  const fs_tensor& kc = tensor_arg(kc_arg, "k_cache", 4, false);
  const fs_tensor& vc = tensor_arg(vc_arg, "v_cache", 4, false);
  same_shape(vc, "v_cache", {kc.size[0], kc.size[1], kc.size[2], kc.size[3]}, "k_cache's");
  const bool paged = block_table != nullptr;
  if (paged && pages_per_seq <= 0)
    fail(FS_INVALID_ARGUMENT, "pages_per_seq must be positive with a block table (got " + std::to_string(pages_per_seq) + ")");
  const int64_t B = q.size[0], P = paged ? kc.size[1] : 0;
  fs_tensor k_dense = kc;  // the dense cache's shape [B, Nk, Hkv, d], which the plan reads
  if (paged) k_dense.size[0] = B, k_dense.size[1] = int64_t(pages_per_seq) * P;
  std::vector<int64_t> lens;
  if (cache_seqlens) lens.assign(cache_seqlens, cache_seqlens + B);
  const Plan pl = plan_call(o, &q, &k_dense, false, [&](Problem& p) {
    p.cache_seqlens = lens;
    // The stage keeps the cache in pages of its own size where the kernel's tiles divide the caller's (128
    // keys: both head dims' decode tiles), otherwise contiguous; the values are the same.
    if (paged && P % 128 == 0 && o && o->memory == FS_DEVICE) p.page_size = P;
    if (paged && lens.empty()) p.cache_seqlens.assign(size_t(B), p.Nk);  // a table: the cache is a KV cache
  });
  const Problem& p = pl.p;
  const auto [out, lse] = o_lse(pl, o_arg, lse_arg, /*written=*/true);
  // K and V gathered as they lie: paged, [pages, Hkv, P, d] (a page as a batch entry), then unpaged.
  check_memories(pl, {{&q, "q"}, {&kc, "k_cache"}, {&vc, "v_cache"}, {&out, "o"}, {&lse, "lse"}});
  last_copied = pl.memory == FS_DEVICE ? 1 : -1;  // a KV cache is gathered into the stage's own (docs/interface.md)
  Inputs in = gather_qkv(pl, q, kc, vc);
  if (paged) {
    in.k = unpage(in.k, block_table, B, pages_per_seq, p);
    in.v = unpage(in.v, block_table, B, pages_per_seq, p);
  }
  run_plan(pl, in, [&](const auto& res) {
    scatter_bnhd(res.o, out, pl.dtype, pl.memory);
    scatter_lse(res.lse, lse, pl.memory);
  });
  if (pl.memory == FS_DEVICE) device_synchronize();
}

// ---- packed variable-length batches (core/varlen.h): [1, total, H, d] views (capi/staging.h) ----
void varlen(const fs_options* o, const fs_tensor* q_arg, const fs_tensor* k_arg, const fs_tensor* v_arg,
            const int32_t* cu_q, const int32_t* cu_k, int32_t batch, const fs_tensor* o_arg, const fs_tensor* lse_arg,
            const fs_tensor* do_arg, const fs_tensor* dq_arg, const fs_tensor* dk_arg, const fs_tensor* dv_arg) {
  const bool backward = do_arg != nullptr || dq_arg != nullptr || dk_arg != nullptr || dv_arg != nullptr;
  const fs_tensor& q = tensor_arg(q_arg, "q", 4, false);
  const fs_tensor& k = tensor_arg(k_arg, "k", 4, false);
  if (q.size[0] != 1 || k.size[0] != 1)
    fail(FS_INVALID_ARGUMENT, "a packed batch's q and k are [1, total, H, d] (the sequences end to end), not " +
                                  shape_of(q.size[0] == 1 ? k : q));
  if (!cu_q || !cu_k) fail(FS_INVALID_ARGUMENT, "cu_seqlens_q and cu_seqlens_k must both be given");
  if (batch <= 0) fail(FS_INVALID_ARGUMENT, "batch must be positive (got " + std::to_string(batch) + ")");
  Varlen vl;
  try {
    vl = make_varlen(std::vector<int32_t>(cu_q, cu_q + batch + 1), std::vector<int32_t>(cu_k, cu_k + batch + 1));
  } catch (const std::invalid_argument& e) {
    fail(FS_INVALID_ARGUMENT, e.what());
  }
  if (vl.total_q() != q.size[1] || vl.total_k() != k.size[1])
    fail(FS_INVALID_ARGUMENT, "cu_seqlens_q ends at " + std::to_string(vl.total_q()) + " and cu_seqlens_k at " +
                                  std::to_string(vl.total_k()) + ", but q has " + std::to_string(q.size[1]) +
                                  " rows and k " + std::to_string(k.size[1]));
  // The plan sees the packed batch as a kernel's grid would: B sequences of the longest lengths.
  fs_tensor qd = q, kd = k;
  qd.size[0] = kd.size[0] = batch;
  qd.size[1] = std::max<int64_t>(1, vl.max_seqlen_q), kd.size[1] = std::max<int64_t>(1, vl.max_seqlen_k);
  const Plan pl = plan_call(o, &qd, &kd, backward, {}, /*varlen=*/true);
  const Problem& p = pl.p;
  try {
    validate_varlen_problem(p, vl);
  } catch (const std::invalid_argument& e) {
    fail(FS_INVALID_ARGUMENT, e.what());
  }
  const fs_tensor& v = tensor_arg(v_arg, "v", 4, false);
  same_shape(v, "v", {1, vl.total_k(), p.Hkv, p.d}, "k's [1, total_k, Hkv, d]");
  const fs_tensor& out = tensor_arg(o_arg, "o", 4, !backward);
  same_shape(out, "o", {1, vl.total_q(), p.Hq, p.d}, "q's [1, total_q, Hq, d]");
  const fs_tensor& lse = tensor_arg(lse_arg, "lse", 3, !backward);
  same_shape(lse, "lse", {1, p.Hq, vl.total_q()}, "[1, Hq, total_q] of q's");
  std::vector<std::pair<const fs_tensor*, const char*>> all = {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "o"}, {&lse, "lse"}};
  if (backward) {
    const char* names[] = {"dout", "dq", "dk", "dv"};
    const fs_tensor* args[] = {do_arg, dq_arg, dk_arg, dv_arg};
    const std::vector<int64_t> shapes[] = {{1, vl.total_q(), p.Hq, p.d}, {1, vl.total_q(), p.Hq, p.d},
                                           {1, vl.total_k(), p.Hkv, p.d}, {1, vl.total_k(), p.Hkv, p.d}};
    for (int i = 0; i < 4; ++i) {
      same_shape(tensor_arg(args[i], names[i], 4, i > 0), names[i], shapes[i], i < 2 ? "q's" : "k's");
      all.push_back({args[i], names[i]});
    }
  }
  for (const auto& [t, name] : all) check_memory(pl, *t, name);
  try {
    if (zero_copy(pl, vl, {&q, &k, &v, &out, &lse, do_arg, dq_arg, dk_arg, dv_arg})) return;
  } catch (const std::invalid_argument& e) {
    fail(FS_UNSUPPORTED, e.what());
  }
  Inputs in;
  in.q = gather_packed(q, pl.dtype, pl.memory);
  in.k = gather_packed(k, pl.dtype, pl.memory);
  in.v = gather_packed(v, pl.dtype, pl.memory);
  if (backward) in.dout = gather_packed(*do_arg, pl.dtype, pl.memory);
  auto write = [&](const auto& res) {
    if (!backward) {
      scatter_packed(res.o, out, pl.dtype, pl.memory);
      scatter_lse(res.lse, lse, pl.memory);  // [Hq, total_q] into [1, Hq, total_q]
      return;
    }
    scatter_packed(res.dq, *dq_arg, pl.dtype, pl.memory);
    scatter_packed(res.dk, *dk_arg, pl.dtype, pl.memory);
    scatter_packed(res.dv, *dv_arg, pl.dtype, pl.memory);
  };
  try {
    if (pl.fp64) {
      write(varlen_oracle(reference_oracle(), vl).exact(p, in));
    } else {
      std::unique_ptr<Runner> runner = make_varlen_runner(*pl.stage, p, vl, in, pl.variant);
      runner->run();
      if (backward) runner->run_backward();
      write(runner->outputs());
    }
  } catch (const std::invalid_argument& e) {
    fail(FS_UNSUPPORTED, e.what());
  }
}

}  // namespace
}  // namespace fa::capi

using namespace fa::capi;

extern "C" {

int32_t fs_version(void) { return FS_VERSION; }

const char* fs_last_error(void) { return last_error.c_str(); }

int32_t fs_last_call_copied(void) { return last_copied; }

fs_options fs_default_options(void) {
  fs_options o{};
  o.causal = 0;
  o.softmax_scale = 0;
  o.dtype = FS_FP32;
  o.memory = FS_HOST;
  o.stage = nullptr;
  o.variant = nullptr;
  return o;
}

fs_tensor fs_contiguous(void* data, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
  fs_tensor t{};
  t.data = data;
  t.ndim = 4;
  const int64_t size[4] = {batch, seqlen, heads, head_dim};
  int64_t stride = 1;
  for (int k = 3; k >= 0; --k) {
    t.size[k] = size[k];
    t.stride[k] = stride;
    stride *= size[k];
  }
  return t;
}

fs_tensor fs_contiguous_lse(void* data, int64_t batch, int64_t heads, int64_t seqlen_q) {
  fs_tensor t{};
  t.data = data;
  t.ndim = 3;
  t.size[0] = batch;
  t.size[1] = heads;
  t.size[2] = seqlen_q;
  t.stride[2] = 1;
  t.stride[1] = seqlen_q;
  t.stride[0] = heads * seqlen_q;
  return t;
}

fs_status fs_forward(const fs_options* options, const fs_tensor* q, const fs_tensor* k, const fs_tensor* v,
                     const fs_tensor* o, const fs_tensor* lse) {
  return guarded("fs_forward", [&] { forward(options, q, k, v, o, lse); });
}

fs_status fs_forward_kvcache(const fs_options* options, const fs_tensor* q, const fs_tensor* k_cache,
                             const fs_tensor* v_cache, const int32_t* cache_seqlens, const int32_t* block_table,
                             int32_t pages_per_seq, const fs_tensor* o, const fs_tensor* lse) {
  return guarded("fs_forward_kvcache",
                 [&] { forward_kvcache(options, q, k_cache, v_cache, cache_seqlens, block_table, pages_per_seq, o, lse); });
}

fs_status fs_forward_varlen(const fs_options* options, const fs_tensor* q, const fs_tensor* k, const fs_tensor* v,
                            const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, int32_t batch,
                            const fs_tensor* o, const fs_tensor* lse) {
  return guarded("fs_forward_varlen", [&] {
    varlen(options, q, k, v, cu_seqlens_q, cu_seqlens_k, batch, o, lse, nullptr, nullptr, nullptr, nullptr);
  });
}

fs_status fs_backward_varlen(const fs_options* options, const fs_tensor* q, const fs_tensor* k, const fs_tensor* v,
                             const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, int32_t batch,
                             const fs_tensor* o, const fs_tensor* lse, const fs_tensor* dout, const fs_tensor* dq,
                             const fs_tensor* dk, const fs_tensor* dv) {
  return guarded("fs_backward_varlen", [&] {
    if (!dout || !dq || !dk || !dv) fail(FS_INVALID_ARGUMENT, std::string(!dout ? "dout" : !dq ? "dq" : !dk ? "dk" : "dv") + " is NULL");
    varlen(options, q, k, v, cu_seqlens_q, cu_seqlens_k, batch, o, lse, dout, dq, dk, dv);
  });
}

fs_status fs_backward(const fs_options* options, const fs_tensor* q, const fs_tensor* k, const fs_tensor* v,
                      const fs_tensor* o, const fs_tensor* lse, const fs_tensor* dout, const fs_tensor* dq,
                      const fs_tensor* dk, const fs_tensor* dv) {
  return guarded("fs_backward", [&] { backward(options, q, k, v, o, lse, dout, dq, dk, dv); });
}

fs_status fs_resolve(const fs_options* options, const fs_tensor* q, const fs_tensor* k, int32_t backward,
                     const char** stage, const char** variant) {
  return guarded("fs_resolve", [&] {
    if (!stage || !variant) fail(FS_INVALID_ARGUMENT, "stage and variant must point to where the names go");
    const Plan pl = plan_call(options, q, k, backward != 0);
    *stage = pl.stage->name.c_str();
    *variant = "";
    if (!pl.variant.empty())  // a name that lives as long as the library: the stage's own copy
      for (const auto* list : {&pl.stage->variants, &pl.stage->tuning_variants})
        for (const std::string& v : *list)
          if (v == pl.variant) *variant = v.c_str();
  });
}

int32_t fs_stage_count(void) {
  int32_t n = 0;
  guarded("fs_stage_count", [&] { n = int32_t(fa::stages().size()); });
  return n;
}

const char* fs_stage_name(int32_t index) {
  const char* name = nullptr;
  guarded("fs_stage_name", [&] {
    if (index < 0 || size_t(index) >= fa::stages().size())
      fail(FS_INVALID_ARGUMENT, "no stage " + std::to_string(index) + " (there are " +
                                    std::to_string(fa::stages().size()) + ")");
    name = fa::stages()[size_t(index)].name.c_str();
  });
  return name;
}

fs_memory fs_stage_memory(int32_t index) {
  fs_memory m = FS_HOST;
  guarded("fs_stage_memory", [&] {
    if (index >= 0 && size_t(index) < fa::stages().size() && fa::stages()[size_t(index)].gpu()) m = FS_DEVICE;
  });
  return m;
}

const char* fs_gpu_unavailable_reason(void) {
  static thread_local std::string why;
  guarded("fs_gpu_unavailable_reason", [&] { why = fa::gpu_unavailable_reason(); });
  return why.c_str();
}

}  // extern "C"
