// FlashAttention, step by step — step 4g: a packed batch of variable-length sequences as a type (step4_fused_pipelined/packed_batch.h)
//
// What it adds: 4f's kernel over a packed batch (core/varlen.h, flash_attn_varlen_func's layout), in one
// launch. A training batch of documents of different lengths, padded to the longest, spends most of its work
// on padding; laid end to end with no padding, each sequence is its own problem and must see only its own keys.
//   Q, O [total_q, Hq, d], K, V [total_k, Hkv, d], LSE [Hq, total_q]; sequence b is tokens cu_q[b] ..
//   cu_q[b+1] - 1 of Q (cu_k[b] .. of K): Nq_b = cu_q[b+1] - cu_q[b] queries against Nk_b keys, causal
//   bottom-right (input_pos_b = Nk_b - Nq_b).
// The scheduler: the grid is laid out as for a dense batch of the longest sequence (B sequences x Hq heads x
// ceil(max_seqlen_q / Br) query tiles, scheduler.cuh), and a tile past its sequence's end exits before it
// loads anything (past_end). Within a sequence every tile walks what the mask's trip count gives on the
// sequence's own problem (keys(): Nk_b, input_pos_b), so no tile of another sequence is ever visited and no
// visible tile is skipped (the host test counts them against brute force, tests/test_gpu_varlen.cpp).
// Where the rows live: the tensor maps see Q and K as [H, total, d] (gpu/tma.h, make_tensor_map_packed), so a
// tile is TMA box (row cu_q[b] + m0, head h) and K's (row cu_k[b] + k0, KV head). A box may run past the
// sequence into the next one's rows: those query rows are never stored and those keys are masked (j >= Nk_b),
// as the tail of a dense K is; past the last token TMA reads zeros. The outputs are stored row by row (4f's
// epilogue), each row at its packed place, so no store crosses into a neighbour.
// Limits: one split per tile (varlen takes no --splits), no packed query heads (GQA reads K/V once per query
// head), no dropout and no bias (core/varlen.h says why). The backward over the same offsets is step 5's
// (step5_backward/packed_rows.h).
#pragma once
#include <cstdint>
#include <vector>

#include "core/varlen.h"
#include "gpu/attn_params.h"
#include "step4_fused_pipelined/paged_kv.h"

namespace fa::step4 {

struct PackedBatch {
  const int* cu_q = nullptr;     // [B + 1] offsets of the sequences' queries (core/varlen.h), on the device
  const int* cu_k = nullptr;     // [B + 1] offsets of their keys
  int total_q = 0;               // cu_q[B]: the length of an LSE row
  int Hq = 1, Hkv = 1;           // heads of Q and of K/V: the head coordinate of a tile
  int* tiles_visited = nullptr;  // a test's count of the K/V tiles the blocks walk; nullptr: not counted

  __device__ int q0(int b) const { return __ldg(cu_q + b); }  // sequence b's first token
  __device__ int k0(int b) const { return __ldg(cu_k + b); }
  // Sequence b as a problem of its own: Nq_b queries, Nk_b keys, the bottom-right diagonal.
  __device__ AttnParams keys(const AttnParams& p, int b) const {
    AttnParams s = p;
    s.Nq = __ldg(cu_q + b + 1) - q0(b);
    s.Nk = __ldg(cu_k + b + 1) - k0(b);
    s.input_pos = s.Nk - s.Nq;
    return s;
  }
  __device__ AttnParams queries(const AttnParams& view, int b) const {
    AttnParams s = view;
    s.Nq = __ldg(cu_q + b + 1) - q0(b);
    return s;
  }
  __device__ bool past_end(int m0, const AttnParams& seq_view) const { return m0 >= seq_view.Nq; }
  // A tile's TMA coordinates: bh (bh_kv) is b * Hq + h (b * Hkv + hkv) in the grid's view.
  __device__ KvTileAt q_tile(int b, int bh, int m0) const { return {q0(b) + m0, bh % Hq}; }
  __device__ KvTileAt tile(int b, int bh_kv, int k) const { return {k0(b) + k, bh_kv % Hkv}; }
  // Row `row` of the tile's sequence: O [total_q, Hq, d] (row index), LSE [Hq, total_q].
  __device__ int64_t o_row(int b, int bh, int64_t /*flat*/, int row) const { return int64_t(q0(b) + row) * Hq + bh % Hq; }
  __device__ int64_t lse_at(int b, int bh, int64_t /*flat*/, int row) const { return int64_t(bh % Hq) * total_q + q0(b) + row; }
  // The test's count (thread 0 of a block with work): how many K/V tiles the block walked.
  __device__ void count_tiles(int n) const {
    if (tiles_visited) atomicAdd(tiles_visited, n);
  }
};

// The host's side: the words the kernel reads, in one buffer: cu_q (B + 1), cu_k (B + 1), then a zero (the
// test's tile counter); and the PackedBatch (or a type built on it) over that buffer once on the device.
inline std::vector<int32_t> packed_words(const Varlen& v) {
  std::vector<int32_t> w = v.cu_seqlens_q;
  w.insert(w.end(), v.cu_seqlens_k.begin(), v.cu_seqlens_k.end());
  w.push_back(0);
  return w;
}
template <class PB = PackedBatch>
PB packed_batch_at(int* words, const Varlen& v, int64_t Hq, int64_t Hkv) {
  PB pb;
  pb.cu_q = words;
  pb.cu_k = words + v.cu_seqlens_q.size();
  pb.total_q = int(v.total_q());
  pb.Hq = int(Hq), pb.Hkv = int(Hkv);
  return pb;
}

}  // namespace fa::step4
