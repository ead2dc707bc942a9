// FlashAttention, step by step — step 4: the fused, pipelined tensor-core forward (registry entry).
#pragma once
#include <functional>
#include <string>

#include "gpu/attn_params.h"
#include "core/stage.h"
#include "core/varlen.h"

namespace fa::step4 {

struct PackedBatch;  // packed_batch.h

Stage stage();

// "" when step 4's kernels can run p, otherwise why not (step 5, which runs them for its forward, asks too).
std::string unsupported(const Problem& p);

// Set-up for step 4's forward on device tensors (params.q/k/v -> params.o, params.lse), returning the
// launch; `variant` as for --variant. Step 5 runs its training forward through this.
std::function<void()> make_forward(const Problem& p, const AttnParams& params, const std::string& variant = "auto");

// 4g's set-up on device tensors of a packed batch (params: B sequences, Nq, Nk the longest; q, k, v, o, lse in
// the packed layout), its offsets `pb` on the device: the forward step 5 trains a packed batch with.
std::function<void()> make_packed_forward(const Problem& grid, const AttnParams& params, const PackedBatch& pb,
                                          int64_t total_q, int64_t total_k, const std::string& variant = "auto");

// A packed batch's forward set-up on device tensors (grid: B sequences of the longest lengths; pb: the offsets
// on the device), returning its launch: make_packed_forward (4g), or step 7's (7e).
using PackedForward = std::function<std::function<void()>(const Problem& grid, const AttnParams& params, const PackedBatch& pb,
                                                          int64_t total_q, int64_t total_k, const std::string& variant)>;

// Why a packed batch on the device is not for the zero-copy path's kernels (a head dim without kernels,
// modifiers or dropout, whose buffers only a Runner makes, an empty batch, a GPU without TMA), or "".
std::string packed_device_refusal(const Problem& p, const Varlen& v);
// A packed forward on a batch already on the device (Stage::run_device, core/stage.h): "" once queued on the
// default stream, or the refusal above, before anything is queued; the offsets go to stream-ordered memory.
std::string run_packed_on_device(const Problem& p, const Varlen& v, const DeviceBatch& t, const std::string& variant,
                                 const PackedForward& forward);
// 4g's: run_packed_on_device with make_packed_forward, at auto, sm90 or sm120. Step 5's zero-copy forward.
std::string run_device(const Problem& p, const Varlen& v, const DeviceBatch& t, const std::string& variant = "auto");

// 4g's scheduler, seen from a test: the K/V tiles the blocks of one run of a packed batch walk, all together
// (p, v, packed and variant as for Stage::make_varlen).
int64_t packed_tiles_walked(const Problem& p, const Varlen& v, const Inputs& packed, const std::string& variant);

}  // namespace fa::step4
