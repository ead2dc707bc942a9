// FlashAttention, step by step — step 2: the whole problem, the registry entry and the footprint table
// (step2_online_softmax/stage.cpp)
//
// attention() runs one variant on every (batch, query head) pair, in parallel over heads, backward() the
// backward on every (batch, KV head) pair; the Runner wraps them for the harness. footprint_table() counts the buffers each variant of passes.cpp allocates.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <stdexcept>

#include "core/host_memory.h"
#include "core/parallel.h"
#include "tiles.h"

namespace fa::step2 {

Head head_of(const Problem& p, const Inputs& in, Outputs& out, int64_t b, int64_t h) {
  const int64_t kv = (b * p.Hkv + h / p.group()) * p.Nk * p.d, qh = b * p.Hq + h;
  Head hd;
  hd.q = in.q.ptr() + qh * p.Nq * p.d;
  hd.k = in.k.ptr() + kv;
  hd.v = in.v.ptr() + kv;
  hd.o = out.o.ptr() + qh * p.Nq * p.d;
  hd.lse = out.lse.ptr() + qh * p.Nq;
  hd.Nq = p.Nq;
  hd.Nk = p.Nk;
  hd.d = p.d;
  hd.scale = p.scale;
  hd.drop = make_dropout(p.dropout, p.seed);
  hd.mod = score_mod_of(p, in.alibi_slopes.empty() ? nullptr : in.alibi_slopes.ptr());
  hd.modifies = p.bias || p.alibi || p.softcap > 0.0f;
  if (p.bias) {  // [B or 1, Hq or 1, Nq, Nk]: a dimension of size 1 broadcasts
    const int64_t bB = in.bias.shape[0], bH = in.bias.shape[1];
    hd.bias = in.bias.ptr() + ((bB == 1 ? 0 : b) * bH + (bH == 1 ? 0 : h)) * p.Nq * p.Nk;
  }
  hd.b = uint32_t(b);
  hd.h = uint32_t(h);
  if (!in.dout.data.empty() && !out.dq.data.empty()) {
    hd.dout = in.dout.ptr() + qh * p.Nq * p.d;
    hd.dq = out.dq.ptr() + qh * p.Nq * p.d;
    hd.dk = out.dk.ptr() + kv;
    hd.dv = out.dv.ptr() + kv;
  }
  return hd;
}

Outputs attention(const Problem& p, const Inputs& in, const std::string& variant, const Config& cfg) {
  const Blocks bl = blocks_from_budget(cfg.budget, p.d);
  std::function<void(const Head&)> run;
  if (variant == "3pass") run = [](const Head& hd) { attention_3pass(hd); };
  else if (variant == "2pass") run = [&](const Head& hd) { attention_2pass(hd, cfg.tile); };
  else if (variant == "online") run = [&](const Head& hd) { attention_online(hd, cfg.tile); };
  else if (variant == "fa1") run = [&](const Head& hd) { attention_fa1(hd, bl); };
  else if (variant == "fa2") run = [&](const Head& hd) { attention_fa2(hd, bl); };
  else throw std::invalid_argument("step2 has no variant '" + variant + "'");

  Outputs out;
  out.o = Tensor({p.B, p.Hq, p.Nq, p.d});
  out.lse = Tensor({p.B, p.Hq, p.Nq});
  parallel_for_2d(p.B, p.Hq, [&](int64_t b, int64_t h) { run(head_of(p, in, out, b, h)); });
  return out;
}

bool backward_order(const std::string& variant, Order& order) {
  if (variant == "fa2") order = Order::kv_outer;  // FlashAttention-2's backward
  else if (variant == "fa1") order = Order::q_outer;
  else return false;
  return true;
}

void backward(const Problem& p, const Inputs& in, Order order, Blocks bl, Outputs& out) {
  out.dq = Tensor({p.B, p.Hq, p.Nq, p.d});
  out.dk = Tensor({p.B, p.Hkv, p.Nk, p.d});
  out.dv = Tensor({p.B, p.Hkv, p.Nk, p.d});
  // dBias: dS of every (b, query head), each written by the one task that owns the head; a bias that
  // broadcasts over batches or heads has it summed over them afterwards (as step 1 does).
  const int64_t bB = p.bias ? in.bias.shape[0] : 1, bH = p.bias ? in.bias.shape[1] : 1;
  const bool broadcast = p.bias && (bB != p.B || bH != p.Hq);
  Tensor dS_all;  // [B, Hq, Nq, Nk]
  if (p.bias) (broadcast ? dS_all : out.dbias) = Tensor({p.B, p.Hq, p.Nq, p.Nk});
  Tensor& dS_heads = broadcast ? dS_all : out.dbias;
  // One (b, KV head) per task, so that the GQA sums into dK, dV stay inside one thread.
  parallel_for_2d(p.B, p.Hkv, [&](int64_t b, int64_t hk) {
    std::vector<Head> group;  // the g query heads of KV head hk
    for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
      group.push_back(head_of(p, in, out, b, h));
      if (p.bias) group.back().dbias = dS_heads.ptr() + (b * p.Hq + h) * p.Nq * p.Nk;
    }
    if (order == Order::kv_outer) backward_kv_outer(group, bl);
    else backward_q_outer(group, bl);
  });
  if (broadcast) {
    out.dbias = Tensor({bB, bH, p.Nq, p.Nk});
    const int64_t n = p.Nq * p.Nk;
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.Hq; ++h) {
        const float* src = dS_all.ptr() + (b * p.Hq + h) * n;
        float* dst = out.dbias.ptr() + ((bB == 1 ? 0 : b) * bH + (bH == 1 ? 0 : h)) * n;
        for (int64_t k = 0; k < n; ++k) dst[k] += src[k];
      }
  }
}

double memory_needed(const Problem& p, const std::string& variant, const Config& cfg) {
  const double Nq = double(p.Nq), Nk = double(p.Nk), d = double(p.d);
  const double tile = double(std::min(cfg.tile, p.Nk)), T = double(ceil_div(p.Nk, cfg.tile));
  const Blocks bl = blocks_from_budget(cfg.budget, p.d);
  const double Br = double(bl.Br), Bc = double(bl.Bc);
  // The floats one head holds at once, as footprint_table() counts them, plus the [Nq, d] product the two
  // untiled variants form before storing O.
  double per_head = 0;
  if (variant == "3pass") per_head = Nq * Nk + Nq * d;
  else if (variant == "2pass") per_head = Nq * Nk + 3 * Nq * T + Nq * tile + Nq + Nq * d;
  else if (variant == "online") per_head = tile + d;
  else if (variant == "fa1") per_head = 3 * Br * Bc + Br * d + 2 * Nq + 2 * Br;  // S_ij, P~_ij, dropped P~_ij
  else per_head = Br * d + 2 * Br * Bc + 3 * Br;  // fa2
  // The backward of one KV head: S_ij, P_ij, Pd_ij, dP_ij, dS_ij [Br, Bc], dQ_i [Br, d], dK_j and dV_j
  // [Bc, d], D [Nq] of each of its g query heads.
  const double per_kv_head = 5 * Br * Bc + Br * d + 2 * Bc * d + double(p.group()) * Nq;
  const double working = std::max(double(parallel_workers(p.B * p.Hq)) * per_head,
                                   p.backward ? double(parallel_workers(p.B * p.Hkv)) * per_kv_head : 0.0);
  // With a bias, the backward keeps dS of every (b, h) for dBias, and dBias itself (at most that size).
  const double dbias = p.backward && p.bias ? 2 * double(p.B * p.Hq) * Nq * Nk : 0.0;
  // A Runner holds the outputs of its previous run until the new ones are complete: outputs twice.
  return (working + 2 * output_elements(p) + dbias) * sizeof(float);
}

namespace {

class Step2Runner final : public Runner {
 public:
  Step2Runner(const Problem& p, const Inputs& in, std::string variant, Config cfg)
      : p_(p), in_(in), variant_(std::move(variant)), cfg_(cfg) {}
  void run() override { out_ = attention(p_, in_, variant_, cfg_); }
  // From the O and LSE of run(), in the loop order of the variant (fa1: q-outer, fa2: kv-outer).
  void run_backward() override {
    Order order = Order::kv_outer;
    backward_order(variant_, order);
    backward(p_, in_, order, blocks_from_budget(cfg_.budget, p_.d), out_);
  }
  Outputs outputs() override { return out_; }

 private:
  Problem p_;
  const Inputs& in_;
  std::string variant_;
  Config cfg_;
  Outputs out_;
};


// A ratio with two decimals, or two significant digits below 0.1, so that a small one still shows:
// "1.05", "0.004" rather than "0.00".
std::string ratio_str(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, r >= 0.1 ? "%.2f" : "%.2g", r);
  return buf;
}

}  // namespace

Stage stage(const Config& cfg) {
  Stage s;
  s.name = "step2_online_softmax";
  s.title = "online softmax on the CPU: 3-pass, 2-pass, online, FlashAttention-1 and -2 loop orders";
  s.has_backward = true;
  s.has_score_mods = true;  // every variant: the scores of all five come from tiles.h's scores()
  s.has_varlen = true;      // every variant: a packed batch, sequence by sequence (core/varlen.h)
  s.variants = {"3pass", "2pass", "online", "fa1", "fa2"};
  s.supports.backward = {"fa1", "fa2"};  // the backward's two loop orders (below); any dtype, head dim, modifier
  s.unsupported = [](const Problem& p, const std::string& v) {
    Order order;
    if (!p.backward || backward_order(v, order)) return std::string();
    return "the backward is tiled like fa1 (q-outer) or fa2 (kv-outer): --backward needs --variant fa1 or fa2, "
           "not " + v;
  };
  s.make = [cfg](const Problem& p, const Inputs& in, const std::string& v) -> std::unique_ptr<Runner> {
    return std::make_unique<Step2Runner>(p, in, v, cfg);
  };
  s.host_bytes = [cfg](const Problem& p, const std::string& v) { return memory_needed(p, v, cfg); };
  return s;
}

// One line per buffer: what it holds, its shape, floats per query row. "All rows" multiplies by Nq: the
// footprint when every row of the head is in flight at once, as on a GPU.
std::string footprint_table(int64_t Nq, int64_t Nk, int64_t d, int64_t tile, int64_t budget) {
  const int64_t T = ceil_div(Nk, tile), t = std::min(tile, Nk);
  struct Buf {
    const char* variant;
    const char* what;
    std::string shape;
    int64_t per_row;
  };
  const std::string sT = "[Nq, T=" + std::to_string(T) + "]";
  const std::vector<Buf> bufs = {
      {"3pass", "S, then P in place", "[Nq, Nk]", Nk},
      {"3pass", "m, l", "[Nq] x 2", 2},
      {"2pass", "E = exp(S - LM), then A", "[Nq, Nk]", Nk},
      {"2pass", "LM, LS, PRM", sT + " x 3", 3 * T},
      {"2pass", "GM, L", "[Nq] x 2", 2},
      {"online", "one tile of s, then p", "[Nq, tile]", t},
      {"online", "m, l", "[Nq] x 2", 2},
  };
  std::string s;
  out(s, "intermediate memory of one head: Nq = %lld query rows, Nk = %lld keys, d = %lld, tile = %lld keys\n",
      (long long)Nq, (long long)Nk, (long long)d, (long long)tile);
  out(s, "(the output O [Nq, d], which online uses as its accumulator acc, and LSE [Nq] are not counted)\n\n");
  out(s, "%-7s %-25s %-16s %12s %14s %12s\n", "variant", "buffer", "shape", "floats/row", "floats, all", "bytes, all");
  auto total = [&](const char* v) {
    int64_t n = 0;
    for (const Buf& b : bufs)
      if (std::string(b.variant) == v) n += b.per_row;
    return n;
  };
  const int64_t base = total("3pass");
  for (size_t k = 0; k < bufs.size(); ++k) {
    const Buf& b = bufs[k];
    out(s, "%-7s %-25s %-16s %12lld %14lld %12lld\n", b.variant, b.what, b.shape.c_str(), (long long)b.per_row,
        (long long)(b.per_row * Nq), (long long)(4 * b.per_row * Nq));
    if (k + 1 == bufs.size() || std::string(bufs[k + 1].variant) != b.variant) {
      const int64_t n = total(b.variant);
      out(s, "%-7s %-25s %-16s %12lld %14lld %12lld   %sx of 3pass\n", b.variant, "total", "", (long long)n,
          (long long)(n * Nq), (long long)(4 * n * Nq), ratio_str(double(n) / double(base)).c_str());
    }
  }
  const Blocks bl = blocks_from_budget(budget, d);
  const int64_t Br = bl.Br, Bc = bl.Bc;
  out(s, "\nfa1/fa2 on chip, budget M = %lld floats: Bc = ceil(M / 4d) = %lld, Br = min(Bc, d) = %lld\n",
      (long long)budget, (long long)Bc, (long long)Br);
  const int64_t four = 2 * Br * d + 2 * Bc * d, extra = Br * Bc + 2 * Br;
  out(s, "  Q_i, O_i [Br, d] x 2 + K_j, V_j [Bc, d] x 2 = %lld floats (what the rule sizes to M)\n", (long long)four);
  out(s, "  + S_ij/P_ij [Br, Bc] + m_i, l_i [Br] x 2 = %lld more (Br <= d keeps S_ij within M / 4)\n",
      (long long)extra);
  out(s, "  between visits fa1 keeps O, m, l in HBM ([Nq, d] + [Nq] x 2); fa2 keeps them on chip\n");
  return s;
}

}  // namespace fa::step2
