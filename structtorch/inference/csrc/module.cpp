// The fused CPU kernels' Python module (structtorch.inference.fused): tree passes, K-best lists, smoothed-LP sweeps and
// the linear SVMs' dual coordinate descent.
#include "common.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  stcpu::register_tree(m);
  stcpu::register_lp(m);
  stcpu::register_kbest(m);
  stcpu::register_dcd(m);
}
