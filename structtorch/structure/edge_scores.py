"""Label-count edge scores: the empirical mutual information I(Y_i; Y_j) of label pairs and the Chow-Liu
tree (its maximum spanning tree), from the labels alone.

The regression-based edge scores of tree-CRF structure learning (piecewise, local / global CMI, DCI) are
in ``structtorch.estimation``.
"""

from __future__ import annotations

import torch

from ..graph import Graph
from .spanning import max_spanning_tree

__all__ = ["chow_liu_tree", "label_mutual_information"]


def label_mutual_information(y: torch.Tensor, num_states: int = 2, smoothing: float = 1.0) -> torch.Tensor:
    """Empirical mutual information I(Y_i; Y_j) [E] over the edges of ``Graph.complete(n)``.

    y: LongTensor [N, n] with values in [0, num_states); counts get ``smoothing`` pseudo-counts
    per joint cell (so unseen combinations do not give log 0).
    """
    if y.dim() != 2 or y.shape[0] == 0:
        raise ValueError(f"y must have shape [N >= 1, n], got {tuple(y.shape)}")
    N, n = y.shape
    K = num_states
    if y.min() < 0 or y.max() >= K:
        raise ValueError(f"y must hold labels in [0, {K}), got min {int(y.min())}, max {int(y.max())}")
    edges = Graph.complete(n).edges.to(y.device)
    joint_idx = y[:, edges[:, 0]] * K + y[:, edges[:, 1]]  # [N, E]
    counts = torch.nn.functional.one_hot(joint_idx, K * K).sum(0).to(torch.float64) + smoothing  # [E, K*K]
    p = (counts / counts.sum(-1, keepdim=True)).view(-1, K, K)
    pi, pj = p.sum(-1, keepdim=True), p.sum(-2, keepdim=True)
    return (p * (p.log() - pi.log() - pj.log())).sum((-1, -2))


def chow_liu_tree(y: torch.Tensor, num_states: int = 2, smoothing: float = 1.0) -> Graph:
    """Chow-Liu tree of labels y [N, n]: the maximum spanning tree of pairwise mutual information."""
    complete = Graph.complete(y.shape[1])
    mask = max_spanning_tree(label_mutual_information(y, num_states, smoothing), complete)
    return Graph(y.shape[1], complete.edges[mask.cpu()])

