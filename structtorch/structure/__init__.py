"""Structure: spanning trees (Boruvka max spanning forest, Pruefer sampling), circuit rank, and edge scores
from estimated conditionals (tree-CRF structure learning)."""

from .circuit_rank import cccp_linearization, circuit_rank, circuit_rank_penalty
from .conditionals import LAMBDA_GRID, conditional_log_probs, select_inputs
from .edge_scores import EDGE_SCORES, chow_liu_tree, edge_scores, label_mutual_information, scores_from_log_probs
from .spanning import max_spanning_tree, random_spanning_trees, spanning_forest, uniform_spanning_tree

__all__ = [
    "EDGE_SCORES",
    "LAMBDA_GRID",
    "cccp_linearization",
    "chow_liu_tree",
    "conditional_log_probs",
    "edge_scores",
    "circuit_rank",
    "circuit_rank_penalty",
    "label_mutual_information",
    "max_spanning_tree",
    "random_spanning_trees",
    "scores_from_log_probs",
    "select_inputs",
    "spanning_forest",
    "uniform_spanning_tree",
]
