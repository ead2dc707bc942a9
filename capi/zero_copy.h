// FlashAttention, step by step — capi/zero_copy.h
// The C interface's zero-copy path: a device call whose tensors are laid out as a stage's kernels read them
// runs on them in place (core/stage.h, Stage::run_device), instead of through the host (capi/staging.h).
//   Q, O, dO, dQ [B, N, H, d] contiguous  =  the packed layout [B * N, H, d] of B sequences of N tokens
//   the LSE [B, Hq, Nq]                    read and written in place when its strides are the packed
//                                          [Hq, B * Nq]'s, else through a device scratch and 2-D copies
// Everything is queued on the CUDA default stream; nothing waits for the GPU.
#pragma once
#include <string>

#include "capi/flash_step.h"
#include "core/stage.h"
#include "core/varlen.h"

namespace fa::capi {

struct CallTensors {
  const fs_tensor *q, *k, *v, *o, *lse;                  // a forward writes o and lse, a backward reads them
  const fs_tensor *dout = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;  // a backward's
};

// Runs pass p (p.backward: the backward) of stage s on the caller's device tensors when s has a zero-copy path
// that takes the call and every tensor is laid out for it; v: the sequences (a dense batch's are B of equal
// length). Returns false, with nothing the caller can see done, when the call must be copied instead.
bool run_zero_copy(const Stage& s, const std::string& variant, const Problem& p, const Varlen& v, fs_dtype dtype,
                   const CallTensors& t);

// A dense batch as a packed one: B sequences of Nq queries and Nk keys (empty if B * N does not fit int32).
Varlen dense_as_packed(const Problem& p);

}  // namespace fa::capi
