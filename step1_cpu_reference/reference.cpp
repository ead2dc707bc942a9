// FlashAttention, step by step — step 1: the CPU reference (step1_cpu_reference/reference.cpp)
// See reference.h for the equations. Eigen does the matrix products; everything else is plain loops.
#include "reference.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "core/dropout.h"
#include "core/dtype.h"
#include "core/host_memory.h"
#include "core/parallel.h"
#include "core/score_mod.h"

namespace fa::step1 {

template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMapF = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

template <typename T>
Result<T> attention(const Problem& p, const Inputs& in, bool backward, DType emulate) {
  const int64_t B = p.B, Hq = p.Hq, Hkv = p.Hkv, Nq = p.Nq, Nk = p.Nk, d = p.d, G = p.group();
  const T scale = T(p.scale);
  const T inf = std::numeric_limits<T>::infinity();
  const DropoutParams drop = make_dropout(p.dropout, p.seed);
  const T keep_scale = T(1) / (T(1) - T(p.dropout));

  // Rounds a whole matrix to the emulated precision (no-op in fp32 mode).
  auto rnd = [&](Mat<T>& m) {
    if (emulate != DType::fp32) m = m.unaryExpr([&](T x) { return T(round_to(emulate, float(x))); });
  };

  Result<T> r;
  r.o = TensorT<T>({B, Hq, Nq, d});
  r.lse = TensorT<T>({B, Hq, Nq});
  if (backward) {
    r.dq = TensorT<T>({B, Hq, Nq, d});
    r.dk = TensorT<T>({B, Hkv, Nk, d});
    r.dv = TensorT<T>({B, Hkv, Nk, d});
  }

  // Score modifiers (core/score_mod.h). The bias broadcasts over a batch or head dimension of size 1.
  const ScoreMod mod = score_mod_of(p, in.alibi_slopes.empty() ? nullptr : in.alibi_slopes.ptr());
  const bool modifies = p.bias || p.alibi || p.softcap > 0.0f;
  if (p.bias && !(in.bias.shape.size() == 4 && (in.bias.shape[0] == B || in.bias.shape[0] == 1) &&
                  (in.bias.shape[1] == Hq || in.bias.shape[1] == 1) && in.bias.shape[2] == Nq && in.bias.shape[3] == Nk))
    throw std::invalid_argument("the problem has a bias but the inputs' bias has shape " + shape_str(in.bias.shape));
  if (p.alibi && !in.alibi_slopes.empty() && in.alibi_slopes.shape != std::vector<int64_t>{Hq})
    throw std::invalid_argument("the inputs' ALiBi slopes have shape " + shape_str(in.alibi_slopes.shape) +
                                ", not [" + std::to_string(Hq) + "]");
  const int64_t biasB = p.bias ? in.bias.shape[0] : 1, biasH = p.bias ? in.bias.shape[1] : 1;
  auto bias_at = [&](int64_t b, int64_t h) -> const float* {
    return in.bias.ptr() + ((biasB == 1 ? 0 : b) * biasH + (biasH == 1 ? 0 : h)) * Nq * Nk;
  };
  // dBias is dS (the gradient of the pre-softcap score) summed over the broadcast dimensions. Each thread
  // writes its own (b, h) slice of a [B, Hq, Nq, Nk] buffer, summed afterwards; without broadcasting the
  // slices are dBias itself.
  const bool dbias = backward && p.bias;
  const bool broadcast = dbias && (biasB != B || biasH != Hq);
  TensorT<T> dS_all;
  if (dbias) r.dbias = TensorT<T>({biasB, biasH, Nq, Nk});
  if (broadcast) dS_all = TensorT<T>({B, Hq, Nq, Nk});
  TensorT<T>& dS_out = broadcast ? dS_all : r.dbias;

  // One (b, kv head) per iteration, so the GQA sums into dK/dV stay inside one thread.
  parallel_for_2d(B, Hkv, [&](int64_t b, int64_t hk) {
    const int64_t kv_off = (b * Hkv + hk) * Nk * d;
    // A KV cache with ragged sequences: sequence b sees its first kv_len(b) keys, its diagonal shifted with them.
    const int64_t len_b = p.kv_len(b);
    ScoreMod mod_b = mod;
    mod_b.input_pos = p.kv_input_pos(b);
    const Mat<T> K = ConstMapF(in.k.ptr() + kv_off, Nk, d).cast<T>();  // [Nk, d]
    const Mat<T> V = ConstMapF(in.v.ptr() + kv_off, Nk, d).cast<T>();  // [Nk, d]
    Mat<T> dK_sum = Mat<T>::Zero(Nk, d), dV_sum = Mat<T>::Zero(Nk, d);

    for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
      const int64_t q_off = (b * Hq + h) * Nq * d;
      const Mat<T> Q = ConstMapF(in.q.ptr() + q_off, Nq, d).cast<T>();  // [Nq, d]

      // S = scale * Q K^T, then the modifier (bias, ALiBi, softcap), then the mask.   [Nq, Nk]
      Mat<T> S = scale * (Q * K.transpose());
      rnd(S);
      const float* bias = p.bias ? bias_at(b, h) : nullptr;
      for (int64_t i = 0; i < Nq; ++i)
        for (int64_t j = 0; j < Nk; ++j) {
          if (j >= len_b || !visible(mod_b, i, j)) S(i, j) = -inf;
          else if (modifies) S(i, j) = modify<T>(mod_b, S(i, j), bias ? T(bias[i * Nk + j]) : T(0), h, i, j);
        }
      if (modifies) rnd(S);

      // 3-pass safe softmax: row max, row sum of exp(S - max), normalise.  [Nq, Nk]
      Mat<T> P(Nq, Nk);
      for (int64_t i = 0; i < Nq; ++i) {
        const T m = S.row(i).maxCoeff();
        T* lse = &r.lse.data[(b * Hq + h) * Nq + i];
        if (m == -inf) {  // the row sees no key: O = 0, LSE = -inf
          P.row(i).setZero();
          *lse = -inf;
          continue;
        }
        T l = 0;
        for (int64_t j = 0; j < Nk; ++j) l += (P(i, j) = std::exp(S(i, j) - m));
        P.row(i) /= l;
        *lse = m + std::log(l);
      }
      rnd(P);

      // Dropout: Z is 0 or 1/(1-p) per element, from the shared Philox mask.   [Nq, Nk]
      Mat<T> Z = Mat<T>::Ones(Nq, Nk);
      if (drop.threshold != 0)
        for (int64_t i = 0; i < Nq; ++i)
          for (int64_t j = 0; j < Nk; ++j)
            Z(i, j) = dropout_keep(drop, uint32_t(b), uint32_t(h), uint32_t(i), uint32_t(j)) ? keep_scale : T(0);
      Mat<T> Pd = P.cwiseProduct(Z);
      rnd(Pd);

      Mat<T> O = Pd * V;  // [Nq, d]
      rnd(O);
      Eigen::Map<Mat<T>>(r.o.ptr() + q_off, Nq, d) = O;
      if (!backward) continue;

      const Mat<T> dO = ConstMapF(in.dout.ptr() + q_off, Nq, d).cast<T>();  // [Nq, d]
      const Eigen::Matrix<T, Eigen::Dynamic, 1> D = dO.cwiseProduct(O).rowwise().sum();  // [Nq]
      Mat<T> dV = Pd.transpose() * dO;  // [Nk, d]
      Mat<T> dPd = dO * V.transpose();  // [Nq, Nk]
      rnd(dPd);
      Mat<T> dP = dPd.cwiseProduct(Z);
      rnd(dP);
      Mat<T> dS = P.cwiseProduct(dP.colwise() - D);  // [Nq, Nk]
      rnd(dS);
      if (p.softcap > 0.0f) {  // back through the softcap: dS of the pre-softcap score
        for (int64_t i = 0; i < Nq; ++i)
          for (int64_t j = 0; j < Nk; ++j) dS(i, j) *= softcap_grad<T>(mod, S(i, j));
        rnd(dS);
      }
      if (dbias) Eigen::Map<Mat<T>>(dS_out.ptr() + (b * Hq + h) * Nq * Nk, Nq, Nk) = dS;
      Mat<T> dQ = scale * (dS * K);  // [Nq, d]
      rnd(dQ);
      Eigen::Map<Mat<T>>(r.dq.ptr() + q_off, Nq, d) = dQ;
      dK_sum += scale * (dS.transpose() * Q);
      dV_sum += dV;
    }
    if (backward) {
      rnd(dK_sum);
      rnd(dV_sum);
      Eigen::Map<Mat<T>>(r.dk.ptr() + kv_off, Nk, d) = dK_sum;
      Eigen::Map<Mat<T>>(r.dv.ptr() + kv_off, Nk, d) = dV_sum;
    }
  });
  if (broadcast) {  // the sum over the broadcast dimensions, in a fixed order
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h) {
        const T* src = dS_all.ptr() + (b * Hq + h) * Nq * Nk;
        T* dst = r.dbias.ptr() + ((biasB == 1 ? 0 : b) * biasH + (biasH == 1 ? 0 : h)) * Nq * Nk;
        for (int64_t k = 0; k < Nq * Nk; ++k) dst[k] += src[k];
      }
    if (emulate != DType::fp32)
      for (T& x : r.dbias.data) x = T(round_to(emulate, float(x)));
  }
  return r;
}

double memory_needed(const Problem& p, bool backward, size_t element_bytes) {
  const double Nq = double(p.Nq), Nk = double(p.Nk), d = double(p.d);
  // One iteration of the loop above: S, P, Z, Pd [Nq, Nk] (and dPd, dP, dS for the backward); K, V and the
  // dK, dV sums [Nk, d]; Q, O (and dO, dQ) [Nq, d]. As many iterations run at once as there are threads.
  const double per_iteration = (backward ? 7 : 4) * Nq * Nk + 4 * Nk * d + (backward ? 4 : 2) * Nq * d;
  const double working = double(parallel_workers(p.B * p.Hkv)) * per_iteration;
  Problem outputs_of = p;
  outputs_of.backward = backward;
  // With a bias, the backward keeps dS of every (b, h) for dBias, and dBias itself (at most that size).
  const double dbias = backward && p.bias ? 2 * double(p.B * p.Hq) * Nq * Nk : 0.0;
  return (working + output_elements(outputs_of) + dbias) * double(element_bytes);
}

template Result<float> attention<float>(const Problem&, const Inputs&, bool, DType);
template Result<double> attention<double>(const Problem&, const Inputs&, bool, DType);

namespace {

class CpuRunner final : public Runner {
 public:
  CpuRunner(const Problem& p, const Inputs& in) : p_(p), in_(in) {}
  void run() override { res_ = attention<float>(p_, in_, false); }
  // The reference recomputes the forward inside its backward: step 1 keeps nothing between calls.
  void run_backward() override { res_ = attention<float>(p_, in_, true); }
  Outputs outputs() override { return res_; }

 private:
  Problem p_;
  const Inputs& in_;
  Result<float> res_;
};

}  // namespace

Stage stage() {
  Stage s;
  s.name = "step1_cpu_reference";
  s.title = "CPU reference (Eigen, fp32)";
  s.has_backward = true;
  s.has_score_mods = true;
  s.has_varlen = true;  // a packed batch, sequence by sequence (core/varlen.h)
  // A KV cache's ragged lengths (the oracle of step 4's decoding), dense: pages are a GPU layout.
  s.has_kv_cache = true;
  s.supports.kv_pages = false;
  s.unsupported = [](const Problem& p, const std::string&) {
    if (p.page_size > 0) return std::string("--page-size: pages are a GPU layout; step 1 reads the cache dense (drop it)");
    if (p.has_kv_cache() && (p.backward || p.dropout > 0 || p.has_score_mods()))
      return std::string("a KV cache is decoding's: forward only, without dropout or score modifiers");
    return std::string();
  };
  s.make = [](const Problem& p, const Inputs& in, const std::string&) -> std::unique_ptr<Runner> {
    return std::make_unique<CpuRunner>(p, in);
  };
  // The run's matrices and outputs in float, and the outputs of the run before, which a Runner holds until
  // the new ones are complete.
  s.host_bytes = [](const Problem& p, const std::string&) {
    return memory_needed(p, p.backward, sizeof(float)) + output_elements(p) * sizeof(float);
  };
  return s;
}

Oracle oracle() {
  Oracle o;
  o.exact = [](const Problem& p, const Inputs& in) { return attention<double>(p, in, p.backward); };
  o.naive_low_precision = [](const Problem& p, const Inputs& in) { return attention<float>(p, in, p.backward, p.dtype); };
  // check_against keeps the fp64 outputs while the float run works: the larger of the two moments.
  o.host_bytes = [](const Problem& p) {
    const double fp64_outputs = output_elements(p) * sizeof(double);
    return std::max(memory_needed(p, p.backward, sizeof(double)),
                    fp64_outputs + memory_needed(p, p.backward, sizeof(float)));
  };
  return o;
}

}  // namespace fa::step1
