// FlashAttention, step by step — gpu/tma.h
// Host side of TMA: a tensor map describes a [BH, N, d] tensor in global memory and the box one copy
// moves, so the kernel names a tile by coordinates instead of computing addresses. Made with the
// driver's cuTensorMapEncodeTiled, reached through cudaGetDriverEntryPointByVersion (no link against
// libcuda).
#pragma once
#include <cuda.h>

#include "core/problem.h"

namespace fa {

// A map over a contiguous [BH, N, d] tensor of `t` (bf16 or fp16) at `base`, whose box is
// [1, box_rows, 64] elements (64 of 16 bits = 128 bytes, the width of the 128-byte swizzle). Rows beyond
// N read as zeros and are not written by stores. `swizzle` = false lays the box out row after row (the
// ablation that shows what the swizzle buys).
CUtensorMap make_tensor_map_bhnd(const void* base, DType t, int64_t BH, int64_t N, int64_t d, int box_rows,
                                 bool swizzle = true);

// The same box over a packed batch [total, H, d] (core/varlen.h: the tokens of every sequence end to end, the
// heads interleaved), seen as a [H, total, d] tensor: dims {d, total, H} with strides {H * d, d} elements,
// so a tile is named by the same (row, head) coordinates as in make_tensor_map_bhnd, the row being a token
// of the whole batch. Rows beyond `total` read as zeros; `total` 0 is encoded as 1 (base must hold H * d).
CUtensorMap make_tensor_map_packed(const void* base, DType t, int64_t total, int64_t H, int64_t d, int box_rows);

}  // namespace fa
