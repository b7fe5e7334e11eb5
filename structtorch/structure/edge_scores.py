"""Label-count edge scores: the empirical mutual information I(Y_i; Y_j) of label pairs, the Chow-Liu tree (its
maximum spanning tree) and the candidate graph of the labels' strongest partners, from the labels alone.

All pairs' joint counts come from one Gram matrix of the one-hot labels (O(N n^2 K^2) multiply-adds, no
[N, E] intermediate), so the screen costs about a second at n = 983 labels and N = 12,920 examples.
The regression-based edge scores of tree-CRF structure learning (piecewise, local / global CMI, DCI) are
in ``structtorch.estimation``.
"""

from __future__ import annotations

import torch

from ..graph import Graph, check_int
from .spanning import max_spanning_tree

__all__ = ["candidate_graph", "chow_liu_tree", "dependence_order", "label_mutual_information",
           "mutual_information_matrix", "top_partner_graph"]


def mutual_information_matrix(y: torch.Tensor, num_states: int = 2, smoothing: float = 1.0) -> torch.Tensor:
    """Empirical mutual information I(Y_i; Y_j) of every label pair, float64 [n, n] (zero diagonal).

    y: LongTensor [N, n] with values in [0, num_states); counts get ``smoothing`` pseudo-counts per joint
    cell (so unseen combinations do not give log 0). The joint counts of all pairs are one Gram matrix
    (``_joint_counts``).
    """
    if y.dim() != 2 or y.shape[0] == 0:
        raise ValueError(f"y must have shape [N >= 1, n], got {tuple(y.shape)}")
    K = check_int(num_states, "num_states", 2)
    lo, hi = torch.aminmax(y)
    if lo < 0 or hi >= K:
        raise ValueError(f"y must hold labels in [0, {K}), got min {int(lo)}, max {int(hi)}")
    counts = _joint_counts(y, K) + smoothing  # [n, n, K, K]
    p = counts / counts.sum((-1, -2), keepdim=True)
    pi, pj = p.sum(-1, keepdim=True), p.sum(-2, keepdim=True)
    mi = (p * (p.log() - pi.log() - pj.log())).sum((-1, -2))
    return mi.fill_diagonal_(0.0)


def _joint_counts(y: torch.Tensor, K: int) -> torch.Tensor:
    """counts[i, j, a, b] = #{examples with y_i = a, y_j = b}, float64 [n, n, K, K], from the Gram matrix of the
    one-hot labels without their last state, [N, n (K - 1)] (for binary labels: Y^T Y); the cells of the last
    state follow from the one-state counts and N (float32 products: exact up to 2^24 examples)."""
    N, n = y.shape
    a = (y[..., None] == torch.arange(K - 1, device=y.device)).reshape(N, n * (K - 1)).to(torch.float32)
    gram = (a.T @ a).to(torch.float64).view(n, K - 1, n, K - 1).permute(0, 2, 1, 3)  # [n, n, K-1, K-1]
    single = a.sum(0).to(torch.float64).view(n, K - 1)  # [n, K-1]
    counts = torch.empty(n, n, K, K, dtype=torch.float64, device=y.device)
    counts[..., :-1, :-1] = gram
    counts[..., :-1, -1] = single[:, None, :] - gram.sum(-1)  # y_i = a, y_j = last
    counts[..., -1, :-1] = single[None, :, :] - gram.sum(-2)  # y_i = last, y_j = b
    counts[..., -1, -1] = N - counts[..., :-1, :].sum((-1, -2)) - counts[..., -1, :-1].sum(-1)
    return counts


def label_mutual_information(y: torch.Tensor, num_states: int = 2, smoothing: float = 1.0,
                             graph: Graph | None = None) -> torch.Tensor:
    """Empirical mutual information I(Y_i; Y_j) [E] over the edges of ``graph`` (default ``Graph.complete(n)``);
    y [N, n] long, as ``mutual_information_matrix``."""
    graph = Graph.complete(y.shape[1]) if graph is None else graph
    mi = mutual_information_matrix(y, num_states, smoothing)
    edges = graph.edges.to(mi.device)
    return mi[edges[:, 0], edges[:, 1]]


def dependence_order(y: torch.Tensor, graph: Graph, num_states: int = 2) -> torch.Tensor:
    """The edges of ``graph`` by decreasing mutual information of their labels (ties by edge index): LongTensor
    [E] on the graph's device. Structure searches that a time budget may stop score pairs in this order."""
    mi = label_mutual_information(y, num_states, graph=graph)
    return mi.argsort(descending=True, stable=True).to(graph.edges.device)


def chow_liu_tree(y: torch.Tensor, num_states: int = 2, smoothing: float = 1.0) -> Graph:
    """Chow-Liu tree of labels y [N, n]: the maximum spanning tree of pairwise mutual information (over all
    n (n - 1) / 2 pairs)."""
    complete = Graph.complete(y.shape[1])
    mask = max_spanning_tree(label_mutual_information(y, num_states, smoothing, complete), complete)
    return Graph(y.shape[1], complete.edges[mask.cpu()])


def top_partner_graph(scores: torch.Tensor, m: int) -> Graph:
    """The union over labels of each label's ``m`` highest-scoring partners: a Graph on n nodes with at most n m
    edges (every edge once, i < j, sorted). scores: symmetric [n, n] (the diagonal is ignored); ties by lower
    partner index. With m >= n - 1 it is the complete graph."""
    if scores.dim() != 2 or scores.shape[0] != scores.shape[1]:
        raise ValueError(f"scores must be a square [n, n] matrix, got {tuple(scores.shape)}")
    n = scores.shape[0]
    m = min(check_int(m, "m (partners per label)", 1), max(n - 1, 0))
    if m == 0:
        return Graph.empty(n)
    s = scores.detach().to(torch.float64).clone()
    s.fill_diagonal_(float("-inf"))
    # stable descending order: equal scores keep the lower partner index first
    partners = torch.sort(s, dim=1, descending=True, stable=True).indices[:, :m]  # [n, m]
    i = torch.arange(n, device=s.device).repeat_interleave(m)
    j = partners.reshape(-1)
    keys = torch.unique(torch.minimum(i, j) * n + torch.maximum(i, j))
    return Graph(n, torch.stack([keys // n, keys % n], 1).cpu())


def candidate_graph(y: torch.Tensor, m: int | None, num_states: int = 2) -> Graph:
    """The label graph a structure learner chooses its edges from: ``Graph.complete(n)`` when ``m`` is None or
    the complete graph has at most n m edges (n <= 2 m + 1), else ``top_partner_graph`` of the labels' mutual
    information (each label's m most dependent partners). y [N, n] long."""
    n = y.shape[1]
    if m is None or n <= 2 * check_int(m, "m (partners per label)", 1) + 1:
        return Graph.complete(n)
    return top_partner_graph(mutual_information_matrix(y, num_states), m)
