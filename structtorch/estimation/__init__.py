"""Estimation: the regression-based edge scores of tree-CRF structure learning (Bradley & Guestrin 2010):
estimated conditionals P(T_r | X_{C_r}) of many small regressions at once (count tables or l2 logistic
regressions with CV-chosen penalties, on the batched solvers), the edge scores built from them, and the
input mapping (``select_inputs``). Above ``solvers``; the engine ops they feed (``max_spanning_tree``) are
in ``structtorch.structure``."""

from .conditionals import LAMBDA_GRID, conditional_log_probs, select_inputs
from .edge_scores import EDGE_SCORES, edge_scores, scores_from_log_probs

__all__ = ["EDGE_SCORES", "LAMBDA_GRID", "conditional_log_probs", "edge_scores", "scores_from_log_probs",
           "select_inputs"]
