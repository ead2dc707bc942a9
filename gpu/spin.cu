// FlashAttention, step by step — a GPU spin (gpu/spin.cu): one thread busy for a number of clock cycles.
#include "gpu/cuda_util.h"

namespace fa {
namespace {
__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
}  // namespace

void gpu_spin(long long cycles) {
  spin_kernel<<<1, 1>>>(cycles);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fa
