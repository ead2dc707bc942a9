// FlashAttention, step by step — step 6: the autotuner (step6_autotune/autotune.cpp)
#include "autotune.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <nlohmann/json.hpp>

#include "core/random.h"
#include "gpu/cuda_util.h"
#include "gpu/platform.h"
#include "harness/eval.h"
#include "step4_fused_pipelined/fused.h"
#include "step5_backward/backward.h"

namespace fa::step6 {

using nlohmann::json;

DeviceLimits current_device() {
  int dev = 0, optin = 0, threads = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerBlock, dev));
  return {prop.name, prop.major, prop.minor, size_t(optin), threads};
}

std::vector<std::string> feasible_variants(const Stage& s, const Problem& p, const DeviceLimits& dev,
                                           std::vector<std::string>* rejected) {
  std::vector<std::string> ok;
  for (const std::string& v : s.tuning_variants) {
    Stage::LaunchShape shape;
    std::string why;
    try {
      shape = s.launch_shape(p, v);
    } catch (const std::invalid_argument& e) {  // a configuration built for other head dims only
      if (rejected) rejected->push_back(v + ": " + e.what());
      continue;
    }
    const std::string cannot = s.unsupported ? s.unsupported(p, v) : "";
    const std::string excluded = s.tuning_exclusion ? s.tuning_exclusion(v) : "";
    if (!cannot.empty())  // e.g. score modifiers on one of step 4's lesson configurations
      why = cannot;
    else if (!excluded.empty())
      why = excluded;
    else if (shape.smem_bytes > dev.smem_optin)
      why = std::to_string(shape.smem_bytes) + " bytes of shared memory > the device's " + std::to_string(dev.smem_optin);
    else if (shape.threads > dev.max_threads)
      why = std::to_string(shape.threads) + " threads > the device's " + std::to_string(dev.max_threads);
    if (why.empty()) ok.push_back(v);
    else if (rejected) rejected->push_back(v + ": " + why);
  }
  return ok;
}

namespace {

int64_t power_of_two_at_least(int64_t n) {
  int64_t bucket = 1;
  while (bucket < n) bucket *= 2;
  return bucket;
}

// The key's part for the score modifiers that are on ("" with none, so plain keys stay as they were).
std::string score_mods_key(const Problem& p, const std::vector<int64_t>& bias_shape) {
  std::string k;
  if (p.bias) {
    const bool full_b = bias_shape.size() == 4 ? bias_shape[0] != 1 : p.B > 1;
    const bool full_h = bias_shape.size() == 4 ? bias_shape[1] != 1 : p.Hq > 1;
    k += std::string("|bias") + (full_b ? "B" : "1") + (full_h ? "H" : "1");
  }
  if (p.alibi) k += "|alibi";
  if (p.softcap > 0.0f) k += "|softcap";
  if (p.has_window()) {
    const auto side = [](int64_t w) {  // -1: unbounded; 0; otherwise its power-of-two bucket
      return w < 0 ? std::string("-1") : w == 0 ? std::string("0") : "<=" + std::to_string(power_of_two_at_least(w));
    };
    k += "|win" + side(p.window_left) + "," + side(p.causal ? 0 : p.window_right);  // causal: no key right of it
  }
  return k;
}

}  // namespace

std::string cache_key(const Stage& s, const Problem& p, const DeviceLimits& dev, const std::vector<int64_t>& bias_shape) {
  // Sequence lengths share a choice within a power of two.
  const int64_t bucket = power_of_two_at_least(std::max(p.Nq, p.Nk));
  std::string decode;  // a decode whose splits are tuned: the blocks it has without them (above)
  if (s.tuning_splits && !s.tuning_splits(p, default_config(s, p, dev)).empty())
    decode = "|decode:BHkv<=" + std::to_string(power_of_two_at_least(p.B * p.Hkv)) +
             ",rows<=" + std::to_string(power_of_two_at_least(p.group() * p.Nq));
  return dev.name + "|sm" + std::to_string(dev.cc_major) + std::to_string(dev.cc_minor) + "|" + s.name + "|" +
         (p.backward && s.has_backward ? "bwd" : "fwd") + "|" + dtype_name(p.dtype) + "|d" + std::to_string(p.d) + "|" +
         (p.causal ? "causal" : "full") + "|g" + std::to_string(p.group()) + (p.dropout > 0 ? "|dropout" : "") +
         score_mods_key(p, bias_shape) + decode + "|N<=" + std::to_string(bucket);
}

std::string pick(const std::vector<std::pair<std::string, double>>& table, const std::string& default_config,
                 double margin) {
  std::string best;
  double best_tflops = -1, default_tflops = -1;
  for (const auto& [v, tflops] : table) {
    if (tflops > best_tflops) best_tflops = tflops, best = v;
    if (v == default_config) default_tflops = tflops;
  }
  return default_tflops > 0 && best_tflops <= default_tflops * (1 + margin) ? default_config : best;
}

bool autotune_disabled() {
  for (const char* name : {"DISABLE_AUTOTUNE", "FMHA_DISABLE_AUTOTUNE"}) {
    const char* v = std::getenv(name);
    if (v && *v && std::string(v) != "0") return true;
  }
  return false;
}

std::string default_cache_path() {
  if (const char* f = std::getenv("FA_AUTOTUNE_CACHE"); f && *f) return f;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string base = xdg && *xdg ? xdg : std::string(home ? home : "/tmp") + "/.cache";
  return base + "/flashattention-step-by-step/autotune.json";
}

namespace {

json load_cache(const std::string& file) {
  std::ifstream f(file);
  if (!f) return json{{"version", 1}, {"entries", json::object()}};
  try {
    json j = json::parse(f);
    if (!j.contains("entries")) throw std::runtime_error("no entries");
    return j;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "autotune: ignoring unreadable cache %s (%s)\n", file.c_str(), e.what());
    return json{{"version", 1}, {"entries", json::object()}};
  }
}

void save_cache(const std::string& file, const json& j) {
  const std::filesystem::path dir = std::filesystem::path(file).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create the autotune cache's folder " + dir.string() + ": " + ec.message());
  const std::string tmp = file + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) throw std::runtime_error("cannot write the autotune cache " + tmp);
    f << j.dump(1) << "\n";
  }
  if (std::rename(tmp.c_str(), file.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp + " to " + file);
}

// Quick check: the candidate computes what the default configuration computes, up to a few roundings
// of the storage type (tile sizes change the order of the sums and where P is rounded).
bool same_result(const Tensor& a, const Tensor& ref, DType t) {
  const double eps = t == DType::bf16 ? 1.0 / 256 : t == DType::fp16 ? 1.0 / 2048 : 1e-6;
  double ref_max = 1.0, diff = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(a.data[i])) return false;
    ref_max = std::max(ref_max, double(std::fabs(ref.data[i])));
    diff = std::max(diff, double(std::fabs(a.data[i] - ref.data[i])));
  }
  return diff <= 8 * eps * ref_max;
}

}  // namespace

std::string default_config(const Stage& s, const Problem& p, const DeviceLimits& dev) {
  if (!s.config_of || s.variants.empty()) return "";
  return s.config_of(p, s.variants[0], dev.cc_major);
}

Problem forward_only(Problem p) {
  p.backward = false;
  return p;
}

Problem with_splits(Problem p, const Choice& c) {
  if (p.splits == 0) p.splits = c.splits;
  return p;
}

Autotuner::Autotuner(std::string cache_file) : file_(std::move(cache_file)) {}

std::string Autotuner::cached(const Stage& s, const Problem& p, const std::vector<int64_t>& bias_shape) const {
  const json j = load_cache(file_);
  const std::string key = cache_key(s, p, current_device(), bias_shape);
  return j["entries"].contains(key) ? j["entries"][key]["variant"].get<std::string>() : "";
}

void Autotuner::clear() { std::remove(file_.c_str()); }

Choice Autotuner::choose(const Stage& s, const Problem& p, bool force, const std::vector<int64_t>& bias_shape) {
  const std::string def = s.variants.empty() ? "" : s.variants[0];
  if (s.tuning_variants.empty()) return {def, 0, "default (nothing to tune)", {}};
  if (autotune_disabled()) return {def, 0, "default (DISABLE_AUTOTUNE)", {}};
  const DeviceLimits dev = current_device();
  const std::string key = cache_key(s, p, dev, bias_shape);
  json cache = load_cache(file_);
  if (!force && cache["entries"].contains(key)) {
    const json& e = cache["entries"][key];
    return {e["variant"].get<std::string>(), e.value("splits", int64_t(0)), "cache", {}};
  }

  if (s.unsupported)  // what the default cannot run, no candidate is timed on
    if (const std::string why = s.unsupported(p, def); !why.empty())
      throw std::invalid_argument(s.name + " cannot run this problem: " + why);
  std::vector<std::string> rejected;
  const std::vector<std::string> candidates = feasible_variants(s, p, dev, &rejected);
  for (const std::string& r : rejected) std::fprintf(stderr, "autotune: skip %s\n", r.c_str());
  const bool bwd = p.backward && s.has_backward;
  const double flops = bwd ? p.flops_backward() : p.flops_forward();

  // Fresh inputs, drawn for this tuning run; with a bias, a random one of the caller's shape (its values
  // change no work; its shape changes the traffic). ALiBi takes the standard slopes: they change nothing.
  Inputs in = random_inputs(p);
  if (p.bias)
    in.bias = random_tensor(bias_shape.size() == 4 ? bias_shape : std::vector<int64_t>{p.B, p.Hq, p.Nq, p.Nk}, p.seed,
                            9, 0.0f, DType::fp32);
  Outputs ref;
  {
    auto r = s.make(p, in, def);
    r->run();
    if (bwd) r->run_backward();
    ref = r->outputs();
  }
  // Every candidate, and in a decode every split count the stage offers for it (0: the stage's own choice).
  struct Candidate {
    std::string config;
    int64_t splits;
    std::string label() const { return splits ? config + " splits=" + std::to_string(splits) : config; }
  };
  std::vector<Candidate> runs;
  for (const std::string& v : candidates) {
    runs.push_back({v, 0});
    if (s.tuning_splits)
      for (int64_t n : s.tuning_splits(p, v)) runs.push_back({v, n});
  }
  Choice best{def, 0, "tuned now", {}};
  double best_tflops = -1;
  for (size_t k = 0; k < runs.size(); ++k) {
    const Candidate& c = runs[k];
    std::fprintf(stderr, "autotune [%zu/%zu] %-34s ", k + 1, runs.size(), c.label().c_str());
    Problem q = p;
    q.splits = c.splits ? c.splits : p.splits;
    auto r = s.make(q, in, c.config);
    r->run();
    if (bwd) r->run_backward();
    const Outputs out = r->outputs();
    const bool same = same_result(out.o, ref.o, p.dtype) &&
                      (!bwd || (same_result(out.dq, ref.dq, p.dtype) && same_result(out.dk, ref.dk, p.dtype) &&
                                same_result(out.dv, ref.dv, p.dtype)));
    if (!same) {
      std::fprintf(stderr, "differs from the default configuration: skipped\n");
      continue;
    }
    const Timing t = time_runner(*r, s, bwd);
    const double tflops = flops / ((bwd ? t.bwd_ms : t.fwd_ms) * 1e-3) / 1e12;
    std::fprintf(stderr, "%8.1f TFLOP/s\n", tflops);
    best.table.emplace_back(c.label(), tflops);
  }
  if (!best.table.empty()) {
    const std::string label = pick(best.table, default_config(s, p, dev));
    for (const Candidate& c : runs)
      if (c.label() == label) best.variant = c.config, best.splits = c.splits;
    for (const auto& [v, tflops] : best.table)
      if (v == label) best_tflops = tflops;
    std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
    json entry = {{"variant", best.variant}, {"tflops", best_tflops}, {"date", date}};
    if (best.splits) entry["splits"] = best.splits;
    cache["entries"][key] = entry;
    save_cache(file_, cache);
  }
  return best;
}

Stage stage(const std::string& cache_file) {
  const Stage fwd = step4::stage(), bwd = step5::stage();
  Stage s;
  s.name = "step6_autotune";
  s.title = "steps 4 and 5 in the configurations tuned for this GPU and problem (cached)";
  s.platform = &tma_platform();  // every kernel loads through TMA: sm_90 and later (gpu/platform.h)
  s.has_backward = true;
  s.has_score_mods = true;  // step 4's and step 5's, in the configurations that have them (the tuner picks no other)
  // "tuned": the configurations the autotuner chose (or reads from its cache); "default": steps 4 and 5
  // in their default configurations, nothing tuned (the baseline of `--bench --bench-against default`).
  s.variants = {"tuned", "default"};
  // Its kernels are step 4's and step 5's, each checked there (and every configuration by the
  // configuration test).
  s.forward_from = fwd.name;
  s.backward_from = bwd.name;
  // What it runs: what the defaults of steps 4 and 5 run (core/stage.h, Supports). No --splits (has_splits
  // is false: the tuner picks a decode's split count).
  s.supports.dtypes = {DType::bf16, DType::fp16};
  s.supports.head_dims = {64, 128};
  s.unsupported = [fwd, bwd](const Problem& p, const std::string&) {
    if (p.d != 64 && p.d != 128)  // steps 4 and 5 run other head dims zero-padded: nothing of their own to tune
      return "head dim " + std::to_string(p.d) + ": step 6 tunes the compiled head dims, 64 and 128 (steps 4 and 5 "
             "run d = " + std::to_string(p.d) + " on the next of them, zero-padded)";
    std::string why = fwd.unsupported(p, fwd.variants[0]);
    if (why.empty() && p.backward) why = bwd.unsupported(p, bwd.variants[0]);
    return why;
  };
  s.make = [fwd, bwd, cache_file](const Problem& p, const Inputs& in, const std::string& v) -> std::unique_ptr<Runner> {
    if (v == "default") return p.backward ? bwd.make(p, in, bwd.variants[0]) : fwd.make(p, in, fwd.variants[0]);
    const Choice f = Autotuner(cache_file).choose(fwd, forward_only(p), false, in.bias.shape);
    std::fprintf(stderr, "step6_autotune: forward: %s config %s%s\n", f.source.c_str(), f.variant.c_str(),
                 f.splits ? (" splits " + std::to_string(f.splits)).c_str() : "");
    if (!p.backward) return fwd.make(with_splits(p, f), in, f.variant);
    const Choice b = Autotuner(cache_file).choose(bwd, p, false, in.bias.shape);
    std::fprintf(stderr, "step6_autotune: backward: %s config %s\n", b.source.c_str(), b.variant.c_str());
    return bwd.make(p, in, step5::with_forward(b.variant, f.variant));
  };
  return s;
}

}  // namespace fa::step6
