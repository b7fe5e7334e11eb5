// Fused CPU tree passes (structtorch.inference.fused): MAP, log Z, marginals and max-marginals of a forest
// as one loop nest each, instead of a chain of small torch ops per contraction step.
//
// Inputs in the user's (batch-major) slot layout: unary u [B, N, K], pairwise p [B, NE, K, K] in stored
// edge orientation. ``order`` [C]: the non-root slots, every node after all of its children (leaves
// first); ``parent`` [N], ``parent_edge`` [N] (the edge slot joining v to its parent, -1 for roots) and
// ``flip`` [N] (that edge is stored as (x_v, x_parent)); ``roots`` [R] with their graph ``root_group`` [R].
//
// The batch is split over torch's threads (at::parallel_for) and, within a thread, into chunks of W
// entries transposed (8 x 8 blocks) into batch-minor buffers U [N, K, Wp] and P [NE, K, K, Wp] (Wp = W
// rounded up to the SIMD width): every inner loop is a SIMD loop over the chunk's entries
// (at::vec::Vectorized, with SLEEF's exp and log), the buffers stay in cache, and the outputs are
// transposed straight into the caller's layout. The potentials are read once.
#include "common.h"

namespace stcpu {
namespace {

constexpr double kFold = 4294967296.0;  // 2^32: a sum pass's scale factor past this is folded into U

// The batch-minor buffers of one chunk: entries [b0, b0 + W), padded with zeros to Wp.
template <typename T>
struct Chunk {
  int64_t b0 = 0, W = 0, Wp = 0;
  std::vector<T> U, P;  // [N, K, Wp], [NE, K, K, Wp] (stored edge orientation)
  std::vector<T> S;     // [N, K, Wp] (sum passes): scale factors, the log-domain value is U + log S

  void load(const Forest& f, const T* u, const T* p, int64_t b0_, int64_t W_, bool scales) {
    const int64_t V = Vectorized<T>::size(), NK = f.N * f.K, EKK = f.NE * f.K * f.K;
    b0 = b0_;
    W = W_;
    Wp = (W + V - 1) / V * V;
    to_minor(U, u, NK, b0, W, Wp);
    to_minor(P, p, EKK, b0, W, Wp);
    if (scales) S.assign(NK * Wp, T(1));
  }

  // The slot-oriented row M[v, xp, xv] of the chunk's P (v not a root).
  T* M(const Forest& f, int64_t v, int64_t xp, int64_t xv) {
    const int64_t K = f.K;
    return P.data() + (f.parent_edge[v] * K * K + (f.flip[v] ? xv * K + xp : xp * K + xv)) * Wp;
  }

};

// Inside pass: raises every non-root node into its parent, U[p, xp] += msg[v, xp] = max / logsumexp over
// xv of (U[v, xv] + M[v, xp, xv]), in place on the chunk's U. arg [N, K, Wp] (MAX only, when not null)
// gets the first maximiser as a T. COND: M[v, xp, xv] is replaced by the conditional of xv given xp,
// U[v, xv] + M[v, xp, xv] - msg[v, xp] (MAX, -inf when msg is) or its exp (sum, 0 when msg is -inf).
//
// The sum pass needs no log per message: with the chunk's scales S, msg = best + log(acc) with best the max
// of the shifted terms U + M (without log S) and acc = sum of exp(U + M - best) * S, so U[p] += best and
// S[p] *= acc. S stays in {0} and [1, K * kFold^2] (acc >= 1 from the term at best): a scale past kFold is
// folded back into U (one log).
template <typename T, bool MAX, bool COND>
void inside(const Forest& f, Chunk<T>& c, T* arg) {
  using Vec = Vectorized<T>;
  const int64_t K = f.K, Wp = c.Wp;
  const Vec zero(T(0));
  std::vector<T*> row(K);  // M[v, xp, xv] for xv < K
  for (int64_t i = 0; i < f.C; ++i) {
    const int64_t v = f.order[i], p = f.parent[v];
    const T* Uv = c.U.data() + v * K * Wp;
    T* Up = c.U.data() + p * K * Wp;
    const T* Sv = MAX ? nullptr : c.S.data() + v * K * Wp;
    T* Sp = MAX ? nullptr : c.S.data() + p * K * Wp;
    for (int64_t xp = 0; xp < K; ++xp) {
      for (int64_t xv = 0; xv < K; ++xv) row[xv] = c.M(f, v, xp, xv);
      for (int64_t w = 0; w < Wp; w += Vec::size()) {
        Vec best = load(Uv + w) + load(row[0] + w), idx(T(0));
        for (int64_t xv = 1; xv < K; ++xv) {
          const Vec s = load(Uv + xv * Wp + w) + load(row[xv] + w);
          if (MAX) idx = Vec::blendv(idx, Vec(T(xv)), s > best);  // strict: the first maximiser
          best = at::vec::maximum(best, s);
        }
        const Vec dead = best == ninf<T>();  // every term impossible
        Vec acc(T(0));
        if (!MAX || COND) {
          for (int64_t xv = 0; xv < K; ++xv) {
            T* m = row[xv] + w;
            const Vec s = load(Uv + xv * Wp + w) + load(m);
            if (MAX) {
              Vec::blendv(s - best, ninf<T>(), dead).store(m);
            } else {
              const Vec e = Vec::blendv((s - best).exp(), zero, dead) * load(Sv + xv * Wp + w);
              acc += e;
              if (COND) e.store(m);
            }
          }
          if (!MAX && COND) {
            const Vec inv = Vec::blendv(Vec(T(1)) / acc, zero, dead);
            for (int64_t xv = 0; xv < K; ++xv) (load(row[xv] + w) * inv).store(row[xv] + w);
          }
        }
        T* up = Up + xp * Wp + w;
        if (MAX) {
          (load(up) + best).store(up);
        } else {
          T* sp = Sp + xp * Wp + w;
          Vec scale = load(sp) * acc, sum = load(up) + best;
          const Vec big = scale > Vec(T(kFold));
          if (big.zero_mask() != kAllZero<T>) {  // some lane's scale past kFold: fold it into U
            sum = Vec::blendv(sum, sum + scale.log(), big);
            scale = Vec::blendv(scale, Vec(T(1)), big);
          }
          sum.store(up);
          scale.store(sp);
        }
        if (MAX && arg != nullptr) idx.store(arg + (v * K + xp) * Wp + w);
      }
    }
  }
}

// Per root i: its value rv [R, Wp] = max / logsumexp over its states of U[r] (and its first maximiser
// into y0 [R, Wp] when not null); vals [G, Wp] sums them per graph.
template <typename T, bool MAX>
void root_values(const Forest& f, const Chunk<T>& c, T* rv, T* vals, T* y0) {
  using Vec = Vectorized<T>;
  const int64_t K = f.K, Wp = c.Wp;
  std::fill(vals, vals + f.G * Wp, T(0));
  for (int64_t i = 0; i < f.R; ++i) {
    const T* u = c.U.data() + f.roots[i] * K * Wp;
    for (int64_t w = 0; w < Wp; w += Vec::size()) {
      Vec m = load(u + w), idx(T(0));
      for (int64_t k = 1; k < K; ++k) {
        const Vec s = load(u + k * Wp + w);
        idx = Vec::blendv(idx, Vec(T(k)), s > m);
        m = at::vec::maximum(m, s);
      }
      if (!MAX) {
        const Vec dead = m == ninf<T>();
        Vec acc(T(0));
        const T* sr = c.S.data() + f.roots[i] * K * Wp + w;
        for (int64_t k = 0; k < K; ++k)
          acc += Vec::blendv((load(u + k * Wp + w) - m).exp(), Vec(T(0)), dead) * load(sr + k * Wp);
        m += acc.log();
      }
      m.store(rv + i * Wp + w);
      T* val = vals + f.root_group[i] * Wp + w;
      (load(val) + m).store(val);
      if (y0 != nullptr) idx.store(y0 + i * Wp + w);
    }
  }
}

// Outside pass, sum or max semiring, from the roots' (max-)marginals already in mu [N, K, Wp] and the
// conditionals left in M by inside<.., COND>: joint[v, xp, xv] = mu[p, xp] (x) cond(xv | xp),
// mu[v, xv] = (+) over xp of the joint. J (sum only) keeps the joints in P's layout [NE, K, K, Wp].
template <typename T, bool MAX>
void outside(const Forest& f, Chunk<T>& c, T* mu, T* J) {
  using Vec = Vectorized<T>;
  const int64_t K = f.K, Wp = c.Wp;
  for (int64_t i = f.C - 1; i >= 0; --i) {
    const int64_t v = f.order[i], p = f.parent[v];
    T* mv = mu + v * K * Wp;
    std::fill(mv, mv + K * Wp, MAX ? -std::numeric_limits<T>::infinity() : T(0));
    for (int64_t xp = 0; xp < K; ++xp) {
      const T* mp = mu + (p * K + xp) * Wp;
      for (int64_t xv = 0; xv < K; ++xv) {
        const T* cond = c.M(f, v, xp, xv);
        T* joint = J == nullptr ? nullptr : J + (cond - c.P.data());
        T* out = mv + xv * Wp;
        for (int64_t w = 0; w < Wp; w += Vec::size()) {
          if (MAX) {
            at::vec::maximum(load(out + w), load(mp + w) + load(cond + w)).store(out + w);
          } else {
            const Vec j = load(mp + w) * load(cond + w);
            j.store(joint + w);
            (load(out + w) + j).store(out + w);
          }
        }
      }
    }
  }
}

// The roots' marginals into mu: softmax of U[r] (sum) or U[r] plus the maxima of the other trees of its
// graph (max); zeros / -inf where the root's graph has no possible assignment.
template <typename T, bool MAX>
void root_marginals(const Forest& f, const Chunk<T>& c, const T* rv, const T* vals, T* mu) {
  using Vec = Vectorized<T>;
  const int64_t K = f.K, Wp = c.Wp;
  const Vec zero(T(0));
  for (int64_t i = 0; i < f.R; ++i) {
    const int64_t r = f.roots[i];
    for (int64_t w = 0; w < Wp; w += Vec::size()) {
      const Vec top = load(rv + i * Wp + w), total = load(vals + f.root_group[i] * Wp + w);
      const Vec dead = (total - total) != Vec(T(0));  // log Z or max of the graph not finite
      for (int64_t k = 0; k < K; ++k) {
        const Vec x = load(c.U.data() + (r * K + k) * Wp + w);
        const Vec m = MAX ? Vec::blendv(x + (total - top), ninf<T>(), dead)
                          : Vec::blendv((x - top).exp() * load(c.S.data() + (r * K + k) * Wp + w), zero, dead);
        m.store(mu + (r * K + k) * Wp + w);
      }
    }
  }
}

// Runs body(chunk) over the batch: threads over ranges of the batch, chunks of W entries within a range.
template <typename T, typename Body>
void for_chunks(const Forest& f, const T* u, const T* p, int64_t per_entry, bool scales, const Body& body) {
  const int64_t W = chunk_size<T>(per_entry);
  at::parallel_for(0, f.B, W, [&](int64_t lo, int64_t hi) {
    Chunk<T> c;
    for (int64_t b = lo; b < hi; b += W) {
      c.load(f, u, p, b, std::min(W, hi - b), scales);
      body(c);
    }
  });
}

// values [G, B] from vals [G, Wp]
template <typename T>
void store_values(const Forest& f, const Chunk<T>& c, const T* vals, T* values) {
  for (int64_t g = 0; g < f.G; ++g)
    for (int64_t w = 0; w < c.W; ++w) values[g * f.B + c.b0 + w] = vals[g * c.Wp + w];
}

std::vector<torch::Tensor> tree_map(const torch::Tensor& u, const torch::Tensor& p, const torch::Tensor& order,
                                    const torch::Tensor& parent, const torch::Tensor& parent_edge,
                                    const torch::Tensor& flip, const torch::Tensor& roots,
                                    const torch::Tensor& root_group, int64_t G) {
  const Forest f = forest(u, p, order, parent, parent_edge, flip, roots, root_group, G);
  auto values = torch::empty({G, f.B}, u.options());
  auto y = torch::empty({f.B, f.N}, u.options().dtype(torch::kLong));
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "tree_map", [&] {
    using T = scalar_t;
    for_chunks<T>(f, u.data_ptr<T>(), p.data_ptr<T>(), f.N * 2 * f.K + f.NE * f.K * f.K + 2 * f.N, false, [&](Chunk<T>& c) {
      const int64_t K = f.K, Wp = c.Wp;
      std::vector<T> arg(f.N * K * Wp), rv(f.R * Wp), vals(f.G * Wp), y0(f.R * Wp);
      std::vector<int32_t> yc(f.N * Wp);
      inside<T, true, false>(f, c, arg.data());
      root_values<T, true>(f, c, rv.data(), vals.data(), y0.data());
      for (int64_t i = 0; i < f.R; ++i)
        for (int64_t w = 0; w < Wp; ++w) yc[f.roots[i] * Wp + w] = int32_t(y0[i * Wp + w]);
      for (int64_t i = f.C - 1; i >= 0; --i) {  // parents before children
        const int64_t v = f.order[i], pv = f.parent[v];
        for (int64_t w = 0; w < Wp; ++w) yc[v * Wp + w] = int32_t(arg[(v * K + yc[pv * Wp + w]) * Wp + w]);
      }
      int64_t* yo = y.data_ptr<int64_t>();
      for (int64_t w = 0; w < c.W; ++w)
        for (int64_t v = 0; v < f.N; ++v) yo[(c.b0 + w) * f.N + v] = yc[v * Wp + w];
      store_values(f, c, vals.data(), values.data_ptr<T>());
    });
  });
  return {values, y};
}

torch::Tensor tree_logz(const torch::Tensor& u, const torch::Tensor& p, const torch::Tensor& order,
                        const torch::Tensor& parent, const torch::Tensor& parent_edge, const torch::Tensor& flip,
                        const torch::Tensor& roots, const torch::Tensor& root_group, int64_t G) {
  const Forest f = forest(u, p, order, parent, parent_edge, flip, roots, root_group, G);
  auto values = torch::empty({G, f.B}, u.options());
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "tree_logz", [&] {
    using T = scalar_t;
    for_chunks<T>(f, u.data_ptr<T>(), p.data_ptr<T>(), f.N * 2 * f.K + f.NE * f.K * f.K + 2 * f.N, true, [&](Chunk<T>& c) {
      std::vector<T> rv(f.R * c.Wp), vals(f.G * c.Wp);
      inside<T, false, false>(f, c, nullptr);
      root_values<T, false>(f, c, rv.data(), vals.data(), nullptr);
      store_values(f, c, vals.data(), values.data_ptr<T>());
    });
  });
  return values;
}

// Marginals: (log Z [G, B], mu [B, N, K], pairwise marginals [B, NE, K, K] in stored orientation), all
// zero for the rows of a graph with no possible assignment. Max-marginals (``max`` true): (max [G, B],
// max-marginals [B, N, K], empty).
std::vector<torch::Tensor> tree_marginals(const torch::Tensor& u, const torch::Tensor& p, const torch::Tensor& order,
                                          const torch::Tensor& parent, const torch::Tensor& parent_edge,
                                          const torch::Tensor& flip, const torch::Tensor& roots,
                                          const torch::Tensor& root_group, int64_t G, bool max) {
  const Forest f = forest(u, p, order, parent, parent_edge, flip, roots, root_group, G);
  const int64_t K = f.K, KK = K * K;
  auto values = torch::empty({G, f.B}, u.options());
  auto mu = torch::empty(u.sizes(), u.options());
  auto pair = max ? torch::empty({0}, u.options()) : torch::empty(p.sizes(), u.options());
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "tree_marginals", [&] {
    using T = scalar_t;
    for_chunks<T>(f, u.data_ptr<T>(), p.data_ptr<T>(), f.N * 3 * K + f.NE * 2 * KK + 2 * f.N, !max, [&](Chunk<T>& c) {
      const int64_t Wp = c.Wp;
      std::vector<T> m(f.N * K * Wp), rv(f.R * Wp), vals(f.G * Wp);
      std::vector<T> J(max ? 0 : f.NE * KK * Wp);
      if (max) {
        inside<T, true, true>(f, c, nullptr);
        root_values<T, true>(f, c, rv.data(), vals.data(), nullptr);
        root_marginals<T, true>(f, c, rv.data(), vals.data(), m.data());
        outside<T, true>(f, c, m.data(), nullptr);
      } else {
        inside<T, false, true>(f, c, nullptr);
        root_values<T, false>(f, c, rv.data(), vals.data(), nullptr);
        root_marginals<T, false>(f, c, rv.data(), vals.data(), m.data());
        outside<T, false>(f, c, m.data(), J.data());
      }
      transpose(m.data(), Wp, mu.data_ptr<T>() + c.b0 * f.N * K, f.N * K, f.N * K, c.W);
      if (!max) transpose(J.data(), Wp, pair.data_ptr<T>() + c.b0 * f.NE * KK, f.NE * KK, f.NE * KK, c.W);
      store_values(f, c, vals.data(), values.data_ptr<T>());
    });
  });
  return {values, mu, pair};
}

}  // namespace

void register_tree(pybind11::module_& m) {
  m.def("tree_map", &tree_map, "MAP values [G, B] and assignment [B, N]");
  m.def("tree_logz", &tree_logz, "log Z [G, B]");
  m.def("tree_marginals", &tree_marginals, "(values [G, B], (max-)marginals [B, N, K], pairwise [B, NE, K, K])");
}

}  // namespace stcpu
