// FlashAttention, step by step — what the GPU test grids share (tests/gpu_grid.h): the case description,
// its readable name, the problem it makes, the list of "stage:variant" to run (the cases each stage declares
// it runs: core/stage.h, Supports), the one reason to skip (no GPU for the stage), and the verdict check.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "tests/declarations.h"
#include "harness/cli.h"
#include "harness/registry.h"

namespace fa::grid {

constexpr int64_t kDefaultPos = INT64_MIN;  // input_pos = Nk - Nq

struct Case {
  int64_t B, Hq, Hkv, Nq, Nk, d;
  bool causal;
  int64_t input_pos;  // kDefaultPos: Nk - Nq
  DType dtype;
  float dropout;
};

inline std::string case_name(const Case& c) {
  std::ostringstream s;
  s << "B" << c.B << "_H" << c.Hq << "_G" << c.Hq / c.Hkv << "_Nq" << c.Nq << "_Nk" << c.Nk << "_d" << c.d << "_"
    << dtype_name(c.dtype);
  if (c.causal) s << "_causal" << (c.input_pos == kDefaultPos ? "" : "_pos" + std::to_string(c.input_pos));
  if (c.dropout > 0) s << "_dropout";
  std::string n = s.str();
  std::replace(n.begin(), n.end(), '-', 'm');
  return n;
}

// Readable test parameters in gtest's output (instead of the bytes of the struct).
inline void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

// The problem of a case; the seed comes from its name, so every case draws its own inputs.
inline Problem to_problem(const Case& c, bool backward) {
  Problem p;
  p.B = c.B;
  p.Hq = c.Hq;
  p.Hkv = c.Hkv;
  p.Nq = c.Nq;
  p.Nk = c.Nk;
  p.d = c.d;
  p.causal = c.causal;
  p.input_pos = c.input_pos == kDefaultPos ? c.Nk - c.Nq : c.input_pos;
  p.scale = 1.0f / std::sqrt(float(c.d));
  p.dtype = c.dtype;
  p.dropout = c.dropout;
  p.seed = std::hash<std::string>{}(case_name(c)) & 0xffff;
  p.backward = backward;
  p.validate();
  return p;
}

enum class Pass { forward, backward };

// The compute capability the grids resolve "auto"-like variants for: the GPU's, or an H100's (9) where there
// is none (every case is skipped there, and the list of tests stays the one the H100 runs).
inline int grid_cc_major() {
  for (const Stage& s : stages())
    if (s.platform && s.platform->unavailable_reason().empty()) return s.platform->compute_capability_major();
  return 9;
}

// ("stage:variant", case) for every GPU stage that owns the kernels of `pass` (not those that borrow another
// stage's, like step 5's forward or step 6's), every variant of it and every case the stage declares it runs
// (core/stage.h, Supports: step 7 lists no dropout case, steps 4 to 7 no fp32 one), less the pairs whose
// variant runs the same configuration as an earlier variant of the stage on that case (step 4's "auto" is
// "sm90" on an H100; at d = 64 "sm120" is too).
inline std::vector<std::tuple<std::string, Case>> grid_entries(Pass pass, const std::vector<Case>& cases,
                                                               const std::function<bool(const std::string&)>& keep_variant) {
  std::vector<std::tuple<std::string, Case>> out;
  const int cc = grid_cc_major();
  for (const Stage& s : stages()) {
    if (!s.gpu()) continue;
    if (pass == Pass::forward && !s.forward_from.empty()) continue;
    if (pass == Pass::backward && (!s.has_backward || !s.backward_from.empty())) continue;
    const std::vector<std::string> variants = s.variants.empty() ? std::vector<std::string>{""} : s.variants;
    for (const Case& c : cases) {
      const Problem p = to_problem(c, pass == Pass::backward);
      std::vector<std::string> seen;
      for (const std::string& v : variants) {
        if (!keep_variant(v) || !declares(s, p, v)) continue;
        if (s.config_of) {
          const std::string config = s.config_of(p, v, cc);
          if (std::find(seen.begin(), seen.end(), config) != seen.end()) continue;
          seen.push_back(config);
        }
        out.emplace_back(v.empty() ? s.name : s.name + ":" + v, c);
      }
    }
  }
  return out;
}

// "stage" or "stage:variant" for every GPU stage of the registry that `keep` accepts, and each variant
// of it that `keep_variant` accepts.
inline std::vector<std::string> stage_variants(const std::function<bool(const Stage&)>& keep,
                                               const std::function<bool(const std::string&)>& keep_variant) {
  std::vector<std::string> v;
  for (const Stage& s : stages()) {
    if (!s.gpu() || !keep(s)) continue;
    if (s.variants.empty()) v.push_back(s.name);
    for (const std::string& var : s.variants)
      if (keep_variant(var)) v.push_back(s.name + ":" + var);
  }
  return v;
}

// The stage and variant of "stage:variant", and why this machine cannot run the stage ("" when it can): no
// GPU, or (step 7) one that is not a Hopper. That is the one reason a grid case skips. The cases are listed
// from what the stage declares it runs, so its refusal of one (refusal(), below) is a failure:
//   if (const std::string why = resolve(stage_variant, s, variant); !why.empty()) GTEST_SKIP() << why;
//   ASSERT_EQ(refusal(*s, p, variant), "");
inline std::string resolve(const std::string& stage_variant, const Stage*& s, std::string& variant) {
  const size_t colon = stage_variant.find(':');
  s = &find_stage(stage_variant.substr(0, colon));
  variant = colon == std::string::npos ? "" : stage_variant.substr(colon + 1);
  return s->gpu() ? s->platform->unavailable_reason() : "";
}

// Why the stage refuses p in `variant` although it declares it ("" when it runs it, as it should), or why
// it is not declared at all (a test that lists an undeclared case by mistake).
inline std::string refusal(const Stage& s, const Problem& p, const std::string& variant) {
  const std::string sv = variant.empty() ? s.name : s.name + ":" + variant;
  if (!declares(s, p, variant)) return sv + " does not declare this case (core/stage.h, Supports)";
  if (std::string why = s.unsupported(p, variant); !why.empty())
    return sv + " declares this case but refuses it: " + why;
  return "";
}

// tests/declarations.h's check on p for every GPU stage that `keep` accepts.
inline void expect_declarations_agree(const Problem& p, const std::function<bool(const Stage&)>& keep) {
  for (const Stage& s : stages())
    if (s.gpu() && keep(s)) expect_stage_declares_what_it_runs(s, p);
}

// Every output of the report passes the tolerance rule, and every element was written.
inline void expect_pass(const CheckReport& r) {
  for (int k = 0; k < r.n; ++k) {
    const ErrorStats& e = r.stage[k];
    EXPECT_TRUE(r.verdict[k].pass) << CheckReport::name(k) << ": max_abs " << e.max_abs << " > tolerance "
                                   << r.verdict[k].tolerance << " (naive low precision " << r.baseline[k].max_abs
                                   << "), unwritten " << e.unwritten << ", NaN computed " << e.nan << ", NaN in the reference "
                                   << e.ref_nan << ", inf mismatches " << e.mismatched_inf;
  }
}

// gtest's name of a "stage:variant" parameter (no ':' allowed).
inline std::string param_name(std::string n) {  // gtest names: letters, digits and '_' only
  std::replace_if(n.begin(), n.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
  return n;
}

// Runs `runner`'s forward, then its backward twice, and expects outputs first .. last - 1 of (dQ, dK, dV,
// dBias) to hold the same bits both times (each of them written: not empty).
inline void expect_backward_repeats(Runner& runner, int first, int last, int64_t d) {
  runner.run();
  runner.run_backward();
  const Outputs a = runner.outputs();
  runner.run_backward();
  const Outputs b = runner.outputs();
  const Tensor* ta[] = {&a.dq, &a.dk, &a.dv, &a.dbias};
  const Tensor* tb[] = {&b.dq, &b.dk, &b.dv, &b.dbias};
  for (int k = first; k < last; ++k) {
    ASSERT_EQ(ta[k]->size(), tb[k]->size());
    ASSERT_GT(ta[k]->size(), 0u);
    EXPECT_EQ(std::memcmp(ta[k]->ptr(), tb[k]->ptr(), ta[k]->size() * sizeof(float)), 0)
        << CheckReport::name(k + 2) << " differs between two runs (d = " << d << ")";
  }
}

}  // namespace fa::grid
