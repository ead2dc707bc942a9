// FlashAttention, step by step — step 2: the tiled backward on the CPU, both loop orders (step2_online_softmax/backward.cpp)
//
// Step 1's backward holds P, dP and dS [Nq, Nk] whole. Here the same equations run one block (i, j) at a
// time, Br query rows by Bc keys, and P_ij is recomputed from the forward's LSE_i instead of being stored:
// the forward keeps O and LSE [Nq], nothing quadratic. A visit of block (i, j) touches five accumulators,
// dQ_i [Br, d], dK_j and dV_j [Bc, d]; which loop is outside decides which of them stay put:
//
//   kv-outer: for j (K/V blocks) { dK_j, dV_j on chip; for i (Q blocks) { visit; dQ_i += ... in HBM } }
//             Dao 2023, Algorithm 2. On a GPU every K/V block is one thread block, and dQ_i receives a
//             contribution from each of them: atomic adds, or a second kernel (step 5).
//   q-outer:  for i (Q blocks) { dQ_i on chip; for j (K/V blocks) { visit; dK_j, dV_j += ... in HBM } }
//             The mirror image: dQ_i is written once, dK_j and dV_j collect one contribution per Q block.
// Blocks wholly outside the mask (causal, window) are skipped in both, as in the forward.
#include <algorithm>

#include "tiles.h"

namespace fa::step2 {

const char* order_name(Order o) { return o == Order::kv_outer ? "kv-outer" : "q-outer"; }

namespace {

// D_i = rowsum(dO_i * O_i) for every row of the head: the term the softmax's Jacobian subtracts.   [Nq]
std::vector<float> row_dots(const Head& hd) {
  std::vector<float> D(size_t(hd.Nq));
  for (int64_t i = 0; i < hd.Nq; ++i) {
    float s = 0.0f;
    for (int64_t c = 0; c < hd.d; ++c) s += hd.dout[i * hd.d + c] * hd.o[i * hd.d + c];
    D[size_t(i)] = s;
  }
  return D;
}

// One visit of block (i, j) of head hd: query rows [i0, i0 + rows), keys [j0, j0 + cols). Adds to the
// row-major blocks dQ_i [rows, d], dK_j and dV_j [cols, d], wherever the loop order keeps them; then shows
// the block to `observe` (--trace --backward), if given.
void visit(const Head& hd, const std::vector<float>& D, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
           float* dQ_i, float* dK_j, float* dV_j, BackwardVisitObserver observe = nullptr, void* ctx = nullptr) {
  const int64_t d = hd.d;
  const MatR S = scores(hd, i0, rows, j0, cols);  // [rows, cols]  S_ij, masked = -inf
  MatR P(rows, cols);                             // [rows, cols]  P_ij = exp(S_ij - LSE_i), no rescaling
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) P(r, c) = safe_exp_diff(S(r, c), hd.lse[i0 + r]);  // LSE_i = -inf: 0
  MatR Pd = P;  // [rows, cols]  P_ij * Z_ij / (1 - p): the weights the forward multiplied V_j by
  apply_dropout(hd, Pd, i0, j0);
  const ConstMap dO_i(hd.dout + i0 * d, rows, d);  // [rows, d]

  Map(dV_j, cols, d).noalias() += Pd.transpose() * dO_i;  // dV_j += Pd_ij^T dO_i
  MatR dP = dO_i * v_rows(hd, j0, cols).transpose();      // [rows, cols]  dPd_ij = dO_i V_j^T
  apply_dropout(hd, dP, i0, j0);                          //               dP_ij = dPd_ij * Z_ij / (1 - p)
  MatR dS(rows, cols);                                    // [rows, cols]  dS_ij = P_ij * (dP_ij - D_i)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)  // back through the softcap (1 without one): dS of the pre-softcap score
      dS(r, c) = P(r, c) * (dP(r, c) - D[size_t(i0 + r)]) * softcap_grad(hd.mod, S(r, c));
  if (hd.dbias)  // dBias_ij = dS_ij for this (b, h); the caller sums over the bias's broadcast dimensions
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) hd.dbias[(i0 + r) * hd.Nk + j0 + c] = dS(r, c);
  Map(dQ_i, rows, d).noalias() += hd.scale * (dS * k_rows(hd, j0, cols));              // dQ_i += scale dS_ij K_j
  Map(dK_j, cols, d).noalias() += hd.scale * (dS.transpose() * q_rows(hd, i0, rows));  // dK_j += scale dS_ij^T Q_i
  if (observe)
    observe({i0, rows, j0, cols, S.data(), P.data(), dP.data(), dS.data(), &D[size_t(i0)], dQ_i, dK_j, dV_j}, ctx);
}

}  // namespace

void backward_kv_outer(const std::vector<Head>& group, Blocks bl, BackwardVisitObserver observe, void* ctx) {
  const Head& kv = group.front();  // K, V, dK, dV are those of every head of the group
  const int64_t Nq = kv.Nq, Nk = kv.Nk, d = kv.d;
  std::vector<std::vector<float>> D;  // [g][Nq]
  for (const Head& hd : group) {
    D.push_back(row_dots(hd));
    std::fill(hd.dq, hd.dq + Nq * d, 0.0f);  // "HBM": dQ collects one contribution per K/V block
  }
  MatR dK_j(bl.Bc, d), dV_j(bl.Bc, d);  // [Bc, d]  on chip for the whole inner loop

  for (int64_t j0 = 0; j0 < Nk; j0 += bl.Bc) {  // outer: K_j, V_j loaded once
    const int64_t cols = std::min(bl.Bc, Nk - j0);
    dK_j.setZero();
    dV_j.setZero();
    for (size_t g = 0; g < group.size(); ++g) {  // GQA: every query head of the KV head adds to dK_j, dV_j
      const Head& hd = group[g];
      for (int64_t i0 = 0; i0 < Nq; i0 += bl.Br) {  // inner: every Q block visits K_j, V_j
        const int64_t rows = std::min(bl.Br, Nq - i0);
        if (block_masked(hd, i0, rows, j0, cols)) continue;  // causal or window: no row sees K_j
        visit(hd, D[g], i0, rows, j0, cols, hd.dq + i0 * d, dK_j.data(), dV_j.data(), observe, ctx);
      }
    }
    Map(kv.dk + j0 * d, cols, d) = dK_j.topRows(cols);  // written once
    Map(kv.dv + j0 * d, cols, d) = dV_j.topRows(cols);
  }
}

void backward_q_outer(const std::vector<Head>& group, Blocks bl) {
  const Head& kv = group.front();
  const int64_t Nq = kv.Nq, Nk = kv.Nk, d = kv.d;
  std::fill(kv.dk, kv.dk + Nk * d, 0.0f);  // "HBM": dK, dV collect one contribution per Q block
  std::fill(kv.dv, kv.dv + Nk * d, 0.0f);
  MatR dQ_i(bl.Br, d);  // [Br, d]  on chip for the whole inner loop

  for (const Head& hd : group) {  // GQA: every query head of the KV head adds to dK, dV
    const std::vector<float> D = row_dots(hd);  // [Nq]
    for (int64_t i0 = 0; i0 < Nq; i0 += bl.Br) {  // outer: Q_i, dO_i, LSE_i, D_i loaded once
      const int64_t rows = std::min(bl.Br, Nq - i0);
      dQ_i.setZero();
      for (int64_t j0 = 0; j0 < Nk; j0 += bl.Bc) {  // inner: the K/V blocks, in order
        const int64_t cols = std::min(bl.Bc, Nk - j0);
        if (block_masked(hd, i0, rows, j0, cols)) continue;  // causal or window: no row sees K_j
        visit(hd, D, i0, rows, j0, cols, dQ_i.data(), kv.dk + j0 * d, kv.dv + j0 * d);
      }
      Map(hd.dq + i0 * d, rows, d) = dQ_i.topRows(rows);  // written once
    }
  }
}

}  // namespace fa::step2
