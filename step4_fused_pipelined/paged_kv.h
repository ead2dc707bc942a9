// FlashAttention, step by step — step 4f: the KV cache as a type, contiguous or paged (step4_fused_pipelined/paged_kv.h)
//
// What it adds: where 4f's K/V tile lives, and how many keys each sequence holds, as a type the split kernel
// takes the way it takes its mask (mask.h). A serving engine keeps each sequence's cache in fixed-size
// pages, allocated as the sequence grows and found through a block table (vLLM's PagedAttention); the
// sequences of a batch hold different numbers of keys.
//   ContiguousKv  K and V [B, Hkv, Nk, d], every sequence Nk keys: the tile of keys k0 .. k0 + Bc - 1 of
//                 KV head bh_kv = b * Hkv + hkv is TMA box (row k0, head bh_kv). Nothing is read.
//   KvCache       sequence b holds seqlens[b] keys (nullptr: Nk each); with a block table, K and V sit in a
//                 pool of pages [pages, Hkv, P, d] (the course's [.., H, N, d] order, one page per "batch"):
//                 key k of sequence b is row k % P of page block_table[b * pages_per_seq + k / P]. P is a
//                 multiple of Bc, so a tile never straddles two pages and stays one TMA copy, from (row
//                 k0 % P, head page * Hkv + hkv). Without a table the storage is the dense one.
// The kernel asks two things: keys(p, b), the problem as sequence b sees it (Nk its length, input_pos moved
// with it: Problem::kv_input_pos), which its mask and trip count then read; and tile(b, bh_kv, k0), the TMA
// coordinates of a tile. (Where the query rows and outputs live, DenseQueries says: the dense layout.)
// The split schedule (splits.h) still divides the capacity's tiles: a short
// sequence's later splits see no tile and write the merge's identity.
// Limits: P a multiple of Bc. Keys of the last page past the sequence's length are loaded and masked
// (P = 0), so they must hold finite numbers (0 x NaN is NaN); the pages a sequence does not use are never
// read. Forward only, without dropout or score modifiers (decoding).
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/hd.h"
#include "core/problem.h"
#include "gpu/attn_params.h"

namespace fa::step4 {

struct KvTileAt {
  int row, bh;  // TMA coordinates of a [Bc, D] box in a tensor map [BH, N, D]: its first row, its head
};

// Where a tile's query rows come from and its outputs go, in the dense layout both caches keep: Q tile
// (row m0, head bh) of the [BH, Nq, d] view; O row and LSE entry `flat` = bh * Nq + row of [B, Hq, Nq]. A
// packed batch of ragged sequences (packed_batch.h, 4g) says these differently; here none reads memory.
struct DenseQueries {
  FA_HD const AttnParams& queries(const AttnParams& view, int /*b*/) const { return view; }  // the view's rows
  FA_HD bool past_end(int /*m0*/, const AttnParams& /*view*/) const { return false; }       // every tile has rows
  FA_HD KvTileAt q_tile(int /*b*/, int bh, int m0) const { return {m0, bh}; }
  FA_HD int64_t o_row(int /*b*/, int /*bh*/, int64_t flat, int /*row*/) const { return flat; }
  FA_HD int64_t lse_at(int /*b*/, int /*bh*/, int64_t flat, int /*row*/) const { return flat; }
  FA_HD void count_tiles(int /*n*/) const {}  // only a packed batch's test counts
};

struct ContiguousKv : DenseQueries {
  FA_HD const AttnParams& keys(const AttnParams& p, int /*b*/) const { return p; }
  FA_HD KvTileAt tile(int /*b*/, int bh_kv, int k0) const { return {k0, bh_kv}; }
};

struct KvCache : DenseQueries {
  const int* seqlens = nullptr;      // [B] keys of each sequence; nullptr: Nk each
  const int* block_table = nullptr;  // [B, pages_per_seq] physical pages; nullptr: the dense K and V
  int pages_per_seq = 0, page_size = 0, Hkv = 1;

  FA_HD AttnParams keys(const AttnParams& p, int b) const {
    AttnParams s = p;
    if (seqlens) {
      s.Nk = seqlens[b];
      s.input_pos = p.input_pos - (p.Nk - s.Nk);  // the queries keep their distance from the last key
    }
    return s;
  }
  FA_HD KvTileAt tile(int b, int bh_kv, int k0) const {
    if (!block_table) return {k0, bh_kv};
    const int page = block_table[b * pages_per_seq + k0 / page_size];
    return {k0 % page_size, page * Hkv + bh_kv % Hkv};
  }
};

// The host's side: which physical page holds each logical page of each sequence. Sequence b uses
// ceil(len_b / P) pages; all used pages are shuffled over the pool (seeded), so that neighbours in a
// sequence are not neighbours in memory, as in a cache that has served many requests. Entries past a
// sequence's pages are -1 (never read).
struct PageTable {
  std::vector<int32_t> table;  // [B, pages_per_seq]
  int pages_per_seq = 0;       // ceil(Nk / P): the capacity's pages
  int pages = 0;               // pages in the pool: those the sequences use (at least 1, for the tensor map)
};
inline PageTable make_page_table(const Problem& p, uint64_t seed) {
  PageTable t;
  const int64_t P = p.page_size;
  t.pages_per_seq = int((p.Nk + P - 1) / P);
  int64_t used = 0;
  for (int64_t b = 0; b < p.B; ++b) used += (p.kv_len(b) + P - 1) / P;
  std::vector<int32_t> order(size_t(std::max<int64_t>(used, 1)));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  t.pages = int(order.size());
  t.table.assign(size_t(p.B) * size_t(t.pages_per_seq), -1);
  size_t next = 0;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t n = 0; n < (p.kv_len(b) + P - 1) / P; ++n) t.table[size_t(b * t.pages_per_seq + n)] = order[next++];
  return t;
}

}  // namespace fa::step4
