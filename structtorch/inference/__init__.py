"""Inference ops on batched ``Potentials``: exact on trees, brute force, K-best, smoothed LP."""

from .backends import BACKENDS, backend, current_backend, fused_active, set_backend
from .decode import tree_f1, tree_mpm
from .exact import brute_force_kbest, brute_force_logz, brute_force_map, brute_force_marginals
from .kbest import ensemble_map, tree_kbest
from .lp import LPResult, lp_map
from .smoothed import SmoothedLPResult, smoothed_lp
from .tree import tree_logz, tree_map, tree_marginals, tree_max_marginals, tree_sample

__all__ = [
    "BACKENDS",
    "backend",
    "current_backend",
    "fused_active",
    "LPResult",
    "SmoothedLPResult",
    "brute_force_kbest",
    "brute_force_logz",
    "brute_force_map",
    "brute_force_marginals",
    "lp_map",
    "set_backend",
    "smoothed_lp",
    "ensemble_map",
    "tree_kbest",
    "tree_logz",
    "tree_f1",
    "tree_map",
    "tree_mpm",
    "tree_marginals",
    "tree_max_marginals",
    "tree_sample",
]
