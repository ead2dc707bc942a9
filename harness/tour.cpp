// FlashAttention, step by step — the tour: every stage of this build on its default problem, checked
// against step 1 and timed, in one table. The README's first command runs this.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "harness/cli.h"
#include "harness/registry.h"

namespace {

struct Row {
  std::string stage, result;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flashattention_tour: run every stage on its default problem, check it and time it"};
  fa::CommonOptions o;
  fa::add_common_options(app, o);
  CLI11_PARSE(app, argc, argv);
  try {
    o.check = true;
    o.tuner = fa::tuned_variant;  // --tuned: the stages with configurations run step 6's choice
    const fa::Inputs in = fa::prepare_inputs(o);
    const fa::Problem& p = o.problem;
    std::printf("problem: %s  (%.2f GFLOP forward)\n\n", p.describe().c_str(), p.flops_forward() * 1e-9);
    std::printf("%-34s %-32s %11s %8s %11s %12s\n", "stage", "variant", "max|O| err", "check", "time [ms]",
                "throughput");
    int failures = 0;
    bool any_gpu_stage = false;
    for (const fa::Stage& s : fa::stages()) any_gpu_stage = any_gpu_stage || s.gpu();
    if (!any_gpu_stage) std::printf("%-34s skipped: %s\n", "GPU stages (step3 .. step6)", fa::gpu_unavailable_reason().c_str());
    for (const fa::Stage& s : fa::stages()) {
      std::vector<std::string> variants = s.variants.empty() ? std::vector<std::string>{""} : s.variants;
      const bool tune = o.tuned && !s.tuning_variants.empty() && fa::gpu_unavailable_reason().empty();
      if (tune) variants = {o.tuner(s, p)};
      for (const std::string& v : variants) {
        std::printf("%-34s %-32s ", s.name.c_str(), v.c_str());
        std::fflush(stdout);
        if (s.gpu()) {
          if (const std::string why = fa::gpu_unavailable_reason(); !why.empty()) {
            std::printf("skipped: %s\n", why.c_str());
            break;
          }
        }
        if (const std::string why = s.unsupported(p, v); !why.empty()) {
          std::printf("skipped: %s\n", why.c_str());
          continue;
        }
        auto runner = s.make(p, in, v);
        runner->run();
        if (p.backward && s.has_backward) runner->run_backward();
        const fa::CheckReport r = fa::check_against_reference(p, in, runner->outputs());
        const fa::Timing t = fa::time_runner(*runner, s, false);
        const double rate = p.flops_forward() / (t.fwd_ms * 1e-3);
        char tp[32];
        std::snprintf(tp, sizeof tp, s.gpu() ? "%.1f TFLOP/s" : "%.1f GFLOP/s", s.gpu() ? rate * 1e-12 : rate * 1e-9);
        std::printf("%11.2e %8s %11.3f %12s\n", r.stage[0].max_abs, r.pass ? "pass" : "FAIL", t.fwd_ms, tp);
        if (!r.pass) ++failures;
      }
    }
    std::printf("\nerrors are max |O - O_ref| against step 1 in fp64; 'check' applies the tolerance rule to O and LSE\n");
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashattention_tour: error: %s\n", e.what());
    return 2;
  }
}
