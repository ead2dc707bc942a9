// FlashAttention, step by step — core/varlen.cpp
#include "core/varlen.h"

#include <algorithm>
#include <charconv>
#include <tuple>

#include "core/random.h"
#include "core/score_mod.h"

namespace fa {

namespace {

std::string join(const std::vector<int32_t>& xs) {
  std::string s;
  for (size_t k = 0; k < xs.size(); ++k) {
    if (k) s += ',';
    s += std::to_string(xs[k]);
  }
  return s;
}

// The checks of one list, named `name`.
void validate_list(const std::vector<int32_t>& cu, const char* name) {
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  if (cu.size() < 2)
    fail(std::string(name) + " needs at least 2 entries (batch + 1 offsets, the first 0), got " + std::to_string(cu.size()));
  if (cu[0] != 0) fail(std::string(name) + " must start at 0 (got " + std::to_string(cu[0]) + ")");
  for (size_t k = 1; k < cu.size(); ++k)
    if (cu[k] < cu[k - 1])
      fail(std::string(name) + " must not decrease: entry " + std::to_string(k) + " (" + std::to_string(cu[k]) +
           ") is below entry " + std::to_string(k - 1) + " (" + std::to_string(cu[k - 1]) +
           "); each entry is where a sequence starts");
}

}  // namespace

void Varlen::validate() const {
  validate_list(cu_seqlens_q, "cu_seqlens_q");
  validate_list(cu_seqlens_k, "cu_seqlens_k");
  if (cu_seqlens_q.size() != cu_seqlens_k.size())
    throw std::invalid_argument("cu_seqlens_q has " + std::to_string(cu_seqlens_q.size()) + " entries and cu_seqlens_k " +
                                std::to_string(cu_seqlens_k.size()) + ": both are batch + 1 long");
  for (int64_t b = 0; b < batch(); ++b)
    for (const auto& [len, max, what] : {std::tuple{len_q(b), max_seqlen_q, "queries: max_seqlen_q"},
                                         std::tuple{len_k(b), max_seqlen_k, "keys: max_seqlen_k"}})
      if (len > max)
        throw std::invalid_argument("sequence " + std::to_string(b) + " has " + std::to_string(len) + " " + what +
                                    " (" + std::to_string(max) + ") must be at least the longest sequence");
}

std::string Varlen::describe() const {
  return "batch=" + std::to_string(batch()) + " cu_seqlens_q=" + join(cu_seqlens_q) + " cu_seqlens_k=" +
         join(cu_seqlens_k) + " max_seqlen_q=" + std::to_string(max_seqlen_q) + " max_seqlen_k=" +
         std::to_string(max_seqlen_k);
}

Varlen make_varlen(std::vector<int32_t> cu_seqlens_q, std::vector<int32_t> cu_seqlens_k) {
  Varlen v;
  v.cu_seqlens_q = std::move(cu_seqlens_q);
  v.cu_seqlens_k = std::move(cu_seqlens_k);
  // The longest, counted only where the lists are well formed; validate() says what is wrong otherwise.
  for (size_t k = 1; k < v.cu_seqlens_q.size(); ++k)
    v.max_seqlen_q = std::max<int64_t>(v.max_seqlen_q, int64_t(v.cu_seqlens_q[k]) - v.cu_seqlens_q[k - 1]);
  for (size_t k = 1; k < v.cu_seqlens_k.size(); ++k)
    v.max_seqlen_k = std::max<int64_t>(v.max_seqlen_k, int64_t(v.cu_seqlens_k[k]) - v.cu_seqlens_k[k - 1]);
  v.validate();
  return v;
}

Varlen varlen_from_lengths(const std::vector<int64_t>& lengths_q, const std::vector<int64_t>& lengths_k) {
  auto prefix = [](const std::vector<int64_t>& lens, const char* name) {
    std::vector<int32_t> cu = {0};
    int64_t at = 0;
    for (int64_t l : lens) {
      if (l < 0) throw std::invalid_argument(std::string(name) + ": a sequence length must be >= 0 (got " + std::to_string(l) + ")");
      at += l;
      if (at > std::numeric_limits<int32_t>::max())
        throw std::invalid_argument(std::string(name) + ": the total length passes int32's 2^31 - 1");
      cu.push_back(int32_t(at));
    }
    return cu;
  };
  return make_varlen(prefix(lengths_q, "lengths_q"), prefix(lengths_k, "lengths_k"));
}

std::vector<int32_t> parse_cu_seqlens(const std::string& text, const std::string& flag) {
  return parse_whole_numbers(text, flag, "offsets", "0,5,5,12");
}

std::vector<int32_t> parse_whole_numbers(const std::string& text, const std::string& flag, const std::string& what,
                                         const std::string& example) {
  std::vector<int32_t> cu;
  size_t at = 0;
  while (true) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const char *first = text.data() + at, *last = text.data() + comma;
    int64_t x = -1;
    const auto [stop, error] = std::from_chars(first, last, x);
    if (first == last || error != std::errc() || stop != last || x < 0 || x > std::numeric_limits<int32_t>::max())
      throw std::invalid_argument(flag + ": expected " + what + " separated by commas, whole numbers from 0 to 2147483647 "
                                  "(e.g. " + example + "), got '" + text + "'");
    cu.push_back(int32_t(x));
    if (comma == text.size()) break;
    at = comma + 1;
  }
  return cu;
}

void validate_varlen_problem(const Problem& p, const Varlen& v) {
  if (p.bias)
    throw std::invalid_argument("a bias is a dense [B, Hq, Nq, Nk] tensor, which a packed batch of ragged sequences "
                                "has no shape for: varlen takes ALiBi, the window and the softcap, not a bias");
  if (p.dropout > 0)
    throw std::invalid_argument("varlen takes no dropout yet: the dropout mask's batch coordinate in a packed batch "
                                "is not defined");
  if (p.splits > 0) throw std::invalid_argument("varlen takes no split-KV (--splits): each sequence runs whole");
  Problem shared = p;  // what every sequence shares, validated on a problem of one query and one key
  shared.B = shared.Nq = shared.Nk = 1;
  shared.input_pos = 0;
  shared.validate();
  v.validate();
}

Problem sequence_problem(const Problem& p, const Varlen& v, int64_t b) {
  Problem s = p;
  s.B = 1;
  s.Nq = v.len_q(b);
  s.Nk = v.len_k(b);
  s.input_pos = s.Nk - s.Nq;  // bottom-right, per sequence
  return s;
}

Problem packed_grid_problem(const Problem& p, const Varlen& v) {
  Problem g = p;
  g.B = v.batch(), g.Nq = v.max_seqlen_q, g.Nk = v.max_seqlen_k, g.input_pos = 0;  // each sequence has its own
  return g;
}

Inputs with_a_row(const Problem& p, const Inputs& packed) {
  if (packed.q.size() > 0 && packed.k.size() > 0) return packed;
  Inputs in = packed;
  if (in.q.size() == 0) {
    in.q = Tensor({1, p.Hq, p.d});
    if (p.backward) in.dout = in.q;
  }
  if (in.k.size() == 0) in.k = in.v = Tensor({1, p.Hkv, p.d});
  return in;
}

double varlen_flops_forward(const Problem& p, const Varlen& v) {
  double f = 0;
  for (int64_t b = 0; b < v.batch(); ++b)
    if (sequence_has_work(v, b)) f += sequence_problem(p, v, b).flops_forward();
  return f;
}

bool packed_row_sees_a_key(const Problem& p, const Varlen& v, int64_t row) {
  const auto& cu = v.cu_seqlens_q;
  const int64_t b = int64_t(std::upper_bound(cu.begin(), cu.end(), int32_t(row)) - cu.begin()) - 1;
  if (b < 0 || b >= v.batch() || v.len_k(b) == 0) return false;
  const Problem s = sequence_problem(p, v, b);
  int64_t lo, hi;
  visible_range(score_mod_of(s), s.Nk, row - cu[size_t(b)], &lo, &hi);
  return lo <= hi;
}

Inputs random_packed_inputs(const Problem& p, const Varlen& v) {
  Inputs in;  // the streams of random_inputs: q 1, k 2, v 3, dO 4
  in.q = random_tensor({v.total_q(), p.Hq, p.d}, p.seed, 1, 0.3f, p.dtype);
  in.k = random_tensor({v.total_k(), p.Hkv, p.d}, p.seed, 2, 0.3f, p.dtype);
  in.v = random_tensor({v.total_k(), p.Hkv, p.d}, p.seed, 3, 0.5f, p.dtype);
  if (p.backward) in.dout = random_tensor({v.total_q(), p.Hq, p.d}, p.seed, 4, 0.5f, p.dtype);
  return in;
}

void check_packed_inputs(const Problem& p, const Varlen& v, const Inputs& packed) {
  auto expect = [&](const char* name, const Tensor& t, int64_t rows, const char* list, int64_t H, const char* heads) {
    const std::vector<int64_t> want = {rows, H, p.d};
    if (t.shape != want)
      throw std::invalid_argument(std::string(name) + " has shape " + shape_str(t.shape) + "; " + list + " ends at " +
                                  std::to_string(rows) + " and the problem has " + std::to_string(H) + " " + heads +
                                  " of dim " + std::to_string(p.d) + ": expected " + shape_str(want));
  };
  expect("q", packed.q, v.total_q(), "cu_seqlens_q", p.Hq, "query heads");
  expect("k", packed.k, v.total_k(), "cu_seqlens_k", p.Hkv, "kv heads");
  expect("v", packed.v, v.total_k(), "cu_seqlens_k", p.Hkv, "kv heads");
  if (p.backward) expect("dout", packed.dout, v.total_q(), "cu_seqlens_q", p.Hq, "query heads");
  if (p.alibi && !packed.alibi_slopes.empty() && packed.alibi_slopes.shape != std::vector<int64_t>{p.Hq})
    throw std::invalid_argument("the ALiBi slopes have shape " + shape_str(packed.alibi_slopes.shape) + ", not [" +
                                std::to_string(p.Hq) + "]");
}

Inputs sequence_inputs(const Problem& p, const Varlen& v, const Inputs& packed, int64_t b) {
  const int64_t Lq = v.len_q(b), Lk = v.len_k(b), q0 = v.cu_seqlens_q[size_t(b)], k0 = v.cu_seqlens_k[size_t(b)];
  const int64_t d = p.d;
  // packed [total, H, d] -> dense [1, H, L, d]: head h's rows r0 .. r0 + L - 1.
  auto gather = [d](const Tensor& from, int64_t H, int64_t L, int64_t r0) {
    Tensor to({1, H, L, d});
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t c = 0; c < d; ++c) to.data[size_t((h * L + i) * d + c)] = from.data[size_t(((r0 + i) * H + h) * d + c)];
    return to;
  };
  Inputs in;
  in.q = gather(packed.q, p.Hq, Lq, q0);
  in.k = gather(packed.k, p.Hkv, Lk, k0);
  in.v = gather(packed.v, p.Hkv, Lk, k0);
  if (p.backward) in.dout = gather(packed.dout, p.Hq, Lq, q0);
  in.alibi_slopes = packed.alibi_slopes;
  return in;
}

namespace {

class VarlenRunner final : public Runner {
 public:
  VarlenRunner(const Stage& s, const Problem& p, const Varlen& v, const Inputs& packed, const std::string& variant)
      : p_(p), v_(v) {
    if (!s.has_varlen)
      throw std::invalid_argument(s.name + " has no varlen path (--cu-seqlens-q, --cu-seqlens-k): steps 1, 2, 4, 5 and 7 have");
    validate_varlen_problem(p, v);
    check_packed_inputs(p, v, packed);
    for (int64_t b = 0; b < v.batch(); ++b)
      if (sequence_has_work(v, b)) seqs_.push_back({b, sequence_problem(p, v, b), sequence_inputs(p, v, packed, b), nullptr});
    // The runners after the inputs: a Runner may keep a reference to its inputs, which must not move.
    for (Seq& q : seqs_) {
      if (const std::string why = s.unsupported(q.p, variant); !why.empty())
        throw std::invalid_argument(s.name + " cannot run sequence " + std::to_string(q.b) + " (" + q.p.describe() +
                                    "): " + why);
      q.runner = s.make(q.p, q.in, variant);
    }
  }
  void run() override {
    for (Seq& q : seqs_) q.runner->run();
  }
  void run_backward() override {
    for (Seq& q : seqs_) q.runner->run_backward();
  }
  Outputs outputs() override {
    Outputs out = packed_outputs<float>(p_, v_);
    for (Seq& q : seqs_) scatter_sequence(p_, v_, q.b, q.runner->outputs(), out);
    return out;
  }

 private:
  struct Seq {
    int64_t b;
    Problem p;
    Inputs in;
    std::unique_ptr<Runner> runner;
  };
  Problem p_;
  Varlen v_;
  std::vector<Seq> seqs_;
};

}  // namespace

std::unique_ptr<Runner> make_varlen_runner(const Stage& s, const Problem& p, const Varlen& v, const Inputs& packed,
                                           const std::string& variant) {
  if (s.has_varlen && s.make_varlen) {  // the stage's own packed kernel: one launch for the whole batch
    validate_varlen_problem(p, v);
    check_packed_inputs(p, v, packed);
    if (const std::string why = s.unsupported(p, variant); !why.empty())
      throw std::invalid_argument(s.name + " cannot run this packed batch: " + why);
    return s.make_varlen(p, v, packed, variant);
  }
  return std::make_unique<VarlenRunner>(s, p, v, packed, variant);
}

Oracle varlen_oracle(const Oracle& dense, const Varlen& v) {
  Oracle o;
  o.exact = [dense, v](const Problem& p, const Inputs& in) { return run_packed<double>(p, v, in, dense.exact); };
  o.naive_low_precision = [dense, v](const Problem& p, const Inputs& in) {
    return run_packed<float>(p, v, in, dense.naive_low_precision);
  };
  // The largest sequence's need: they run one after the other.
  o.host_bytes = [dense, v](const Problem& p) {
    double most = 0;
    for (int64_t b = 0; b < v.batch(); ++b)
      if (sequence_has_work(v, b) && dense.host_bytes) most = std::max(most, dense.host_bytes(sequence_problem(p, v, b)));
    return most;
  };
  return o;
}

}  // namespace fa
