"""Baseline learners: Independent (Empty), FixedTree (M3N on a given tree, e.g. Chow-Liu), Full
(complete graph, LP relaxation)."""

from __future__ import annotations

import torch

from ..energies import FinleyJoachimsEnergy
from ..graph import Graph
from ..inference import lp_map, smoothed_lp
from ..losses import hamming_augment
from ..potentials import Potentials
from .base import StructuredLearner

__all__ = ["Independent", "FixedTree", "Full"]


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


class Full(StructuredLearner):
    """Full baseline of CRANK: the Finley-Joachims energy on the complete label graph.

    Training: structured hinge whose loss-augmented max is the entropy-smoothed LP value
    (``smoothed_lp``, an upper bound, so the loss upper-bounds the LP-relaxed hinge), with each
    training example's messages warm-started from the previous epoch. Prediction: smoothed LP at
    ``predict_eps`` decoded by node pseudo-marginals, or the exact LP (``test_inference="lp_map"``,
    scipy HiGHS, CPU, per example).

    Args:
        eps / iters / tol: smoothing and sweeps of the training inference.
        predict_eps / predict_iters: the same for prediction (cold start).
        test_inference: "smoothed_lp" or "lp_map". Other args as ``StructuredLearner``.
    """

    def __init__(self, num_features: int, num_labels: int, eps: float = 0.01, iters: int = 20, tol: float = 1e-4,
                 predict_eps: float = 0.005, predict_iters: int = 300, test_inference: str = "smoothed_lp",
                 **kwargs) -> None:
        if test_inference not in ("smoothed_lp", "lp_map"):
            raise ValueError(f"Full: test_inference must be 'smoothed_lp' or 'lp_map', got {test_inference!r}")
        super().__init__(num_features, num_labels, test_inference=self._predict_labels, **kwargs)
        self.save_hyperparameters({"test_inference": test_inference})
        self.register_buffer("messages", torch.zeros(0), persistent=False)  # [N_train, E, 2, K] warm starts

    def build_energy(self) -> FinleyJoachimsEnergy:
        n = self.hparams.num_labels
        return FinleyJoachimsEnergy(self.hparams.num_features, n, Graph.complete(n))

    def loss(self, pot: Potentials, y: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        hp = self.hparams
        aug = hamming_augment(pot, y, hp.margin_scale)
        res = smoothed_lp(aug, hp.eps, hp.iters, messages=self._warm_start(index, aug), tol=hp.tol)
        if index is not None:
            self.messages[index] = res.messages
        return res.value - pot.score(y)

    def _warm_start(self, index: torch.Tensor | None, pot: Potentials) -> torch.Tensor | None:
        """Stored messages of these examples (zeros the first time), growing the store as needed."""
        if index is None:
            return None
        E, K = pot.graph.num_edges, pot.num_states
        need = int(index.max()) + 1
        if self.messages.shape[0] < need:
            grown = pot.unary.new_zeros(max(need, 2 * self.messages.shape[0]), E, 2, K)
            if self.messages.numel():
                grown[: self.messages.shape[0]] = self.messages
            self.messages = grown
        return self.messages[index]

    def _predict_labels(self, pot: Potentials) -> torch.Tensor:
        hp = self.hparams
        if hp.test_inference == "lp_map":
            return lp_map(pot).assignment
        return smoothed_lp(pot, hp.predict_eps, hp.predict_iters, tol=hp.tol * hp.predict_eps / hp.eps).assignment
