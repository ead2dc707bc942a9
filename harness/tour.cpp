// FlashAttention, step by step — the tour: every stage of this build on its default problem, checked
// against step 1 and timed, in one table. The README's first command runs this.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include "core/host_memory.h"
#include "harness/cli.h"
#include "harness/registry.h"

namespace {

// --gpu-status: one line for scripts (run.sh test, docs/bench/sweep.py) that must know before they start
// whether the GPU stages can run: the GPU's name and exit code 0, or the reason why not and exit code 1.
int print_gpu_status() {
  if (const std::string why = fa::gpu_unavailable_reason(); !why.empty()) {
    std::printf("%s\n", why.c_str());
    return 1;
  }
  for (const fa::Stage& s : fa::stages())
    if (s.gpu()) {
      std::printf("%s\n", s.platform->device_name().c_str());
      break;
    }
  return 0;
}

// The flags of a stage's own executable, which mean nothing here: the tour runs every stage and variant,
// checked against step 1 and timed once. They are kept out of --help and refused with that reason.
const char* const kStageOnlyFlags[] = {"--variant", "--check",         "--bench",        "--bench-against",
                                       "--dump",    "--json",          "--list-variants", "--cu-seqlens-q",
                                       "--cu-seqlens-k"};

// Why variant v of s is not run on ps, in the tour's terms: a variant without a backward says which of
// the stage's variants have one (their rows run it), where the stage's own message would advise a
// --variant that the tour does not take.
std::string skip_reason(const fa::Stage& s, const fa::Problem& ps, const std::string& v) {
  const std::string why = s.unsupported(ps, v);
  fa::Problem forward = ps;
  forward.backward = false;
  if (why.empty() || !ps.backward || !s.unsupported(forward, v).empty()) return why;
  std::string with;
  for (const std::string& other : s.variants)
    if (s.unsupported(ps, other).empty()) with += (with.empty() ? "" : ", ") + other;
  return "no backward pass in this variant" + (with.empty() ? std::string() : " (the rows of " + with + " run it)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flashattention_tour: run every stage on its default problem, check it and time it"};
  fa::CommonOptions o;
  fa::add_common_options(app, o);
  for (const char* flag : kStageOnlyFlags) app.get_option(flag)->group("");  // "": left out of --help
  app.footer("Exit codes: 0 every stage that ran passed its check; 1 a stage failed its check or could not run "
             "(its row says why); 2 bad input (one line on stderr, nothing run).");
  bool gpu_status = false;
  app.add_flag("--gpu-status", gpu_status,
               "print the GPU the GPU stages run on (exit 0) or why they cannot run here (exit 1); run nothing");
  if (const std::optional<int> rc = fa::parse_command_line(app, argc, argv, "flashattention_tour")) return *rc;
  try {
    if (gpu_status) {
      fa::refuse_flags_beside(app, "--gpu-status", {}, "prints one line and runs nothing");
      return print_gpu_status();
    }
    for (const std::string& f : fa::flags_given(app))
      for (const char* flag : kStageOnlyFlags)
        if (f == flag)
          throw std::invalid_argument(f + " is a flag of a stage's own executable (the tour runs every stage and "
                                      "variant, checked against step 1 and timed once): drop " + f);
    o.check = true;
    o.tuner = fa::tuned_variant;  // --tuned: the stages with configurations run step 6's choice
    // Every row is checked against step 1, and each needs its fp64 reference beside the inputs and its
    // outputs: where that alone does not fit, no row can run, so the tour refuses before drawing the inputs
    // (the rows' own sizes are checked row by row below).
    const fa::Inputs in = fa::prepare_inputs(o, [](const fa::Problem& p, double input_bytes) {
      const fa::Oracle& oracle = fa::reference_oracle();
      const double reference = oracle.host_bytes ? oracle.host_bytes(p) : 0.0;
      const double outputs = 2 * fa::output_elements(p) * sizeof(float);
      fa::require_host_memory(input_bytes + reference + outputs,
                              "any row of the tour (the inputs " + fa::memory_str(input_bytes) + ", step 1's fp64 reference " +
                                  fa::memory_str(reference) + ", the outputs " + fa::memory_str(outputs) + ")");
    });
    const fa::Problem& p = o.problem;
    std::printf("problem: %s  (%.2f GFLOP forward)\n\n", p.describe().c_str(), p.flops_forward() * 1e-9);
    std::printf("%-34s %-32s %11s %8s %11s %12s\n", "stage", "variant", "max|O| err", "check", "time [ms]",
                "throughput");
    int failures = 0;
    bool any_gpu_stage = false;
    for (const fa::Stage& s : fa::stages()) any_gpu_stage = any_gpu_stage || s.gpu();
    if (!any_gpu_stage) std::printf("%-34s skipped: %s\n", "GPU stages", fa::gpu_unavailable_reason().c_str());
    for (const fa::Stage& s : fa::stages()) {
      // Each GPU stage asks its own platform: step 7 needs a Hopper GPU where steps 3 to 6 run on either.
      const std::string unavailable = s.gpu() ? s.platform->unavailable_reason() : "";
      std::vector<std::string> variants = s.variants.empty() ? std::vector<std::string>{""} : s.variants;
      const bool tune = o.tuned && !s.tuning_variants.empty() && unavailable.empty();
      fa::Problem ps = p;  // the stage's problem: the tuner may set its split count
      if (tune) {
        std::fflush(stdout);  // the rows so far come before the tuner's progress (stderr) when both go to a file
        variants = {o.tuner(s, ps)};
      }
      for (const std::string& v : variants) {
        // A long CPU row says how long before it starts (the check and the timed runs included).
        if (!s.gpu() && skip_reason(s, ps, v).empty()) {
          fa::CommonOptions as_run = o;
          as_run.bench = true;
          try {
            fa::announce_long_cpu_run(s, fa::reference_oracle(), ps, {v}, as_run);
          } catch (const std::exception&) {  // the row's own error, which the row reports when it runs
          }
        }
        std::printf("%-34s %-32s ", s.name.c_str(), v.c_str());
        std::fflush(stdout);
        if (!unavailable.empty()) {
          std::printf("skipped: %s\n", unavailable.c_str());
          break;
        }
        if (const std::string why = skip_reason(s, ps, v); !why.empty()) {
          std::printf("skipped: %s\n", why.c_str());
          continue;
        }
        try {  // one stage's error (out of memory, say) is its row's, and the tour goes on
          fa::require_memory_for(s, fa::reference_oracle(), ps, v, true);
          auto runner = s.make(ps, in, v);
          runner->run();
          if (ps.backward && s.has_backward) runner->run_backward();
          const fa::CheckReport r = fa::check_against_reference(ps, in, runner->outputs());
          const fa::Timing t = fa::time_runner(*runner, s, false);
          const double rate = ps.flops_forward() / (t.fwd_ms * 1e-3);
          char tp[32];
          std::snprintf(tp, sizeof tp, s.gpu() ? "%.1f TFLOP/s" : "%.1f GFLOP/s", s.gpu() ? rate * 1e-12 : rate * 1e-9);
          std::printf("%11.2e %8s %11.3f %12s\n", r.stage[0].max_abs, r.pass ? "pass" : "FAIL", t.fwd_ms, tp);
          if (!r.pass) ++failures;
        } catch (const std::bad_alloc&) {
          std::printf("error: out of memory\n");
          ++failures;
        } catch (const std::exception& e) {
          std::printf("error: %s\n", e.what());
          ++failures;
        }
      }
    }
    std::printf("\nerrors are max |O - O_ref| against step 1 in fp64; 'check' applies the tolerance rule to O and LSE\n");
    return failures ? 1 : 0;
  } catch (...) {
    return fa::report_error("flashattention_tour");
  }
}
