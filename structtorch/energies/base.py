"""The base of every energy: an ``nn.Module`` mapping inputs to ``Potentials`` on ``self.graph``."""

from __future__ import annotations

import torch
from torch import nn

from ..graph import Graph

__all__ = ["Energy"]


class Energy(nn.Module):
    """Base class: maps inputs x [B, D] to ``Potentials`` on ``self.graph``.

    Subclasses implement ``forward(x) -> Potentials``; they may override ``pairwise_weights`` (the
    per-edge weights a structure regulariser acts on, and what structure pictures show) and
    ``restrict`` (learners whose structure is learned from data build the energy on a candidate
    graph, then keep an edge subset).
    """

    graph: Graph
    #: True when score(x, y) = <pot(x; w), m(y)> is linear in the parameters w with no offset: the
    #: certified solvers (``structtorch.solvers``) need it
    is_linear: bool = False

    def pairwise_weights(self) -> torch.Tensor | None:
        """Scalar weight per edge [E] for structure regularisers and pictures, or None."""
        return None

    def stored_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """The inputs x [N, D] laid out for this energy's repeated forward passes over row slices of them (a
        solver that holds its training set for the whole fit stores them so, once): x itself by default; the linear
        energies' may be ``inputs.SparseInputs`` (products through the nonzeros of sparse rows)."""
        return x

    def label_bias(self) -> torch.Tensor | None:
        """For binary labels: the parameter [(M,) n] whose entry l adds to state 1's unary score of label l in every
        row (the certified L-BFGS solver moves it alone at each certificate for a second dual point, and a CRF's
        iterate with it where that lowers the objective: ``SmoothedLBFGS.moved_biases``), or None."""
        return None

    def edge_bias(self) -> torch.Tensor | None:
        """The parameter [(M,) E, K, K] whose entry (e, a, b) adds to edge e's pairwise score at states (a, b) in every
        row (a CRF's certificate moves it after the labels' biases, edge by edge, as a block step where that lowers
        its objective: ``SmoothedLBFGS.moved_biases``), or None."""
        return None

    def restrict(self, mask: torch.Tensor) -> None:
        """Keep only the edges of ``self.graph`` where ``mask`` [E] (bool) is True, with their weights.

        Called by ``StructuredLearner.set_structure`` before the optimizer exists (and when a
        checkpoint is loaded), so parameters may be replaced.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support restrict(mask); implement it to let "
                                  f"a learner choose its edges from data")

    def _restricted_graph(self, mask: torch.Tensor) -> tuple[Graph, torch.Tensor]:
        """(subgraph, mask as a bool tensor on the parameters' device) after validating ``mask``."""
        mask = torch.as_tensor(mask)
        if mask.dtype != torch.bool or mask.shape != (self.graph.num_edges,):
            raise ValueError(f"restrict(mask): mask must be a bool tensor of shape [{self.graph.num_edges}] "
                             f"(one entry per edge of {self.graph!r}), got {mask.dtype} {tuple(mask.shape)}")
        return Graph.from_mask(mask, self.graph), mask
