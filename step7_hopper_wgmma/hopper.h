// FlashAttention, step by step — step 7: the Hopper forward with wgmma, warp specialization and ping-pong
// (registry entry). Needs an sm_90 GPU; built when 90 is among the CUDA architectures.
#pragma once
#include <functional>
#include <string>

#include "core/stage.h"
#include "gpu/attn_params.h"

namespace fa::step7 {

Stage stage();

// Set-up for step 7's forward on device tensors (params.q/k/v -> params.o, params.lse), returning the
// launch; `variant` as for --variant. Its --backward runs step 5's backward from this forward.
std::function<void()> make_forward(const Problem& p, const AttnParams& params, const std::string& variant = "auto");

}  // namespace fa::step7
