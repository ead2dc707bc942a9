// FlashAttention, step by step — step 4: the fused, pipelined tensor-core forward (registry entry).
#pragma once
#include <functional>
#include <string>

#include "gpu/gpu_runner.h"
#include "core/stage.h"

namespace fa::step4 {

Stage stage();

// Set-up for step 4's forward on device tensors (params.q/k/v -> params.o, params.lse), returning the
// launch; `variant` as for --variant. Step 5 runs its training forward through this.
std::function<void()> make_forward(const Problem& p, const AttnParams& params, const std::string& variant = "auto");

}  // namespace fa::step4
