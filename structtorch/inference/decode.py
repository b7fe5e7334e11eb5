"""Decoders of a tree model's distribution P(y | x) ∝ exp(score(y)) aimed at one loss each.

``tree_map`` (the joint mode) is the Bayes decision for the subset 0/1 loss. ``tree_mpm`` (each label's
posterior mode) is the Bayes decision for the Hamming loss. ``tree_f1`` aims at example-based F1 (binary
labels): the plug-in rule of Jansche (2007) and Ye et al. (ICML 2012), which predicts the k labels of highest
marginal P(y_i = 1), with k maximising the ratio of expectations 2 sum_{i in S} p_i / (k + E|y|) (an
approximation of E[F1(S, y)], close once labels are many), and the empty set when its exact probability
P(y = 0) is higher (F1 of two empty sets is 1).
"""

from __future__ import annotations

import torch

from ..potentials import Potentials
from .tree import tree_marginals

__all__ = ["tree_f1", "tree_mpm"]


def _check(pot: Potentials, op: str) -> None:
    if pot.graph.is_ensemble:
        raise ValueError(f"{op} decodes one tree or forest per row; got an ensemble of {pot.graph.num_graphs} "
                         f"graphs (decode each tree, or use ensemble_map)")


def tree_mpm(pot: Potentials) -> torch.Tensor:
    """Maximum posterior marginals: y_i = argmax_a P(y_i = a | x), exact on a tree or forest -> y [*B, n]."""
    _check(pot, "tree_mpm")
    return tree_marginals(pot)[0].argmax(-1)


def _probability_of_zeros(pot: Potentials, mu: torch.Tensor, mu_pair: torch.Tensor) -> torch.Tensor:
    """P(y = 0) [*B] from a forest's exact marginals mu [*B, n, K], mu_pair [*B, E, K, K], by the tree
    factorisation P(y) = prod_e mu_e(y_e) prod_i mu_i(y_i)^(1 - deg_i) (no second pass for log Z)."""
    edges = pot.graph.edges.to(mu.device)
    degree = torch.bincount(edges.reshape(-1), minlength=pot.graph.num_nodes).double()  # [n]
    node, edge = mu[..., 0].double(), mu_pair[..., 0, 0].double()  # [*B, n], [*B, E]
    possible = (node > 0).all(-1)  # a node that cannot be 0 (or a row with Z = 0): P(y = 0) = 0
    log_p = edge.log().sum(-1) + ((1 - degree) * torch.where(node > 0, node, 1.0).log()).sum(-1)
    return torch.where(possible, log_p.exp(), 0.0)


def tree_f1(pot: Potentials) -> torch.Tensor:
    """Plug-in expected-F1 decoding (module docstring) of binary labels on a tree or forest -> y [*B, n].

    Marginals p [*B, n] and the empty set's probability, both from one ``tree_marginals`` pass.
    """
    _check(pot, "tree_f1")
    if pot.num_states != 2:
        raise ValueError(f"tree_f1 decodes binary labels (F1 counts the labels set to 1), got K={pot.num_states} "
                         f"states: use tree_map or tree_mpm")
    mu, mu_pair = tree_marginals(pot)
    p = mu[..., 1].double()  # [*B, n]
    n = p.shape[-1]
    p_sorted, order = p.sort(dim=-1, descending=True)
    k = torch.arange(1, n + 1, dtype=p.dtype, device=p.device)
    expected_f1 = 2 * p_sorted.cumsum(-1) / (k + p.sum(-1, keepdim=True))  # [*B, n]: the top-k sets, k = 1..n
    best, k_best = expected_f1.max(-1)
    empty = torch.zeros(p.shape, dtype=torch.long, device=p.device)
    p_empty = _probability_of_zeros(pot, mu, mu_pair)  # [*B]
    take = (k <= k_best.unsqueeze(-1) + 1) & (p_empty < best).unsqueeze(-1)
    return empty.scatter(-1, order, take.long())
