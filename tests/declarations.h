// FlashAttention, step by step — what a stage declares against what it runs (tests/declarations.h).
// The test grids list their cases from each stage's declaration (core/stage.h, Supports) and fail on a
// refusal of a declared case; this check, host-side and without a GPU, is what makes a wrong refusal fail
// where no grid runs (CI): on a problem p, for every variant of a stage and every tuning configuration
// compiled for p's head dim, declared iff unsupported() returns "". What the command line refuses before
// asking the stage (--splits, --backward or a KV cache on a stage without them) is left out.
#pragma once
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "core/stage.h"

namespace fa {

// Returns how many (stage, variant) pairs it checked on p.
inline int expect_stage_declares_what_it_runs(const Stage& s, const Problem& p) {
  if ((p.splits > 0 && !s.has_splits) || (p.backward && !s.has_backward) || (p.has_kv_cache() && !s.has_kv_cache)) return 0;
  std::vector<std::string> names = s.variants.empty() ? std::vector<std::string>{""} : s.variants;
  for (const std::string& config : s.tuning_variants) {
    try {
      s.launch_shape(p, config);  // throws for a configuration the head dim (or dtype) does not compile
    } catch (const std::invalid_argument&) {
      continue;
    }
    names.push_back(config);
  }
  for (const std::string& v : names) {
    const std::string why = s.unsupported(p, v);
    EXPECT_EQ(declares(s, p, v), why.empty())
        << s.name << ":" << v << " on " << p.describe() << " splits " << p.splits
        << (why.empty() ? ": runs it but does not declare it" : ": declares it but refuses it: " + why);
  }
  return int(names.size());
}

}  // namespace fa
