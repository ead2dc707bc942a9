// FlashAttention, step by step — step 4: a tile of 64-column panels, as a type (step4_fused_pipelined/panel_tile.h)
//
// What it is: the one shared-memory layout of every tensor-core kernel of the course (steps 4, 5 and 7).
// A [Rows, D] tile of 16-bit elements is stored as D / 64 panels of [Rows, 64]: each panel row is 128
// bytes, the width of TMA's 128-byte swizzle and of a wgmma descriptor's swizzle atom. Inside a panel the
// 16-byte chunk c of row r sits at chunk c ^ (r % 8) (kSwizzle: what TMA writes, and ldmatrix then reads
// eight rows in eight different bank groups), or at chunk c of a 144-byte row (kPadded, 4a), or plainly
// (kPlain, the bank-conflict ablation). fragments.cuh says why; this file only says where.
//
//   PanelLayout<Rows, L>   where element (row, col) is: a function of the coordinates, for any col
//   PanelTile<Rows, D, L>  that layout over D columns: how many panels, how many bytes
//
// For readers going on to CUTLASS: in CuTe the swizzled PanelTile is
//   tile_to_shape(composition(Swizzle<3, 4, 3>{}, Layout<Shape<_8, _64>, Stride<_64, _1>>{}), Shape<Rows, D>{})
// the 128-byte swizzle atom (8 rows of 64 16-bit elements, the XOR of address bits 4-6 with bits 7-9) tiled
// down the rows first, then across the panels: exactly panel(col / 64) + offset inside the panel below.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/hd.h"

namespace fa::step4 {

// How the 16-byte chunks of a tile's rows are placed in shared memory.
enum class SmemLayout {
  kSwizzle,  // chunk c of row r at chunk c ^ (r % 8) of a 128-byte row: what TMA writes, conflict-free
  kPadded,   // rows of 128 + 16 bytes: conflict-free too, at 1/8 more memory; TMA cannot write it
  kPlain,    // rows of 128 bytes: ldmatrix hits 8-way bank conflicts (the ablation)
};

template <int Rows, SmemLayout L = SmemLayout::kSwizzle>
struct PanelLayout {
  static constexpr int kRows = Rows;
  static constexpr int kPanelCols = 64;                                // 64 x 16-bit = one 128-byte row
  static constexpr int kRowBytes = L == SmemLayout::kPadded ? 144 : 128;
  static constexpr int kPanelBytes = Rows * kRowBytes;                 // one [Rows, 64] panel

  // Byte offset of panel c, the columns 64c .. 64c + 63.
  FA_HD static constexpr uint32_t panel(int c) { return uint32_t(c * kPanelBytes); }
  // Byte offset of element (row, col), col a multiple of 8 (a 16-byte chunk).
  FA_HD static constexpr uint32_t offset(int row, int col) {
    const int chunk = (col % kPanelCols) / 8;
    if constexpr (L == SmemLayout::kPadded) return uint32_t((col / kPanelCols) * kPanelBytes + row * kRowBytes + chunk * 16);
    const int at = L == SmemLayout::kSwizzle ? chunk ^ (row & 7) : chunk;  // the swizzle: chunk XOR row % 8
    return panel(col / kPanelCols) + uint32_t(row * kRowBytes + (at << 4));
  }
};

template <int Rows, int D, SmemLayout L = SmemLayout::kSwizzle>
struct PanelTile : PanelLayout<Rows, L> {
  static_assert(D % 64 == 0, "d is split into 64-column panels, the width of the 128-byte swizzle");
  static constexpr int kCols = D;
  static constexpr int kPanels = D / 64;
  static constexpr size_t kBytes = size_t(kPanels) * PanelLayout<Rows, L>::kPanelBytes;
  // A swizzled tile must start on 1024 bytes (the pattern repeats over 8 rows of 128 bytes), so the next
  // tile does too only if this one's size is a multiple of 1024: every kernel's shared-memory type checks it.
  static constexpr bool kKeepsAlignment = kBytes % 1024 == 0;
};

}  // namespace fa::step4
