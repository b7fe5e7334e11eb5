"""RTA's energy: joint features varphi(x) kron psi_ij(y_i, y_j) on the edges of T random spanning trees.

Marchand, Su, Morvant, Rousu, Shawe-Taylor (NIPS 2014), Sec. 2-4: tree T_t scores its own edges,
F_t(x, y) = <w_t, phi_hat_t(x, y)>, with phi_t = (varphi(x) kron psi_ij(y_i, y_j))_(ij in T_t) and
phi_hat_t = phi_t / |phi_t| (unit norm: varphi(x) of unit norm, psi one-hot over the K^2 edge labels,
n - 1 edges, so |phi_t| = sqrt(n - 1)); the ensemble's score is the mean F(x, y) = (1/T) sum_t F_t (eq. 3
with uniform q), what ``ensemble_map`` maximises.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..graph import Graph, check_float, check_int
from ..potentials import Potentials
from .base import Energy
from .linear import check_num_models, feature_gram

__all__ = ["FEATURE_MAPS", "TreeEnsembleEnergy", "additive_part"]

#: TreeEnsembleEnergy's varphi(x): x / |x| (the paper's), x / sqrt(D), x as given
FEATURE_MAPS = ("row", "global", "none")


def _feature_map(normalize: bool | str) -> str:
    """normalize (True, False or a name in ``FEATURE_MAPS``) as a name."""
    if isinstance(normalize, bool):
        return "row" if normalize else "none"
    if normalize not in FEATURE_MAPS:
        raise ValueError(f"normalize must be True, False or one of {FEATURE_MAPS}, got {normalize!r}")
    return normalize


def additive_part(table: torch.Tensor) -> torch.Tensor:
    """The orthogonal projection of tables t [..., K, K] onto sums a(y_i) + b(y_j): row mean + column mean - mean."""
    return table.mean(-1, keepdim=True) + table.mean(-2, keepdim=True) - table.mean((-1, -2), keepdim=True)


class TreeEnsembleEnergy(Energy):
    """Per-tree edge weights on an ensemble of spanning trees (RTA).

    Args:
        num_features: D, the size of x.
        trees: an ensemble ``Graph`` with edges [T, n-1, 2] (e.g. ``random_spanning_trees``).
        num_states: K labels per node (2 for multilabel).
        bias: a weight per (tree, edge, edge label) on a constant input (regularised like the biases of
            the other energies).
        normalize: varphi(x), one of ``FEATURE_MAPS``: "row" (or True): x / |x|, each row of unit norm, the paper's
            phi_hat; "global": x / sqrt(D) (unit mean squared norm for standardised inputs), or x divided by the
            training rows' root mean squared norm once ``set_feature_map`` has seen them; rows keep their relative
            norms; with either, each tree's features are scaled by 1 / sqrt(n-1). "none" (or False): x as given, no
            scaling. ``set_feature_map`` switches between "row" and "global" (``RTA``'s normalize="auto").
        num_models: M models trained at once (regularisation grid, CV folds), or None.
        interaction_l2: the l2 weight of the input-dependent interaction part of each edge table, relative to the
            rest (1: the paper's psi_ij). The weights' table over (y_i, y_j) splits orthogonally into a sum of terms
            in y_i and in y_j (``additive_part``) and the interaction; the interaction's joint features are scaled
            by gamma = 1 / sqrt(interaction_l2), which is the same as weighting its l2 that much more; inf: no
            input-dependent interaction (gamma = 0). The biases' tables (input-independent interactions) keep
            weight 1.

    Potentials: unary zeros [(M,) B, n, K]; pairwise [(M,) B, T, n-1, K, K]. Parameters: weight
    [(M,) T, n-1, K*K, D], bias [(M,) T, n-1, K*K]. Buffers (checkpointed): ``tree_edges``, the trees,
    ``feature_map_index``, the feature map's index in ``FEATURE_MAPS``, and ``global_norm``, "global"'s divisor
    (sqrt(D) until ``set_feature_map`` sees training rows).
    """

    is_linear = True

    def __init__(self, num_features: int, trees: Graph, num_states: int = 2, bias: bool = True,
                 normalize: bool | str = True, num_models: int | None = None, interaction_l2: float = 1.0) -> None:
        super().__init__()
        check_num_models(num_models)
        self.set_interaction_l2(interaction_l2)
        if not isinstance(trees, Graph) or not trees.is_ensemble:
            raise ValueError(f"trees must be an ensemble Graph with edges [T, n-1, 2], got {trees!r}")
        trees.require_spanning_trees("TreeEnsembleEnergy")
        check_int(num_states, "num_states", 2)
        self.graph, self.num_states, self.num_models = trees, num_states, num_models
        lead = () if num_models is None else (num_models,)
        T, E = trees.num_graphs, trees.num_edges
        self.weight = nn.Parameter(torch.zeros(*lead, T, E, num_states ** 2, num_features))
        self.bias = nn.Parameter(torch.zeros(*lead, T, E, num_states ** 2)) if bias else None
        self.register_buffer("tree_edges", trees.edges.clone())
        self.register_buffer("feature_map_index", torch.tensor(FEATURE_MAPS.index(_feature_map(normalize))))
        self.register_buffer("global_norm", torch.tensor(math.sqrt(num_features)))  # "global"'s divisor

    @property
    def feature_map(self) -> str:
        """varphi's name in ``FEATURE_MAPS``."""
        return FEATURE_MAPS[int(self.feature_map_index)]

    def set_feature_map(self, name: str, x: torch.Tensor | None = None) -> None:
        """Switch varphi between "row" and "global" (both unit norm on average: the weights' scale means the same);
        with training rows x [N, D], "global" divides by their root mean squared norm instead of sqrt(D)."""
        if name not in ("row", "global") or self.feature_map == "none":
            raise ValueError(f"set_feature_map switches between 'row' and 'global' on a normalised energy, got "
                             f"{name!r} on {self.feature_map!r}")
        self.feature_map_index.fill_(FEATURE_MAPS.index(name))
        if x is not None:
            self.global_norm.fill_(float(x.double().pow(2).sum(-1).mean().sqrt()))

    def set_interaction_l2(self, interaction_l2: float) -> None:
        """Set the input-dependent interaction's l2 weight (see the class): gamma = 1 / sqrt(interaction_l2)."""
        check_float(interaction_l2, "interaction_l2", 0.0, expected="a number > 0 (inf: no input-dependent "
                    "interaction)")
        self.interaction_l2 = float(interaction_l2)

    @property
    def interaction_scale(self) -> float:
        """gamma = 1 / sqrt(interaction_l2): the weight of the interaction's joint features (0 at inf)."""
        return 1.0 / math.sqrt(self.interaction_l2)

    @property
    def tree_scale(self) -> float:
        """1 / |phi_t| with varphi(x) of unit norm: phi_hat_t = phi_t / sqrt(n - 1); 1 without normalising."""
        E = self.graph.num_edges
        return 1.0 / math.sqrt(E) if self.feature_map != "none" and E else 1.0

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """varphi(x) [B, D] (``feature_map``): x / |x|, x / ``global_norm`` or x."""
        name = self.feature_map
        if name == "none":
            return x
        if name == "global":
            return x / self.global_norm.to(x.dtype)
        return x / x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)

    def forward(self, x: torch.Tensor) -> Potentials:
        """x [B, D] -> Potentials (unary [(M,) B, n, K] zeros, pairwise [(M,) B, T, n-1, K, K])."""
        K, n = self.num_states, self.graph.num_nodes
        s = torch.einsum("...tecd,bd->...btec", self.weight, self.features(x))  # [(M,) B, T, n-1, K*K]
        s = self.scale_interaction(s.unflatten(-1, (K, K))).flatten(-2)
        if self.bias is not None:
            s = s + self.bias.unsqueeze(-4)
        pair = (s * self.tree_scale).unflatten(-1, (K, K))
        unary = s.new_zeros(*s.shape[:-3], n, K)
        return Potentials(unary, pair, self.graph)

    def pairwise_weights(self) -> torch.Tensor:
        """|w_t,e| [(M,) T, n-1]: the norm of each tree edge's weights (what the ensemble relies on)."""
        w = self.weight.detach().flatten(-2).pow(2).sum(-1)
        if self.bias is not None:
            w = w + self.bias.detach().pow(2).sum(-1)
        return w.sqrt()

    def block_gram(self, x: torch.Tensor, d_unary: torch.Tensor, d_pair: torch.Tensor, bias_scale: float,
                   summed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-node [(M,) n, B, B] (zeros: no unary parameters) and per-edge [(M,) T(n-1), B, B] Gram parts of
        the per-example gradients of <pot(x_b), d_b>, or with ``summed`` their sums [(M,) B, B], with d_pair
        [(M,) B, T(n-1), K, K] in the flat layout of ``lift_models`` (pairwise / T, trees one after the other); see
        ``FinleyJoachimsEnergy.block_gram``."""
        T, B = self.graph.num_graphs, x.shape[0]
        gram = f"...beij,...ceij->...{'' if summed else 'e'}bc"
        plain, bias = torch.einsum(gram, d_pair, d_pair), bias_scale if self.bias is not None else None
        if self.interaction_scale == 1.0:
            pair = plain * feature_gram(self.features(x), bias)
        else:  # the weights' part of the gradient is scale_interaction(d) (a symmetric operator), the biases' d
            scaled = self.scale_interaction(d_pair)
            pair = torch.einsum(gram, scaled, scaled) * feature_gram(self.features(x), None) + plain * (bias or 0.0)
        nodes = d_unary.new_zeros(*d_unary.shape[:-3], *(() if summed else (self.graph.num_nodes,)), B, B)
        return nodes, pair * (self.tree_scale / T) ** 2

    def scale_interaction(self, table: torch.Tensor) -> torch.Tensor:
        """An edge table [..., K, K] with its interaction part (``additive_part``'s rest) times gamma."""
        if self.interaction_scale == 1.0:
            return table
        additive = additive_part(table)
        return additive + self.interaction_scale * (table - additive)
