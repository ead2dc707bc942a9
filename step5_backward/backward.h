// FlashAttention, step by step — step 5: the backward pass on tensor cores (registry entry).
#pragma once
#include <string>

#include "core/stage.h"

namespace fa::step5 {

Stage stage();

// A step 5 variant whose training forward runs step 4's configuration `forward` (step 6 uses it to run
// both passes in their tuned configurations): "<variant>/fwd=<forward>".
std::string with_forward(const std::string& variant, const std::string& forward);

}  // namespace fa::step5
