// The fused CPU kernels' Python module (structtorch.inference.fused): tree passes, K-best lists and smoothed-LP sweeps.
#include "common.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  stcpu::register_tree(m);
  stcpu::register_lp(m);
  stcpu::register_kbest(m);
}
