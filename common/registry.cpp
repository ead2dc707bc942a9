// FlashAttention, step by step — common/registry.cpp
// The one list of stages, in tutorial order. The CLI, the tests, the tour and the benchmarks iterate it;
// a stage joins the course by adding one line here.
#include <stdexcept>

#include "stage.h"
#include "step1_cpu_reference/reference.h"
#include "step2_online_softmax/online.h"
#ifdef FA_WITH_CUDA
#include "cuda_util.h"
#include "step3_naive_kernel/naive.h"
#include "step4_fused_pipelined/fused.h"
#include "step5_backward/backward.h"
#include "step6_autotune/autotune.h"
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
#ifdef FA_WITH_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
      return std::string("no NVIDIA GPU or driver on this machine (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
    return std::string("no usable CUDA device (") + cudaGetErrorString(e) + ")";
  }
  if (n == 0) return "no CUDA device found";
  return "";
#else
  return "this build has no CUDA (nvcc was not found at configure time)";
#endif
}

}  // namespace fa
