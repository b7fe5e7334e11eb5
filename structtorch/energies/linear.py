"""Linear energies x -> Potentials for multilabel prediction."""

from __future__ import annotations

import torch
from torch import nn

from ..graph import Graph
from ..potentials import Potentials

__all__ = ["Energy", "FinleyJoachimsEnergy", "LinearTableEnergy"]


class Energy(nn.Module):
    """Base class: maps inputs x [B, D] to ``Potentials`` on ``self.graph``.

    Subclasses implement ``forward(x) -> Potentials`` and may override ``pairwise_weights`` (the
    per-edge weights a structure regulariser acts on) and ``set_graph`` (learners that change
    the edge set).
    """

    graph: Graph

    def pairwise_weights(self) -> torch.Tensor | None:
        """Scalar weight per edge [E] for structure regularisers, or None."""
        return None


def _as_graph(graph: Graph | None, num_labels: int) -> Graph:
    return Graph.empty(num_labels) if graph is None else graph


class FinleyJoachimsEnergy(Energy):
    """Binary multilabel energy of Finley & Joachims: score(x, y) = sum_i y_i (w_i^T x + b_i)
    + sum_(ij in E) w_ij y_i y_j, y in {0, 1}^n.

    Potentials: unary [B, n, 2] (state 0 scores 0), pairwise [E, 2, 2] (only [1, 1] non-zero,
    shared across the batch).
    """

    def __init__(self, num_features: int, num_labels: int, graph: Graph | None = None, bias: bool = True) -> None:
        super().__init__()
        self.graph = _as_graph(graph, num_labels)
        if self.graph.num_nodes != num_labels or self.graph.is_ensemble:
            raise ValueError(f"graph must be a single graph on num_labels={num_labels} nodes, got {self.graph}")
        self.unary = nn.Linear(num_features, num_labels, bias=bias)
        nn.init.zeros_(self.unary.weight)
        if bias:
            nn.init.zeros_(self.unary.bias)
        self.edge_weight = nn.Parameter(torch.zeros(self.graph.num_edges))

    def forward(self, x: torch.Tensor) -> Potentials:
        s1 = self.unary(x)  # [B, n]
        unary = torch.stack([torch.zeros_like(s1), s1], -1)
        pair = self.edge_weight.new_zeros(self.graph.num_edges, 2, 2)
        pair = pair.index_put((torch.arange(self.graph.num_edges, device=pair.device),
                               torch.ones((), dtype=torch.long, device=pair.device),
                               torch.ones((), dtype=torch.long, device=pair.device)), self.edge_weight)
        return Potentials(unary, pair, self.graph)

    def pairwise_weights(self) -> torch.Tensor:
        return self.edge_weight


class LinearTableEnergy(Energy):
    """General linear energy with K states: unary_i(x)[a] = W_ia^T x + b_ia and a full K x K table
    per edge, either constant or input-dependent (pairwise_e(x)[a, b] = V_eab^T x + c_eab).

    Potentials: unary [B, n, K], pairwise [E, K, K] (constant) or [B, E, K, K] (input-dependent).
    """

    def __init__(self, num_features: int, num_labels: int, num_states: int = 2, graph: Graph | None = None,
                 input_dependent_pairwise: bool = False) -> None:
        super().__init__()
        self.graph = _as_graph(graph, num_labels)
        self.num_states = num_states
        self.unary = nn.Linear(num_features, num_labels * num_states)
        E = self.graph.num_edges
        self.input_dependent_pairwise = input_dependent_pairwise
        if input_dependent_pairwise:
            self.pairwise = nn.Linear(num_features, E * num_states ** 2)
            nn.init.zeros_(self.pairwise.weight)
            nn.init.zeros_(self.pairwise.bias)
        else:
            self.table = nn.Parameter(torch.zeros(E, num_states, num_states))

    def forward(self, x: torch.Tensor) -> Potentials:
        K, n, E = self.num_states, self.graph.num_nodes, self.graph.num_edges
        unary = self.unary(x).view(*x.shape[:-1], n, K)
        pair = self.pairwise(x).view(*x.shape[:-1], E, K, K) if self.input_dependent_pairwise else self.table
        return Potentials(unary, pair, self.graph)
