// FlashAttention, step by step — step 4f: how many splits a decode takes (step4_fused_pipelined/splits.h)
//
// Host-side arithmetic of split-KV (kernel_4f_split_kv.cuh), kept free of CUDA so that the host tests run it
// without a GPU or a CUDA toolkit (tests/test_host_kernels.cpp): the split counts step 6 tries, the one
// FlashAttention's heuristic picks, and the K/V tiles a query tile may walk, which the splits divide.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace fa::step4 {

// The split counts 4f runs a decode with, for a head whose keys fill `kv_tiles` K/V tiles: round counts up
// to 128 and up to one tile per split, skipping those that give each split as many tiles as the count before
// (more blocks, the same work each). choose_splits (below) picks one; step 6 times every one.
inline std::vector<int> split_counts(int64_t kv_tiles) {
  std::vector<int> counts;
  int64_t last = 0;  // tiles per split of the last count taken
  for (int n : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128})
    if (n <= std::max<int64_t>(kv_tiles, 1) && (kv_tiles + n - 1) / n != last)
      counts.push_back(n), last = (kv_tiles + n - 1) / n;
  return counts;
}

// A split keeps at least this many keys: fewer leave its block too little work for its fixed costs (set-up,
// the first loads' latency, the merge's read of its result). Every count, measured: docs/history/step4.md#4e-the-split-count.
constexpr int64_t kMinSplitKeys = 128;

// The number of splits, after FlashAttention's heuristic: none when the blocks already fill the GPU, counted
// as two blocks per SM; otherwise the fewest of split_counts (above) whose waves of blocks fill those
// slots to within 85 % of the best, among the counts that leave each split at least kMinSplitKeys keys
// (`kv_tiles` tiles of `tile_keys` keys). Measured against every count on the H100, this rule is within a few
// percent of the best count (docs/history/step4.md#4e-the-split-count).
inline int choose_splits(int64_t blocks, int64_t kv_tiles, int64_t tile_keys, int sms) {
  const int64_t slots = 2 * int64_t(sms);
  if (blocks >= 0.8 * double(slots)) return 1;
  auto efficiency = [&](int s) {
    const int64_t waves = (blocks * s + slots - 1) / slots;
    return double(blocks * s) / double(waves * slots);
  };
  std::vector<int> counts;
  for (int s : split_counts(kv_tiles))
    if (s == 1 || s * kMinSplitKeys <= kv_tiles * tile_keys) counts.push_back(s);
  double best = 0;
  for (int s : counts) best = std::max(best, efficiency(s));
  for (int s : counts)
    if (efficiency(s) >= 0.85 * best) return s;
  return 1;
}

// The K/V tiles of Bc keys that one query tile of Br rows may walk, at most, in a problem of Nq rows and Nk
// keys: all of K, or with a window bounded on both sides (the causal mask bounds the right) the tiles its band
// can touch. A tile's rows (at most max(Br, Nq) positions: packed ones wrap) see a band of at most
// span + left + right keys, which touches at most ceil(band / Bc) + 1 tiles. The splits divide this count, so
// it is never fewer than a query tile walks (core/tile_range.h, key_tiles): they cover every visible tile.
inline int split_kv_tiles(int64_t Nq, int64_t Nk, bool causal, int64_t window_left, int64_t window_right, int Br, int Bc) {
  int kv_tiles = int((Nk + Bc - 1) / Bc);
  if (window_left >= 0 && (window_right >= 0 || causal)) {
    const int64_t right = causal ? 0 : window_right;  // causal: no key right of the diagonal
    const int64_t band = std::max<int64_t>(Br, Nq) + window_left + right;
    kv_tiles = int(std::min<int64_t>(kv_tiles, (band + Bc - 1) / Bc + 1));
  }
  return kv_tiles;
}

}  // namespace fa::step4
