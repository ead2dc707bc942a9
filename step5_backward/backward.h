// FlashAttention, step by step — step 5: the backward pass on tensor cores (registry entry).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "core/stage.h"

namespace fa {
struct AttnParams;
struct Varlen;
namespace step4 {
struct PackedBatch;
}
}

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

// A packed batch's forward set-up on a runner's device tensors (p: the grid's problem, B sequences of the
// longest lengths; pb: the offsets on the device), returning its launch: step 4's make_packed_forward (4g), or
// step 7's (7e).
using PackedForwardFactory =
    std::function<std::function<void()>(const Problem& grid, const AttnParams& params, const step4::PackedBatch& pb,
                                        int64_t total_q, int64_t total_k, const std::string& variant)>;
// Step 5's packed runner (core/varlen.h: Stage::make_varlen) with the forward `forward` makes for the part of
// `variant` after "/fwd=": step 7 runs a packed batch with its own forward and this backward.
std::unique_ptr<Runner> make_packed_runner(const Problem& p, const Varlen& v, const Inputs& packed,
                                           const std::string& variant, const PackedForwardFactory& forward);

}  // namespace fa::step5
