// FlashAttention, step by step — harness/registry.cpp
// The one list of stages, in tutorial order: a stage joins the course by adding one line here. This file
// and the programs that link it (the tour, the tests) are the only ones that include every stage.
#include "harness/registry.h"

#include <cstdio>
#include <stdexcept>

#include "step1_cpu_reference/reference.h"
#include "step2_online_softmax/online.h"
#ifdef FA_WITH_CUDA
#include "gpu/platform.h"
#include "step3_naive_kernel/naive.h"
#include "step4_fused_pipelined/fused.h"
#include "step5_backward/backward.h"
#include "step6_autotune/autotune.h"
#endif
#ifdef FA_WITH_STEP7
#include "step7_hopper_wgmma/hopper.h"
#endif

namespace fa {

const std::vector<Stage>& stages() {
  static const std::vector<Stage> all = [] {
    std::vector<Stage> v;
    v.push_back(step1::stage());
    v.push_back(step2::stage());
#ifdef FA_WITH_CUDA
    v.push_back(step3::stage());
    v.push_back(step4::stage());
    v.push_back(step5::stage());
    v.push_back(step6::stage());
#endif
#ifdef FA_WITH_STEP7  // Hopper only: built when sm_90 is among the CUDA architectures
    v.push_back(step7::stage());
#endif
    return v;
  }();
  return all;
}

const Stage& find_stage(const std::string& name) {
  for (const Stage& s : stages())
    if (s.name == name) return s;
  throw std::invalid_argument("no stage named '" + name + "' in this build");
}

std::string gpu_unavailable_reason() {
#if defined(FA_WITH_CUDA)
  return cuda_platform().unavailable_reason();
#elif defined(FA_CUDA_DISABLED_BY_OPTION)
  return "the GPU stages were not built (configured with -DFA_WITH_CUDA=OFF)";
#else
  return "the GPU stages were not built (nvcc was not found at configure time)";
#endif
}

const Oracle& reference_oracle() {
  static const Oracle oracle = step1::oracle();
  return oracle;
}

CheckReport check_against_reference(const Problem& p, const Inputs& in, const Outputs& got) {
  return check_against(reference_oracle(), p, in, got);
}

std::string tuned_variant(const Stage& s, Problem& p) {
#ifdef FA_WITH_CUDA
  const step6::Choice c = step6::Autotuner().choose(s, p);
  p = step6::with_splits(p, c);
  std::printf("--tuned: %s config %s%s\n", c.source.c_str(), c.variant.c_str(),
              c.splits ? (" splits " + std::to_string(c.splits)).c_str() : "");
  return c.variant;
#else
  (void)s, (void)p;
  throw std::invalid_argument("--tuned needs the GPU stages (a build with CUDA)");
#endif
}

}  // namespace fa
