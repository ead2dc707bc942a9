// FlashAttention, step by step — core/varlen.h
// Packed variable-length batches, as FlashAttention's flash_attn_varlen_func takes them: the sequences of a
// batch laid end to end, with no padding, and two prefix sums saying where each one starts.
//
//   Q [total_q, Hq, d], K and V [total_k, Hkv, d]  ->  O [total_q, Hq, d], LSE [Hq, total_q]
//   cu_seqlens_q = {0, Lq_0, Lq_0 + Lq_1, ..., total_q}   (int32, batch + 1 entries); cu_seqlens_k likewise
//   max_seqlen_q, max_seqlen_k: at least the longest sequence (what a GPU kernel sizes its grid by)
//
// Sequence b's queries are the rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1, and they see only its own keys,
// rows cu_seqlens_k[b] .. cu_seqlens_k[b+1] - 1. Each sequence is the dense problem of core/problem.h with
// B = 1, Nq = Lq_b, Nk = Lk_b and input_pos = Lk_b - Lq_b: causal is bottom-right per sequence (query i
// sees key j <= i + Lk_b - Lq_b, FlashAttention 2.1's convention), and the window and ALiBi's diagonal sit
// there too. GQA, the window, the softcap and ALiBi carry over unchanged. A sequence with no queries
// produces nothing (its keys get dK = dV = 0); one with no keys gives its rows O = 0, LSE = -inf and dQ = 0,
// the convention for a row that sees no key.
//
// How a CPU stage runs one (VarlenRunner, run_packed): sequence by sequence, each gathered into the
// dense [1, H, L, d] layout (a copy: the packed rows interleave the heads, the dense layout does not), run
// through the stage's own dense code, and its outputs scattered back. The loop is here, once, for every
// stage that declares Stage::has_varlen.
// Not taken: a bias (a dense [B, Hq, Nq, Nk] tensor has no meaning for ragged sequences), dropout (the
// mask's batch coordinate in a packed batch is not defined yet) and split-KV.
#pragma once
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/problem.h"
#include "core/stage.h"
#include "core/tensor.h"

namespace fa {

struct Varlen {
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;  // batch + 1 entries each, from 0, never decreasing
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;       // at least the longest query / key sequence

  int64_t batch() const { return int64_t(cu_seqlens_q.size()) - 1; }
  int64_t total_q() const { return cu_seqlens_q.empty() ? 0 : cu_seqlens_q.back(); }
  int64_t total_k() const { return cu_seqlens_k.empty() ? 0 : cu_seqlens_k.back(); }
  int64_t len_q(int64_t b) const { return int64_t(cu_seqlens_q[size_t(b + 1)]) - cu_seqlens_q[size_t(b)]; }
  int64_t len_k(int64_t b) const { return int64_t(cu_seqlens_k[size_t(b + 1)]) - cu_seqlens_k[size_t(b)]; }
  // Throws std::invalid_argument with one clear sentence when the description is malformed: fewer than two
  // entries, lists of different lengths, a first entry other than 0, a decreasing entry, a max_seqlen shorter
  // than a sequence.
  void validate() const;
  // "batch=3 cu_seqlens_q=0,5,5,12 cu_seqlens_k=0,7,7,20 max_seqlen_q=7 max_seqlen_k=13"
  std::string describe() const;
};

// A validated description with max_seqlen_q/k the longest sequences.
Varlen make_varlen(std::vector<int32_t> cu_seqlens_q, std::vector<int32_t> cu_seqlens_k);
// The same from the lengths of the sequences.
Varlen varlen_from_lengths(const std::vector<int64_t>& lengths_q, const std::vector<int64_t>& lengths_k);
// "0,5,5,12" -> {0, 5, 5, 12}: whole numbers from 0 to 2^31 - 1, separated by commas; throws
// std::invalid_argument naming `flag` otherwise (the order is Varlen::validate's business).
std::vector<int32_t> parse_cu_seqlens(const std::string& text, const std::string& flag);
// The same for any list of whole numbers (a KV cache's --cache-seqlens): `what` and `example` name them in the message.
std::vector<int32_t> parse_whole_numbers(const std::string& text, const std::string& flag, const std::string& what,
                                         const std::string& example);

// Refuses what a varlen run of p cannot take (a bias, dropout, split-KV), validates the fields of p that all
// sequences share (heads, head dim, scale, modifiers) and v. p's B, Nq, Nk and input_pos are not read.
void validate_varlen_problem(const Problem& p, const Varlen& v);
// Sequence b as a dense problem: B = 1, Nq = Lq_b, Nk = Lk_b, input_pos = Lk_b - Lq_b (bottom-right).
Problem sequence_problem(const Problem& p, const Varlen& v, int64_t b);
// Does sequence b run at all? Not when it has no queries or no keys (the outputs' initial values are its result).
inline bool sequence_has_work(const Varlen& v, int64_t b) { return v.len_q(b) > 0 && v.len_k(b) > 0; }
// The forward FLOPs of the whole batch: the sum over its sequences (Problem::flops_forward's convention).
double varlen_flops_forward(const Problem& p, const Varlen& v);
// Does packed query row `row` see any key (by the mask: causal, window)? The rows where LSE = -inf belongs.
bool packed_row_sees_a_key(const Problem& p, const Varlen& v, int64_t row);

// Seeded random packed inputs: Q [total_q, Hq, d], K, V [total_k, Hkv, d] (and dO with p.backward), drawn
// and rounded to the dtype as random_inputs draws the dense ones.
Inputs random_packed_inputs(const Problem& p, const Varlen& v);
// Throws std::invalid_argument when the packed inputs do not have the shapes v and p ask for ("q has shape
// [11, 8, 64]; cu_seqlens_q ends at 12 and the problem has 8 heads of dim 64: expected [12, 8, 64]").
void check_packed_inputs(const Problem& p, const Varlen& v, const Inputs& packed);
// A packed batch as a GPU kernel's grid sees it (a stage's make_varlen): B sequences, Nq and Nk the longest;
// each sequence's own lengths and diagonal come from the offsets.
Problem packed_grid_problem(const Problem& p, const Varlen& v);
// The packed inputs, with an empty Q (K) of a batch that has no query (key) at all given one zero row: what a
// GPU stage uploads, since a TMA tensor map must point at memory. The extra row is never read.
Inputs with_a_row(const Problem& p, const Inputs& packed);
// Sequence b's inputs in the dense layout [1, H, L, d] (copies), with the ALiBi slopes.
Inputs sequence_inputs(const Problem& p, const Varlen& v, const Inputs& packed, int64_t b);

// The packed outputs before any sequence runs: O = 0 [total_q, Hq, d], LSE = -inf [Hq, total_q], and with
// p.backward dQ = 0 like O, dK = dV = 0 [total_k, Hkv, d].
template <typename T>
OutputsT<T> packed_outputs(const Problem& p, const Varlen& v) {
  OutputsT<T> out;
  out.o = TensorT<T>({v.total_q(), p.Hq, p.d});
  out.lse = TensorT<T>({p.Hq, v.total_q()}, -std::numeric_limits<T>::infinity());
  if (p.backward) {
    out.dq = TensorT<T>({v.total_q(), p.Hq, p.d});
    out.dk = TensorT<T>({v.total_k(), p.Hkv, p.d});
    out.dv = TensorT<T>({v.total_k(), p.Hkv, p.d});
  }
  return out;
}

// Writes the dense outputs `seq` of sequence b ([1, H, L, d], LSE [1, Hq, Lq]) into its rows of `packed`.
template <typename T>
void scatter_sequence(const Problem& p, const Varlen& v, int64_t b, const OutputsT<T>& seq, OutputsT<T>& packed) {
  const int64_t Lq = v.len_q(b), Lk = v.len_k(b), q0 = v.cu_seqlens_q[size_t(b)], k0 = v.cu_seqlens_k[size_t(b)];
  const int64_t d = p.d, total_q = v.total_q();
  // dense [H, L, d] -> packed [total, H, d]: row r0 + i of head h.
  auto rows = [d](const TensorT<T>& from, TensorT<T>& to, int64_t H, int64_t L, int64_t r0) {
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t c = 0; c < d; ++c) to.data[size_t(((r0 + i) * H + h) * d + c)] = from.data[size_t((h * L + i) * d + c)];
  };
  rows(seq.o, packed.o, p.Hq, Lq, q0);
  for (int64_t h = 0; h < p.Hq; ++h)
    for (int64_t i = 0; i < Lq; ++i) packed.lse.data[size_t(h * total_q + q0 + i)] = seq.lse.data[size_t(h * Lq + i)];
  if (!p.backward) return;
  rows(seq.dq, packed.dq, p.Hq, Lq, q0);
  rows(seq.dk, packed.dk, p.Hkv, Lk, k0);
  rows(seq.dv, packed.dv, p.Hkv, Lk, k0);
}

// The varlen loop: every sequence with work through `dense` (any callable (const Problem&, const Inputs&) ->
// OutputsT<T>: a stage's run, step 1's attention), gathered and scattered, one after the other.
template <typename T, typename Dense>
OutputsT<T> run_packed(const Problem& p, const Varlen& v, const Inputs& packed, const Dense& dense) {
  validate_varlen_problem(p, v);
  check_packed_inputs(p, v, packed);
  OutputsT<T> out = packed_outputs<T>(p, v);
  for (int64_t b = 0; b < v.batch(); ++b)
    if (sequence_has_work(v, b))
      scatter_sequence(p, v, b, dense(sequence_problem(p, v, b), sequence_inputs(p, v, packed, b)), out);
  return out;
}

// A Runner for the packed batch built from stage s's own Runners, one per sequence with work: construction
// gathers every sequence's inputs and makes its runner (set-up, untimed); run() and run_backward() run them
// in order; outputs() scatters their outputs. Refuses (std::invalid_argument) a stage without
// Stage::has_varlen and a sequence that s.unsupported() refuses, naming it.
std::unique_ptr<Runner> make_varlen_runner(const Stage& s, const Problem& p, const Varlen& v, const Inputs& packed,
                                           const std::string& variant);

// The oracle of a packed batch: `dense`'s fp64 and low-precision computations run through run_packed.
Oracle varlen_oracle(const Oracle& dense, const Varlen& v);

}  // namespace fa
