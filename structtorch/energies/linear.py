"""Linear energies x -> Potentials for multilabel prediction.

Both energies are linear in their parameters (no constant offset), so score(x, y) =
<pot(x; theta), m(y)> is linear in theta: what the dual solvers in ``structtorch.solvers`` rely on.
With ``num_models=M`` every parameter gets a leading model dim [M] (a regularisation grid or CV
folds trained as one batched model) and the potentials come out [M, B, ...].
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..graph import Graph, check_bool, check_float, check_int
from ..inputs import SparseInputs
from ..potentials import Potentials
from .base import Energy

__all__ = ["BatchedLinear", "FinleyJoachimsEnergy", "LinearTableEnergy", "affine", "as_graph", "check_num_models",
           "feature_gram"]


def as_graph(graph: Graph | None, num_labels: int) -> Graph:
    """``graph``, or the graph without edges on ``num_labels`` nodes when it is None."""
    return Graph.empty(num_labels) if graph is None else graph


def check_num_models(num_models: int | None) -> None:
    """ValueError unless ``num_models`` (the leading model dim M of a batched energy) is None or an int >= 1."""
    if num_models is not None:
        check_int(num_models, "num_models", 1, expected="None or a positive int")


def affine(x: torch.Tensor | SparseInputs, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x w^T + b [(M,) B, out] of rows x [B, D] (a tensor, or ``SparseInputs``: through their nonzeros), weight
    [(M,) out, D] and bias [(M,) out] (or None)."""
    if isinstance(x, SparseInputs):
        out = x.linear(weight)
    elif weight.dim() == 2:
        return F.linear(x, weight, bias)
    else:
        out = torch.einsum("mod,bd->mbo", weight, x)
    return out if bias is None else out + bias.unsqueeze(-2)


class BatchedLinear(nn.Module):
    """M independent linear maps applied to shared inputs: x [B, D] -> [M, B, out].

    weight [M, out, D], bias [M, out] (None without bias). ``init="zeros"`` or ``"uniform"``
    (nn.Linear's default distribution, U(-1/sqrt(D), 1/sqrt(D)), drawn per model).
    """

    def __init__(self, num_models: int, in_features: int, out_features: int, bias: bool = True,
                 init: str = "zeros") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_models, out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(num_models, out_features)) if bias else None
        if init == "uniform":
            bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
            for p in self.parameters():
                nn.init.uniform_(p, -bound, bound)

    def forward(self, x: torch.Tensor | SparseInputs) -> torch.Tensor:
        return affine(x, self.weight, self.bias)


def feature_gram(x: torch.Tensor, bias_scale: float | None) -> torch.Tensor:
    """x_b . x_c (+ bias_scale) [B, B]: the Gram of a linear layer's per-example inputs (bias included)."""
    return x @ x.T + (bias_scale if bias_scale is not None else 0.0)


class FinleyJoachimsEnergy(Energy):
    """Binary multilabel energy of Finley & Joachims: score(x, y) = sum_i y_i (w_i^T x + b_i)
    + sum_(ij in E) w_ij y_i y_j, y in {0, 1}^n.

    ``spin=True``: the pairwise score is the Ising coupling w_ij s_i s_j of the spins s = 2y - 1 in {-1, +1}
    (table w_ij [[1, -1], [-1, 1]]). The same family of score functions (with the biases), but the l2 on
    w_ij now prices a coupling together with its shift of both labels' biases, a 16x cheaper interaction
    4 w_ij y_i y_j: the parametrisation that reproduces CRANK's published Table 1.

    Potentials: unary [B, n, 2] (state 0 scores 0), pairwise [E, 2, 2] (only [1, 1] non-zero, or
    w_ij times the spin table; shared across the batch). With ``num_models=M``: parameters unary.weight [M, n, D],
    unary.bias [M, n], edge_weight [M, E]; unary [M, B, n, 2], pairwise [M, 1, E, 2, 2].
    ``edge_mask`` (bool [(M,) E] buffer, default all True) gives each model its own edge subset: the
    weights outside it score nothing (and get no gradient), e.g. one forest per model of a structure search.
    """

    is_linear = True

    def __init__(self, num_features: int, num_labels: int, graph: Graph | None = None, bias: bool = True,
                 num_models: int | None = None, spin: bool = False) -> None:
        super().__init__()
        check_num_models(num_models)
        check_bool(spin, "spin")
        self.spin = spin
        self.graph = as_graph(graph, num_labels)
        if self.graph.num_nodes != num_labels or self.graph.is_ensemble:
            raise ValueError(f"graph must be a single graph on num_labels={num_labels} nodes, got {self.graph}")
        self.num_models = num_models
        if num_models is None:
            self.unary = nn.Linear(num_features, num_labels, bias=bias)
            nn.init.zeros_(self.unary.weight)
            if bias:
                nn.init.zeros_(self.unary.bias)
            self.edge_weight = nn.Parameter(torch.zeros(self.graph.num_edges))
        else:
            self.unary = BatchedLinear(num_models, num_features, num_labels, bias=bias)
            self.edge_weight = nn.Parameter(torch.zeros(num_models, self.graph.num_edges))
        self.register_buffer("edge_mask", torch.ones(self.edge_weight.shape, dtype=torch.bool), persistent=False)
        # [2, 2] the edge table per unit of w_ij: [[0, 0], [0, 1]] (y_i y_j) or [[1, -1], [-1, 1]] (s_i s_j)
        table = [[1.0, -1.0], [-1.0, 1.0]] if spin else [[0.0, 0.0], [0.0, 1.0]]
        self.register_buffer("pair_table", torch.tensor(table), persistent=False)

    def stored_inputs(self, x: torch.Tensor | SparseInputs) -> torch.Tensor | SparseInputs:
        """x [N, D] as ``SparseInputs`` where they are sparse up to a constant row (``SPARSE_PRODUCT_DENSITY``; a
        standardised sparse feature matrix), whose products go through the nonzeros; else x."""
        return SparseInputs.stored(x)

    def forward(self, x: torch.Tensor | SparseInputs) -> Potentials:
        s1 = affine(x, self.unary.weight, self.unary.bias)  # [(M,) B, n]
        unary = torch.stack([torch.zeros_like(s1), s1], -1)
        w = self.edge_weight * self.edge_mask  # [(M,) E]
        pair = w[..., None, None] * self.pair_table
        if self.num_models is not None:
            pair = pair.unsqueeze(1)
        return Potentials(unary, pair, self.graph)

    def pairwise_weights(self) -> torch.Tensor:
        return self.edge_weight

    def label_bias(self) -> torch.Tensor | None:
        return self.unary.bias

    def restrict(self, mask: torch.Tensor) -> None:
        """Keep the edges where ``mask`` [E] is True, with their weights."""
        self.graph, mask = self._restricted_graph(mask)
        self.edge_weight = nn.Parameter(self.edge_weight.detach()[..., mask.to(self.edge_weight.device)].clone())
        self.edge_mask = self.edge_mask[..., mask.to(self.edge_mask.device)].clone()

    def block_gram(self, x: torch.Tensor, d_unary: torch.Tensor, d_pair: torch.Tensor, bias_scale: float,
                   summed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Gram matrices of the per-example gradients of <pot(x_b), d_b>, split by node and edge.

        x [B, D]; d_unary [(M,) B, n, 2], d_pair [(M,) B, E, 2, 2]. Returns node parts [(M,) n, B, B] and
        edge parts [(M,) E, B, B]: the inner product of the gradients (w.r.t. the parameters, bias
        coordinates weighted by ``bias_scale``) of <pot(x_b), d_b> and <pot(x_c), d_c>, both restricted
        to a node/edge subset, is the sum of its parts (each node and edge owns disjoint parameters).
        ``summed``: the sums over the nodes and over the edges instead, [(M,) B, B] each (one block per example).
        """
        feat = feature_gram(x, bias_scale if self.unary.bias is not None else None)
        dp = (d_pair * self.pair_table).sum((-2, -1))  # d <pot, d_b> / d w_ij
        out = "" if summed else "p"  # p: the node or edge index
        return (torch.einsum(f"...bp,...cp->...{out}bc", d_unary[..., 1], d_unary[..., 1]) * feat,
                torch.einsum(f"...bp,...cp->...{out}bc", dp, dp))


class LinearTableEnergy(Energy):
    """General linear energy with K states: unary_i(x)[a] = W_ia^T x + b_ia and a full K x K table
    per edge, either constant or input-dependent (pairwise_e(x)[a, b] = V_eab^T x + c_eab).

    Potentials: unary [B, n, K], pairwise [E, K, K] (constant) or [B, E, K, K] (input-dependent).
    With ``num_models=M``: every parameter gets a leading [M] dim; unary [M, B, n, K], pairwise
    [M, 1, E, K, K] (constant) or [M, B, E, K, K] (input-dependent).

    ``pairwise_l2`` (r > 0) weights the pairwise parameters' l2 against the unary ones' by reparametrisation: the
    pairwise potentials are the pairwise parameters' times r^(-1/2), so lambda/2 |V|^2 on the parameters is
    lambda r / 2 |V'|^2 on the effective tables V' = V / sqrt(r), with every solver and its certificate unchanged.
    """

    is_linear = True

    def __init__(self, num_features: int, num_labels: int, num_states: int = 2, graph: Graph | None = None,
                 input_dependent_pairwise: bool = False, num_models: int | None = None, pairwise_l2: float = 1.0
                 ) -> None:
        super().__init__()
        check_num_models(num_models)
        self.pairwise_scale = check_float(pairwise_l2, "pairwise_l2", 0.0, finite=True) ** -0.5
        self.graph = as_graph(graph, num_labels)
        self.num_states = num_states
        self.num_models = num_models
        E = self.graph.num_edges
        self.input_dependent_pairwise = input_dependent_pairwise
        if num_models is None:
            self.unary = nn.Linear(num_features, num_labels * num_states)
        else:
            self.unary = BatchedLinear(num_models, num_features, num_labels * num_states, init="uniform")
        if input_dependent_pairwise:
            if num_models is None:
                self.pairwise = nn.Linear(num_features, E * num_states ** 2)
                nn.init.zeros_(self.pairwise.weight)
                nn.init.zeros_(self.pairwise.bias)
            else:
                self.pairwise = BatchedLinear(num_models, num_features, E * num_states ** 2)
        else:
            lead = () if num_models is None else (num_models,)
            self.table = nn.Parameter(torch.zeros(*lead, E, num_states, num_states))

    def forward(self, x: torch.Tensor) -> Potentials:
        K, n, E = self.num_states, self.graph.num_nodes, self.graph.num_edges
        u = self.unary(x)
        unary = u.view(*u.shape[:-1], n, K)
        if self.input_dependent_pairwise:
            p = self.pairwise(x)
            pair = p.view(*p.shape[:-1], E, K, K)
        else:
            pair = self.table if self.num_models is None else self.table.unsqueeze(1)
        return Potentials(unary, pair * self.pairwise_scale if self.pairwise_scale != 1.0 else pair, self.graph)

    def restrict(self, mask: torch.Tensor) -> None:
        """Keep the edges where ``mask`` [E] is True, with their tables (or their input-dependent rows)."""
        self.graph, mask = self._restricted_graph(mask)
        if not self.input_dependent_pairwise:
            self.table = nn.Parameter(self.table.detach()[..., mask.to(self.table.device), :, :].clone())
            return
        old = self.pairwise
        rows = mask.to(old.weight.device).repeat_interleave(self.num_states ** 2)
        D = old.weight.shape[-1]
        if self.num_models is None:
            self.pairwise = nn.Linear(D, int(rows.sum()))
        else:
            self.pairwise = BatchedLinear(self.num_models, D, int(rows.sum()))
        self.pairwise.to(old.weight)
        with torch.no_grad():
            self.pairwise.weight.copy_(old.weight[..., rows, :])
            self.pairwise.bias.copy_(old.bias[..., rows])

    def block_gram(self, x: torch.Tensor, d_unary: torch.Tensor, d_pair: torch.Tensor, bias_scale: float,
                   summed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-node [(M,) n, B, B] and per-edge [(M,) E, B, B] Gram parts of the per-example gradients of
        <pot(x_b), d_b>, or with ``summed`` their sums [(M,) B, B] (see ``FinleyJoachimsEnergy.block_gram``);
        d_unary [(M,) B, n, K], d_pair [(M,) B, E, K, K]."""
        feat = feature_gram(x, bias_scale)
        out = "" if summed else "p"  # p: the node or edge index
        nodes = torch.einsum(f"...bpa,...cpa->...{out}bc", d_unary, d_unary) * feat
        pair = torch.einsum(f"...bpij,...cpij->...{out}bc", d_pair, d_pair) * self.pairwise_scale ** 2
        return nodes, pair * feat if self.input_dependent_pairwise else pair
