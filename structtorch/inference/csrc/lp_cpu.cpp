// Fused CPU sweeps of the entropy-smoothed LP (structtorch.inference.smoothed): star updates (eq. 10) of a
// batch of problems, each stopped after its own first sweep whose dual decrease is below tol, then the dual
// value (eq. 8) and the pseudo-marginals (eq. 9) at the final messages.
//
// Inputs (batch-major; finite potentials: the caller keeps -inf potentials on the eager sweeps): unary u
// [B, N, K], pairwise p [B, E, K, K] (stored edge orientation), inv_eps [B] (1 / each problem's
// temperature), messages lam [B, 2E, K] in score units (half-edge h = 2e + s carries edge e's message into
// node edges[e, s]). The stars: ``order`` [V], the nodes of degree >= 1 in sweep order (colour by colour,
// as the eager sweeps: the same messages up to rounding), and ``ptr`` [N + 1] / ``half`` [2E], the
// half-edges into each node (CSR).
//
// As in tree_cpu.cpp, chunks of the batch are transposed into batch-minor buffers (scaled by 1 / eps) and
// every inner loop is a SIMD loop over the chunk's problems; a SIMD vector whose problems have all stopped
// is skipped in later sweeps.
#include "common.h"

namespace stcpu {
namespace {

struct Stars {
  const int64_t *order, *ptr, *half;
  int64_t V, N, E, K, max_degree;
};

// log-sum-exp over k < K of term(k) (finite terms), one SIMD vector.
template <typename T, typename Term>
Vectorized<T> lse(int64_t K, const Term& term) {
  using Vec = Vectorized<T>;
  if (K == 2) {
    const Vec a = term(0), b = term(1);
    return at::vec::maximum(a, b) + (Vec(T(1)) + (Vec(T(0)) - (a - b).abs()).exp()).log();  // log, not log1p: faster
  }
  Vec m = term(0);
  for (int64_t k = 1; k < K; ++k) m = at::vec::maximum(m, term(k));
  Vec acc(T(0));
  for (int64_t k = 0; k < K; ++k) acc += (term(k) - m).exp();
  return m + acc.log();
}

template <typename T>
struct LPChunk {
  int64_t b0 = 0, W = 0, Wp = 0;
  std::vector<T> U, P, L, ie;  // [N K, Wp], [E K K, Wp], [2E K, Wp] scaled by 1 / eps; ie [Wp] = 1 / eps
  std::vector<T> M, Tb, Bo, dec, open;  // star buffers [dmax K, Wp], [K, Wp] x 2, [Wp] x 2
  std::vector<int64_t> live;  // offsets of the SIMD vectors with an open problem

  void load(const Stars& s, const T* u, const T* p, const T* inv_eps, const T* lam, int64_t b0_, int64_t W_) {
    const int64_t V = Vectorized<T>::size(), K = s.K;
    b0 = b0_;
    W = W_;
    Wp = (W + V - 1) / V * V;
    to_minor(U, u, s.N * K, b0, W, Wp);
    to_minor(P, p, s.E * K * K, b0, W, Wp);
    to_minor(L, lam, 2 * s.E * K, b0, W, Wp);
    ie.assign(Wp, T(1));
    std::copy(inv_eps + b0, inv_eps + b0 + W, ie.begin());
    for (auto* buf : {&U, &P, &L})
      for (int64_t r = 0; r < int64_t(buf->size()) / Wp; ++r)
        for (int64_t w = 0; w < Wp; ++w) (*buf)[r * Wp + w] *= ie[w];
    M.resize(std::max<int64_t>(1, s.max_degree) * K * Wp);
    Tb.resize(K * Wp);
    Bo.resize(K * Wp);
    dec.resize(Wp);
    open.assign(Wp, T(0));
    std::fill(open.begin(), open.begin() + W, T(1));
    live.clear();
    for (int64_t w = 0; w < Wp; w += V) live.push_back(w);
  }
};

// One sweep of star updates over s.order on the chunk's open problems; with ``track``, dec [Wp] gets each
// problem's dual decrease (scaled units): a star's terms lse(b_i) + sum_e lse(m_e - lambda_e) before and
// (d + 1) lse(T / (d + 1)) after.
template <typename T>
void sweep(const Stars& s, LPChunk<T>& c, bool track) {
  using Vec = Vectorized<T>;
  const int64_t K = s.K, Wp = c.Wp;
  const Vec zero(T(0));
  if (track) std::fill(c.dec.begin(), c.dec.end(), T(0));
  for (int64_t vi = 0; vi < s.V; ++vi) {
    const int64_t i = s.order[vi], h0 = s.ptr[i], d = s.ptr[i + 1] - h0;
    const T inv = T(1) / T(d + 1);
    const T* Ui = c.U.data() + i * K * Wp;
    for (int64_t w : c.live)
      for (int64_t x = 0; x < K; ++x) load(Ui + x * Wp + w).store(c.Tb.data() + x * Wp + w);
    for (int64_t k = 0; k < d; ++k) {  // m_e(x) = lse_{x_j} (theta_e(x, x_j) - lambda_{e->j}(x_j)); T += m_e
      const int64_t h = s.half[h0 + k], side = h & 1;
      const T* Pe = c.P.data() + (h >> 1) * K * K * Wp;
      const T* Lo = c.L.data() + (h ^ 1) * K * Wp;  // messages into the other endpoint
      T* Mk = c.M.data() + k * K * Wp;
      for (int64_t x = 0; x < K; ++x) {
        const int64_t base = side == 0 ? x * K : x, step = side == 0 ? 1 : K;  // P index of (x_i = x, x_j)
        for (int64_t w : c.live) {
          const Vec m = lse<T>(K, [&](int64_t xj) { return load(Pe + (base + xj * step) * Wp + w) - load(Lo + xj * Wp + w); });
          m.store(Mk + x * Wp + w);
          (load(c.Tb.data() + x * Wp + w) + m).store(c.Tb.data() + x * Wp + w);
        }
      }
    }
    for (int64_t w : c.live) {
      const Vec on = load(c.open.data() + w) != zero;
      Vec before = zero;
      if (track)
        for (int64_t x = 0; x < K; ++x) load(Ui + x * Wp + w).store(c.Bo.data() + x * Wp + w);
      for (int64_t k = 0; k < d; ++k) {  // eq. (10): lambda_{e->i} = m_e - T / (d + 1)
        T* Lh = c.L.data() + s.half[h0 + k] * K * Wp;
        const T* Mk = c.M.data() + k * K * Wp;
        if (track) {
          before += lse<T>(K, [&](int64_t x) { return load(Mk + x * Wp + w) - load(Lh + x * Wp + w); });
          for (int64_t x = 0; x < K; ++x) (load(c.Bo.data() + x * Wp + w) + load(Lh + x * Wp + w)).store(c.Bo.data() + x * Wp + w);
        }
        for (int64_t x = 0; x < K; ++x) {
          const Vec nu = load(Mk + x * Wp + w) - load(c.Tb.data() + x * Wp + w) * Vec(inv);
          Vec::blendv(load(Lh + x * Wp + w), nu, on).store(Lh + x * Wp + w);
        }
      }
      if (track) {
        const Vec b = lse<T>(K, [&](int64_t x) { return load(c.Bo.data() + x * Wp + w); });
        const Vec a = lse<T>(K, [&](int64_t x) { return load(c.Tb.data() + x * Wp + w) * Vec(inv); });
        (load(c.dec.data() + w) + Vec::blendv(zero, before + b - a * Vec(T(d + 1)), on)).store(c.dec.data() + w);
      }
    }
  }
}

// The dual value [Wp] (scaled units) at the chunk's messages; U and P become the pseudo-marginals
// softmax(b_i) [N K, Wp] and softmax(b_e) [E K K, Wp].
template <typename T>
void dual_and_marginals(const Stars& s, LPChunk<T>& c, T* value) {
  using Vec = Vectorized<T>;
  const int64_t K = s.K, KK = K * K, Wp = c.Wp, Vs = Vec::size();
  std::fill(value, value + Wp, T(0));
  auto softmax = [&](T* rows, int64_t R) {  // rows [R, Wp] -> softmax over R, its lse added to value
    for (int64_t w = 0; w < Wp; w += Vs) {
      const Vec z = lse<T>(R, [&](int64_t r) { return load(rows + r * Wp + w); });
      for (int64_t r = 0; r < R; ++r) (load(rows + r * Wp + w) - z).exp().store(rows + r * Wp + w);
      (load(value + w) + z).store(value + w);
    }
  };
  for (int64_t i = 0; i < s.N; ++i) {
    T* bi = c.U.data() + i * K * Wp;  // b_i = theta_i + sum of the messages into i
    for (int64_t h = s.ptr[i]; h < s.ptr[i + 1]; ++h) {
      const T* Lh = c.L.data() + s.half[h] * K * Wp;
      for (int64_t x = 0; x < K * Wp; x += Vs) (load(bi + x) + load(Lh + x)).store(bi + x);
    }
    softmax(bi, K);
  }
  for (int64_t e = 0; e < s.E; ++e) {
    T* be = c.P.data() + e * KK * Wp;  // b_e(x0, x1) = theta_e - lambda_{e->0}(x0) - lambda_{e->1}(x1)
    const T* L0 = c.L.data() + 2 * e * K * Wp;
    const T* L1 = L0 + K * Wp;
    for (int64_t x0 = 0; x0 < K; ++x0)
      for (int64_t x1 = 0; x1 < K; ++x1)
        for (int64_t w = 0; w < Wp; w += Vs) {
          T* r = be + (x0 * K + x1) * Wp + w;
          (load(r) - load(L0 + x0 * Wp + w) - load(L1 + x1 * Wp + w)).store(r);
        }
    softmax(be, KK);
  }
}

// (messages [B, 2E, K] in score units, value [B], mu [B, N, K], pairwise mu [B, E, K, K], sweeps [B]) after
// up to ``iters`` sweeps; tol < 0: no stopping rule (every problem runs ``iters`` sweeps).
std::vector<torch::Tensor> lp_solve(const torch::Tensor& u, const torch::Tensor& p, const torch::Tensor& inv_eps,
                                    const torch::Tensor& lam, const torch::Tensor& order, const torch::Tensor& ptr,
                                    const torch::Tensor& half, int64_t iters, double tol) {
  TORCH_CHECK(u.dim() == 3 && u.is_contiguous() && p.dim() == 4 && p.is_contiguous() && lam.dim() == 3 &&
                  lam.is_contiguous() && inv_eps.dim() == 1 && inv_eps.is_contiguous(),
              "lp_solve: contiguous u [B, N, K], p [B, E, K, K], inv_eps [B], lam [B, 2E, K] expected");
  const int64_t B = u.size(0), N = u.size(1), K = u.size(2), E = p.size(1);
  TORCH_CHECK(p.size(0) == B && p.size(2) == K && p.size(3) == K && lam.size(0) == B && lam.size(1) == 2 * E &&
                  lam.size(2) == K && inv_eps.size(0) == B && ptr.numel() == N + 1 && half.numel() == 2 * E,
              "lp_solve: inconsistent shapes");
  const int64_t* pp = ptr.data_ptr<int64_t>();
  int64_t dmax = 0;
  for (int64_t i = 0; i < N; ++i) dmax = std::max(dmax, pp[i + 1] - pp[i]);
  const Stars s{order.data_ptr<int64_t>(), pp, half.data_ptr<int64_t>(), order.numel(), N, E, K, dmax};
  auto out_lam = torch::empty_like(lam), mu = torch::empty_like(u), pair = torch::empty_like(p);
  auto value = torch::empty({B}, u.options());
  auto sweeps = torch::zeros({B}, u.options().dtype(torch::kLong));
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "lp_solve", [&] {
    using T = scalar_t;
    const int64_t Vs = Vectorized<T>::size();
    const int64_t W = chunk_size<T>(N * K + E * K * K + 2 * E * K + (dmax + 2) * K + 4);
    at::parallel_for(0, B, W, [&](int64_t lo, int64_t hi) {
      LPChunk<T> c;
      std::vector<T> val;
      for (int64_t b = lo; b < hi; b += W) {
        c.load(s, u.data_ptr<T>(), p.data_ptr<T>(), inv_eps.data_ptr<T>(), lam.data_ptr<T>(), b, std::min(W, hi - b));
        int64_t* sw = sweeps.data_ptr<int64_t>() + c.b0;
        for (int64_t it = 0; it < iters && !c.live.empty(); ++it) {
          sweep(s, c, tol >= 0);
          for (int64_t w = 0; w < c.W; ++w)
            if (c.open[w] != T(0)) {
              ++sw[w];
              if (tol >= 0 && !(c.dec[w] >= T(tol))) c.open[w] = T(0);
            }
          c.live.clear();
          for (int64_t w = 0; w < c.Wp; w += Vs)
            if (std::any_of(c.open.begin() + w, c.open.begin() + w + Vs, [](T o) { return o != T(0); }))
              c.live.push_back(w);
        }
        val.resize(c.Wp);
        dual_and_marginals(s, c, val.data());
        for (int64_t r = 0; r < 2 * E * K; ++r)  // back to score units
          for (int64_t w = 0; w < c.Wp; ++w) c.L[r * c.Wp + w] /= c.ie[w];
        T* vo = value.data_ptr<T>() + c.b0;
        for (int64_t w = 0; w < c.W; ++w) vo[w] = val[w] / c.ie[w];
        transpose(c.U.data(), c.Wp, mu.data_ptr<T>() + c.b0 * N * K, N * K, N * K, c.W);
        transpose(c.P.data(), c.Wp, pair.data_ptr<T>() + c.b0 * E * K * K, E * K * K, E * K * K, c.W);
        transpose(c.L.data(), c.Wp, out_lam.data_ptr<T>() + c.b0 * 2 * E * K, 2 * E * K, 2 * E * K, c.W);
      }
    });
  });
  return {out_lam, value, mu, pair, sweeps};
}

}  // namespace

void register_lp(pybind11::module_& m) {
  m.def("lp_solve", &lp_solve, "(messages [B, 2E, K], value [B], mu [B, N, K], pairwise [B, E, K, K], sweeps [B])");
}

}  // namespace stcpu
