// Fused CPU tree passes (structtorch.inference.fused): MAP, log Z, marginals and max-marginals of a forest
// as one loop nest each, instead of a chain of small torch ops per contraction step.
//
// Layout as in tree.py (batch-minor): U [N, K, B] unary per node slot, M [N, K, K, B] the potential of
// each slot's parent edge oriented (x_parent, x_v). ``order`` [C]: the non-root slots, every node after
// all of its children (leaves first); ``parent`` [N]; ``roots`` [R] with their graph ``root_group`` [R].
// The batch is split into chunks run in parallel (at::parallel_for); within a chunk the nodes are
// visited in order and every inner loop runs over the chunk's contiguous batch entries.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kGrain = 256;  // batch entries per parallel chunk (a smaller batch runs inline)

struct Forest {
  const int64_t* order;
  int64_t C;
  const int64_t* parent;
  const int64_t* roots;
  const int64_t* root_group;
  int64_t R;
  int64_t K;
  int64_t B;
};

Forest forest(const torch::Tensor& order, const torch::Tensor& parent, const torch::Tensor& roots,
              const torch::Tensor& root_group, const torch::Tensor& U) {
  TORCH_CHECK(U.dim() == 3 && U.is_contiguous(), "U must be a contiguous [N, K, B] tensor");
  return {order.data_ptr<int64_t>(), order.numel(), parent.data_ptr<int64_t>(), roots.data_ptr<int64_t>(),
          root_group.data_ptr<int64_t>(), roots.numel(), U.size(1), U.size(2)};
}

// Inside pass over batch entries [b0, b1): raises every non-root node into its parent,
// U[p, xp] += msg[v, xp] = max / logsumexp over xv of (U[v, xv] + M[v, xp, xv]), in place on U.
// msg [N, K, B] and arg [N, K, B] (first maximiser, MAX only) are written when not null.
template <typename T, bool MAX>
void inside(const Forest& f, T* U, const T* M, T* msg, int64_t* arg, int64_t b0, int64_t b1) {
  const int64_t K = f.K, B = f.B, W = b1 - b0;
  const T ninf = -std::numeric_limits<T>::infinity();
  std::vector<T> best(W), acc(W);
  std::vector<int64_t> idx(W);
  for (int64_t c = 0; c < f.C; ++c) {
    const int64_t v = f.order[c], p = f.parent[v];
    const T* Uv = U + v * K * B + b0;
    T* Up = U + p * K * B + b0;
    for (int64_t xp = 0; xp < K; ++xp) {
      const T* row = M + (v * K + xp) * K * B + b0;  // M[v, xp, :, b0:]
      for (int64_t b = 0; b < W; ++b) {
        best[b] = Uv[b] + row[b];
        idx[b] = 0;
      }
      for (int64_t xv = 1; xv < K; ++xv) {
        const T* u = Uv + xv * B;
        const T* m = row + xv * B;
        for (int64_t b = 0; b < W; ++b) {
          const T s = u[b] + m[b];
          if (s > best[b]) {  // strict: the first maximiser
            best[b] = s;
            idx[b] = xv;
          }
        }
      }
      if (!MAX) {  // logsumexp = best + log(sum exp(s - best)); -inf when every term is -inf
        for (int64_t b = 0; b < W; ++b) acc[b] = 0;
        for (int64_t xv = 0; xv < K; ++xv) {
          const T* u = Uv + xv * B;
          const T* m = row + xv * B;
          for (int64_t b = 0; b < W; ++b) acc[b] += best[b] == ninf ? T(0) : std::exp(u[b] + m[b] - best[b]);
        }
        for (int64_t b = 0; b < W; ++b) best[b] = best[b] == ninf ? ninf : best[b] + std::log(acc[b]);
      }
      T* up = Up + xp * B;
      for (int64_t b = 0; b < W; ++b) up[b] += best[b];
      if (msg != nullptr) std::copy(best.begin(), best.end(), msg + (v * K + xp) * B + b0);
      if (arg != nullptr) std::copy(idx.begin(), idx.end(), arg + (v * K + xp) * B + b0);
    }
  }
}

// Per root r and batch entry: max / logsumexp over its states of U[r] (root_value [R, B]); values [G, B]
// sums them per graph.
template <typename T, bool MAX>
void roots(const Forest& f, const T* U, T* root_value, T* values, int64_t b0, int64_t b1) {
  const int64_t K = f.K, B = f.B;
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < f.R; ++i) {
    const T* u = U + f.roots[i] * K * B;
    T* rv = root_value + i * B;
    for (int64_t b = b0; b < b1; ++b) {
      T m = u[b];
      for (int64_t k = 1; k < K; ++k) m = std::max(m, u[k * B + b]);
      if (!MAX && m != ninf) {
        T s = 0;
        for (int64_t k = 0; k < K; ++k) s += std::exp(u[k * B + b] - m);
        m += std::log(s);
      }
      rv[b] = m;
      values[f.root_group[i] * B + b] += m;
    }
  }
}

template <typename T>
void map_chunk(const Forest& f, T* U, const T* M, int64_t* arg, T* root_value, T* values, int64_t* y, int64_t b0,
               int64_t b1) {
  const int64_t K = f.K, B = f.B;
  inside<T, true>(f, U, M, nullptr, arg, b0, b1);
  roots<T, true>(f, U, root_value, values, b0, b1);
  for (int64_t i = 0; i < f.R; ++i) {  // each root's first maximiser
    const int64_t r = f.roots[i];
    const T* u = U + r * K * B;
    for (int64_t b = b0; b < b1; ++b) {
      int64_t a = 0;
      for (int64_t k = 1; k < K; ++k) a = u[k * B + b] > u[a * B + b] ? k : a;
      y[r * B + b] = a;
    }
  }
  for (int64_t c = f.C - 1; c >= 0; --c) {  // parents before children
    const int64_t v = f.order[c], p = f.parent[v];
    for (int64_t b = b0; b < b1; ++b) y[v * B + b] = arg[(v * K + y[p * B + b]) * B + b];
  }
}

// Outside pass over [b0, b1), sum or max semiring, from the roots' (max-)marginals already in mu:
// joint[v, xp, xv] = mu[p, xp] (x) cond(xv | xp), cond = U[v, xv] + M[v, xp, xv] - msg[v, xp] in log space
// (the term impossible when msg is -inf); mu[v, xv] = (+) over xp of the joint. J [N, K, K, B] (sum only)
// keeps the joints.
template <typename T, bool MAX>
void outside(const Forest& f, const T* U, const T* M, const T* msg, T* mu, T* J, int64_t b0, int64_t b1) {
  const int64_t K = f.K, B = f.B;
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t c = f.C - 1; c >= 0; --c) {
    const int64_t v = f.order[c], p = f.parent[v];
    T* mv = mu + v * K * B;
    for (int64_t xv = 0; xv < K; ++xv)
      for (int64_t b = b0; b < b1; ++b) mv[xv * B + b] = MAX ? ninf : T(0);
    for (int64_t xp = 0; xp < K; ++xp) {
      const T* mp = mu + (p * K + xp) * B;
      const T* ms = msg + (v * K + xp) * B;
      for (int64_t xv = 0; xv < K; ++xv) {
        const T* u = U + (v * K + xv) * B;
        const T* m = M + ((v * K + xp) * K + xv) * B;
        T* out = mv + xv * B;
        if (MAX) {
          for (int64_t b = b0; b < b1; ++b) {
            const T j = ms[b] == ninf ? ninf : mp[b] + (u[b] + m[b] - ms[b]);
            out[b] = std::max(out[b], j);
          }
        } else {
          T* jv = J + ((v * K + xp) * K + xv) * B;
          for (int64_t b = b0; b < b1; ++b) {
            const T j = ms[b] == ninf ? T(0) : mp[b] * std::exp(u[b] + m[b] - ms[b]);
            jv[b] = j;
            out[b] += j;
          }
        }
      }
    }
  }
}

std::vector<torch::Tensor> tree_map(const torch::Tensor& unary, const torch::Tensor& M, const torch::Tensor& order,
                                    const torch::Tensor& parent, const torch::Tensor& roots_t,
                                    const torch::Tensor& root_group, int64_t G) {
  auto U = unary.clone(at::MemoryFormat::Contiguous);
  const Forest f = forest(order, parent, roots_t, root_group, U);
  auto values = torch::zeros({G, f.B}, U.options());
  auto root_value = torch::empty({f.R, f.B}, U.options());
  auto arg = torch::empty(U.sizes(), U.options().dtype(torch::kLong));
  auto y = torch::empty({U.size(0), f.B}, U.options().dtype(torch::kLong));
  AT_DISPATCH_FLOATING_TYPES(U.scalar_type(), "tree_map", [&] {
    at::parallel_for(0, f.B, kGrain, [&](int64_t b0, int64_t b1) {
      map_chunk<scalar_t>(f, U.data_ptr<scalar_t>(), M.data_ptr<scalar_t>(), arg.data_ptr<int64_t>(),
                          root_value.data_ptr<scalar_t>(), values.data_ptr<scalar_t>(), y.data_ptr<int64_t>(), b0, b1);
    });
  });
  return {values, y};
}

torch::Tensor tree_logz(const torch::Tensor& unary, const torch::Tensor& M, const torch::Tensor& order,
                        const torch::Tensor& parent, const torch::Tensor& roots_t, const torch::Tensor& root_group,
                        int64_t G) {
  auto U = unary.clone(at::MemoryFormat::Contiguous);
  const Forest f = forest(order, parent, roots_t, root_group, U);
  auto values = torch::zeros({G, f.B}, U.options());
  auto root_value = torch::empty({f.R, f.B}, U.options());
  AT_DISPATCH_FLOATING_TYPES(U.scalar_type(), "tree_logz", [&] {
    at::parallel_for(0, f.B, kGrain, [&](int64_t b0, int64_t b1) {
      inside<scalar_t, false>(f, U.data_ptr<scalar_t>(), M.data_ptr<scalar_t>(), nullptr, nullptr, b0, b1);
      roots<scalar_t, false>(f, U.data_ptr<scalar_t>(), root_value.data_ptr<scalar_t>(),
                             values.data_ptr<scalar_t>(), b0, b1);
    });
  });
  return values;
}

// Marginals: (log Z [G, B], mu [N, K, B], J [N, K, K, B]); the roots' mu = softmax(U[r]) (zeros when
// impossible). Max-marginals (``max`` true): (values [G, B], mm [N, K, B], empty); a root's mm = U[r] plus
// the maxima of the other trees of its graph (-inf when its graph has no possible assignment).
std::vector<torch::Tensor> tree_marginals(const torch::Tensor& unary, const torch::Tensor& M,
                                          const torch::Tensor& order, const torch::Tensor& parent,
                                          const torch::Tensor& roots_t, const torch::Tensor& root_group, int64_t G,
                                          bool max) {
  auto U = unary.clone(at::MemoryFormat::Contiguous);
  const Forest f = forest(order, parent, roots_t, root_group, U);
  const int64_t K = f.K, B = f.B;
  auto values = torch::zeros({G, B}, U.options());
  auto root_value = torch::empty({f.R, B}, U.options());
  auto msg = torch::empty(U.sizes(), U.options());
  auto mu = torch::zeros(U.sizes(), U.options());
  auto J = max ? torch::empty({0}, U.options()) : torch::zeros({U.size(0), K, K, B}, U.options());
  AT_DISPATCH_FLOATING_TYPES(U.scalar_type(), "tree_marginals", [&] {
    using T = scalar_t;
    at::parallel_for(0, B, kGrain, [&](int64_t b0, int64_t b1) {
      T* u = U.data_ptr<T>();
      T* rv = root_value.data_ptr<T>();
      T* val = values.data_ptr<T>();
      T* m = mu.data_ptr<T>();
      const T ninf = -std::numeric_limits<T>::infinity();
      if (max) {
        inside<T, true>(f, u, M.data_ptr<T>(), msg.data_ptr<T>(), nullptr, b0, b1);
        roots<T, true>(f, u, rv, val, b0, b1);
      } else {
        inside<T, false>(f, u, M.data_ptr<T>(), msg.data_ptr<T>(), nullptr, b0, b1);
        roots<T, false>(f, u, rv, val, b0, b1);
      }
      for (int64_t i = 0; i < f.R; ++i) {
        const int64_t r = f.roots[i];
        for (int64_t b = b0; b < b1; ++b) {
          const T top = rv[i * B + b], total = val[f.root_group[i] * B + b];
          for (int64_t k = 0; k < K; ++k) {
            const T x = u[(r * K + k) * B + b];
            if (max)
              m[(r * K + k) * B + b] = std::isfinite(total) ? x + (total - top) : ninf;
            else
              m[(r * K + k) * B + b] = top == ninf ? T(0) : std::exp(x - top);
          }
        }
      }
      if (max)
        outside<T, true>(f, u, M.data_ptr<T>(), msg.data_ptr<T>(), m, nullptr, b0, b1);
      else
        outside<T, false>(f, u, M.data_ptr<T>(), msg.data_ptr<T>(), m, J.data_ptr<T>(), b0, b1);
    });
  });
  return {values, mu, J};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("tree_map", &tree_map, "MAP values [G, B] and assignment [N, B]");
  m.def("tree_logz", &tree_logz, "log Z [G, B]");
  m.def("tree_marginals", &tree_marginals, "(values, (max-)marginals, joints)");
}
