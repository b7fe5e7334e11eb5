// Dual coordinate descent for L1-loss linear SVMs (Hsieh, Chang, Lin, Keerthi, Sathiyamoorthi, ICML 2008:
// liblinear's solver), one SVM per label, all labels sharing the inputs (structtorch.solvers.dcd); and, at the end,
// the same cyclic exact coordinate steps on BCFW's box-constrained block-step problems (box_gauss_seidel).
//
// Label l's dual: max_a sum_i a_i - 1/2 |w(a)|^2, 0 <= a_i <= C, w(a) = sum_i a_i s_il x_i (s = +-1). One epoch
// visits the rows in a given order; at row i every label takes its exact coordinate step
// a_i <- clip(a_i - (s_il w_l.x_i - 1) / |x_i|^2, 0, C) and w_l follows. Labels are independent problems:
// they are split over torch's threads in blocks of kLanes, whose weights are held transposed ([D][kLanes])
// so that each row's dot products and updates are SIMD loops over the block's labels, x_i read once a block
// (the dot products in independent accumulators: a chain of dependent FMAs would wait on each other's latency).
#include "common.h"

namespace stcpu {

namespace {

using Vec = Vectorized<double>;
constexpr int64_t kVecs = 4;                     // SIMD vectors of labels per block
constexpr int64_t kLanes = kVecs * Vec::size();  // labels per block

// The entries of a row: dense (entry k is column k) or sparse (entry k is column idx[k]).
struct Dense {
  int64_t operator()(int64_t k) const { return k; }
};
struct Sparse {
  const int64_t* idx;
  int64_t operator()(int64_t k) const { return idx[k]; }
};

// g[kLanes] = wt^T x_i over the row's entries (values val [count], columns col(k)): two entries at a time into
// independent accumulators (8 FMA chains in flight).
template <typename Col>
void dots(const double* wt, Col col, const double* val, int64_t count, double* g) {
  Vec acc[2][kVecs];
  for (auto& half : acc)
    for (auto& a : half) a = Vec(0.0);
  int64_t k = 0;
  for (; k + 1 < count; k += 2)
    for (int64_t h = 0; h < 2; ++h) {
      const Vec xd(val[k + h]);
      const double* row = wt + col(k + h) * kLanes;
      for (int64_t v = 0; v < kVecs; ++v) acc[h][v] = at::vec::fmadd(Vec::loadu(row + v * Vec::size()), xd, acc[h][v]);
    }
  if (k < count) {
    const Vec xd(val[k]);
    for (int64_t v = 0; v < kVecs; ++v)
      acc[0][v] = at::vec::fmadd(Vec::loadu(wt + col(k) * kLanes + v * Vec::size()), xd, acc[0][v]);
  }
  for (int64_t v = 0; v < kVecs; ++v) (acc[0][v] + acc[1][v]).store(g + v * Vec::size());
}

// wt += x_i coef^T over the row's entries.
template <typename Col>
void update(double* wt, Col col, const double* val, int64_t count, const double* coef) {
  Vec c[kVecs];
  for (int64_t v = 0; v < kVecs; ++v) c[v] = Vec::loadu(coef + v * Vec::size());
  for (int64_t k = 0; k < count; ++k) {
    const Vec xd(val[k]);
    double* row = wt + col(k) * kLanes;
    for (int64_t v = 0; v < kVecs; ++v)
      at::vec::fmadd(c[v], xd, Vec::loadu(row + v * Vec::size())).store(row + v * Vec::size());
  }
}

// Every label's exact coordinate step at a row of |x_i|^2 = qi from its margins g[l] = w_l . x_i: the labels' signs
// s [lanes] and dual variables a [lanes] (stride N) of the row; coef[l] = (new a - old a) s (0 past lanes). Returns
// whether any a moved.
bool steps(const double* g, double qi, const double* s, double* a, int64_t N, double C, int64_t lanes, double* coef) {
  bool moved = false;
  for (int64_t l = 0; l < kLanes; ++l) {
    coef[l] = 0.0;
    if (l >= lanes) continue;
    double& al = a[l * N];
    const double next = std::min(std::max(al - (s[l] * g[l] - 1.0) / qi, 0.0), C);
    coef[l] = (next - al) * s[l];
    moved |= next != al;
    al = next;
  }
  return moved;
}

void dcd_block(const double* x, const double* q, const double* sign, const int64_t* order, double* alpha,
               double* w, int64_t N, int64_t D, int64_t L, int64_t R, int64_t epochs, double C, int64_t l0,
               int64_t lanes) {
  std::vector<double> wt(D * kLanes, 0.0);  // [D][kLanes]
  for (int64_t l = 0; l < lanes; ++l)
    for (int64_t d = 0; d < D; ++d) wt[d * kLanes + l] = w[(l0 + l) * D + d];
  double g[kLanes], coef[kLanes];
  for (int64_t e = 0; e < epochs; ++e) {
    for (int64_t r = 0; r < R; ++r) {
      const int64_t i = order[e * R + r];
      if (q[i] <= 0.0) continue;  // an all-zero row: no step changes w
      const double* xi = x + i * D;
      dots(wt.data(), Dense{}, xi, D, g);
      if (steps(g, q[i], sign + i * L + l0, alpha + l0 * N + i, N, C, lanes, coef))
        update(wt.data(), Dense{}, xi, D, coef);
    }
  }
  for (int64_t l = 0; l < lanes; ++l)
    for (int64_t d = 0; d < D; ++d) w[(l0 + l) * D + d] = wt[d * kLanes + l];
}

// As dcd_block on rows x_i = z_i + c (z in CSR: indptr [N + 1], indices, values; zc_i = z_i . c, cc = |c|^2): each
// label's w = u + beta c, so w . x_i = u . z_i + beta zc_i + u . c + beta cc and a step w += coef x_i is
// u += coef z_i, beta += coef, u . c += coef zc_i: O(nnz(z_i)) per row and label instead of O(D).
void dcd_block_sparse(const int64_t* indptr, const int64_t* indices, const double* values, const double* c,
                      const double* zc, double cc, const double* q, const double* sign, const int64_t* order,
                      double* alpha, double* w, int64_t N, int64_t D, int64_t L, int64_t R, int64_t epochs, double C,
                      int64_t l0, int64_t lanes) {
  std::vector<double> ut(D * kLanes, 0.0);  // u [D][kLanes], from u = w, beta = 0
  double beta[kLanes] = {0.0}, cu[kLanes] = {0.0}, g[kLanes], coef[kLanes];
  for (int64_t l = 0; l < lanes; ++l)
    for (int64_t d = 0; d < D; ++d) {
      ut[d * kLanes + l] = w[(l0 + l) * D + d];
      cu[l] += c[d] * w[(l0 + l) * D + d];
    }
  for (int64_t e = 0; e < epochs; ++e) {
    for (int64_t r = 0; r < R; ++r) {
      const int64_t i = order[e * R + r];
      if (q[i] <= 0.0) continue;
      const int64_t* idx = indices + indptr[i];
      const double* val = values + indptr[i];
      const int64_t nnz = indptr[i + 1] - indptr[i];
      dots(ut.data(), Sparse{idx}, val, nnz, g);
      for (int64_t l = 0; l < lanes; ++l) g[l] += beta[l] * (zc[i] + cc) + cu[l];
      if (!steps(g, q[i], sign + i * L + l0, alpha + l0 * N + i, N, C, lanes, coef)) continue;
      update(ut.data(), Sparse{idx}, val, nnz, coef);
      for (int64_t l = 0; l < lanes; ++l) {
        beta[l] += coef[l];
        cu[l] += coef[l] * zc[i];
      }
    }
  }
  for (int64_t l = 0; l < lanes; ++l)
    for (int64_t d = 0; d < D; ++d) w[(l0 + l) * D + d] = ut[d * kLanes + l] + beta[l] * c[d];
}

}  // namespace

// x [N, D], sign [N, L] (+-1), order [E, R] (rows to visit, epoch by epoch), alpha [L, N] and w [L, D] updated in
// place; all float64 (order int64), contiguous, on the CPU.
void svm_dcd(const torch::Tensor& x, const torch::Tensor& sign, const torch::Tensor& order, torch::Tensor alpha,
             torch::Tensor w, double C) {
  TORCH_CHECK(x.dim() == 2 && sign.dim() == 2 && order.dim() == 2 && alpha.dim() == 2 && w.dim() == 2,
              "svm_dcd: x [N, D], sign [N, L], order [E, R], alpha [L, N], w [L, D]");
  const int64_t N = x.size(0), D = x.size(1), L = sign.size(1), E = order.size(0), R = order.size(1);
  TORCH_CHECK(sign.size(0) == N && alpha.size(0) == L && alpha.size(1) == N && w.size(0) == L && w.size(1) == D,
              "svm_dcd: shapes do not match");
  const std::vector<const torch::Tensor*> dense = {&x, &sign, &alpha, &w};
  for (const torch::Tensor* t : dense)
    TORCH_CHECK(t->scalar_type() == torch::kDouble && t->is_contiguous() && t->device().is_cpu(),
                "svm_dcd: x, sign, alpha and w must be contiguous float64 CPU tensors");
  TORCH_CHECK(order.scalar_type() == torch::kLong && order.is_contiguous(), "svm_dcd: order must be int64");
  const torch::Tensor q = x.pow(2).sum(1).contiguous();
  const int64_t blocks = (L + kLanes - 1) / kLanes;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      dcd_block(x.data_ptr<double>(), q.data_ptr<double>(), sign.data_ptr<double>(), order.data_ptr<int64_t>(),
                alpha.data_ptr<double>(), w.data_ptr<double>(), N, D, L, R, E, C, b * kLanes,
                std::min(kLanes, L - b * kLanes));
  });
}

// svm_dcd on rows x_i = z_i + c: z [N, D] as CSR (indptr [N + 1], indices [nnz] int64, values [nnz]), c [D],
// q [N] = |x_i|^2; sign, order, alpha and w as svm_dcd's. Its steps are svm_dcd's, in O(nnz(z_i)) per row.
void svm_dcd_sparse(const torch::Tensor& indptr, const torch::Tensor& indices, const torch::Tensor& values,
                    const torch::Tensor& c, const torch::Tensor& q, const torch::Tensor& sign,
                    const torch::Tensor& order, torch::Tensor alpha, torch::Tensor w, double C) {
  const int64_t N = q.size(0), D = c.size(0), L = sign.size(1), E = order.size(0), R = order.size(1);
  TORCH_CHECK(indptr.numel() == N + 1 && indices.numel() == values.numel() && sign.size(0) == N &&
                  alpha.size(0) == L && alpha.size(1) == N && w.size(0) == L && w.size(1) == D,
              "svm_dcd_sparse: shapes do not match");
  const std::vector<const torch::Tensor*> dense = {&values, &c, &q, &sign, &alpha, &w};
  for (const torch::Tensor* t : dense)
    TORCH_CHECK(t->scalar_type() == torch::kDouble && t->is_contiguous() && t->device().is_cpu(),
                "svm_dcd_sparse: values, c, q, sign, alpha and w must be contiguous float64 CPU tensors");
  const std::vector<const torch::Tensor*> index = {&indptr, &indices, &order};
  for (const torch::Tensor* t : index)
    TORCH_CHECK(t->scalar_type() == torch::kLong && t->is_contiguous(), "svm_dcd_sparse: indices must be int64");
  const torch::Tensor rows = torch::repeat_interleave(torch::arange(N, indptr.options()), indptr.diff());
  const torch::Tensor zc = torch::zeros({N}, c.options()).index_add_(0, rows, values * c.index_select(0, indices));
  const double cc = c.pow(2).sum().item<double>();
  const int64_t blocks = (L + kLanes - 1) / kLanes;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      dcd_block_sparse(indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), values.data_ptr<double>(),
                       c.data_ptr<double>(), zc.data_ptr<double>(), cc, q.data_ptr<double>(), sign.data_ptr<double>(),
                       order.data_ptr<int64_t>(), alpha.data_ptr<double>(), w.data_ptr<double>(), N, D, L, R, E, C,
                       b * kLanes, std::min(kLanes, L - b * kLanes));
  });
}

// BCFW's block steps (structtorch.solvers.bcfw._gauss_seidel): for each of the P = M C problems, maximise
// gamma . g - 1/2 gamma^T A gamma over gamma in [0, 1]^B (zero where not ok) by ``sweeps`` cyclic exact
// coordinate steps, gamma_i <- clip(gamma_i + (g_i - (A gamma)_i) / A_ii, 0, 1) ok_i; a direction with A_ii <= 0
// takes the full step where g_i > 0 and is not revisited. A [P, B, B] PSD, g and ok [P, B] -> gamma [P, B],
// in A's dtype, the problems split over torch's threads.
torch::Tensor box_gauss_seidel(const torch::Tensor& A, const torch::Tensor& g, const torch::Tensor& ok,
                               int64_t sweeps) {
  TORCH_CHECK(A.dim() == 3 && A.size(1) == A.size(2) && g.dim() == 2 && g.size(0) == A.size(0) &&
                  g.size(1) == A.size(1) && ok.sizes() == g.sizes() && A.is_contiguous() && g.is_contiguous() &&
                  ok.is_contiguous() && g.scalar_type() == A.scalar_type() && ok.scalar_type() == A.scalar_type(),
              "box_gauss_seidel: A [P, B, B], g and ok [P, B] (contiguous, one dtype)");
  const int64_t P = A.size(0), B = A.size(1);
  auto gamma = torch::empty_like(g);
  AT_DISPATCH_FLOATING_TYPES(A.scalar_type(), "box_gauss_seidel", [&] {
    using T = scalar_t;
    const T *a = A.data_ptr<T>(), *gg = g.data_ptr<T>(), *oo = ok.data_ptr<T>();
    T* out = gamma.data_ptr<T>();
    at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
      std::vector<T> r(B);
      for (int64_t q = p0; q < p1; ++q) {
        const T *Aq = a + q * B * B, *gq = gg + q * B, *okq = oo + q * B;
        T* x = out + q * B;
        std::fill(r.begin(), r.end(), T(0));  // A gamma (the free directions have zero columns)
        for (int64_t i = 0; i < B; ++i) x[i] = Aq[i * B + i] > 0 ? T(0) : T(gq[i] > 0) * okq[i];
        for (int64_t s = 0; s < sweeps; ++s)
          for (int64_t i = 0; i < B; ++i) {
            const T d = Aq[i * B + i];
            if (!(d > 0)) continue;
            const T next = std::min(std::max(x[i] + (gq[i] - r[i]) * (T(1) / d), T(0)), T(1)) * okq[i];
            const T step = next - x[i];
            for (int64_t j = 0; j < B; ++j) r[j] += Aq[j * B + i] * step;  // column i
            x[i] = next;
          }
      }
    });
  });
  return gamma;
}

void register_dcd(pybind11::module_& m) {
  m.def("box_gauss_seidel", &box_gauss_seidel, "BCFW's block steps: Gauss-Seidel sweeps on box-constrained QPs");
  m.def("svm_dcd", &svm_dcd, "epochs of dual coordinate descent on one L1-loss SVM per label (in place)");
  m.def("svm_dcd_sparse", &svm_dcd_sparse, "svm_dcd on rows that are sparse up to a constant row (in place)");
}

}  // namespace stcpu
