"""Circuit rank of an edge subset, CRANK's circuit-rank regulariser and its CCCP linearisation.

Meshi, Eban, Elidan, Globerson, "Learning Max-Margin Tree Predictors", UAI 2013:
the circuit rank r(A) = |A| + c(A) - n counts the independent cycles of (V, A) and is 0
iff A is a forest. Its tight convex surrogate on the pairwise weights is (eq. 12)

    f(pi) = sum over e not in T(pi) of pi_e,    pi = |w_pair|,

where T(pi) is Kruskal's maximum spanning tree under pi. f = ||pi||_1 - max_T sum_{e in T} pi_e
is a difference of convex functions; CCCP (Alg. 1, Prop. 4.3) linearises the concave part at
w_t with v = sign(w_t) on the edges of T(|w_t|) and 0 elsewhere.
"""

from __future__ import annotations

import torch

from ..graph import Graph
from .spanning import check_edge_tensor, edges_on, endpoints, max_spanning_tree, spanning_forest

__all__ = ["circuit_rank", "circuit_rank_penalty", "cccp_linearization"]


def circuit_rank(mask: torch.Tensor, g: Graph) -> torch.Tensor:
    """Circuit rank |A| + c(A) - n of the edge subsets A = {e : mask[..., e]}.

    mask: BoolTensor [*B, E] ([*B, T, E] for an ensemble of T graphs).
    g: Graph on n nodes with E edges.
    Returns LongTensor [*B] (resp. [*B, T]) where c(A) counts the connected components of
    (V, A), isolated nodes included; 0 iff A is a forest. Computed as |A| - |F| with F a
    spanning forest of A (|F| = n - c(A)).
    """
    check_edge_tensor(mask, g, "mask")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a BoolTensor [*B, E], got {mask.dtype}")
    size = mask.sum(-1)
    E = g.num_edges
    if E == 0 or mask.numel() == 0:
        return size
    G = mask.numel() // E
    ends = edges_on(g, mask.device).reshape(-1, E, 2)  # [T, E, 2]
    sel = mask.reshape(-1).nonzero().squeeze(1)
    src, dst = endpoints(ends, sel, E, g.num_nodes)
    forest = spanning_forest(src, dst, sel, G * g.num_nodes)  # any distinct keys: only |F| matters
    # size of the spanning forest of each subset: count its edges per batch row
    owner = torch.div(sel[forest], E, rounding_mode="floor")
    count = torch.zeros(G, dtype=torch.long, device=mask.device)
    count.index_add_(0, owner, torch.ones_like(owner))
    return size - count.view(size.shape)


class _CircuitRankPenalty(torch.autograd.Function):
    """f(pi) = sum_{e not in T(pi)} pi_e with the Kruskal subgradient 1[e not in T(pi)]."""

    @staticmethod
    def forward(ctx, pi: torch.Tensor, g: Graph) -> torch.Tensor:  # type: ignore[override]
        off_tree = ~max_spanning_tree(pi, g)
        ctx.save_for_backward(off_tree)
        return torch.where(off_tree, pi, torch.zeros_like(pi)).sum(-1)  # eq. (12); inf-safe

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (off_tree,) = ctx.saved_tensors
        return grad_out.unsqueeze(-1) * off_tree.to(grad_out.dtype), None


def circuit_rank_penalty(pi: torch.Tensor, g: Graph) -> torch.Tensor:
    """CRANK's circuit-rank regulariser f(pi), eq. (12): the sum of pi over the edges NOT in the
    maximum spanning tree T(pi) (``max_spanning_tree``, Kruskal tie-breaking).

    pi: floating tensor [*B, E] (``[*B, T, E]`` for an ensemble), normally pi = |w_pair| >= 0;
        for pi >= 0, f(pi) = 0 iff the edges with pi > 0 form a forest.
    g: Graph with E edges.
    Returns [*B] (resp. [*B, T]). Differentiable: d f / d pi_e = 1 on edges outside T(pi),
    0 on tree edges (the Kruskal subgradient; T(pi) is locally constant).
    """
    check_edge_tensor(pi, g, "pi")
    if not pi.is_floating_point():
        raise TypeError(f"pi must be a floating tensor [*B, E], got {pi.dtype}")
    if torch.isnan(pi).any():
        raise ValueError("pi contains NaN; the circuit-rank regulariser needs totally ordered weights")
    return _CircuitRankPenalty.apply(pi, g)


@torch.no_grad()
def cccp_linearization(w_pair: torch.Tensor, g: Graph) -> torch.Tensor:
    """The CCCP linearisation v of CRANK's Prop. 4.3 at the pairwise weights ``w_pair``.

    w_pair: floating tensor [*B, E] (``[*B, T, E]`` for an ensemble); g: Graph with E edges.
    Returns v of the same shape and dtype (no gradient): v_e = sign(w_e) on the edges of
    T(|w|) = max_spanning_tree(|w_pair|, g), 0 elsewhere. v is a subgradient of the concave
    part -max_T sum_{e in T} |w_e| of eq. (12), so beta * (||w||_1 - v^T w) upper-bounds
    beta * f(|w|), with equality at w = w_pair.
    """
    check_edge_tensor(w_pair, g, "w_pair")
    if not w_pair.is_floating_point():
        raise TypeError(f"w_pair must be a floating tensor [*B, E], got {w_pair.dtype}")
    if torch.isnan(w_pair).any():
        raise ValueError("w_pair contains NaN; the circuit-rank regulariser needs totally ordered weights")
    w = w_pair.detach()
    tree = max_spanning_tree(w.abs(), g)
    return torch.where(tree, torch.sign(w), torch.zeros_like(w))  # Prop. 4.3
