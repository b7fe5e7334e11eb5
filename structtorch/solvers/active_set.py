"""Per-example active sets of labellings for BCFW's pairwise steps (block-coordinate pairwise Frank-Wolfe,
Osokin, Alayrac, Lukasewitz, Dokania and Lacoste-Julien, "Minding the gaps for block Frank-Wolfe optimization of
structured SVMs", ICML 2016, Alg. 3).

Example i's dual point is written mu_i = sum_j alpha_ij m(y_ij) + r_i rho_i: up to S labellings y_ij with weights
alpha_ij > 0, and a residual point rho_i of weight r_i = 1 - sum_j alpha_ij, the part of mu_i not written as
labellings (the start, and labellings evicted from a full set). rho_i is never stored: r_i rho_i = mu_i - sum_j
alpha_ij m(y_ij), a convex combination of labellings, so it stays in the marginal polytope. A pairwise step moves
weight from an "away" atom (the labelling of least loss-augmented score, or the residual) to the Frank-Wolfe
vertex; plain Frank-Wolfe is the pairwise step away from a residual that holds everything.
"""

from __future__ import annotations

import torch

__all__ = ["ActiveSets", "labelling_scores", "pair_index", "weighted_marginals"]


class ActiveSets:
    """Labellings [N, M, S, n] (uint8 up to 256 states) and their weights [N, M, S] (float64; 0: a free slot).

    Args:
        num_examples: N. num_models: M. size: S >= 1. num_nodes: n. num_states: K. device: where they live.
    """

    #: weights below this are dropped (their mass goes to the residual); residuals below ``MIN_RESIDUAL`` are no
    #: away candidates (their score is a ratio with r in the denominator)
    MIN_WEIGHT, MIN_RESIDUAL = 1e-12, 1e-6

    def __init__(self, num_examples: int, num_models: int, size: int, num_nodes: int, num_states: int,
                 device: torch.device | str) -> None:
        dtype = torch.uint8 if num_states <= 256 else torch.int32
        self.labellings = torch.zeros(num_examples, num_models, size, num_nodes, dtype=dtype, device=device)
        self.weights = torch.zeros(num_examples, num_models, size, dtype=torch.float64, device=device)

    @property
    def size(self) -> int:
        return self.labellings.shape[2]

    def reset(self) -> None:
        """Every example's point is all residual (after a new start)."""
        self.weights.zero_()

    def gather(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Examples ``index`` [B]: labellings [M, B, S, n] (long) and weights [M, B, S] (float64)."""
        return self.labellings[index].movedim(1, 0).long(), self.weights[index].movedim(1, 0)

    def move(self, index: torch.Tensor, away: torch.Tensor, vertex: torch.Tensor, eta: torch.Tensor) -> int:
        """Move weight eta [M, B] (float64, >= 0) of examples ``index`` [B] from atom ``away`` [M, B] (S: the
        residual) to the labelling ``vertex`` [M, B, n]: into its slot if held, else a free slot, else the slot of
        least weight, whose mass joins the residual. Returns the number of such evictions."""
        Y, A = self.gather(index)
        M, B, S, n = Y.shape
        A = A.scatter_add(-1, away.clamp_max(S - 1)[..., None], torch.where(away < S, -eta, 0.0)[..., None])
        A = torch.where(A < self.MIN_WEIGHT, 0.0, A)
        held = (Y == vertex[:, :, None, :]).all(-1) & (A > 0)
        has, free = held.any(-1), A == 0
        slot = torch.where(has, held.to(torch.int8).argmax(-1),
                           torch.where(free.any(-1), free.to(torch.int8).argmax(-1), A.argmin(-1)))
        moved = eta > 0
        kept = torch.where(has, A.gather(-1, slot[..., None]).squeeze(-1), 0.0)
        A = torch.where(moved[..., None], A.scatter(-1, slot[..., None], (kept + eta)[..., None]), A)
        Y = torch.where(moved[..., None, None], Y.scatter(2, slot[..., None, None].expand(M, B, 1, n),
                                                          vertex[:, :, None, :]), Y)
        self.labellings[index] = Y.movedim(0, 1).to(self.labellings.dtype)
        self.weights[index] = A.movedim(0, 1)
        return int((moved & ~has & ~free.any(-1)).sum())


def pair_index(Y: torch.Tensor, edges: torch.Tensor, num_states: int) -> torch.Tensor:
    """The flat state index s K + t of each edge (a, b) under labellings Y [M, B, S, n]: [M, B, E, S] (long)."""
    small = torch.uint8 if num_states <= 16 else torch.long  # s K + t < 256
    Y = Y.to(small)
    return (Y.index_select(-1, edges[:, 0]) * num_states + Y.index_select(-1, edges[:, 1])).transpose(-1, -2).long()


def labelling_scores(U: torch.Tensor, P: torch.Tensor, Y: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """<U, m_u(Y)> + <P, m_p(Y)> [M, B, S] for unary U [M, B, n, K], pairwise P [M, B or 1, E, K, K] and
    labellings Y [M, B, S, n] (long) with their ``pair_index`` [M, B, E, S]."""
    M, B, S, n = Y.shape
    K = U.shape[-1]
    return U.gather(-1, Y.transpose(-1, -2)).sum(-2) + P.flatten(-2).expand(M, B, -1, K * K).gather(-1, pairs).sum(-2)


def weighted_marginals(Y: torch.Tensor, pairs: torch.Tensor, A: torch.Tensor, num_states: int, dtype: torch.dtype
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_j A_j m(Y_j): unary [M, B, n, K] and pairwise [M, B, E, K, K] for labellings Y [M, B, S, n] (long) with
    their ``pair_index`` [M, B, E, S] and weights A [M, B, S]."""
    M, B, S, n = Y.shape
    E, K, A = pairs.shape[2], num_states, A.to(dtype)
    unary = torch.zeros(M, B, n, K, dtype=dtype, device=Y.device)
    unary.scatter_add_(-1, Y.transpose(-1, -2), A[:, :, None, :].expand(M, B, n, S))
    pair = torch.zeros(M, B, E, K * K, dtype=dtype, device=Y.device)
    pair.scatter_add_(-1, pairs, A[:, :, None, :].expand(M, B, E, S))
    return unary, pair.unflatten(-1, (K, K))
