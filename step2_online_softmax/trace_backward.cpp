// FlashAttention, step by step — step 2: the worked example through the tiled backward
// (step2_online_softmax/trace_backward.cpp)
//
// What this trace adds to trace.cpp's: the backward, block by block, in FlashAttention-2's order (kv-outer,
// Dao 2023, Algorithm 2). The forward (attention_fa2, the one --trace prints) saves O and LSE; then the
// real backward_kv_outer runs on the example of trace.h with an incoming gradient dO drawn as the harness
// draws it. For each K/V block j, dK_j and dV_j start at 0 "on chip"; every Q block i visits it, recomputes
// P_ij = exp(S_ij - LSE_i) from the saved LSE, and adds to dV_j, dK_j (on chip) and dQ_i (in HBM, one
// addition per K/V block), with D_i = rowsum(dO_i * O_i). Each visit is printed through the function's
// observer; the final dQ, dK, dV are compared with step 1's whole-matrix backward. With and without the
// causal mask. The output is deterministic: tests/golden/step2_trace_backward.txt.
#include <algorithm>
#include <cmath>

#include "step1_cpu_reference/reference.h"
#include "trace.h"

namespace fa::step2 {
namespace {

using example::kD, example::kM, example::kN, example::nums;

struct Printer {
  std::string* s;
  Blocks bl;
  const float* lse;            // [N]  the forward's LSE_i
  int64_t j0 = -1, next_i0 = 0;  // the K/V block being printed, the first Q block it has not visited
};

// The Q blocks after the last visit of the current K/V block that the loop skipped, and the block's end.
void close_block(Printer& pr) {
  if (pr.j0 < 0) return;
  const Blocks& bl = pr.bl;
  for (int64_t i0 = pr.next_i0; i0 < kN; i0 += bl.Br)
    out(*pr.s, "\nvisit (j=%lld, i=%lld): rows %lld..%lld see none of keys %lld..%lld: skipped\n",
        (long long)(pr.j0 / bl.Bc), (long long)(i0 / bl.Br), (long long)i0, (long long)std::min(i0 + bl.Br, kN) - 1,
        (long long)pr.j0, (long long)std::min(pr.j0 + bl.Bc, kN) - 1);
  out(*pr.s, "\nK/V block j=%lld done: dK_j and dV_j of keys %lld..%lld written to HBM, once\n",
      (long long)(pr.j0 / bl.Bc), (long long)pr.j0, (long long)std::min(pr.j0 + bl.Bc, kN) - 1);
}

void print_visit(const BackwardVisit& v, void* ctx) {
  Printer& pr = *static_cast<Printer*>(ctx);
  std::string& s = *pr.s;
  const Blocks& bl = pr.bl;
  if (v.j0 != pr.j0) {
    close_block(pr);
    pr.j0 = v.j0;
    pr.next_i0 = 0;
    out(s, "\nK/V block j=%lld: keys %lld..%lld, loaded once; dK_j = dV_j = 0 on chip\n", (long long)(v.j0 / bl.Bc),
        (long long)v.j0, (long long)(v.j0 + v.cols - 1));
  }
  for (int64_t i0 = pr.next_i0; i0 < v.i0; i0 += bl.Br)  // causal: blocks wholly above the diagonal
    out(s, "\nvisit (j=%lld, i=%lld): rows %lld..%lld see none of keys %lld..%lld: skipped\n",
        (long long)(v.j0 / bl.Bc), (long long)(i0 / bl.Br), (long long)i0, (long long)(i0 + bl.Br - 1),
        (long long)v.j0, (long long)(v.j0 + v.cols - 1));
  pr.next_i0 = v.i0 + v.rows;

  const int w = int(8 * v.cols), wd = int(8 * kD);
  out(s, "\nvisit (j=%lld, i=%lld): Q rows %lld..%lld, K/V keys %lld..%lld\n", (long long)(v.j0 / bl.Bc),
      (long long)(v.i0 / bl.Br), (long long)v.i0, (long long)(v.i0 + v.rows - 1), (long long)v.j0,
      (long long)(v.j0 + v.cols - 1));
  out(s, "  row |%*s |%8s%8s |%*s |%*s |%*s |%*s\n", w, "S_ij", "LSE_i", "D_i", w, "P_ij", w, "dP_ij", w, "dS_ij", wd,
      "dQ_i (HBM)");
  for (int64_t r = 0; r < v.rows; ++r) {
    out(s, "  %3lld |", (long long)(v.i0 + r));
    nums(s, v.S + r * v.cols, v.cols);
    out(s, " |%8.4f%8.4f |", pr.lse[v.i0 + r], v.D[r]);
    nums(s, v.P + r * v.cols, v.cols);
    out(s, " |");
    nums(s, v.dP + r * v.cols, v.cols);
    out(s, " |");
    nums(s, v.dS + r * v.cols, v.cols);
    out(s, " |");
    nums(s, v.dQ_i + r * kD, kD);
    out(s, "\n");
  }
  out(s, "  key |%*s |%*s\n", wd, "dV_j (on chip)", wd, "dK_j (on chip)");
  for (int64_t c = 0; c < v.cols; ++c) {
    out(s, "  %3lld |", (long long)(v.j0 + c));
    nums(s, v.dV_j + c * kD, kD);
    out(s, " |");
    nums(s, v.dK_j + c * kD, kD);
    out(s, "\n");
  }
}

}  // namespace

std::string trace_backward(uint64_t seed) {
  Problem p = example::problem(seed, false, 0.0f, true);
  const Inputs in = example::inputs(p);
  const Blocks bl = blocks_from_budget(kM, kD);

  std::string s;
  example::print_example(s, "step 2 backward trace", p, in);
  out(s, "\nThe forward (attention_fa2, as --trace prints it) saves O and LSE_i = m_i + log l_i, nothing [N, N].\n");
  out(s, "FlashAttention-2's backward (kv-outer): for each K/V block j, dK_j = dV_j = 0 on chip; visit Q blocks i = 0, 1, ...\n");
  out(s, "  S_ij = scale Q_i K_j^T (-inf: masked)   P_ij = exp(S_ij - LSE_i): recomputed, already normalised\n");
  out(s, "  D_i = rowsum(dO_i o O_i)   dV_j += P_ij^T dO_i   dP_ij = dO_i V_j^T   dS_ij = P_ij o (dP_ij - D_i)\n");
  out(s, "  dQ_i += scale dS_ij K_j: in HBM, one addition per K/V block   dK_j += scale dS_ij^T Q_i: on chip\n");
  out(s, "  the tables show dQ_i, dV_j and dK_j after the visit's additions\n");

  for (bool causal : {false, true}) {
    p.causal = causal;
    Outputs res = example::outputs(p);  // O, LSE, dQ, dK, dV
    const Head hd = head_of(p, in, res, 0, 0);
    attention_fa2(hd, bl);
    out(s, "\n==== %s ====\n", causal ? "causal: query i sees keys 0..i" : "no mask");
    out(s, "\nthe forward's output, saved for the backward\n");
    out(s, "  row |%16s%8s\n", "O", "LSE");
    for (int64_t i = 0; i < kN; ++i) {
      out(s, "  %3lld |", (long long)i);
      nums(s, res.o.ptr() + i * kD, kD);
      out(s, "%8.4f\n", res.lse.data[i]);
    }
    Printer pr{&s, bl, res.lse.ptr()};
    backward_kv_outer({hd}, bl, print_visit, &pr);
    close_block(pr);

    const auto ref = step1::attention<double>(p, in, true);
    out(s, "\nresult: dQ, dK, dV beside step 1's backward (fp64), which holds P, dP and dS [N, N] whole\n");
    out(s, "  row |%16s |%16s |%16s |%16s |%16s |%16s\n", "dQ", "dK", "dV", "step 1: dQ", "dK", "dV");
    double err = 0;
    for (int64_t i = 0; i < kN; ++i) {
      out(s, "  %3lld |", (long long)i);
      for (const Tensor* t : {&res.dq, &res.dk, &res.dv}) {
        nums(s, t->ptr() + i * kD, kD);
        out(s, " |");
      }
      for (const TensorT<double>* t : {&ref.dq, &ref.dk, &ref.dv}) {
        for (int64_t c = 0; c < kD; ++c) out(s, "%8.4f", t->data[i * kD + c]);
        out(s, t == &ref.dv ? "\n" : " |");
      }
      const std::pair<const Tensor*, const TensorT<double>*> pairs[] = {
          {&res.dq, &ref.dq}, {&res.dk, &ref.dk}, {&res.dv, &ref.dv}};
      for (const auto& [got, want] : pairs)
        for (int64_t c = 0; c < kD; ++c)
          err = std::max(err, std::fabs(got->data[i * kD + c] - want->data[i * kD + c]));
    }
    out(s, "  max |dQ, dK, dV - step 1| < 1e-6: %s\n", err < 1e-6 ? "yes" : "NO");
  }
  return s;
}

}  // namespace fa::step2
