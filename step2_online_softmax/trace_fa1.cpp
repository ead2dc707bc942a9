// FlashAttention, step by step — step 2: the worked example in FlashAttention-1's loop order, with dropout
// (step2_online_softmax/trace_fa1.cpp)
//
// What this trace adds to trace.cpp's: the other loop order, and dropout. The real attention_fa1 runs the
// example of trace.h with K/V blocks outer and Q blocks inner (Dao et al. 2022, Algorithm 1); between two
// visits of a Q block its O_i, l_i, m_i sit in "HBM", and each visit reads them, merges in the block's own
// (m~_ij, l~_ij) and writes them back, O_i normalised. With dropout p = 0.25, as the paper's full forward
// pass has it: the keep mask Z and the scale 1/(1-p) multiply P~_ij before P~_ij V_j, while l~_ij sums the
// undropped P~_ij, so that LSE is that of the undropped scores (docs/conventions.md). The final O and LSE
// are compared with step 1 under the same mask. The output is deterministic: tests/golden/step2_trace_fa1.txt.
#include <algorithm>
#include <cmath>

#include "step1_cpu_reference/reference.h"
#include "trace.h"

namespace fa::step2 {
namespace {

using example::kD, example::kM, example::kN, example::nums;

constexpr float kDropout = 0.25f;

struct Printer {
  std::string* s;
  Blocks bl;
  int64_t j0 = -1;  // the K/V block being printed
};

void print_visit(const Fa1Visit& v, void* ctx) {
  Printer& pr = *static_cast<Printer*>(ctx);
  std::string& s = *pr.s;
  if (v.j0 != pr.j0) {
    out(s, "\nK/V block j=%lld: keys %lld..%lld, loaded once; every Q block visits it in turn\n",
        (long long)(v.j0 / pr.bl.Bc), (long long)v.j0, (long long)(v.j0 + v.cols - 1));
    pr.j0 = v.j0;
  }
  const int w = int(8 * v.cols);
  out(s, "\nvisit (j=%lld, i=%lld): Q rows %lld..%lld; O_i, l_i, m_i read from HBM, merged, written back\n",
      (long long)(v.j0 / pr.bl.Bc), (long long)(v.i0 / pr.bl.Br), (long long)v.i0, (long long)(v.i0 + v.rows - 1));
  out(s, "  row |%*s |%8s |%*s |%8s |%*s |%8s%8s |%*s\n", w, "S_ij", "m~_ij", w, "P~_ij", "l~_ij", w,
      "P~_ij Z_ij/(1-p)", "m_i", "l_i", int(8 * kD), "O_i");
  for (int64_t r = 0; r < v.rows; ++r) {
    out(s, "  %3lld |", (long long)(v.i0 + r));
    nums(s, v.S + r * v.cols, v.cols);
    out(s, " |%8.4f |", v.tile[r].m);
    nums(s, v.P + r * v.cols, v.cols);
    out(s, " |%8.4f |", v.tile[r].l);
    nums(s, v.Pd + r * v.cols, v.cols);
    out(s, " |%8.4f%8.4f |", v.state[r].m, v.state[r].l);
    nums(s, v.O + r * kD, kD);
    out(s, "\n");
  }
}

}  // namespace

std::string trace_fa1(uint64_t seed) {
  const Problem p = example::problem(seed, false, kDropout);
  const Inputs in = example::inputs(p);
  const Blocks bl = blocks_from_budget(kM, kD);
  Outputs res = example::outputs(p);
  const Head hd = head_of(p, in, res, 0, 0);

  std::string s;
  example::print_example(s, "step 2 trace, FlashAttention-1's loop order", p, in);
  out(s, "\nkeep mask Z_ij (1 kept, 0 dropped): Philox of (seed, b = 0, h = 0, i, j), never stored (docs/conventions.md)\n");
  out(s, "  row | j =");
  for (int64_t j = 0; j < kN; ++j) out(s, "%3lld", (long long)j);
  out(s, "\n");
  for (int64_t i = 0; i < kN; ++i) {
    out(s, "  %3lld |    ", (long long)i);
    for (int64_t j = 0; j < kN; ++j) out(s, "%3d", hd.keep(i, j) != 0.0f ? 1 : 0);
    out(s, "\n");
  }

  out(s, "\nFlashAttention-1's loop order (Dao et al. 2022, Algorithm 1): for each K/V block j, visit Q blocks i = 0, 1, ...\n");
  out(s, "  in HBM between visits: O_i, l_i, m_i of every row, at first O = 0, l = 0, m = -inf\n");
  out(s, "  S_ij = scale Q_i K_j^T   m~_ij = rowmax(S_ij)   P~_ij = exp(S_ij - m~_ij)   l~_ij = rowsum(P~_ij), undropped\n");
  out(s, "  P~_ij Z_ij/(1-p): the dropped weights, the ones V_j is multiplied by\n");
  out(s, "  m_i = max(m_i old, m~_ij)   l_i = e^(m_i old - m_i) l_i old + e^(m~_ij - m_i) l~_ij\n");
  out(s, "  O_i = (e^(m_i old - m_i) l_i old O_i old + e^(m~_ij - m_i) P~_ij Z_ij/(1-p) V_j) / l_i: normalised at every visit\n");

  out(s, "\n==== no mask, dropout p = %.2f ====\n", p.dropout);
  Printer pr{&s, bl};
  attention_fa1(hd, bl, print_visit, &pr);

  const auto ref = step1::attention<double>(p, in, false);
  out(s, "\nresult: O and LSE_i = m_i + log l_i as left in HBM, beside step 1 (fp64, the same keep mask)\n");
  out(s, "  row |%16s%8s |%16s%8s\n", "O", "LSE", "step 1: O", "LSE");
  double err = 0;
  for (int64_t i = 0; i < kN; ++i) {
    out(s, "  %3lld |", (long long)i);
    nums(s, res.o.ptr() + i * kD, kD);
    out(s, "%8.4f |", res.lse.data[i]);
    for (int64_t c = 0; c < kD; ++c) out(s, "%8.4f", ref.o.data[i * kD + c]);
    out(s, "%8.4f\n", ref.lse.data[i]);
    for (int64_t c = 0; c < kD; ++c) err = std::max(err, std::fabs(res.o.data[i * kD + c] - ref.o.data[i * kD + c]));
  }
  out(s, "  max |O - O_step1| < 1e-6: %s\n", err < 1e-6 ? "yes" : "NO");
  out(s, "  LSE is that of the undropped scores: the same as in --trace, whose O has no dropout\n");
  return s;
}

}  // namespace fa::step2
