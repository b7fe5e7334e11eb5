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

}  // namespace stcpu
