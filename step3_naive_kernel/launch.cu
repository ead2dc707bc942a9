// FlashAttention, step by step — step 3: launching the first CUDA kernel (step3_naive_kernel/launch.cu)
#include "core/padded_head_dim.h"
#include "kernel.cuh"
#include "gpu/gpu_runner.h"
#include "gpu/platform.h"
#include "naive.h"

namespace fa::step3 {
namespace {

class NaiveRunner final : public GpuRunner {
 public:
  using GpuRunner::GpuRunner;
  void run() override {
    dispatch_dtype</*kAllowFp32=*/true>(p_.dtype, [&](auto t) {
      using T = decltype(t);
      dispatch_head_dim(int(p_.d), [&](auto dim) {
        constexpr int D = decltype(dim)::value;
        const dim3 grid((p_.Nq + kWarpsPerBlock - 1) / kWarpsPerBlock, p_.Hq, p_.B);
        if (p_.has_score_mods())  // the kernel with the modifiers: a plain problem never pays for them
          naive_forward<T, D, true><<<grid, 32 * kWarpsPerBlock>>>(params_);
        else
          naive_forward<T, D><<<grid, 32 * kWarpsPerBlock>>>(params_);
        CUDA_CHECK_LAUNCH();
      });
    });
  }
};

}  // namespace

Stage stage() {
  Stage s;
  s.name = "step3_naive_kernel";
  s.title = "naive CUDA kernel: one warp per row, K/V through registers, fp32 CUDA cores";
  s.platform = &cuda_platform();
  s.has_score_mods = true;  // --bias, --alibi, --softcap, --window: naive_forward<T, D, /*kMods=*/true>
  s.supports.head_dims = {64, 128};  // every storage type (fp32 too: CUDA cores), dropout and the modifiers
  s.unsupported = [](const Problem& p, const std::string&) {
    if (p.Nq > 65535 * kWarpsPerBlock || p.Hq > 65535 || p.B > 65535) return std::string("grid too large");
    return head_dim_unsupported(p.d);
  };
  s.make = [](const Problem& p, const Inputs& in, const std::string&) -> std::unique_ptr<Runner> {
    return std::make_unique<NaiveRunner>(p, in);
  };
  return with_padded_head_dims(s);  // d = 32, 96, ...: on the next compiled head dim, zero-padded (core/padded_head_dim.h)
}

}  // namespace fa::step3
