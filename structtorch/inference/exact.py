"""Inference by enumerating all K**n assignments: the reference every exact op is tested against."""

from __future__ import annotations

import torch

from ..graph import check_int
from ..potentials import Potentials

__all__ = ["all_assignments", "assignment_index", "all_scores", "brute_force_map", "brute_force_logz",
           "brute_force_kbest", "brute_force_marginals", "MAX_ASSIGNMENTS"]

MAX_ASSIGNMENTS = 1 << 20


def _place_values(n: int, K: int, device: torch.device | str) -> torch.Tensor:
    """K**(n-1), ..., K, 1 [n]: each node's weight in an assignment's lexicographic index (node 0 most significant)."""
    return K ** torch.arange(n - 1, -1, -1, device=device)


def all_assignments(n: int, K: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Every assignment [K**n, n] in lexicographic order (node 0 most significant)."""
    if K ** n > MAX_ASSIGNMENTS:
        raise ValueError(f"brute force needs K**n <= 2**20 assignments, got K={K}, n={n} ({K ** n})")
    return torch.arange(K ** n, device=device).unsqueeze(-1).div(_place_values(n, K, device), rounding_mode="floor") % K


def assignment_index(y: torch.Tensor, K: int) -> torch.Tensor:
    """The index [*B] of assignments y [*B, n] in ``all_assignments``' order (its inverse)."""
    return (y * _place_values(y.shape[-1], K, y.device)).sum(-1)


def all_scores(pot: Potentials) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores [*B, K**n] ([*B, T, K**n] for ensembles) of every assignment [K**n, n]."""
    if not isinstance(pot, Potentials):
        raise TypeError(f"brute force inference expects a structtorch.Potentials, got {type(pot).__name__}")
    ys = all_assignments(pot.graph.num_nodes, pot.num_states, pot.device)
    batch = pot.batch_shape
    y = ys.view(-1, *([1] * len(batch)), ys.shape[-1])  # [A, 1.., n] broadcasts against *B
    s = pot.score(y)  # [A, *B] or [A, *B, T]
    return s.movedim(0, -1), ys


def brute_force_map(pot: Potentials) -> tuple[torch.Tensor, torch.Tensor]:
    """(score [*B], y [*B, n]) by enumeration; the lowest-index assignment wins ties."""
    s, ys = all_scores(pot)
    best, idx = s.max(-1)
    return best, ys[idx]


def brute_force_logz(pot: Potentials) -> torch.Tensor:
    """log Z [*B] by enumeration."""
    return all_scores(pot)[0].logsumexp(-1)


def brute_force_marginals(pot: Potentials) -> tuple[torch.Tensor, torch.Tensor]:
    """Unary [*B, n, K] and pairwise [*B, E, K, K] marginals by enumeration.

    Ensembles: per graph, [*B, T, n, K] and [*B, T, E, K, K]. Rows with no possible
    assignment (log Z = -inf) get all-zero marginals.
    """
    s, ys = all_scores(pot)
    K = pot.num_states
    p = torch.nan_to_num(torch.softmax(s, -1), nan=0.0)  # [*B, A] ([*B, T, A])
    oh = torch.nn.functional.one_hot(ys, K).to(p.dtype)  # [A, n, K]
    mu = torch.einsum("...a,ank->...nk", p, oh)
    e = pot.graph.edges.to(pot.device)
    pair = oh[:, e[..., 0], :, None] * oh[:, e[..., 1], None, :]  # [A, (T,) E, K, K]
    if pot.graph.is_ensemble:
        return mu, torch.einsum("...ta,atekl->...tekl", p, pair)
    return mu, torch.einsum("...a,aekl->...ekl", p, pair)


def brute_force_kbest(pot: Potentials, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best assignments by enumeration: scores [*B, k] descending, ys [*B, k, n].

    Impossible assignments (score -inf) and slots beyond K**n are reported with score -inf.
    """
    check_int(k, "k", 1, expected="a positive int")
    s, ys = all_scores(pot)
    A = s.shape[-1]
    top, idx = s.topk(min(k, A), -1)
    if k > A:
        pad = k - A
        top = torch.cat([top, top.new_full((*top.shape[:-1], pad), float("-inf"))], -1)
        idx = torch.cat([idx, idx.new_zeros((*idx.shape[:-1], pad))], -1)
    return top, ys[idx]
