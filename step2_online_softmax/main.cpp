// FlashAttention, step by step — step 2's executable (step2_online_softmax/main.cpp)
//
//   step2_online_softmax --check --bench       every variant on the problem, one line each
//   step2_online_softmax --variant fa2 --check one variant, with the harness's full report (and --dump, --json)
//   step2_online_softmax --backward --check    fa1 (q-outer) and fa2 (kv-outer) backward, dQ, dK, dV checked too
//   step2_online_softmax --trace               the worked example N = 6, d = 2, M = 20, block by block (fa2)
//   step2_online_softmax --trace --variant fa1 the same in FlashAttention-1's loop order, with dropout
//   step2_online_softmax --trace --backward    the same through fa2's backward (kv-outer), tile by tile
//   step2_online_softmax --footprint           the intermediate memory of 3pass, 2pass and online
//   step2_online_softmax --cu-seqlens-q 0,5,5,12 --cu-seqlens-k 0,7,7,20 --check
//                                              a packed variable-length batch, every variant (core/varlen.h)
// --tile sets the keys per tile of 2pass and online, --budget the on-chip floats M of fa1 and fa2. A flag
// that the chosen mode or variant would ignore is refused, as the common CLI refuses bad input: one line,
// exit code 2.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/cli.h"
#include "step1_cpu_reference/reference.h"
#include "step2_online_softmax/online.h"

namespace {

std::string blocks_of(const std::string& v, const fa::step2::Config& cfg, int64_t d, int64_t Nk) {
  if (v == "2pass" || v == "online")
    return "tile " + std::to_string(cfg.tile) + " (T = " + std::to_string((Nk + cfg.tile - 1) / cfg.tile) + ")";
  if (v == "fa1" || v == "fa2") {
    const fa::step2::Blocks bl = fa::step2::blocks_from_budget(cfg.budget, d);
    return "Br " + std::to_string(bl.Br) + " x Bc " + std::to_string(bl.Bc);
  }
  return "whole rows";
}

// Every variant on one set of inputs: check against step 1 and time, one line each. With --backward, the
// variants that have a backward (fa1, fa2), with the errors of dQ, dK, dV and the backward's time too.
int run_all(const fa::Stage& s, fa::CommonOptions& o, const fa::step2::Config& cfg) {
  if (!o.dump_dir.empty() || !o.json_file.empty())
    throw std::invalid_argument("--dump and --json record one variant: add --variant");
  fa::check_common_flags(s, o);  // --bench-against needs --bench, no --tuned, ...
  if (!o.bench_against.empty())
    throw std::invalid_argument("--bench-against times one variant against another: add --variant");
  std::vector<std::string> variants;
  // Each variant runs alone, so the largest need counts; refused, and a long run announced, before the inputs
  // take their memory and time.
  const fa::Inputs in = fa::prepare_inputs(o, [&](const fa::Problem& p, double input_bytes) {
    for (const std::string& v : s.variants)
      if (s.unsupported(p, v).empty()) variants.push_back(v);
    for (const std::string& v : variants) fa::require_memory_for(s, fa::step1::oracle(), p, v, o.check, input_bytes);
    fa::announce_long_cpu_run(s, fa::step1::oracle(), p, variants, o);
  });
  const fa::Problem& p = o.problem;
  std::printf("%s: %s  (%.2f GFLOP%s)\n", s.name.c_str(), p.describe().c_str(), p.flops_forward() * 1e-9,
              p.backward ? " forward" : "");
  const int n = p.backward ? 5 : 2;  // O, LSE (, dQ, dK, dV)
  std::printf("%-8s %-20s %12s %12s", "variant", "blocks", "max|O| err", "max|LSE| err");
  if (p.backward) std::printf(" %-9s %12s %12s %12s", "backward", "max|dQ| err", "max|dK| err", "max|dV| err");
  std::printf(" %6s %11s %9s%s\n", "check", "time [ms]", "GFLOP/s", p.backward ? "  bwd [ms]  GFLOP/s" : "");
  int failures = 0;
  std::string nonfinite, first_nonfinite;  // the variants whose outputs hold NaN or an infinity; the first's details
  for (const std::string& v : variants) {
    std::printf("%-8s %-20s ", v.c_str(), blocks_of(v, cfg, p.d, p.Nk).c_str());
    std::fflush(stdout);
    auto runner = s.make(p, in, v);
    runner->run();
    if (p.backward) runner->run_backward();
    fa::CheckReport r;
    const fa::Outputs out = runner->outputs();
    if (const std::string why = fa::nonfinite_outputs(p, in, out); !why.empty()) {
      if (nonfinite.empty()) first_nonfinite = v + ": " + why;
      nonfinite += (nonfinite.empty() ? "" : ", ") + v;
    }
    if (o.check) r = fa::check_against(fa::step1::oracle(), p, in, out);
    for (int k = 0; k < n; ++k) {
      if (k == 2) {
        fa::step2::Order order = fa::step2::Order::kv_outer;
        fa::step2::backward_order(v, order);
        std::printf("%-9s ", fa::step2::order_name(order));
      }
      if (o.check) std::printf("%12.3e ", r.stage[k].max_abs);
      else std::printf("%12s ", "-");
    }
    std::printf("%6s ", o.check ? (r.pass ? "pass" : "FAIL") : "-");
    failures += o.check && !r.pass ? 1 : 0;
    if (o.bench) {
      const fa::Timing t = fa::time_runner(*runner, s, p.backward);
      std::printf("%11.3f %9.2f", t.fwd_ms, p.flops_forward() / (t.fwd_ms * 1e-3) * 1e-9);
      if (p.backward) std::printf(" %9.3f %8.2f", t.bwd_ms, p.flops_backward() / (t.bwd_ms * 1e-3) * 1e-9);
      std::printf("\n");
    } else {
      std::printf("%11s %9s", "-", "-");
      if (p.backward) std::printf(" %9s %8s", "-", "-");
      std::printf("\n");
    }
  }
  if (o.check)
    std::printf("errors against step 1 in fp64; check: max_abs <= 2 * (step 1 in %s) + 1e-5 * max(1, |ref|)\n",
                fa::dtype_name(p.dtype));
  if (!o.check && !o.bench)
    std::printf("every variant ran once; --check compares each with step 1 in fp64, --bench times it\n");
  if (!nonfinite.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: the outputs of %s are not finite; %s\n", s.name.c_str(), nonfinite.c_str(),
                 first_nonfinite.c_str());
    return fa::kExitNonFinite;
  }
  return failures ? 1 : 0;
}

// --trace: fa2's forward (the default), fa1's forward with dropout, or fa2's backward.
std::string trace_text(const fa::CommonOptions& o) {
  const std::string v = o.variant.empty() ? "fa2" : o.variant;
  const uint64_t seed = o.seed.value_or(0);
  if (v != "fa1" && v != "fa2")
    throw std::invalid_argument("--trace walks the loop order of fa2 (FlashAttention-2) or fa1 (FlashAttention-1): "
                                "--variant " + v + " has none");
  if (o.problem.backward && v == "fa1")
    throw std::invalid_argument("--trace --backward walks fa2's backward (kv-outer) only: drop --variant fa1");
  if (o.problem.backward) return fa::step2::trace_backward(seed);
  return v == "fa1" ? fa::step2::trace_fa1(seed) : fa::step2::trace(seed);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string name = "step2_online_softmax";
  CLI::App app{name + ": the online-softmax invariant on the CPU (3pass, 2pass, online, fa1, fa2)"};
  fa::CommonOptions o;
  fa::add_common_options(app, o);
  fa::step2::Config cfg;
  bool trace = false, footprint = false;
  app.add_flag("--trace", trace,
               "print the worked example (N = 6, d = 2, M = 20) block by block in fa2's loop order, then exit; "
               "with --variant fa1 in FlashAttention-1's loop order, with dropout; with --backward through fa2's "
               "backward (kv-outer)");
  app.add_flag("--footprint", footprint,
               "print the intermediate memory of 3pass, 2pass and online for --seq-q, --seq-k, --dim, --tile");
  const uint64_t most = std::numeric_limits<int64_t>::max();
  app.add_option("--tile", cfg.tile, "keys per tile of 2pass and online")
      ->check(fa::whole_number(1, most))
      ->capture_default_str();
  app.add_option("--budget", cfg.budget, "on-chip floats M of fa1 and fa2: Bc = ceil(M / 4d), Br = min(Bc, d)")
      ->check(fa::whole_number(1, most))
      ->capture_default_str();
  if (const std::optional<int> rc = fa::parse_command_line(app, argc, argv, name)) return *rc;
  try {
    fa::check_command_line(app, o);
    if (trace) {
      fa::refuse_flags_beside(app, "--trace", {"--seed", "--variant", "--backward"},
                              "prints one fixed worked example (N = 6, d = 2, M = 20) in the loop order of --variant "
                              "fa2 or fa1, or through fa2's --backward, changed only by --seed");
      std::fputs(trace_text(o).c_str(), stdout);
      return 0;
    }
    if (footprint) {
      fa::refuse_flags_beside(app, "--footprint", {"--seq", "--seq-q", "--seq-k", "--dim", "--tile", "--budget"},
                              "prints a memory table of --seq, --seq-q, --seq-k, --dim, --tile and --budget");
      const int64_t Nq = o.seq_q.value_or(o.seq.value_or(1024)), Nk = o.seq_k.value_or(o.seq.value_or(1024));
      const int64_t d = o.dim.value_or(o.problem.d);
      if (Nq <= 0 || Nk <= 0 || d <= 0) throw std::invalid_argument("sizes must be positive");
      std::fputs(fa::step2::footprint_table(Nq, Nk, d, cfg.tile, cfg.budget).c_str(), stdout);
      return 0;
    }
    // One variant uses one of the two settings: the other would be ignored.
    const std::string& v = o.variant;
    if (app.count("--tile") && !v.empty() && v != "2pass" && v != "online")
      throw std::invalid_argument("--tile sets the tiles of 2pass and online; --variant " + v + " does not use it");
    if (app.count("--budget") && !v.empty() && v != "fa1" && v != "fa2")
      throw std::invalid_argument("--budget sets the blocks of fa1 and fa2; --variant " + v + " does not use it");
    const fa::Stage s = fa::step2::stage(cfg);
    // A packed variable-length batch (--cu-seqlens-q/-k): every variant that runs it, or the one named.
    if (o.varlen() && !o.list_variants)
      return fa::run_varlen(s, fa::step1::oracle(), o, v.empty() ? s.variants : std::vector<std::string>{v});
    return v.empty() && !o.list_variants ? run_all(s, o, cfg) : fa::run_stage(s, fa::step1::oracle(), o);
  } catch (...) {
    return fa::report_error(name);
  }
}
