// FlashAttention, step by step — harness/cli.cpp
#include "harness/cli.h"

#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/dropout.h"
#include "core/dtype.h"
#include "core/npy.h"
#include "core/random.h"

namespace fa {

void add_common_options(CLI::App& app, CommonOptions& o) {
  Problem& p = o.problem;
  app.add_option("--batch", p.B, "batch size B")->capture_default_str();
  app.add_option("--heads", p.Hq, "query heads Hq")->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads, "key/value heads Hkv (default: = heads; Hq % Hkv == 0 for GQA)");
  app.add_option("--seq", o.seq, "sequence length: sets both Nq and Nk (default 1024)");
  app.add_option("--seq-q", o.seq_q, "query length Nq");
  app.add_option("--seq-k", o.seq_k, "key/value length Nk");
  app.add_option("--dim", p.d, "head dimension d")->capture_default_str();
  app.add_flag("--causal", p.causal, "causal mask: query i sees key j iff j <= input_pos + i");
  app.add_option("--input-pos", o.input_pos, "absolute position of query 0 (default Nk - Nq, bottom-right)");
  app.add_option("--scale", o.scale, "softmax scale (default 1/sqrt(d))");
  app.add_option("--dtype", o.dtype, "storage type of Q, K, V, O: bf16 | fp16 | fp32")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
      ->capture_default_str();
  app.add_option("--dropout", p.dropout, "dropout probability p in [0, 1)")->capture_default_str();
  app.add_option("--seed", p.seed, "seed of the random inputs and the dropout mask")->capture_default_str();
  app.add_flag("--backward", p.backward, "also run the backward pass (stages that have one)");
  app.add_option("--variant", o.variant, "stage variant (see the stage's README)");
  app.add_option("--inputs", o.inputs_dir, "read q.npy, k.npy, v.npy (and do.npy) float32 from DIR");
  app.add_option("--dump", o.dump_dir, "write o.npy, lse.npy (and dq/dk/dv, dropout_mask) to DIR");
  app.add_flag("--check", o.check, "compare with step 1 in fp64; exit 1 if the tolerance rule fails");
  app.add_flag("--bench", o.bench, "time the stage: median of warmed-up runs");
  app.add_option("--json", o.json_file, "append one JSON record per run to FILE");
  app.add_flag("--list-variants", o.list_variants,
               "print the variants (the first is the default), then the named tuning configurations; run nothing");
  app.add_option("--bench-against", o.bench_against,
                 "with --bench: also time VARIANT of this stage on the same inputs, alternating with the main run "
                 "in rounds, and record both (a same-run comparison)");
  app.add_flag("--tuned", o.tuned, "run the configuration step 6 tuned for this GPU and problem (tunes it once)");
}

static Tensor load_checked(const std::string& dir, const std::string& name) {
  Tensor t = read_npy(dir + "/" + name);
  if (t.shape.size() != 4)
    throw std::runtime_error(dir + "/" + name + ": expected 4 dimensions [B, H, N, d], got " + shape_str(t.shape));
  return t;
}

Inputs prepare_inputs(CommonOptions& o) {
  Problem& p = o.problem;
  p.dtype = parse_dtype(o.dtype);
  Inputs in;
  if (!o.inputs_dir.empty()) {
    in.q = load_checked(o.inputs_dir, "q.npy");
    in.k = load_checked(o.inputs_dir, "k.npy");
    in.v = load_checked(o.inputs_dir, "v.npy");
    if (in.k.shape != in.v.shape)
      throw std::invalid_argument("k.npy " + shape_str(in.k.shape) + " and v.npy " + shape_str(in.v.shape) +
                                  " must have the same shape");
    if (in.q.shape[0] != in.k.shape[0] || in.q.shape[3] != in.k.shape[3])
      throw std::invalid_argument("q.npy " + shape_str(in.q.shape) + " and k.npy " + shape_str(in.k.shape) +
                                  " must agree in batch (dim 0) and head dim (dim 3)");
    p.B = in.q.shape[0];
    p.Hq = in.q.shape[1];
    p.Nq = in.q.shape[2];
    p.d = in.q.shape[3];
    p.Hkv = in.k.shape[1];
    p.Nk = in.k.shape[2];
    if (p.backward) {
      in.dout = load_checked(o.inputs_dir, "do.npy");
      if (in.dout.shape != in.q.shape)
        throw std::invalid_argument("do.npy " + shape_str(in.dout.shape) + " must have q.npy's shape " +
                                    shape_str(in.q.shape));
    }
    if (p.Hkv > 0 && p.Hq % p.Hkv != 0)
      throw std::invalid_argument("q.npy has " + std::to_string(p.Hq) + " heads, not a multiple of k.npy's " +
                                  std::to_string(p.Hkv));
  } else {
    p.Hkv = o.kv_heads.value_or(p.Hq);
    p.Nq = o.seq_q.value_or(o.seq.value_or(1024));
    p.Nk = o.seq_k.value_or(o.seq.value_or(1024));
  }
  p.input_pos = o.input_pos.value_or(p.Nk - p.Nq);
  p.scale = o.scale.value_or(p.d > 0 ? float(1.0 / std::sqrt(double(p.d))) : 1.0f);
  p.validate();
  if (!o.inputs_dir.empty()) {
    for (Tensor* t : {&in.q, &in.k, &in.v, &in.dout}) round_tensor(*t, p.dtype);
  } else {
    in = random_inputs(p);
  }
  return in;
}

static void print_check(const CheckReport& r) {
  std::printf("  %-4s %12s %12s %12s %12s  %s\n", "out", "max_abs", "rel_l2", "naive_lowp", "tolerance", "verdict");
  for (int k = 0; k < r.n; ++k) {
    const auto& e = r.stage[k];
    std::printf("  %-4s %12.3e %12.3e %12.3e %12.3e  %s", CheckReport::name(k), e.max_abs, e.rel_l2,
                r.baseline[k].max_abs, r.verdict[k].tolerance, r.verdict[k].pass ? "pass" : "FAIL");
    if (!e.ok_shape) std::printf(" (wrong shape)");
    if (e.unwritten) std::printf(" (%zu elements unwritten/NaN)", e.unwritten);
    if (e.mismatched_inf) std::printf(" (%zu infinities differ)", e.mismatched_inf);
    std::printf("\n");
  }
}

static void append_json(const std::string& file, const nlohmann::json& rec) {
  std::ofstream f(file, std::ios::app);
  if (!f) throw std::runtime_error("cannot open " + file + " for appending");
  f << rec.dump() << "\n";
}

constexpr int64_t kMaxDumpedMask = int64_t(1) << 26;

static std::vector<uint8_t> dropout_mask(const Problem& p) {
  const DropoutParams dp = make_dropout(p.dropout, p.seed);
  std::vector<uint8_t> m(size_t(p.B * p.Hq * p.Nq * p.Nk));
  size_t k = 0;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < p.Nq; ++i)
        for (int64_t j = 0; j < p.Nk; ++j) m[k++] = dropout_keep(dp, uint32_t(b), uint32_t(h), uint32_t(i), uint32_t(j));
  return m;
}

int run_stage(const Stage& s, const Oracle& oracle, CommonOptions& o) {
  if (o.list_variants) {
    for (const std::string& v : s.variants) std::printf("%s\n", v.c_str());
    for (const std::string& v : s.tuning_variants) std::printf("%s\n", v.c_str());
    if (s.variants.empty() && s.tuning_variants.empty()) std::printf("(%s has no variants)\n", s.name.c_str());
    return 0;
  }
  Inputs in = prepare_inputs(o);
  Problem& p = o.problem;
  std::string variant = o.variant.empty() ? (s.variants.empty() ? "" : s.variants[0]) : o.variant;
  auto known = [&](const std::string& v) {
    for (const auto* list : {&s.variants, &s.tuning_variants})
      if (std::find(list->begin(), list->end(), v) != list->end()) return true;
    return false;
  };
  if (!o.bench_against.empty() && !o.bench) throw std::invalid_argument("--bench-against needs --bench");
  if (o.tuned && !o.variant.empty())
    throw std::invalid_argument("--tuned picks the configuration itself: give --tuned or --variant, not both");
  if (!o.dump_dir.empty()) {  // checked before any tuning or run, so that a typo costs nothing
    struct stat st;
    if (stat(o.dump_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw std::runtime_error("--dump: " + o.dump_dir + " is not an existing directory");
  }
  for (const std::string& v : {o.variant, o.bench_against})
    if (!v.empty() && !known(v)) throw std::invalid_argument(s.name + " has no variant '" + v + "'");
  if (p.backward && !s.has_backward) throw std::invalid_argument(s.name + " has no backward pass (--backward)");
  if (const std::string why = s.unsupported(p, variant); !why.empty())
    throw std::invalid_argument(s.name + " cannot run this problem: " + why);
  if (s.platform)
    if (const std::string why = s.platform->unavailable_reason(); !why.empty())
      throw std::runtime_error(s.name + " needs a CUDA GPU: " + why);
  if (o.tuned) {
    if (s.tuning_variants.empty()) throw std::invalid_argument(s.name + " has no configurations to tune (--tuned)");
    if (!o.tuner)
      throw std::invalid_argument("--tuned needs step 6's autotuner, which this program does not link: run "
                                  "step6_autotune with the same flags (it tunes step 4's forward and, with "
                                  "--backward, step 5's backward)");
    variant = o.tuner(s, p);
  }
  std::printf("%s%s%s: %s\n", s.name.c_str(), variant.empty() ? "" : " --variant ", variant.c_str(),
              p.describe().c_str());
  auto runner = s.make(p, in, variant);
  runner->run();
  if (p.backward) runner->run_backward();
  const Outputs out = runner->outputs();

  int rc = 0;
  nlohmann::json rec = {{"stage", s.name},     {"variant", variant},       {"B", p.B},
                        {"Hq", p.Hq},          {"Hkv", p.Hkv},             {"Nq", p.Nq},
                        {"Nk", p.Nk},          {"d", p.d},                 {"causal", p.causal},
                        {"input_pos", p.input_pos}, {"scale", p.scale},    {"dtype", dtype_name(p.dtype)},
                        {"dropout", p.dropout}, {"seed", p.seed},          {"backward", p.backward},
                        {"device", device_name(s)}, {"cuda", runtime_version(s)}, {"git", git_revision()}};
  if (o.check) {
    const CheckReport r = check_against(oracle, p, in, out);
    std::printf("check against step 1 (fp64), rule: max_abs <= 2 * naive_lowp + 1e-5 * max(1, |ref|)\n");
    print_check(r);
    for (int k = 0; k < r.n; ++k) rec["err_" + std::string(CheckReport::name(k))] = r.stage[k].max_abs;
    rec["pass"] = r.pass;
    if (!r.pass) rc = 1;
  }
  if (o.bench) {
    const double unit = s.gpu() ? 1e12 : 1e9;
    const char* uname = s.gpu() ? "TFLOP/s" : "GFLOP/s";
    auto report = [&](const char* what, const Timing& t, nlohmann::json& into) {
      std::printf("%sforward:  %10.3f ms  %8.2f %s\n", what, t.fwd_ms, p.flops_forward() / (t.fwd_ms * 1e-3) / unit, uname);
      into["fwd_ms"] = t.fwd_ms;
      into["fwd_tflops"] = p.flops_forward() / (t.fwd_ms * 1e-3) / 1e12;
      if (!p.backward) return;
      std::printf("%sbackward: %10.3f ms  %8.2f %s\n", what, t.bwd_ms, p.flops_backward() / (t.bwd_ms * 1e-3) / unit, uname);
      into["bwd_ms"] = t.bwd_ms;
      into["bwd_tflops"] = p.flops_backward() / (t.bwd_ms * 1e-3) / 1e12;
    };
    if (o.bench_against.empty()) {
      report("", time_runner(*runner, s, p.backward), rec);
    } else {
      // The two variants on the same inputs, timed in alternating rounds (A B, B A, A B), so that clock and
      // thermal drift falls on both alike; each side's time is the median of its round medians. Only one
      // runner exists at a time: measured on the H100, where the device buffers sit changes a kernel's
      // time by up to 6% (a second runner allocated beside the first was slower running the same kernel),
      // and a runner built after the last one was freed can reuse its memory.
      runner.reset();
      constexpr int kRounds = 3;
      std::vector<double> fa, ba, fb, bb;
      auto time_one = [&](const std::string& v, std::vector<double>& f, std::vector<double>& b) {
        const auto one = s.make(p, in, v);
        const Timing t = time_runner(*one, s, p.backward);
        f.push_back(t.fwd_ms), b.push_back(t.bwd_ms);
      };
      for (int r = 0; r < kRounds; ++r) {
        if (r % 2 == 0) time_one(variant, fa, ba), time_one(o.bench_against, fb, bb);
        else time_one(o.bench_against, fb, bb), time_one(variant, fa, ba);
      }
      report("", {median(fa), median(ba), kRounds}, rec);
      nlohmann::json against = {{"variant", o.bench_against}};
      report(("against " + o.bench_against + ": ").c_str(), {median(fb), median(bb), kRounds}, against);
      rec["rounds_fwd_ms"] = fa, against["rounds_fwd_ms"] = fb;
      if (p.backward) rec["rounds_bwd_ms"] = ba, against["rounds_bwd_ms"] = bb;
      rec["against"] = against;
    }
  }
  for (const auto& [k, v] : o.record_extra) rec[k] = v;
  if (!o.dump_dir.empty()) {
    AtomicFileSet files;
    const std::string dir = o.dump_dir + "/";
    files.add_f32(dir + "o.npy", out.o);
    files.add_f32(dir + "lse.npy", out.lse);
    if (p.backward) {
      files.add_f32(dir + "dq.npy", out.dq);
      files.add_f32(dir + "dk.npy", out.dk);
      files.add_f32(dir + "dv.npy", out.dv);
    }
    // The mask is one byte per score: written up to 2^26 of them (64 MiB), and said so when left out.
    const bool mask_fits = p.B * p.Hq * p.Nq * p.Nk <= kMaxDumpedMask;
    if (p.dropout > 0 && mask_fits) files.add_u8(dir + "dropout_mask.npy", {p.B, p.Hq, p.Nq, p.Nk}, dropout_mask(p));
    files.commit();
    std::printf("wrote %s{o,lse%s%s}.npy\n", dir.c_str(), p.backward ? ",dq,dk,dv" : "",
                p.dropout > 0 && mask_fits ? ",dropout_mask" : "");
    if (p.dropout > 0 && !mask_fits)
      std::printf("dropout_mask.npy not written: B * Hq * Nq * Nk = %lld bytes > %lld\n",
                  (long long)(p.B * p.Hq * p.Nq * p.Nk), (long long)kMaxDumpedMask);
  }
  if (!o.json_file.empty()) append_json(o.json_file, rec);
  return rc;
}

int stage_main(const Stage& s, const Oracle& oracle, int argc, char** argv) {
  try {
    CLI::App app{s.name + ": " + s.title};
    CommonOptions o;
    add_common_options(app, o);
    CLI11_PARSE(app, argc, argv);
    return run_stage(s, oracle, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", s.name.c_str(), e.what());
    return 2;
  }
}

}  // namespace fa
