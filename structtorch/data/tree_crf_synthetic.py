"""Synthetic tree-CRF data (Bradley & Guestrin, ICML 2010, Section 5.1 "Synthetic models").

Binary outputs Y_1..Y_n and binary inputs X_1..X_n, one input per output. A *chain* joins
Y_i - Y_{i+1} and X_i - X_{i+1} (a ladder with rungs Y_i - X_i); a *tree* uses the same cliques on the
edges of a random tree drawn by non-preferential random attachment (node i >= 1 joins a uniformly
random earlier node j < i). Optional *cross factors* phi(Y_p, X_c) sit on every tree edge (p, c),
p < c (for the chain: phi(Y_i, X_{i+1})). Factors are given in log space:

* associative: log phi(a, b) = s if a == b else 0;
* random: every log phi(a, b) ~ Uniform[-s, s];

with strengths s_YY, s_YX, s_XX (cross factors: s_YX unless ``cross_strength`` is given). With
``alternating`` the k-th factor of each type (k = 0, 1, ... in edge order, resp. node order for Y-X)
is multiplied by (-1)^k.

Sampling is exact in both modes:

* "tractable": (Y, X) ~ P(Y, X) proportional to the product of all factors, sampled on the tree of
  4-state super-nodes Z_i = (Y_i, X_i) (state 2 y + x) with ``tree_sample``;
* "intractable": x ~ P(X) (the tree over X with the X-X factors only), then y ~ P(Y | x), the tree
  CRF with the Y-Y factors as pairwise and the Y-X and cross factors at x as unary potentials.

The model, the test set and the training set come from three independent streams of one seed, so
changing ``num_train`` changes neither the model nor the test set, and a smaller training set is a
prefix of a larger one (examples are drawn in fixed-size chunks, each from its own seeded generator).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..graph import Graph, check_int
from ..inference import tree_logz, tree_sample
from ..potentials import Potentials
from .synthetic import complete_index

__all__ = ["TreeCRFSynthetic", "random_attachment_tree", "tree_crf_synthetic"]

STRUCTURES = ("tree", "chain")
FACTORS = ("associative", "random")
JOINTS = ("intractable", "tractable")
_CHUNK = 512  # examples per sampling chunk (one seeded generator each): the unit of the prefix property


@dataclass(frozen=True)
class TreeCRFSynthetic:
    """A synthetic tree-CRF dataset and the model that generated it.

    x_train [N_train, n] float32 in {0., 1.}, y_train [N_train, n] int64 in {0, 1}; same for test.
    tree: the true Y-Y tree (edges [n-1, 2], each (i, j) with i < j, sorted lexicographically); the X-X
    factors and the cross factors phi(Y_i, X_j) sit on the same edges.
    Log factor tables (float64): yy [n-1, 2, 2] (``yy[e, a, b]`` scores Y_i = a, Y_j = b for
    (i, j) = tree.edges[e]), xx [n-1, 2, 2] (X_i = a, X_j = b), yx [n, 2, 2] (``yx[i, a, b]``:
    Y_i = a, X_i = b), cross [n-1, 2, 2] (Y_i = a, X_j = b; zeros without cross factors).
    joint: "intractable" or "tractable", how (x, y) were sampled (see the module docstring).
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    tree: Graph
    yy: torch.Tensor
    xx: torch.Tensor
    yx: torch.Tensor
    cross: torch.Tensor
    joint: str = "intractable"

    @property
    def num_labels(self) -> int:
        return self.tree.num_nodes

    @property
    def num_features(self) -> int:
        """One input per label: n."""
        return self.tree.num_nodes

    @property
    def inputs(self) -> list[list[int]]:
        """The true input mapping: label i's local inputs are [i]."""
        return [[i] for i in range(self.num_labels)]

    def tree_edge_mask(self) -> torch.Tensor:
        """bool [n(n-1)/2]: which edges of ``Graph.complete(n)`` belong to the true tree."""
        n = self.num_labels
        mask = torch.zeros(n * (n - 1) // 2, dtype=torch.bool)
        mask[complete_index(self.tree.edges, n)] = True
        return mask

    # ------------------------------------------------------------------ exact models
    def conditional_potentials(self, x: torch.Tensor) -> Potentials:
        """The exact tree CRF P(Y | x) for x [*B, n] in {0, 1}: unary [*B, n, 2] (the Y-X factors at
        x_i plus the cross factors at x_c, added to their parent Y_p), pairwise [n-1, 2, 2] = yy on ``tree``."""
        x = _binary(x, self.num_labels)
        n, edges = self.num_labels, self.tree.edges
        unary = self.yx.permute(0, 2, 1)[torch.arange(n), x]  # [*B, n, 2]: yx[i, :, x_i]
        if self.tree.num_edges:
            cross = self.cross.permute(0, 2, 1)[torch.arange(len(edges)), x[..., edges[:, 1]]]  # [*B, E, 2]
            unary = unary.index_add(-2, edges[:, 0], cross)
        return Potentials(unary, self.yy, self.tree)

    def conditional_log_likelihood(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """log P(y | x) [*B] under the true CRF, for x [*B, n] and y [*B, n] in {0, 1}."""
        pot = self.conditional_potentials(x)
        return pot.score(y) - tree_logz(pot)

    def input_potentials(self) -> Potentials:
        """P(X) of the intractable mode: the tree over X with the X-X factors only (unary [n, 2] zeros)."""
        return Potentials(torch.zeros(self.num_labels, 2, dtype=self.xx.dtype), self.xx, self.tree)

    def joint_potentials(self) -> Potentials:
        """The product of all factors as a tree over super-nodes Z_i = (Y_i, X_i), state 2 y + x:
        unary [n, 4] = yx, pairwise [n-1, 4, 4] with ``[e, 2a+b, 2c+d] = yy[e,a,c] + xx[e,b,d] + cross[e,a,d]``.
        P(Y, X) of the tractable mode."""
        E = self.tree.num_edges
        pair = (self.yy[:, :, None, :, None] + self.xx[:, None, :, None, :]
                + self.cross[:, :, None, None, :])  # [E, a, b, c, d]
        return Potentials(self.yx.reshape(-1, 4), pair.reshape(E, 4, 4), self.tree)

    # ------------------------------------------------------------------ sampling
    def sample_labels(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Exact y [N, n] int64 ~ P(Y | x) for x [N, n]: one ``tree_sample`` for the whole batch."""
        return tree_sample(self.conditional_potentials(x), 1, generator)[0]

    def sample(self, num_samples: int, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact samples of the data distribution (per ``joint``): x [S, n] float32, y [S, n] int64."""
        if self.joint == "tractable":
            z = tree_sample(self.joint_potentials(), num_samples, generator)  # [S, n], state 2 y + x
            return (z % 2).float(), z // 2
        x = tree_sample(self.input_potentials(), num_samples, generator)
        return x.float(), self.sample_labels(x, generator)


def random_attachment_tree(n: int, rng: np.random.Generator | int | None = None) -> Graph:
    """A random tree on n nodes by non-preferential random attachment: node i >= 1 joins a uniformly
    random earlier node j < i. Edges (j, i), j < i, sorted lexicographically."""
    rng = np.random.default_rng(rng)
    if n < 2:
        return Graph.empty(max(n, 1))
    child = np.arange(1, n)
    parent = rng.integers(0, child)  # parent[i - 1] uniform in [0, i)
    edges = sorted(zip(parent.tolist(), child.tolist()))
    return Graph(n, torch.tensor(edges, dtype=torch.long))


def tree_crf_synthetic(num_train: int, num_test: int, num_labels: int = 40, structure: str = "tree",
                       factors: str = "associative", strengths: Sequence[float] = (4.0, 2.0, 1.0),
                       alternating: bool = True, cross: bool = True, cross_strength: float | None = None,
                       joint: str = "intractable", seed: int = 0) -> TreeCRFSynthetic:
    """Draw a synthetic model (Bradley & Guestrin 2010, Section 5.1) and ``num_train`` + ``num_test``
    exact samples from it.

    structure: "tree" (random attachment) or "chain"; factors: "associative" or "random";
    strengths: (s_YY, s_YX, s_XX) >= 0; alternating: flip the sign of every other factor of each type;
    cross: add phi(Y_p, X_c) on every tree edge (p, c), strength ``cross_strength`` (default s_YX);
    joint: "intractable" (x ~ P(X), y ~ P(Y | x)) or "tractable" ((y, x) ~ P(Y, X)).
    The defaults are the paper's Figures 3 / 4 setting. ValueError for bad arguments.
    """
    s_yy, s_yx, s_xx, s_cross = _check_args(num_train, num_test, num_labels, structure, factors, strengths,
                                            cross_strength, joint)
    model_rng, test_rng, train_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    n = num_labels
    tree = random_attachment_tree(n, model_rng) if structure == "tree" else Graph.chain(n)
    table = lambda num, s: _factor_table(num, s, factors, alternating, model_rng)  # noqa: E731
    yy, yx, xx = table(n - 1, s_yy), table(n, s_yx), table(n - 1, s_xx)
    cross_table = table(n - 1, s_cross) if cross else torch.zeros(n - 1, 2, 2, dtype=torch.float64)
    no_x, no_y = torch.zeros(0, n), torch.zeros(0, n, dtype=torch.long)
    model = TreeCRFSynthetic(no_x, no_y, no_x, no_y, tree, yy, xx, yx, cross_table, joint)
    x_test, y_test = _sample_split(model, num_test, test_rng)
    x_train, y_train = _sample_split(model, num_train, train_rng)
    return replace(model, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def _factor_table(num: int, strength: float, factors: str, alternating: bool,
                  rng: np.random.Generator) -> torch.Tensor:
    """num log factor tables [num, 2, 2] (float64), associative or Uniform[-s, s], signs (-1)^k if alternating."""
    if factors == "associative":
        table = np.broadcast_to(strength * np.eye(2), (num, 2, 2)).copy()
    else:
        table = rng.uniform(-strength, strength, size=(num, 2, 2))
    if alternating:
        table *= ((-1.0) ** np.arange(num))[:, None, None]
    return torch.from_numpy(table)


def _sample_split(model: TreeCRFSynthetic, num: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """num exact samples (x [num, n] float32, y [num, n] int64), drawn in chunks of ``_CHUNK`` examples,
    chunk k from a generator seeded by the k-th draw of ``rng``: the first m samples do not depend on num."""
    seeds = rng.integers(0, 2**63 - 1, size=math.ceil(num / _CHUNK))
    parts = [model.sample(_CHUNK, torch.Generator().manual_seed(int(s))) for s in seeds]
    x, y = (torch.cat(p)[:num] for p in zip(*parts))
    return x.contiguous(), y.contiguous()


def _binary(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [*B, n] with values in {0, 1} as a LongTensor; ValueError otherwise."""
    x = torch.as_tensor(x)
    if x.dim() < 1 or x.shape[-1] != n:
        raise ValueError(f"x must have shape [*B, n={n}], got {tuple(x.shape)}")
    if ((x != 0) & (x != 1)).any():
        raise ValueError("x must hold binary values (0 or 1)")
    return x.long()


def _check_args(num_train: int, num_test: int, num_labels: int, structure: str, factors: str,
                strengths: Sequence[float], cross_strength: float | None, joint: str
                ) -> tuple[float, float, float, float]:
    """Validate ``tree_crf_synthetic``'s arguments; returns (s_YY, s_YX, s_XX, s_cross)."""
    for arg, v, lo in (("num_train", num_train, 1), ("num_test", num_test, 1), ("num_labels", num_labels, 2)):
        check_int(v, arg, lo)
    for arg, v, allowed in (("structure", structure, STRUCTURES), ("factors", factors, FACTORS),
                            ("joint", joint, JOINTS)):
        if v not in allowed:
            raise ValueError(f"{arg} must be one of {', '.join(map(repr, allowed))}, got {v!r}")
    try:
        values = [float(s) for s in strengths]
    except (TypeError, ValueError) as err:
        raise ValueError(f"strengths must be three numbers (Y-Y, Y-X, X-X), got {strengths!r}") from err
    if len(values) != 3:
        raise ValueError(f"strengths must be three numbers (Y-Y, Y-X, X-X), got {strengths!r}")
    s_cross = values[1] if cross_strength is None else float(cross_strength)
    for name, s in zip(("strengths[0] (Y-Y)", "strengths[1] (Y-X)", "strengths[2] (X-X)", "cross_strength"),
                       (*values, s_cross)):
        if not (math.isfinite(s) and s >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {s!r}")
    return values[0], values[1], values[2], s_cross
