// FlashAttention, step by step — step 2: the online-softmax invariant, on the CPU (step2_online_softmax/online.h)
//
// What this stage adds over step 1: the same attention, computed without ever holding a whole row of
// scores. Step 1 materialises S [Nq, Nk] and runs the 3-pass safe softmax over it; here the keys arrive
// one tile at a time and each query row keeps only a running state (m_i, l_i, acc_i)
// (core/online_softmax.h). Five variants, each its own function, from the textbook to FlashAttention:
//
//   3pass   row max, row sum of exp(S - max), normalise; then P V               (step 1's algorithm)
//   2pass   K tiled, Q and V untiled: pass 1 per tile the local max LM and local sums, one barrier for
//           the global max GM, pass 2 corrects with PRM = exp(LM - GM); then A V as one product
//   online  one pass: per row, tile by tile, m_new = max(m, max_j s_j), alpha = exp(m - m_new),
//           l = alpha l + sum_j exp(s_j - m_new), acc = alpha acc + sum_j exp(s_j - m_new) v_j
//   fa1     FlashAttention-1's loop order (Algorithm 1 of Dao et al. 2022): outer loop over K/V blocks,
//           inner over Q blocks; O, l, m live in "HBM" arrays between visits, O kept normalised
//   fa2     FlashAttention-2's loop order (Algorithm 1 of Dao 2023): outer loop over Q blocks; m, l and
//           the un-normalised O stay "on chip" until the last K/V block, normalised once
//
// Block sizes of fa1/fa2 come from an on-chip budget of M floats (FlashAttention-1, Algorithm 1 line 1):
//   Bc = ceil(M / 4d),  Br = min(Bc, d).
// The merge of two partial states (split-KV, "flash-decoding") is attention_split_kv.
//
// The backward (backward.cpp), tiled with the same Br, Bc, recomputes P_ij = exp(S_ij - LSE_i) from the
// forward's LSE instead of storing P, with D_i = rowsum(dO_i * O_i), in one of two loop orders:
//   kv-outer  FlashAttention-2's backward (Algorithm 2 of Dao 2023): outer loop over K/V blocks, dK_j and
//             dV_j held for the block, dQ_i accumulated across K/V blocks            (--variant fa2)
//   q-outer   outer loop over Q blocks, dQ_i held, dK and dV accumulated across Q blocks (--variant fa1)
//
// Everything is computed in float, as step 1's CpuRunner does; the harness checks against step 1 in fp64.
// Semantics (mask, GQA, dropout, fully masked rows): ../docs/conventions.md.
// Limits: the backward only for fa1 and fa2; one head (one KV head in the backward) per OpenMP task;
// "HBM" and "on chip" are ordinary CPU memory here — the loop orders and the data each loop keeps are what is being taught, not the speed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dropout.h"
#include "core/online_softmax.h"
#include "core/score_mod.h"
#include "core/stage.h"

namespace fa::step2 {

// One (batch, query head) pair: the unit every variant works on.
struct Head {
  const float* q = nullptr;  // [Nq, d]
  const float* k = nullptr;  // [Nk, d]  the KV head h / (Hq / Hkv)
  const float* v = nullptr;  // [Nk, d]
  float* o = nullptr;        // [Nq, d]
  float* lse = nullptr;      // [Nq]
  int64_t Nq = 0, Nk = 0, d = 0;
  float scale = 1.0f;
  DropoutParams drop;     // threshold 0: no dropout
  ScoreMod mod;           // the mask (causal, input_pos, window) and the modifiers (core/score_mod.h)
  bool modifies = false;  // a bias, ALiBi or a softcap: the scores go through modify()
  const float* bias = nullptr;  // [Nq, Nk] this head's slice of the bias (broadcast), or null
  uint32_t b = 0, h = 0;  // coordinates of the dropout mask (query head h)
  // The backward's tensors, null in a forward run: dO and dQ of query head h, dK and dV of its KV head.
  const float* dout = nullptr;  // [Nq, d]
  float* dq = nullptr;          // [Nq, d]
  float* dk = nullptr;          // [Nk, d]  shared by the g query heads of the KV head (GQA)
  float* dv = nullptr;          // [Nk, d]
  float* dbias = nullptr;       // [Nq, Nk] dS of the pre-softcap score of (b, h), with a bias; else null

  // Dropout weight of element (i, j): 0 or 1 / (1 - p). Applied after normalisation, so l and LSE
  // are those of the undropped scores.
  float keep(int64_t i, int64_t j) const {
    return dropout_keep(drop, b, h, uint32_t(i), uint32_t(j)) ? drop.keep_scale : 0.0f;
  }
};

// The view of head (b, h) of a problem: Q, O and LSE of query head h, K and V of its KV head; with
// in.dout and out.dq, dk, dv allocated, also dO, dQ of query head h and dK, dV of its KV head.
Head head_of(const Problem& p, const Inputs& in, Outputs& out, int64_t b, int64_t h);

// The five algorithms. Each writes hd.o and hd.lse.
void attention_3pass(const Head& hd);
void attention_2pass(const Head& hd, int64_t tile);   // tile: keys per K tile
void attention_online(const Head& hd, int64_t tile);  // tile: keys per step of the running state

struct Blocks {
  int64_t Br, Bc;  // query rows per Q block, keys per K/V block
};
// FlashAttention-1's rule: Bc = ceil(M / 4d), Br = min(Bc, d), for an on-chip budget of M floats.
Blocks blocks_from_budget(int64_t M, int64_t d);

// What one FlashAttention-2 visit of block (i, j) leaves behind, for --trace. Matrices are row-major.
struct Visit {
  int64_t i0, rows, j0, cols;  // the Q block's first row and size, the K/V block's first key and size
  const float* S;              // [rows, cols]  S_ij = scale Q_i K_j^T modified (score_mod.h), masked = -inf
  const float* P;              // [rows, cols]  P_ij = exp(S_ij - m_i), m_i the new running max (x dropout)
  const float* m_old;          // [rows]        running max before the visit
  const SoftmaxState* state;   // [rows]        running (m_i, l_i) after the visit
  const float* acc;            // [rows, d]     running un-normalised O_i after the visit
};
using VisitObserver = void (*)(const Visit& v, void* ctx);

// What one FlashAttention-1 visit of block (i, j) leaves behind, for --trace --variant fa1.
struct Fa1Visit {
  int64_t i0, rows, j0, cols;  // the Q block's first row and size, the K/V block's first key and size
  const float* S;              // [rows, cols]  S_ij = scale Q_i K_j^T modified (score_mod.h), masked = -inf
  const float* P;              // [rows, cols]  P~_ij = exp(S_ij - m~_ij), undropped
  const float* Pd;             // [rows, cols]  P~_ij Z_ij / (1 - p): the weights V_j is multiplied by
  const SoftmaxState* tile;    // [rows]        (m~_ij, l~_ij) of the block, l~_ij = rowsum(P~_ij)
  const SoftmaxState* state;   // [rows]        (m_i, l_i) as written back to "HBM"
  const float* O;              // [rows, d]     O_i as written back to "HBM", normalised
};
using Fa1VisitObserver = void (*)(const Fa1Visit& v, void* ctx);

void attention_fa1(const Head& hd, Blocks bl, Fa1VisitObserver observe = nullptr, void* ctx = nullptr);
void attention_fa2(const Head& hd, Blocks bl, VisitObserver observe = nullptr, void* ctx = nullptr);

// A partial result over a key range [j0, j1) of one query row: the state of the invariant.
struct Partial {
  SoftmaxState st;         // m, l over the range
  std::vector<float> acc;  // [d]  sum_j exp(s_j - m) * keep_j * v_j
};
// One row, keys [j0, j1), tile by tile: the online pass itself (attention_online runs it over [0, Nk)).
Partial online_partial(const Head& hd, int64_t i, int64_t j0, int64_t j1, int64_t tile);
// a = a (+) b: the merge of partial states over disjoint key ranges.
void merge(Partial& a, const Partial& b);
// Split-KV ("flash-decoding"): the keys cut into `splits` ranges, each an independent online pass,
// the partial states merged at the end (in any order: the merge is associative and commutative).
void attention_split_kv(const Head& hd, int64_t splits, int64_t tile);

// The backward of one KV head. `group` holds its g = Hq / Hkv query heads (GQA), each with O and LSE of
// its forward and dO; both orders write dQ of every head and dK, dV of the KV head, summed over the group.
//   P_ij  = exp(S_ij - LSE_i)                    (0 where masked, and in a row with LSE_i = -inf)
//   Pd_ij = P_ij * Z_ij / (1 - p)                the dropout mask of the forward
//   dV_j += Pd_ij^T dO_i       dPd_ij = dO_i V_j^T       dP_ij = dPd_ij * Z_ij / (1 - p)
//   dS_ij = P_ij * (dP_ij - D_i) * softcap_grad(S_ij)     (the gradient of the pre-softcap score: dBias)
//   dQ_i += scale dS_ij K_j   dK_j += scale dS_ij^T Q_i
enum class Order { kv_outer, q_outer };
// What one visit of block (i, j) of the backward leaves behind, for --trace --backward. Row-major.
struct BackwardVisit {
  int64_t i0, rows, j0, cols;  // the Q block's first row and size, the K/V block's first key and size
  const float* S;              // [rows, cols]  S_ij = scale Q_i K_j^T modified (score_mod.h), masked = -inf
  const float* P;              // [rows, cols]  P_ij = exp(S_ij - LSE_i)
  const float* dP;             // [rows, cols]  dP_ij = dO_i V_j^T (x dropout)
  const float* dS;             // [rows, cols]  dS_ij = P_ij (dP_ij - D_i) softcap_grad(S_ij)
  const float* D;              // [rows]        D_i = rowsum(dO_i * O_i)
  const float* dQ_i;           // [rows, d]     dQ_i after this visit's addition
  const float* dK_j;           // [cols, d]     dK_j after this visit's addition
  const float* dV_j;           // [cols, d]     dV_j after this visit's addition
};
using BackwardVisitObserver = void (*)(const BackwardVisit& v, void* ctx);
void backward_kv_outer(const std::vector<Head>& group, Blocks bl, BackwardVisitObserver observe = nullptr,
                       void* ctx = nullptr);
void backward_q_outer(const std::vector<Head>& group, Blocks bl);
// "kv-outer" or "q-outer"
const char* order_name(Order o);

// The whole problem, every (b, h) in parallel: O [B, Hq, Nq, d], LSE [B, Hq, Nq].
struct Config {
  int64_t tile = 256;     // keys per tile of 2pass and online
  int64_t budget = 16384; // M: on-chip floats of fa1 and fa2 (64 KB)
};
Outputs attention(const Problem& p, const Inputs& in, const std::string& variant, const Config& cfg);
// The backward of the whole problem, every (b, KV head) in parallel, from out.o and out.lse of a forward
// run: allocates and fills out.dq [B, Hq, Nq, d], out.dk and out.dv [B, Hkv, Nk, d]; with a bias also
// out.dbias, shaped like it (dS summed over the dimensions it broadcasts over).
void backward(const Problem& p, const Inputs& in, Order order, Blocks bl, Outputs& out);
// The order --backward runs for `variant`: fa1 q-outer, fa2 kv-outer; false for the untiled variants.
bool backward_order(const std::string& variant, Order& order);
// Bytes of host memory a run of `variant` allocates: the buffers of the heads in flight at once (one per
// thread) and the outputs. 3pass and 2pass hold [Nq, Nk] per head; the tiled variants a few tiles.
double memory_needed(const Problem& p, const std::string& variant, const Config& cfg);

// --footprint: intermediate memory of 3pass, 2pass and online (and fa2's on-chip working set).
std::string footprint_table(int64_t Nq, int64_t Nk, int64_t d, int64_t tile, int64_t budget);
// --trace: the worked example N = 6, d = 2, M = 20, block by block, with and without the causal mask.
std::string trace(uint64_t seed);
// --trace --variant fa1: the same example in FlashAttention-1's loop order, with dropout.
std::string trace_fa1(uint64_t seed);
// --trace --backward: the same example through the kv-outer backward, with and without the causal mask.
std::string trace_backward(uint64_t seed);

// The registry entry; `cfg` sets the tile and budget of the executable's --tile and --budget.
Stage stage(const Config& cfg = {});

}  // namespace fa::step2
