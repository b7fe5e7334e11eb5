"""Baseline learners: Independent (Empty), FixedTree (M3N on a given tree, e.g. Chow-Liu)."""

from __future__ import annotations

import torch

from ..energies import FinleyJoachimsEnergy
from ..graph import Graph
from .base import StructuredLearner

__all__ = ["Independent", "FixedTree"]


class Independent(StructuredLearner):
    """Empty structure: one linear max-margin classifier per label (CRANK's Empty baseline)."""

    def build_energy(self) -> FinleyJoachimsEnergy:
        n = self.hparams.num_labels
        return FinleyJoachimsEnergy(self.hparams.num_features, n, Graph.empty(n))


class FixedTree(StructuredLearner):
    """M3N (Finley-Joachims energy) on a fixed tree or forest over the labels.

    Args:
        edges: the tree as a list of label pairs [[i, j], ...] (kept in the hyper-parameters so a
            checkpoint rebuilds the same model); ``train.py`` passes the Chow-Liu tree of the
            training labels when ``model.tree=chow_liu``.
        Other args as ``StructuredLearner``.
    """

    def __init__(self, num_features: int, num_labels: int, edges: list[list[int]] | None = None, **kwargs) -> None:
        self._edges = torch.as_tensor(edges if edges is not None else [], dtype=torch.long).reshape(-1, 2)
        super().__init__(num_features, num_labels, **kwargs)
        self.save_hyperparameters({"edges": self._edges.tolist()})

    def build_energy(self) -> FinleyJoachimsEnergy:
        graph = Graph(self.hparams.num_labels, self._edges)
        if not graph.is_forest:
            raise ValueError(f"FixedTree needs a tree or forest over the labels, got edges {self._edges.tolist()}")
        return FinleyJoachimsEnergy(self.hparams.num_features, self.hparams.num_labels, graph)
