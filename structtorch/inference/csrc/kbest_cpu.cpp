// Fused CPU K-best MAP of a forest (structtorch.inference.kbest.tree_kbest): the k best assignments of every
// graph by one leaves-first pass of k-lists per batch entry and one backtrack per rank, instead of the eager
// program's chain of gathers and top-k over tiny inner dims per contraction step.
//
// Inputs as the tree passes' (common.h, Forest). Each node v keeps a descending k-list L[v][x] per state x (-inf
// padded): the best scores of the part of v's subtree raked into it so far, v in state x. Raking child c into
// its parent p (``order``: every node after its children):
//   M[xp]    = the k best over (xc, j) of pair(xp, xc) + L[c][xc][j]   (a K-way merge of sorted lists)
//   L[p][xp] = the k best of L[p][xp][i] + M[xp][j] over the rank pairs (i + 1)(j + 1) <= k (any other sum has
//              k sums at least as large above it).
// A graph's list joins its roots the same way (each root's list the K-way merge of its states' lists). Every
// step keeps its arguments; rank r of a graph is backtracked by undoing the steps in reverse. Ties go to the
// lower state, then the lower rank pair. Batch entries are split over torch's threads; scratch O(N K k) each.
#include "common.h"

namespace stcpu {
namespace {

struct Arg {
  int32_t a, b;  // (rank in the older list, rank in the other list), or (state, rank)
};

template <typename T>
struct KBest {
  const Forest& f;
  const int64_t k;
  std::vector<int32_t> I, J;  // the rank pairs
  std::vector<T> L, M, A, cand;
  std::vector<Arg> joined, merged, root_merged, root_joined;  // per child slot / root: each step's arguments
  std::vector<int32_t> head, idx, state, rank, cur;

  KBest(const Forest& f_, int64_t k_) : f(f_), k(k_) {
    for (int32_t i = 0; i < k; ++i)
      for (int32_t j = 0; (i + 1) * (j + 1) <= k; ++j) I.push_back(i), J.push_back(j);
    const int64_t NKk = f.N * f.K * k;
    L.resize(NKk);
    joined.resize(NKk);
    merged.resize(NKk);
    M.resize(f.K * k);
    A.resize(f.G * k);
    cand.resize(I.size());
    idx.resize(I.size());
    root_merged.resize(f.R * k);
    root_joined.resize(f.R * k);
    head.resize(f.K);
    state.resize(f.N);
    rank.resize(f.N);
    cur.resize(f.G);
  }

  // out[0..k) = the k best over (x, j) of shift[x] + lists[x * k + j] (sorted lists), args (x, j).
  void merge(const T* lists, const T* shift, T* out, Arg* args) {
    std::fill(head.begin(), head.end(), 0);
    for (int64_t r = 0; r < k; ++r) {
      T best = -std::numeric_limits<T>::infinity();
      int32_t bx = -1;
      for (int32_t x = 0; x < f.K; ++x) {
        if (head[x] >= k) continue;
        const T s = shift[x] + lists[x * k + head[x]];
        if (s > best) best = s, bx = x;
      }
      out[r] = best;
      args[r] = bx < 0 ? Arg{0, 0} : Arg{bx, head[bx]++};
    }
  }

  // a[0..k) <- the k best of a[i] + b[j] over the rank pairs, args (i, j).
  void join(T* a, const T* b, Arg* args) {
    const int64_t P = I.size();
    for (int64_t q = 0; q < P; ++q) cand[q] = a[I[q]] + b[J[q]], idx[q] = int32_t(q);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t x, int32_t y) {
      return cand[x] > cand[y] || (cand[x] == cand[y] && x < y);
    });
    for (int64_t r = 0; r < k; ++r) a[r] = cand[idx[r]], args[r] = Arg{I[idx[r]], J[idx[r]]};
  }

  void run(const T* u, const T* p, T* scores, int64_t* states) {
    const int64_t K = f.K, Kk = K * k;
    const T ninf = -std::numeric_limits<T>::infinity();
    std::fill(L.begin(), L.end(), ninf);
    for (int64_t v = 0; v < f.N; ++v)
      for (int64_t x = 0; x < K; ++x) L[(v * K + x) * k] = u[v * K + x];
    std::vector<T> shift(K);
    for (int64_t i = 0; i < f.C; ++i) {
      const int64_t v = f.order[i], par = f.parent[v];
      const T* table = p + f.parent_edge[v] * K * K;
      for (int64_t xp = 0; xp < K; ++xp) {
        for (int64_t xc = 0; xc < K; ++xc) shift[xc] = f.flip[v] ? table[xc * K + xp] : table[xp * K + xc];
        merge(L.data() + v * Kk, shift.data(), M.data(), merged.data() + v * Kk + xp * k);
        join(L.data() + par * Kk + xp * k, M.data(), joined.data() + v * Kk + xp * k);
      }
    }
    std::fill(A.begin(), A.end(), ninf);
    for (int64_t g = 0; g < f.G; ++g) A[g * k] = T(0);
    std::fill(shift.begin(), shift.end(), T(0));
    for (int64_t i = 0; i < f.R; ++i) {
      merge(L.data() + f.roots[i] * Kk, shift.data(), M.data(), root_merged.data() + i * k);
      join(A.data() + f.root_group[i] * k, M.data(), root_joined.data() + i * k);
    }
    std::copy(A.begin(), A.end(), scores);
    for (int64_t r = 0; r < k; ++r) {  // backtrack rank r of every graph
      std::fill(cur.begin(), cur.end(), int32_t(r));
      for (int64_t i = f.R - 1; i >= 0; --i) {
        int32_t& c = cur[f.root_group[i]];
        const Arg j = root_joined[i * k + c];
        const Arg m = root_merged[i * k + j.b];
        c = j.a;
        state[f.roots[i]] = m.a, rank[f.roots[i]] = m.b;
      }
      for (int64_t i = f.C - 1; i >= 0; --i) {
        const int64_t v = f.order[i], par = f.parent[v], at = v * Kk + state[par] * k;
        const Arg j = joined[at + rank[par]];
        const Arg m = merged[at + j.b];
        rank[par] = j.a;
        state[v] = m.a, rank[v] = m.b;
      }
      for (int64_t v = 0; v < f.N; ++v) states[v * k + r] = state[v];
    }
  }
};

// The k best of every graph: (scores [B, G, k], states [B, N, k] int64); ranks past a graph's number of
// assignments score -inf, their states unspecified.
std::vector<torch::Tensor> tree_kbest(const torch::Tensor& u, const torch::Tensor& p, const torch::Tensor& order,
                                      const torch::Tensor& parent, const torch::Tensor& parent_edge,
                                      const torch::Tensor& flip, const torch::Tensor& roots,
                                      const torch::Tensor& root_group, int64_t G, int64_t k) {
  const Forest f = forest(u, p, order, parent, parent_edge, flip, roots, root_group, G);
  TORCH_CHECK(k >= 1, "k must be >= 1");
  auto scores = torch::empty({f.B, G, k}, u.options());
  auto states = torch::empty({f.B, f.N, k}, u.options().dtype(torch::kLong));
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "tree_kbest", [&] {
    using T = scalar_t;
    const T *U = u.data_ptr<T>(), *P = p.data_ptr<T>();
    T* S = scores.data_ptr<T>();
    int64_t* X = states.data_ptr<int64_t>();
    at::parallel_for(0, f.B, 1, [&](int64_t b0, int64_t b1) {
      KBest<T> search(f, k);
      for (int64_t b = b0; b < b1; ++b)
        search.run(U + b * f.N * f.K, P + b * f.NE * f.K * f.K, S + b * G * k, X + b * f.N * k);
    });
  });
  return {scores, states};
}

// The scores [B, C] of assignments y [B, C, n] (int64) under unary [B, n, K] and pairwise [B, E, K, K] on the
// graph's edges [E, 2] (RTA's candidates on the ensemble's union graph): O(B C (n + E)), -inf where any term is.
torch::Tensor score_assignments(const torch::Tensor& u, const torch::Tensor& p, const torch::Tensor& edges,
                                const torch::Tensor& y) {
  TORCH_CHECK(u.dim() == 3 && u.is_contiguous() && p.dim() == 4 && p.is_contiguous() && y.dim() == 3 &&
                  y.is_contiguous() && y.scalar_type() == torch::kLong && edges.is_contiguous() &&
                  edges.scalar_type() == torch::kLong && p.size(0) == u.size(0) && y.size(0) == u.size(0) &&
                  y.size(2) == u.size(1) && p.size(1) == edges.size(0) && p.scalar_type() == u.scalar_type(),
              "score_assignments: unary [B, n, K], pairwise [B, E, K, K], edges [E, 2], y [B, C, n] (contiguous)");
  const int64_t B = u.size(0), n = u.size(1), K = u.size(2), E = p.size(1), C = y.size(1);
  auto out = torch::empty({B, C}, u.options());
  const int64_t* e = edges.data_ptr<int64_t>();
  const int64_t* Y = y.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "score_assignments", [&] {
    using T = scalar_t;
    const T *U = u.data_ptr<T>(), *P = p.data_ptr<T>();
    T* O = out.data_ptr<T>();
    at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b)
        for (int64_t c = 0; c < C; ++c) {
          const int64_t* x = Y + (b * C + c) * n;
          const T *ub = U + b * n * K, *pb = P + b * E * K * K;
          T s = T(0);
          for (int64_t v = 0; v < n; ++v) s += ub[v * K + x[v]];
          for (int64_t i = 0; i < E; ++i) s += pb[(i * K + x[e[2 * i]]) * K + x[e[2 * i + 1]]];
          O[b * C + c] = s;
        }
    });
  });
  return out;
}

}  // namespace

void register_kbest(pybind11::module_& m) {
  m.def("tree_kbest", &tree_kbest, "the k best of every graph of a forest: (scores [B, G, k], states [B, N, k])");
  m.def("score_assignments", &score_assignments, "scores [B, C] of assignments y [B, C, n] on one graph");
}

}  // namespace stcpu
