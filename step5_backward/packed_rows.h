// FlashAttention, step by step — step 5: a packed batch in the backward (step5_backward/packed_rows.h)
//
// What it adds: the dK/dV and dQ kernels over step 4g's packed batch of ragged sequences (core/varlen.h,
// step4_fused_pipelined/packed_batch.h), each pass one launch. The kernels take a Rows type that says where
// a sequence's rows live, as 4g's forward takes its PackedBatch:
//   DenseRows   the dense [B, H, N, d] layout; nothing read, every answer the one the kernels always computed
//               (so their dense instances are what they were);
//   PackedRows  4g's PackedBatch: sequence b is tokens cu_q[b] .. of Q and dO and cu_k[b] .. of K and V.
// What a kernel asks, beside 4g's keys(p, b) (the sequence's own problem: Nq_b, Nk_b, the bottom-right
// diagonal), q_tile and tile (TMA coordinates) and lse_at (the LSE's and D's entry, [Hq, total_q]):
//   q_rows(p, b, bh, D), kv_rows(p, b, bh_kv, D)  where dQ's (dK's, dV's) rows of one head of sequence b
//                                                  start and how far apart they are: d elements in the dense
//                                                  layout, H * d in the packed one (the heads interleave);
//   keys_past_end(k0, seq)                         a dK/dV block past its sequence's last key: no work.
// The grids are those of a dense batch of the longest sequences (B = sequences, Nq = max_seqlen_q, Nk =
// max_seqlen_k); a block past its sequence's end exits before it loads anything, as 4g's forward's do.
// Limits: the deterministic kernels only (the atomic kernel's fp32 dQ accumulator is laid out [B, Hq, Nq, d]);
// no dropout and no bias (core/varlen.h).
#pragma once
#include <cstdint>

#include "core/hd.h"
#include "gpu/attn_params.h"
#include "step4_fused_pipelined/packed_batch.h"
#include "step4_fused_pipelined/paged_kv.h"

namespace fa::step5 {

struct RowsAt {
  int64_t first;   // the element of row 0, column 0
  int64_t stride;  // elements from one row to the next
};

struct DenseRows : step4::ContiguousKv {
  FA_HD RowsAt q_rows(const AttnParams& p, int /*b*/, int bh, int D) const { return {int64_t(bh) * p.Nq * D, D}; }
  FA_HD RowsAt kv_rows(const AttnParams& p, int /*b*/, int bh_kv, int D) const { return {int64_t(bh_kv) * p.Nk * D, D}; }
  FA_HD bool keys_past_end(int /*k0*/, const AttnParams& /*seq*/) const { return false; }
};

struct PackedRows : step4::PackedBatch {
  __device__ RowsAt q_rows(const AttnParams& /*p*/, int b, int bh, int D) const {
    return {(int64_t(q0(b)) * Hq + bh % Hq) * D, int64_t(Hq) * D};
  }
  __device__ RowsAt kv_rows(const AttnParams& /*p*/, int b, int bh_kv, int D) const {
    return {(int64_t(k0(b)) * Hkv + bh_kv % Hkv) * D, int64_t(Hkv) * D};
  }
  __device__ bool keys_past_end(int k, const AttnParams& seq) const { return k >= seq.Nk; }
};

}  // namespace fa::step5
