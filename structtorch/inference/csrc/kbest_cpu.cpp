// Fused CPU K-best MAP of a forest (structtorch.inference.kbest.tree_kbest): the k best assignments of every
// graph by one leaves-first pass of k-lists per batch entry and one backtrack of all k ranks, instead of the eager
// program's chain of gathers and top-k over tiny inner dims per contraction step.
//
// Inputs as the tree passes' (common.h, Forest). Each node v keeps a descending k-list L[v][x] per state x (-inf
// padded past its length: a small subtree has fewer than k assignments): the best scores of the part of v's
// subtree raked into it so far, v in state x. Raking child c into its parent p (``order``: every node after its
// children):
//   M[xp]    = the k best over (xc, j) of pair(xp, xc) + L[c][xc][j]   (a K-way merge of sorted lists)
//   L[p][xp] = the k best of L[p][xp][i] + M[xp][j]   (a k-way merge of the sorted rows i; row i + 1 enters once
//              (i, 0) is taken, so only pairs with (i + 1)(j + 1) <= k are ever compared)
// A graph's list joins its roots the same way (each root's list the K-way merge of its states' lists). Every
// step keeps its arguments; the ranks are backtracked by undoing the steps in reverse, all k of a node at once.
// Ties go to the lower state, then the lower rank pair (i, then j). Batch entries are split over torch's threads;
// scratch O(N K k) each.
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
  std::vector<T> L, M, A, out, head_s;
  std::vector<int32_t> Ln, An;  // the lists' lengths: entries past them are -inf
  std::vector<Arg> joined, merged, root_merged, root_joined;  // per child slot / root: each step's arguments
  std::vector<int32_t> head, nxt, st, rk, cur;

  KBest(const Forest& f_, int64_t k_) : f(f_), k(k_) {
    const int64_t NKk = f.N * f.K * k;
    L.resize(NKk);
    Ln.resize(f.N * f.K);
    joined.resize(NKk);  // value-initialised: a rank past a list's length backtracks through valid indices
    merged.resize(NKk);
    M.resize(f.K * k);
    A.resize(f.G * k);
    An.resize(f.G);
    out.resize(k);
    head_s.resize(k);
    nxt.resize(k);
    root_merged.resize(f.R * k);
    root_joined.resize(f.R * k);
    head.resize(f.K);
    st.resize(f.N * k);
    rk.resize(f.N * k);
    cur.resize(f.G * k);
  }

  // out[0..k) = the k best over (x, j < len[x]) of shift[x] + lists[x * k + j] (sorted lists), args (x, j);
  // returns how many are finite (the rest -inf).
  int32_t merge(const T* lists, const int32_t* len, const T* shift, T* out, Arg* args) {
    constexpr T ninf = -std::numeric_limits<T>::infinity();
    int32_t m = 0;
    for (int32_t x = 0; x < f.K; ++x) head[x] = shift[x] == ninf ? len[x] : 0;
    if (f.K == 2) {  // two lists: a two-pointer merge (ties to state 0)
      int32_t h0 = head[0], h1 = head[1];
      const int32_t l0 = len[0], l1 = len[1];
      const T *a0 = lists, *a1 = lists + k;
      for (; m < k && (h0 < l0 || h1 < l1); ++m) {
        const bool zero = h1 >= l1 || (h0 < l0 && shift[0] + a0[h0] >= shift[1] + a1[h1]);
        out[m] = zero ? shift[0] + a0[h0] : shift[1] + a1[h1];
        args[m] = zero ? Arg{0, h0++} : Arg{1, h1++};
      }
      std::fill(out + m, out + k, ninf);
      return m;
    }
    for (; m < k; ++m) {
      T best = ninf;
      int32_t bx = -1;
      for (int32_t x = 0; x < f.K; ++x) {
        if (head[x] >= len[x]) continue;
        const T s = shift[x] + lists[x * k + head[x]];
        if (s > best) best = s, bx = x;
      }
      if (bx < 0) break;
      out[m] = best;
      args[m] = Arg{bx, head[bx]++};
    }
    std::fill(out + m, out + k, ninf);
    return m;
  }

  // a[0..k) <- the k best of a[i] + b[j] over the rank pairs with i < la, j < lb, args (i, j); returns how many.
  int32_t join(T* a, int32_t la, const T* b, int32_t lb, Arg* args) {
    constexpr T ninf = -std::numeric_limits<T>::infinity();
    int32_t m = 0;
    if (la == 0 || lb == 0) {  // nothing to join: the list is empty
    } else if (la == 1 || lb == 1) {  // one list of one entry: the other shifted, already sorted
      const T* one = la == 1 ? a : b;
      const T* other = la == 1 ? b : a;
      const T s0 = one[0];
      m = std::min<int32_t>(la == 1 ? lb : la, int32_t(k));
      for (int32_t r = m - 1; r >= 0; --r) {  // descending r: a[r] is read before it is written
        a[r] = s0 + other[r];
        args[r] = la == 1 ? Arg{0, r} : Arg{r, 0};
      }
    } else {  // a k-way merge of the rows a[i] + b[.], row i + 1 entering once (i, 0) is taken
      int32_t rows = 1;
      nxt[0] = 0, head_s[0] = a[0] + b[0];
      for (; m < k; ++m) {
        int32_t bi = -1;
        T best = ninf;
        for (int32_t i = 0; i < rows; ++i)
          if (head_s[i] > best) best = head_s[i], bi = i;  // ties to the lower row: the (i, j) order
        if (bi < 0) break;
        const int32_t j = nxt[bi]++;
        out[m] = best, args[m] = Arg{bi, j};
        head_s[bi] = nxt[bi] < lb ? a[bi] + b[nxt[bi]] : ninf;
        if (j == 0 && bi + 1 == rows && rows < la) nxt[rows] = 0, head_s[rows] = a[rows] + b[0], ++rows;
      }
      std::copy(out.begin(), out.begin() + m, a);
    }
    std::fill(a + m, a + k, ninf);
    return m;
  }

  void run(const T* u, const T* p, T* scores, int64_t* states) {
    const int64_t K = f.K, Kk = K * k;
    constexpr T ninf = -std::numeric_limits<T>::infinity();
    std::fill(L.begin(), L.end(), ninf);
    for (int64_t v = 0; v < f.N; ++v)
      for (int64_t x = 0; x < K; ++x) {
        L[(v * K + x) * k] = u[v * K + x];
        Ln[v * K + x] = u[v * K + x] == ninf ? 0 : 1;
      }
    std::vector<T> shift(K);
    for (int64_t i = 0; i < f.C; ++i) {
      const int64_t v = f.order[i], par = f.parent[v];
      const T* table = p + f.parent_edge[v] * K * K;
      for (int64_t xp = 0; xp < K; ++xp) {
        for (int64_t xc = 0; xc < K; ++xc) shift[xc] = f.flip[v] ? table[xc * K + xp] : table[xp * K + xc];
        const int32_t m = merge(L.data() + v * Kk, Ln.data() + v * K, shift.data(), M.data(),
                                merged.data() + v * Kk + xp * k);
        int32_t& lp = Ln[par * K + xp];
        lp = join(L.data() + par * Kk + xp * k, lp, M.data(), m, joined.data() + v * Kk + xp * k);
      }
    }
    std::fill(A.begin(), A.end(), ninf);
    for (int64_t g = 0; g < f.G; ++g) A[g * k] = T(0), An[g] = 1;
    std::fill(shift.begin(), shift.end(), T(0));
    for (int64_t i = 0; i < f.R; ++i) {
      const int32_t m = merge(L.data() + f.roots[i] * Kk, Ln.data() + f.roots[i] * K, shift.data(), M.data(),
                              root_merged.data() + i * k);
      int32_t& la = An[f.root_group[i]];
      la = join(A.data() + f.root_group[i] * k, la, M.data(), m, root_joined.data() + i * k);
    }
    std::copy(A.begin(), A.end(), scores);
    // backtrack every rank of every graph at once: st / rk [N, k] the states and ranks of each node's list
    for (int64_t g = 0; g < f.G; ++g)
      for (int32_t r = 0; r < k; ++r) cur[g * k + r] = r;
    for (int64_t i = f.R - 1; i >= 0; --i) {
      int32_t* c = cur.data() + f.root_group[i] * k;
      int32_t *sv = st.data() + f.roots[i] * k, *rv = rk.data() + f.roots[i] * k;
      for (int32_t r = 0; r < k; ++r) {
        const Arg j = root_joined[i * k + c[r]];
        const Arg m = root_merged[i * k + j.b];
        c[r] = j.a, sv[r] = m.a, rv[r] = m.b;
      }
    }
    for (int64_t i = f.C - 1; i >= 0; --i) {
      const int64_t v = f.order[i], par = f.parent[v];
      const Arg *jv = joined.data() + v * Kk, *mv = merged.data() + v * Kk;
      const int32_t* sp = st.data() + par * k;
      int32_t *rp = rk.data() + par * k, *sv = st.data() + v * k, *rv = rk.data() + v * k;
      for (int32_t r = 0; r < k; ++r) {
        const int64_t at = sp[r] * k;
        const Arg j = jv[at + rp[r]];
        const Arg m = mv[at + j.b];
        rp[r] = j.a, sv[r] = m.a, rv[r] = m.b;
      }
    }
    std::copy(st.begin(), st.end(), states);
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
