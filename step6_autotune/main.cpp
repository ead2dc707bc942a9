// FlashAttention, step by step — step 6's executable: tune steps 4 (and 5, with --backward) for a problem,
// cache the choices, run them.
//
//   step6_autotune --seq 4096 --dim 128 --causal --bench     tune (or read the cache), then run and time
//   step6_autotune ... --autotune                             tune again even if the cache has a choice
//   step6_autotune --clear-cache                              forget every cached choice
//   step6_autotune ... --bench --bench-against default        time tuned and default in alternating rounds
// DISABLE_AUTOTUNE=1 (or FMHA_DISABLE_AUTOTUNE=1) runs step 4's default configuration without timing.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "harness/cli.h"
#include "step1_cpu_reference/reference.h"
#include "step6_autotune/autotune.h"
#include "step4_fused_pipelined/fused.h"
#include "step5_backward/backward.h"

int main(int argc, char** argv) {
  CLI::App app{"step6_autotune: steps 4 and 5 in the configurations tuned for this GPU and problem"};
  fa::CommonOptions o;
  fa::add_common_options(app, o);
  bool force = false, clear = false;
  std::string cache, table_json;
  app.add_flag("--autotune", force, "time every configuration again, even if the cache has a choice");
  app.add_option("--cache", cache, "the cache file (default " + fa::step6::default_cache_path() + ")");
  app.add_flag("--clear-cache", clear, "delete the cache file, then continue (or stop, if nothing else to do)");
  app.add_option("--table-json", table_json, "append this problem's table of every config's TFLOP/s to FILE");
  if (const std::optional<int> rc = fa::parse_command_line(app, argc, argv, "step6_autotune")) return *rc;
  try {
    fa::check_command_line(app, o);
    const bool cache_given = !cache.empty();
    if (!cache_given) cache = fa::step6::default_cache_path();
    fa::step6::Autotuner tuner(cache);
    if (clear) {
      tuner.clear();
      std::printf("cleared %s\n", tuner.file().c_str());
      if (argc == 2 || (argc == 4 && cache_given)) return 0;
    }

    const fa::Stage s = fa::step6::stage(cache);  // its make() reads the same cache
    if (o.list_variants) return fa::run_stage(s, fa::step1::oracle(), o);
    if (const std::string why = s.platform->unavailable_reason(); !why.empty())
      throw std::runtime_error("step6_autotune needs a CUDA GPU: " + why);
    fa::CommonOptions probe = o;  // resolve the problem once to tune it (prepare_inputs fills the defaults)
    const std::vector<int64_t> bias_shape = fa::prepare_inputs(probe).bias.shape;  // the cache key names it
    // The forward (step 4) on the problem without its backward, then, for a backward run, the backward
    // (step 5): each tuned or read from the cache, exactly as the stage's make() will ask for them.
    const fa::Problem& p = probe.problem;
    std::vector<std::pair<fa::Stage, fa::Problem>> passes = {{fa::step4::stage(), fa::step6::forward_only(p)}};
    if (p.backward) passes.emplace_back(fa::step5::stage(), p);
    if (o.variant == "default" && o.bench_against != "tuned") passes.clear();  // nothing tuned runs
    for (const auto& [base, problem] : passes) {
      const char* pass = problem.backward ? "backward" : "forward";
      const fa::step6::Choice c = tuner.choose(base, problem, force, bias_shape);
      const std::string def = fa::step6::default_config(base, problem, fa::step6::current_device());
      const std::string chosen = c.splits ? c.variant + " splits=" + std::to_string(c.splits) : c.variant;
      std::printf("%s configuration: %s (%s; cache %s)\n", pass, chosen.c_str(), c.source.c_str(),
                  tuner.file().c_str());
      // The JSON record says which configurations ran, so a tuned/default ratio can be read as "same
      // kernels" (the tuner kept the default) or "a different choice".
      const std::string mode = problem.backward ? "bwd" : "fwd";
      o.record_extra[mode + "_config"] = c.variant;
      o.record_extra[mode + "_default_config"] = def;
      if (c.splits) o.record_extra[mode + "_splits"] = std::to_string(c.splits);
      if (c.table.empty()) continue;
      std::printf("%-34s %10s\n", "config", "TFLOP/s");
      for (const auto& [name, tf] : c.table)
        std::printf("%-34s %10.1f%s\n", name.c_str(), tf, name == chosen ? "  <- chosen" : "");
      if (!table_json.empty()) {
        nlohmann::json rec = {{"device", fa::device_name(s)}, {"d", p.d}, {"Nq", p.Nq}, {"Nk", p.Nk}, {"B", p.B},
                              {"Hq", p.Hq}, {"Hkv", p.Hkv}, {"causal", p.causal}, {"dtype", fa::dtype_name(p.dtype)},
                              {"mode", mode}, {"git", fa::git_revision()},
                              {"chosen", chosen}, {"default", def}, {"table", c.table}};
        std::ofstream(table_json, std::ios::app) << rec.dump() << "\n";
      }
    }
    return fa::run_stage(s, fa::step1::oracle(), o);  // make() now reads the cache: nothing is timed twice
  } catch (...) {
    return fa::report_error("step6_autotune");
  }
}
