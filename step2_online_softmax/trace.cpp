// FlashAttention, step by step — step 2: the worked example, block by block (step2_online_softmax/trace.cpp)
//
// The example of trace.h (N = 6, d = 2, M = 20: three Q blocks of Br = 2 rows, two K/V blocks of Bc = 3
// keys) through FlashAttention-2's forward. The numbers come from the real attention_fa2 through its visit
// observer, not from a copy of the algorithm; the final O and LSE are compared with step 1.
// Then the same keys split in two halves whose partial states are merged (split-KV).
// This file also holds what the three traces share (trace.h). Its output: tests/golden/step2_trace.txt.
#include "trace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/random.h"
#include "step1_cpu_reference/reference.h"

namespace fa::step2 {

namespace example {

Problem problem(uint64_t seed, bool causal, float dropout, bool backward) {
  Problem p;
  p.B = p.Hq = p.Hkv = 1;
  p.Nq = p.Nk = kN;
  p.d = kD;
  p.scale = float(1.0 / std::sqrt(double(kD)));
  p.dtype = DType::fp32;
  p.seed = seed;
  p.causal = causal;
  p.dropout = dropout;
  p.backward = backward;
  return p;
}

Inputs inputs(const Problem& p) { return random_inputs(p); }

Outputs outputs(const Problem& p) {
  Outputs res;
  res.o = Tensor({1, 1, kN, kD});
  res.lse = Tensor({1, 1, kN});
  if (p.backward) res.dq = res.dk = res.dv = Tensor({1, 1, kN, kD});
  return res;
}

void nums(std::string& s, const float* x, int64_t n) {
  // A value that rounds to zero prints as 0.0000, never -0.0000 (as P_ij (dP_ij - D_i) with P_ij = 0 would).
  for (int64_t k = 0; k < n; ++k) out(s, "%8.4f", std::fabs(x[k]) < 0.00005f ? 0.0f : x[k]);
}

void print_example(std::string& s, const std::string& title, const Problem& p, const Inputs& in) {
  const Blocks bl = blocks_from_budget(kM, kD);
  out(s, "%s: N = %lld queries and keys, d = %lld, on-chip budget M = %lld floats\n", title.c_str(), (long long)kN,
      (long long)kD, (long long)kM);
  out(s, "  Bc = ceil(M / 4d) = %lld keys per K/V block, Br = min(Bc, d) = %lld rows per Q block\n",
      (long long)bl.Bc, (long long)bl.Br);
  out(s, "  scale = 1/sqrt(d) = %.4f; inputs drawn with seed %llu, fp32\n", p.scale, (unsigned long long)p.seed);
  if (p.dropout > 0)
    out(s, "  dropout p = %.2f: a kept weight is scaled by 1/(1-p) = %.4f\n", p.dropout, 1.0 / (1.0 - p.dropout));
  const bool dO = !in.dout.data.empty();
  out(s, "\n  row |%16s |%16s |%16s%s\n", "Q", "K", "V", dO ? " |              dO" : "");
  for (int64_t i = 0; i < kN; ++i) {
    out(s, "  %3lld |", (long long)i);
    for (const Tensor* t : {&in.q, &in.k, &in.v, &in.dout}) {
      if (t->data.empty()) continue;
      if (t != &in.q) out(s, " |");
      nums(s, t->ptr() + i * kD, kD);
    }
    out(s, "\n");
  }
}

}  // namespace example

namespace {

using example::kD, example::kM, example::kN, example::nums;

struct Printer {
  std::string* s;
  Blocks bl;
  int64_t i0 = -1, next_j0 = 0;  // the Q block being printed, the first K/V block it has not visited
};

// The K/V blocks of the current Q block that the loop did not visit (causal: wholly above the diagonal).
void close_block(Printer& pr) {
  if (pr.i0 < 0) return;
  for (int64_t j0 = pr.next_j0; j0 < kN; j0 += pr.bl.Bc)
    out(*pr.s, "\nvisit (i=%lld, j=%lld): keys %lld..%lld are all after row %lld's position: skipped\n",
        (long long)(pr.i0 / pr.bl.Br), (long long)(j0 / pr.bl.Bc), (long long)j0,
        (long long)std::min(j0 + pr.bl.Bc, kN) - 1, (long long)std::min(pr.i0 + pr.bl.Br, kN) - 1);
}

void print_visit(const Visit& v, void* ctx) {
  Printer& pr = *static_cast<Printer*>(ctx);
  std::string& s = *pr.s;
  if (v.i0 != pr.i0) {
    close_block(pr);
    pr.i0 = v.i0;
  }
  pr.next_j0 = v.j0 + v.cols;
  const int w = int(8 * v.cols);
  out(s, "\nvisit (i=%lld, j=%lld): Q rows %lld..%lld, K/V keys %lld..%lld\n", (long long)(v.i0 / pr.bl.Br),
      (long long)(v.j0 / pr.bl.Bc), (long long)v.i0, (long long)(v.i0 + v.rows - 1), (long long)v.j0,
      (long long)(v.j0 + v.cols - 1));
  out(s, "  row |%*s |%8s |%8s%8s |%*s |%8s%8s |%*s\n", w, "S_ij", "m_ij", "alpha", "m_i", w, "P_ij", "l_ij", "l_i",
      int(8 * kD), "O_i");
  for (int64_t r = 0; r < v.rows; ++r) {
    const float* S = v.S + r * v.cols;
    const float* P = v.P + r * v.cols;
    const SoftmaxState& st = v.state[r];
    float o[kD], l_ij = 0.0f;  // [d] the running O_i = acc_i / l_i, and rowsum(P_ij)
    for (int64_t c = 0; c < v.cols; ++c) l_ij += P[c];
    for (int64_t c = 0; c < kD; ++c) o[c] = v.acc[r * kD + c] * inv_l(st);
    out(s, "  %3lld |", (long long)(v.i0 + r));
    nums(s, S, v.cols);
    out(s, " |%8.4f |%8.4f%8.4f |", *std::max_element(S, S + v.cols), safe_exp_diff(v.m_old[r], st.m), st.m);
    nums(s, P, v.cols);
    out(s, " |%8.4f%8.4f |", l_ij, st.l);
    nums(s, o, kD);
    out(s, "\n");
  }
}

}  // namespace

std::string trace(uint64_t seed) {
  Problem p = example::problem(seed);
  const Inputs in = example::inputs(p);
  const Blocks bl = blocks_from_budget(kM, kD);

  std::string s;
  example::print_example(s, "step 2 trace", p, in);
  out(s, "\nFlashAttention-2's loop order: for each Q block i, visit K/V blocks j = 0, 1, ... in order.\n");
  out(s, "  S_ij = scale Q_i K_j^T (-inf: masked)     m_ij = rowmax(S_ij)     m_i = max(m_i, m_ij), the running max\n");
  out(s, "  alpha = exp(m_i before - m_i after): the factor by which l_i and acc_i are rescaled\n");
  out(s, "  P_ij = exp(S_ij - m_i)   l_ij = rowsum(P_ij)   l_i = alpha l_i + l_ij   acc_i = alpha acc_i + P_ij V_j\n");
  out(s, "  O_i = acc_i / l_i: the attention output over the keys seen so far (the invariant)\n");

  Tensor O_full;  // [N, d]  the unmasked result, for the split-KV section
  for (bool causal : {false, true}) {
    p.causal = causal;
    Outputs res = example::outputs(p);  // O [1, 1, N, d], LSE [1, 1, N]
    const Tensor &o = res.o, &lse = res.lse;
    out(s, "\n==== %s ====\n", causal ? "causal: query i sees keys 0..i" : "no mask");
    Printer pr{&s, bl};
    attention_fa2(head_of(p, in, res, 0, 0), bl, print_visit, &pr);
    close_block(pr);
    const auto ref = step1::attention<double>(p, in, false);
    out(s, "\nresult: O_i = acc_i / l_i and LSE_i = m_i + log l_i, beside step 1 (fp64)\n");
    out(s, "  row |%16s%8s |%16s%8s\n", "O", "LSE", "step 1: O", "LSE");
    double err = 0;
    for (int64_t i = 0; i < kN; ++i) {
      out(s, "  %3lld |", (long long)i);
      nums(s, o.ptr() + i * kD, kD);
      out(s, "%8.4f |", lse.data[i]);
      for (int64_t c = 0; c < kD; ++c) out(s, "%8.4f", ref.o.data[i * kD + c]);
      out(s, "%8.4f\n", ref.lse.data[i]);
      for (int64_t c = 0; c < kD; ++c) err = std::max(err, std::fabs(o.data[i * kD + c] - ref.o.data[i * kD + c]));
    }
    out(s, "  max |O - O_step1| < 1e-6: %s\n", err < 1e-6 ? "yes" : "NO");
    if (!causal) O_full = o;
  }

  // Split-KV: each half of the keys gives a partial state on its own; the merge recovers the whole.
  p.causal = false;
  Outputs res = example::outputs(p);
  const Head hd = head_of(p, in, res, 0, 0);
  const int64_t half = kN / 2;
  out(s, "\n==== split-KV (flash-decoding), no mask: keys 0..%lld and %lld..%lld on their own, then merged ====\n",
      (long long)half - 1, (long long)half, (long long)kN - 1);
  out(s, "  (m, l, acc) (+) (m', l', acc') = (M, e^(m-M) l + e^(m'-M) l', e^(m-M) acc + e^(m'-M) acc'), M = max(m, m')\n");
  out(s, "  row |%8s%8s%16s |%8s%8s%16s |%8s%8s%16s\n", "m", "l", "acc", "m'", "l'", "acc'", "M", "l", "O = acc / l");
  double err = 0;
  for (int64_t i = 0; i < kN; ++i) {
    Partial a = online_partial(hd, i, 0, half, bl.Bc);
    const Partial b = online_partial(hd, i, half, kN, bl.Bc);
    out(s, "  %3lld |%8.4f%8.4f", (long long)i, a.st.m, a.st.l);
    nums(s, a.acc.data(), kD);
    out(s, " |%8.4f%8.4f", b.st.m, b.st.l);
    nums(s, b.acc.data(), kD);
    merge(a, b);
    float o_merged[kD];  // [d]
    for (int64_t c = 0; c < kD; ++c) o_merged[c] = a.acc[c] * inv_l(a.st);
    out(s, " |%8.4f%8.4f", a.st.m, a.st.l);
    nums(s, o_merged, kD);
    out(s, "\n");
    for (int64_t c = 0; c < kD; ++c) err = std::max(err, double(std::fabs(o_merged[c] - O_full.data[i * kD + c])));
  }
  out(s, "  merged O equals the unmasked O above to 1e-6: %s\n", err < 1e-6 ? "yes" : "NO");
  return s;
}

}  // namespace fa::step2
