"""Synthetic tree-structured multi-label data (Meshi, Eban, Elidan, Globerson, UAI 2013, Fig. 1).

A uniformly random spanning tree T over the n labels is drawn (a random Pruefer sequence),
then weights on T: unary ``w_i ~ N(0, I_D)`` and pairwise ``w_ij ~ N(m, s^2)`` (m = 0 in the paper). Inputs are
``x ~ N(0, I_D)`` and the label vector is the exact MAP of the Finley-Joachims energy

    E(x, y) = sum_i y_i w_i^T x + sum_{(i,j) in T} w_ij y_i y_j,   y in {0, 1}^n,

computed with ``structtorch.inference.tree_map``. The model (tree and weights), the test set and
the training set are drawn from three independent streams of one seed, so changing
``num_train`` changes neither the model nor the test set, and a smaller training set is a
prefix of a larger one (nested learning curves).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..graph import Graph, check_float, check_int
from ..inference import tree_map
from ..potentials import Potentials
from ..structure import pruefer_decode

__all__ = ["CrankSynthetic", "complete_index", "crank_potentials", "crank_synthetic", "random_tree",
           "sparse_multilabel"]


@dataclass(frozen=True)
class CrankSynthetic:
    """A synthetic CRANK dataset and the model that labelled it.

    x_train [N_train, D] float32, y_train [N_train, n] int64 in {0, 1}; same for test.
    tree: the true spanning tree (edges [n-1, 2], each (i, j) with i < j, sorted).
    unary_weights [n, D] float64; pairwise_weights [n-1] float64, aligned with ``tree.edges``.
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    tree: Graph
    unary_weights: torch.Tensor
    pairwise_weights: torch.Tensor

    @property
    def num_labels(self) -> int:
        return self.tree.num_nodes

    @property
    def num_features(self) -> int:
        return int(self.unary_weights.shape[1])

    def potentials(self, x: torch.Tensor) -> Potentials:
        """The true model's potentials for inputs x [N, D]: unary [N, n, 2], pairwise [1, n-1, 2, 2]."""
        return crank_potentials(x, self.unary_weights, self.pairwise_weights, self.tree)

    def label(self, x: torch.Tensor) -> torch.Tensor:
        """Exact MAP labels y [N, n] (int64) of the true model for inputs x [N, D]."""
        return _map_labels(x, self.unary_weights, self.pairwise_weights, self.tree)

    def complete_graph_weights(self) -> torch.Tensor:
        """The pairwise weights [n(n-1)/2] on ``Graph.complete(n)``'s edge order (0 off the tree)."""
        n = self.num_labels
        out = torch.zeros(n * (n - 1) // 2, dtype=self.pairwise_weights.dtype)
        out[self.tree_edge_mask()] = self.pairwise_weights[_complete_order(self.tree)]
        return out

    def tree_edge_mask(self) -> torch.Tensor:
        """bool [n(n-1)/2]: which edges of ``Graph.complete(n)`` belong to the true tree."""
        n = self.num_labels
        mask = torch.zeros(n * (n - 1) // 2, dtype=torch.bool)
        mask[complete_index(self.tree.edges, n)] = True
        return mask


def crank_synthetic(num_train: int, num_test: int, num_labels: int = 10, num_features: int = 4,
                    seed: int = 0, pairwise_scale: float | None = None, pairwise_mean: float = 0.0
                    ) -> CrankSynthetic:
    """Draw a random tree model and label ``num_train`` + ``num_test`` Gaussian inputs by its MAP.

    pairwise_scale: standard deviation s of the edge weights; default ``sqrt(num_features)``,
    the standard deviation of a unary score ``w_i^T x``, so that edges matter as much as inputs.
    pairwise_mean: mean m of the edge weights (default 0, the paper's). A strongly negative m with
    ``pairwise_scale=0`` makes every tree edge an exclusion (two neighbours are never both 1): the labels
    are a maximum-weight independent set of the tree, which no per-label linear classifier represents.
    The same random draws for any m and s, so the tree, the unary weights and the inputs do not change.
    """
    for arg, v, lo in (("num_train", num_train, 0), ("num_test", num_test, 0), ("num_labels", num_labels, 1),
                       ("num_features", num_features, 1)):
        check_int(v, arg, lo)
    scale = float(np.sqrt(num_features)) if pairwise_scale is None else float(pairwise_scale)
    if isinstance(pairwise_mean, bool) or not isinstance(pairwise_mean, (int, float)) or not np.isfinite(pairwise_mean):
        raise ValueError(f"pairwise_mean must be a finite number, got {pairwise_mean!r}")
    model_rng, test_rng, train_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    tree = random_tree(num_labels, model_rng)
    w_unary = torch.from_numpy(model_rng.standard_normal((num_labels, num_features)))
    w_pair = torch.from_numpy(model_rng.standard_normal(num_labels - 1) * scale + float(pairwise_mean))
    x_test = torch.from_numpy(test_rng.standard_normal((num_test, num_features))).float()
    x_train = torch.from_numpy(train_rng.standard_normal((num_train, num_features))).float()
    y_train = _map_labels(x_train, w_unary, w_pair, tree)
    y_test = _map_labels(x_test, w_unary, w_pair, tree)
    return CrankSynthetic(x_train, y_train, x_test, y_test, tree, w_unary, w_pair)


def crank_potentials(x: torch.Tensor, unary_weights: torch.Tensor, pairwise_weights: torch.Tensor,
                     tree: Graph) -> Potentials:
    """Finley-Joachims potentials (float64): unary [N, n, 2] = (0, w_i^T x), pairwise [1, E, 2, 2]
    with only the [1, 1] entry = w_ij. x [N, D], unary_weights [n, D], pairwise_weights [E]."""
    x = x.to(torch.float64)
    score1 = x @ unary_weights.to(torch.float64).T  # [N, n]
    unary = torch.stack([torch.zeros_like(score1), score1], -1)
    pairwise = torch.zeros(1, tree.num_edges, 2, 2, dtype=torch.float64)
    pairwise[0, :, 1, 1] = pairwise_weights.to(torch.float64)
    return Potentials(unary, pairwise, tree)


def random_tree(n: int, rng: np.random.Generator | int | None = None) -> Graph:
    """A uniformly random labelled spanning tree on n nodes (decoded from a random Pruefer sequence)."""
    rng = np.random.default_rng(rng)
    seq = rng.integers(0, n, size=max(0, n - 2)) if n >= 2 else np.zeros(0, dtype=np.int64)
    return pruefer_decode(seq, n)


def _map_labels(x: torch.Tensor, unary_weights: torch.Tensor, pairwise_weights: torch.Tensor,
                tree: Graph) -> torch.Tensor:
    """Exact MAP labels y [N, n] int64 (N may be 0)."""
    if x.shape[0] == 0:
        return torch.zeros(0, tree.num_nodes, dtype=torch.long)
    return tree_map(crank_potentials(x, unary_weights, pairwise_weights, tree))[1]


def complete_index(edges: torch.Tensor, n: int) -> torch.Tensor:
    """Position of each edge (i < j) [E, 2] in ``Graph.complete(n)``'s lexicographic order."""
    i, j = edges.min(-1).values, edges.max(-1).values
    return i * n - i * (i + 1) // 2 + (j - i - 1)


def _complete_order(tree: Graph) -> torch.Tensor:
    """Permutation of the tree's edges into increasing complete-graph position."""
    return complete_index(tree.edges, tree.num_nodes).argsort()


def sparse_multilabel(num_examples: int, num_features: int = 1449, num_labels: int = 45, keywords: int = 8,
                      background: int = 10, seed: int = 0, cardinality: float = 1.25
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Text-like multi-label data shaped like Mulan's medical or enron: sparse binary features, Zipf-distributed
    labels (a few frequent, many with 0-3 positives), about ``cardinality`` labels per example (1.25: medical's;
    enron has 3.38, bibtex 2.40, corel5k 3.52).

    Each example takes 1 + Poisson(cardinality - 1) labels (at most n - 1) drawn with probability ~ 1 / rank^1.3;
    each of its labels turns on 3 of that label's ``keywords`` features, and ``background`` features are drawn with
    probability ~ 1 / rank^0.8. Returns x [N, D] float32 in {0, 1} and y [N, n] int64.
    """
    for arg, v, lo in (("num_examples", num_examples, 1), ("num_features", num_features, 1),
                       ("num_labels", num_labels, 1), ("keywords", keywords, 3), ("background", background, 0)):
        check_int(v, arg, lo)
    cardinality = check_float(cardinality, "cardinality", 1.0, strict=False, finite=True,
                              expected="a finite number >= 1")
    gen = torch.Generator().manual_seed(seed)
    N, D, n = num_examples, num_features, num_labels
    label_p = torch.arange(1, n + 1, dtype=torch.float64) ** -1.3
    feature_p = torch.arange(1, D + 1, dtype=torch.float64) ** -0.8
    words = torch.randint(0, D, (n, keywords), generator=gen)
    extra = torch.poisson(torch.full((N,), cardinality - 1, dtype=torch.float64), generator=gen)
    count = 1 + extra.long().clamp_max(n - 1)
    drawn = torch.multinomial(label_p.expand(N, n), n, generator=gen)  # labels in draw order, without repeats
    y = torch.zeros(N, n, dtype=torch.long).scatter_(1, drawn, (torch.arange(n) < count[:, None]).long())
    pick = torch.rand(N, n, keywords, generator=gen).argsort(-1)[..., :3]  # 3 keywords per label
    hits = words.expand(N, n, keywords).gather(-1, pick)[y.bool()]  # [labels in total, 3]
    rows = torch.arange(N).repeat_interleave(y.sum(1))[:, None].expand(-1, 3)
    x = torch.zeros(N, D)
    x[rows.reshape(-1), hits.reshape(-1)] = 1.0
    if background:
        x.scatter_(1, torch.multinomial(feature_p.expand(N, D), background, generator=gen), 1.0)
    return x, y
