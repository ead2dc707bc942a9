// FlashAttention, step by step — docs/bench/mma_peak.cu
// The GPU's sustained mma.sync.m16n8k16 bf16 throughput (fp32 accumulate): the ceiling for kernels built
// on mma.sync (every stage of this course; wgmma, which is faster on the H100, is not used). On the H100
// 80GB HBM3 the course is measured on it reports 651 TFLOP/s (docs/results/sweep-h100-2026-11-23.json).
//
// How: every warp runs kChains independent accumulator chains, so consecutive mma instructions never wait
// on each other and the tensor-core pipeline stays full; operands live in registers (no memory traffic in
// the loop); the grid is exactly one full wave of resident blocks (several per SM); the accumulators are
// written out at the end so the compiler cannot drop the work. Timing: CUDA events, warm-up launches,
// the median of several timed launches.
//
//   mma_peak [--iters N] [--reps R] [--json FILE]
//
// Without a usable GPU it stops at once with one line saying why, and exit code 2 (as for any error).
#include <cuda_bf16.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpu/cuda_util.h"
#include "gpu/platform.h"
#include "gpu/ptx.h"

namespace {

constexpr int kChains = 8;       // independent mma chains per warp
constexpr int kThreads = 256;    // 8 warps per block
constexpr double kFlopsPerMma = 2.0 * 16 * 8 * 16;

__global__ void __launch_bounds__(kThreads) mma_loop(float* out, int iters) {
  // Operands depend on the thread so nothing is a compile-time constant; small values keep sums finite.
  const float x = 1e-3f * float(threadIdx.x % 7 + 1);
  const uint32_t a[4] = {fa::ptx::pack2<__nv_bfloat16>(x, -x), fa::ptx::pack2<__nv_bfloat16>(x, x),
                         fa::ptx::pack2<__nv_bfloat16>(-x, x), fa::ptx::pack2<__nv_bfloat16>(x, 0.5f * x)};
  const uint32_t b[2] = {fa::ptx::pack2<__nv_bfloat16>(x, x), fa::ptx::pack2<__nv_bfloat16>(-x, x)};
  float c[kChains][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int k = 0; k < kChains; ++k) fa::ptx::mma_16816<__nv_bfloat16>(c[k], a, b);
  }
  float sum = 0;
#pragma unroll
  for (int k = 0; k < kChains; ++k) sum += c[k][0] + c[k][1] + c[k][2] + c[k][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mma_peak: sustained mma.sync.m16n8k16 bf16 (fp32 accumulate) throughput of this GPU"};
  int iters = 16384, reps = 9;
  std::string json_file;
  app.add_option("--iters", iters, "loop iterations per thread (kChains mma each)")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed launches; the median is reported")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--json", json_file, "append one JSON record to FILE");
  CLI11_PARSE(app, argc, argv);
  if (const std::string why = fa::cuda_platform().unavailable_reason(); !why.empty()) {
    std::fprintf(stderr, "mma_peak: %s\n", why.c_str());
    return 2;
  }
  try {
    int dev = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mma_loop, kThreads, 0));
    const int blocks = sms * per_sm;  // one full wave: no tail of half-empty SMs
    fa::DeviceBuffer out(size_t(blocks) * kThreads * sizeof(float));

    auto launch = [&] {
      mma_loop<<<blocks, kThreads>>>(out.as<float>(), iters);
      CUDA_CHECK_LAUNCH();
    };
    const double median_ms = fa::GpuTimer().median_ms(launch, reps);
    const double flops = double(blocks) * (kThreads / 32) * double(iters) * kChains * kFlopsPerMma;
    const double tflops = flops / (median_ms * 1e-3) / 1e12;
    const std::string device = fa::gpu_name();

    std::printf("%s: mma.sync m16n8k16 bf16 (fp32 acc) %.1f TFLOP/s  (%d SMs x %d blocks of %d threads, "
                "%.3f ms median of %d)\n",
                device.c_str(), tflops, sms, per_sm, kThreads, median_ms, reps);
    if (!json_file.empty()) {
      std::ofstream f(json_file, std::ios::app);
      if (!f) throw std::runtime_error("cannot open " + json_file + " for appending");
      const nlohmann::json rec = {{"kind", "mma_peak"}, {"dtype", "bf16"}, {"tflops", tflops},
                                  {"device", device},   {"cuda", fa::cuda_runtime_version()}};
      f << rec.dump() << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mma_peak: error: %s\n", e.what());
    return 2;
  }
}
