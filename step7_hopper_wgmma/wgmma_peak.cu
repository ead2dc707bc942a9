// FlashAttention, step by step — step 7: the ceiling of its tensor-core instructions (step7_hopper_wgmma/wgmma_peak.cu)
//
// What it measures: how many TFLOP/s the H100 sustains on exactly the wgmma instructions 7c issues, with
// nothing else in the loop (no softmax, no copies, no turns): the ceiling a trip of step 7 can approach, as
// docs/bench/mma_peak is for mma.sync. The shapes, as in a trip at d = 128 (wgmma.cuh):
//   qk176   S = Q K^T with 176-key tiles: 8 x m64n176k16, A and B from shared memory (SS)
//   qk128   the same with 128-key tiles:  8 x m64n128k16 (SS)
//   pv176   O += P V with 176-key tiles:  11 x m64n128k16, A (P) from registers, B (V) MN-major (RS)
//   trip176 one warpgroup's share of a trip of 7c: qk176 then pv176 (two commit groups, as 7c)
//   trip128 the same with 128-key tiles
// How: every block has `--warpgroups` warpgroups (7c: 2), each running the shape's instructions `--iters`
// times into its own accumulators, with at most two commit groups in flight (wgmma.wait_group 1, as 7c);
// shared memory holds a Q tile and a K (or V) tile of pseudo-random bf16 in the 128-byte swizzle, read again
// and again; one block per SM, one wave. Timing: CUDA events, two warm-up launches, the median of --reps.
//
//   wgmma_peak [--shape trip176] [--warpgroups 1|2] [--iters N] [--reps R] [--json FILE]
//
// Needs an sm_90 GPU (wgmma is sm_90a's): anywhere else it says so and exits with 2, as for any error.
#include <cuda_bf16.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpu/cuda_util.h"
#include "gpu/platform.h"
#include "gpu/ptx.h"
#include "step7_hopper_wgmma/wgmma.cuh"

namespace {

using T = __nv_bfloat16;
enum class Shape { kQk176, kQk128, kPv176, kTrip176, kTrip128 };

constexpr int kD = 128;                                // head dim: 8 k16 steps of S, n = 128 for O
constexpr uint32_t kQBytes = 2 * 64 * 128;             // [2 panels][64 rows, 64]: a warpgroup's Q rows
constexpr uint32_t kKVBytes = 2 * 176 * 128;           // [2 panels][176 rows, 64]: the longest K or V tile
constexpr uint32_t kSmemBytes = kQBytes + kKVBytes + 1024;  // + the slack to align to 1024

// S = Q K^T of one trip: 8 wgmmas of n = Bc, both operands in shared memory, with warpgroup_qk's descriptors
// but every one accumulating: in a loop of warpgroup_qk (whose first wgmma overwrites S) every S but the last
// is dead, and ptxas deletes the products that made it.
template <int Bc>
__device__ __forceinline__ void qk(float (&s)[Bc / 8][4], uint32_t q, uint32_t k) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t panel = kk / 4, col = (kk % 4) * 32;  // 64 columns per panel, 32 bytes per k16 step
    fa::step7::Wgmma<T, Bc>::ss(s, fa::step7::desc_sw128(q + panel * 64 * 128 + col, 16, 1024),
                                fa::step7::desc_sw128(k + panel * Bc * 128 + col, 16, 1024), true);
  }
}

template <Shape kShape, int kWarpgroups>
__global__ void __launch_bounds__(128 * kWarpgroups, 1) wgmma_loop(float* out, int iters) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  // Pseudo-random bf16 in [-1/64, 1/64): real data, so the tensor cores switch as they do in step 7.
  for (uint32_t i = threadIdx.x; i < (kQBytes + kKVBytes) / 2; i += blockDim.x) {
    const uint32_t h = (i * 2654435761u) ^ ((i >> 7) * 40503u);
    reinterpret_cast<T*>(smem)[i] = __float2bfloat16(float(int(h % 2048) - 1024) * (1.0f / 65536.0f));
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic writes, then wgmma's reads
  __syncthreads();
  const uint32_t q = fa::ptx::smem_u32(smem), kv = q + kQBytes;
  constexpr bool kQk = kShape != Shape::kPv176, kPv = kShape == Shape::kPv176 || kShape == Shape::kTrip176 ||
                                                       kShape == Shape::kTrip128;
  constexpr int kBc = kShape == Shape::kQk128 || kShape == Shape::kTrip128 ? 128 : 176;
  float s[kBc / 8][4] = {};
  float o[kD / 8][4] = {};
  const float x = 1e-3f * float(threadIdx.x % 7 + 1);
  const uint32_t pa[4] = {fa::ptx::pack2<T>(x, -x), fa::ptx::pack2<T>(x, x), fa::ptx::pack2<T>(-x, x),
                          fa::ptx::pack2<T>(x, 0.5f * x)};
  for (int it = 0; it < iters; ++it) {
    fa::step7::wgmma_fence();
    if constexpr (kQk) {
      qk<kBc>(s, q, kv);
      fa::step7::wgmma_commit();
    }
    if constexpr (kPv) {
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk)  // warpgroup_pv's descriptors, one P fragment for every step
        fa::step7::Wgmma<T, kD>::rs(o, pa, fa::step7::desc_sw128(kv + kk * 2048, kBc * 128, 1024));
      fa::step7::wgmma_commit();
    }
    fa::step7::wgmma_wait<1>();  // at most two groups in flight, as in 7c
  }
  fa::step7::wgmma_wait<0>();
  fa::step7::fence_regs(s);
  fa::step7::fence_regs(o);
  float sum = 0;
#pragma unroll
  for (int j = 0; j < kBc / 8; ++j) sum += s[j][0] + s[j][1] + s[j][2] + s[j][3];
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) sum += o[j][0] + o[j][1] + o[j][2] + o[j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;  // so that nothing is dropped
}

// FLOPs one warpgroup does per iteration of the shape.
double flops_per_iter(Shape sh) {
  const double qk176 = 8 * 2.0 * 64 * 176 * 16, qk128 = 8 * 2.0 * 64 * 128 * 16;
  const double pv176 = 11 * 2.0 * 64 * kD * 16, pv128 = 8 * 2.0 * 64 * kD * 16;
  switch (sh) {
    case Shape::kQk176: return qk176;
    case Shape::kQk128: return qk128;
    case Shape::kPv176: return pv176;
    case Shape::kTrip176: return qk176 + pv176;
    case Shape::kTrip128: return qk128 + pv128;
  }
  return 0;
}

template <Shape kShape>
void (*pick(int warpgroups))(float*, int) {
  switch (warpgroups) {
    case 1: return wgmma_loop<kShape, 1>;
    default: return wgmma_loop<kShape, 2>;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wgmma_peak: sustained throughput of step 7's wgmma instructions alone (bf16, fp32 accumulate)"};
  const std::map<std::string, Shape> shapes = {{"qk176", Shape::kQk176}, {"qk128", Shape::kQk128},
                                               {"pv176", Shape::kPv176}, {"trip176", Shape::kTrip176},
                                               {"trip128", Shape::kTrip128}};
  std::string shape_name = "trip176", json_file;
  int warpgroups = 2, iters = 4096, reps = 9;
  app.add_option("--shape", shape_name, "qk176, qk128, pv176, trip176 or trip128 (see the file's header)")
      ->capture_default_str()->check(CLI::IsMember(shapes));
  app.add_option("--warpgroups", warpgroups, "warpgroups per block (one block per SM)")->capture_default_str()
      ->check(CLI::Range(1, 2));
  app.add_option("--iters", iters, "loop iterations per warpgroup")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed launches; the median is reported")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--json", json_file, "append one JSON record to FILE");
  CLI11_PARSE(app, argc, argv);
  if (const std::string why = fa::cuda_platform().unavailable_reason(); !why.empty()) {
    std::fprintf(stderr, "wgmma_peak: %s\n", why.c_str());
    return 2;
  }
  if (const int major = fa::cuda_platform().compute_capability_major(); major != 9) {
    std::fprintf(stderr, "wgmma_peak: needs an sm_90 GPU (wgmma); this one is sm_%dx\n", major);
    return 2;
  }
  try {
    const Shape sh = shapes.at(shape_name);
    void (*kernel)(float*, int) = nullptr;
    switch (sh) {
      case Shape::kQk176: kernel = pick<Shape::kQk176>(warpgroups); break;
      case Shape::kQk128: kernel = pick<Shape::kQk128>(warpgroups); break;
      case Shape::kPv176: kernel = pick<Shape::kPv176>(warpgroups); break;
      case Shape::kTrip176: kernel = pick<Shape::kTrip176>(warpgroups); break;
      case Shape::kTrip128: kernel = pick<Shape::kTrip128>(warpgroups); break;
    }
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int threads = 128 * warpgroups;
    fa::DeviceBuffer out(size_t(sms) * threads * sizeof(float));
    auto launch = [&] {
      kernel<<<sms, threads, kSmemBytes>>>(out.as<float>(), iters);
      CUDA_CHECK_LAUNCH();
    };
    const double median_ms = fa::GpuTimer().median_ms(launch, reps);
    const double tflops = double(sms) * warpgroups * double(iters) * flops_per_iter(sh) / (median_ms * 1e-3) / 1e12;
    const std::string device = fa::gpu_name();
    std::printf("%s: wgmma %s, %d warpgroup(s) per SM: %.1f TFLOP/s  (%.3f ms median of %d)\n", device.c_str(),
                shape_name.c_str(), warpgroups, tflops, median_ms, reps);
    if (!json_file.empty()) {
      std::ofstream f(json_file, std::ios::app);
      if (!f) throw std::runtime_error("cannot open " + json_file + " for appending");
      const nlohmann::json rec = {{"kind", "wgmma_peak"}, {"shape", shape_name}, {"warpgroups", warpgroups},
                                  {"iters", iters},       {"tflops", tflops},    {"ms", median_ms},
                                  {"device", device},     {"cuda", fa::cuda_runtime_version()}};
      f << rec.dump() << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wgmma_peak: error: %s\n", e.what());
    return 2;
  }
}
