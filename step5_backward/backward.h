// FlashAttention, step by step — step 5: the backward pass on tensor cores (registry entry).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "core/stage.h"
#include "step4_fused_pipelined/fused.h"

namespace fa::step5 {

Stage stage();

// A step 5 variant whose training forward runs step 4's configuration `forward` (step 6 uses it to run
// both passes in their tuned configurations): "<variant>/fwd=<forward>".
std::string with_forward(const std::string& variant, const std::string& forward);

// A forward's set-up on a runner's device tensors (params.q, k, v -> params.o, params.lse), returning its
// launch: step 4's make_forward, or another stage's.
using ForwardFactory =
    std::function<std::function<void()>(const Problem& p, const AttnParams& params, const std::string& variant)>;
// Step 5's runner (its forward, then its backward) with the forward `forward` makes for the part of
// `variant` after "/fwd=": step 7 trains with its own forward and this backward.
std::unique_ptr<Runner> make_runner(const Problem& p, const Inputs& in, const std::string& variant,
                                    const ForwardFactory& forward);

// The zero-copy path (core/stage.h, Stage::run_device): a forward runs 4g (step 4's run_device) at the
// forward part of `variant`; a backward runs the packed kernels on the caller's tensors from the O and LSE
// given. Step 7's backward is this one.
std::string run_device(const Problem& p, const Varlen& v, const DeviceBatch& t, const std::string& variant);

// A packed batch's forward set-up (step 4's PackedForward): 4g's make_packed_forward, or step 7's (7e).
using PackedForwardFactory = step4::PackedForward;
// Step 5's packed runner (core/varlen.h: Stage::make_varlen) with the forward `forward` makes for the part of
// `variant` after "/fwd=": step 7 runs a packed batch with its own forward and this backward.
std::unique_ptr<Runner> make_packed_runner(const Problem& p, const Varlen& v, const Inputs& packed,
                                           const std::string& variant, const PackedForwardFactory& forward);

}  // namespace fa::step5
