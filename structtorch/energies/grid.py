"""Grid-image energies: F(x, y) = sum_i u(phi_i, y_i) + sum_ij v(phi_ij, y_i, y_j) (Domke 2013, Sec. 7), one
unary function u and one pairwise function v shared by every position."""

from __future__ import annotations

from ..graph import Graph
from ..inputs import GridInputs
from ..potentials import Potentials
from .base import Energy
from .functions import LocalFunction

__all__ = ["GridEnergy"]


class GridEnergy(Energy):
    """Potentials of ``GridInputs`` on ``graph`` with K states per pixel.

    unary(x)[b, i, k] = scale * u(x.unary[b, i])[k]; pairwise(x)[b, e, k, l] = scale * v(x.pairwise[b, e])[k K + l]
    (k the state of ``edges[e, 0]``). ``scale`` is Domke's eps: u and v are the logistic-regression functions
    of eq. 13 and the energy is eps times them (Alg. 1, step 3).
    """

    def __init__(self, unary: LocalFunction, pairwise: LocalFunction, graph: Graph, num_states: int = 2,
                 scale: float = 1.0) -> None:
        super().__init__()
        K = int(num_states)
        if unary.out_features != K or pairwise.out_features != K * K:
            raise ValueError(f"GridEnergy: the unary function must give K={K} scores and the pairwise K*K={K * K}, "
                             f"got {unary.out_features} and {pairwise.out_features}")
        self.unary_fn, self.pairwise_fn, self.graph = unary, pairwise, graph
        self.num_states, self.scale = K, float(scale)

    def check_inputs(self, x: GridInputs) -> None:
        """ValueError unless x matches the graph (n nodes, E edges) and the functions' feature sizes."""
        if not isinstance(x, GridInputs):
            raise TypeError(f"GridEnergy expects GridInputs (per-pixel and per-edge features), got {type(x).__name__}")
        n, E = self.graph.num_nodes, self.graph.num_edges
        want_u, want_p = (n, self.unary_fn.in_features), (E, self.pairwise_fn.in_features)
        if tuple(x.unary.shape[1:]) != want_u or tuple(x.pairwise.shape[1:]) != want_p:
            got = f"{tuple(x.unary.shape)} and {tuple(x.pairwise.shape)}"
            raise ValueError(f"GridEnergy on {self.graph}: inputs must be unary [B, n={n}, Du={want_u[1]}] and "
                             f"pairwise [B, E={E}, Dp={want_p[1]}], got {got}")

    def forward(self, x: GridInputs) -> Potentials:
        self.check_inputs(x)
        K = self.num_states
        unary = self.scale * self.unary_fn(x.unary)  # [B, n, K]
        pair = self.scale * self.pairwise_fn(x.pairwise).unflatten(-1, (K, K))  # [B, E, K, K]
        return Potentials(unary, pair.to(unary.dtype), self.graph)
