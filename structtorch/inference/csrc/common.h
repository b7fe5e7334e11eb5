// Shared pieces of the fused CPU kernels (tree_cpu.cpp, lp_cpu.cpp): batch chunks transposed to batch-minor
// buffers whose inner loops are SIMD loops over the chunk's entries (at::vec::Vectorized).
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace stcpu {

using at::vec::Vectorized;

constexpr int64_t kMaxChunk = 256;        // batch entries per chunk at most
constexpr int64_t kChunkBytes = 1 << 20;  // the chunk's buffers should fit in about this much cache

// A forest's arrays and sizes, as the Python side passes them (fused.forest): ``order`` [C] the non-root slots,
// every node after all of its children; ``parent``, ``parent_edge``, ``flip`` [N]; ``roots`` [R] of graphs
// ``root_group`` [R]; G graphs; unary [B, N, K] and pairwise [B, NE, K, K] of one dtype.
struct Forest {
  const int64_t* order;
  const int64_t* parent;
  const int64_t* parent_edge;
  const bool* flip;
  const int64_t* roots;
  const int64_t* root_group;
  int64_t C, R, G, N, NE, K, B;
};

inline Forest forest(const torch::Tensor& u, const torch::Tensor& p, const torch::Tensor& order,
                     const torch::Tensor& parent, const torch::Tensor& parent_edge, const torch::Tensor& flip,
                     const torch::Tensor& roots, const torch::Tensor& root_group, int64_t G) {
  TORCH_CHECK(u.dim() == 3 && u.is_contiguous(), "unary must be a contiguous [B, N, K] tensor");
  TORCH_CHECK(p.dim() == 4 && p.is_contiguous() && p.size(0) == u.size(0) && p.size(2) == u.size(2) &&
                  p.size(3) == u.size(2) && p.scalar_type() == u.scalar_type(),
              "pairwise must be a contiguous [B, NE, K, K] tensor of the unary's dtype");
  TORCH_CHECK(flip.scalar_type() == torch::kBool && parent.numel() == u.size(1), "bad forest arrays");
  return {order.data_ptr<int64_t>(), parent.data_ptr<int64_t>(), parent_edge.data_ptr<int64_t>(),
          flip.data_ptr<bool>(), roots.data_ptr<int64_t>(), root_group.data_ptr<int64_t>(),
          order.numel(), roots.numel(), G, u.size(1), p.size(1), u.size(2), u.size(0)};
}

template <typename T>
constexpr int kAllZero = (1 << Vectorized<T>::size()) - 1;  // zero_mask() of a vector of zeros

// The entries per chunk: W such that `per_entry` buffer elements per entry fit in kChunkBytes, a multiple
// of the SIMD width, in [width, cap].
template <typename T>
int64_t chunk_size(int64_t per_entry, int64_t cap = kMaxChunk) {
  const int64_t V = Vectorized<T>::size();
  const int64_t W = kChunkBytes / std::max<int64_t>(1, per_entry * int64_t(sizeof(T)));
  return std::max(V, std::min(cap, W) / V * V);
}

// dst[j * ld_dst + i] = src[i * ld_src + j] for i < rows, j < cols, by 8 x 8 blocks.
template <typename T>
void transpose(const T* src, int64_t ld_src, T* dst, int64_t ld_dst, int64_t rows, int64_t cols) {
  constexpr int64_t S = 8;
  for (int64_t i = 0; i < rows; i += S)
    for (int64_t j = 0; j < cols; j += S) {
      const T* s = src + i * ld_src + j;
      T* d = dst + j * ld_dst + i;
      if (i + S <= rows && j + S <= cols)
        at::vec::transpose_mxn<T, S, S>(s, ld_src, d, ld_dst);
      else
        at::vec::transpose_mxn<T>(s, ld_src, d, ld_dst, int(std::min(S, rows - i)), int(std::min(S, cols - j)));
    }
}

// buf [R, Wp] (batch-minor, lanes W..Wp zero) from entries [b0, b0 + W) of x [B, R].
template <typename T>
void to_minor(std::vector<T>& buf, const T* x, int64_t R, int64_t b0, int64_t W, int64_t Wp) {
  buf.resize(R * Wp);
  transpose(x + b0 * R, R, buf.data(), Wp, W, R);
  if (W < Wp)
    for (int64_t j = 0; j < R; ++j) std::fill(buf.data() + j * Wp + W, buf.data() + (j + 1) * Wp, T(0));
}

template <typename T>
Vectorized<T> load(const T* x) {
  return Vectorized<T>::loadu(x);
}

template <typename T>
Vectorized<T> ninf() {
  return Vectorized<T>(-std::numeric_limits<T>::infinity());
}

void register_tree(pybind11::module_& m);
void register_lp(pybind11::module_& m);
void register_kbest(pybind11::module_& m);
void register_dcd(pybind11::module_& m);

}  // namespace stcpu
