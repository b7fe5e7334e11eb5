"""Structure (engine ops, on core only): spanning trees (Boruvka max spanning forest, Pruefer sampling),
circuit rank and its CCCP linearisation, and label-count edge scores (mutual information, Chow-Liu tree).
The regression-based edge scores of tree-CRF structure learning are in ``structtorch.estimation``."""

from .circuit_rank import cccp_linearization, circuit_rank, circuit_rank_penalty
from .edge_scores import (
    candidate_graph,
    chow_liu_tree,
    label_mutual_information,
    mutual_information_matrix,
    top_partner_graph,
)
from .spanning import max_spanning_tree, pruefer_decode, random_spanning_trees, spanning_forest, uniform_spanning_tree

__all__ = [
    "candidate_graph",
    "cccp_linearization",
    "chow_liu_tree",
    "circuit_rank",
    "circuit_rank_penalty",
    "label_mutual_information",
    "max_spanning_tree",
    "mutual_information_matrix",
    "pruefer_decode",
    "random_spanning_trees",
    "spanning_forest",
    "top_partner_graph",
    "uniform_spanning_tree",
]
