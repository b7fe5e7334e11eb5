"""Structure: spanning trees (Boruvka max spanning forest, Pruefer sampling) and circuit rank."""

from .circuit_rank import cccp_linearization, circuit_rank, circuit_rank_penalty
from .edge_scores import chow_liu_tree, label_mutual_information
from .spanning import max_spanning_tree, random_spanning_trees, spanning_forest, uniform_spanning_tree

__all__ = [
    "cccp_linearization",
    "chow_liu_tree",
    "circuit_rank",
    "circuit_rank_penalty",
    "label_mutual_information",
    "max_spanning_tree",
    "random_spanning_trees",
    "spanning_forest",
    "uniform_spanning_tree",
]
