"""Log-linear factors on local inputs (the tree CRFs of Bradley & Guestrin, ICML 2010).

Label i sees the input columns X_i (its input mapping); an edge (i, j) sees X_ij = X_i u X_j:

    unary_i(x)[a]     = U_ia^T x[X_i]  + b_ia
    pairwise_e(x)[a, b] = V_eab^T x[X_ij] + c_eab.

The mapping is data-dependent (e.g. chosen by l1 regression), so it lives in buffers of fixed shape
(saved in checkpoints), set by ``set_inputs`` before training.
"""

from __future__ import annotations

import torch
from torch import nn

from ..graph import Graph
from ..inputs import SparseInputs, linear_tables
from ..potentials import Potentials
from .base import Energy
from .linear import as_graph, check_num_models

__all__ = ["LocalLinearEnergy", "pad_subsets", "pair_inputs"]


class LocalLinearEnergy(Energy):
    """K-state unary and pairwise tables, each linear in its own input columns.

    Args:
        num_features, num_labels: D, n.
        num_inputs: the size k of each label's input set X_i (an edge sees at most 2k columns).
        num_states: K.
        graph: the (candidate) label graph; default complete.
        local_unary: True: unary_i sees X_i; False: every unary sees all D columns.
        num_models: M batched models (a regularisation grid): every parameter gets a leading [M] dim.

    Parameters: unary_weight [(M,) n, Pu, K], unary_bias [(M,) n, K], pair_weight [(M,) E, 2k, K, K],
    pair_bias [(M,) E, K, K]. Buffers: unary_inputs [n, Pu], pair_inputs [E, 2k] (column indices, -1 =
    none). Potentials: unary [(M,) B, n, K], pairwise [(M,) B, E, K, K].
    """

    is_linear = True

    def __init__(self, num_features: int, num_labels: int, num_inputs: int = 10, num_states: int = 2,
                 graph: Graph | None = None, local_unary: bool = False, num_models: int | None = None) -> None:
        super().__init__()
        check_num_models(num_models)
        if not 1 <= num_inputs <= num_features:
            raise ValueError(f"num_inputs must be in [1, num_features={num_features}], got {num_inputs}")
        self.graph = Graph.complete(num_labels) if graph is None else as_graph(graph, num_labels)
        self.num_models, self.num_states, self.local_unary = num_models, num_states, local_unary
        self.num_features = num_features
        n, E, K = num_labels, self.graph.num_edges, num_states
        unary_width = num_inputs if local_unary else num_features
        self.register_buffer("unary_inputs", torch.full((n, unary_width), -1, dtype=torch.long))
        self.register_buffer("pair_inputs", torch.full((E, 2 * num_inputs), -1, dtype=torch.long))
        if not local_unary:
            self.unary_inputs.copy_(torch.arange(num_features).expand(n, num_features))
        lead = () if num_models is None else (num_models,)
        self.unary_weight = nn.Parameter(torch.zeros(*lead, n, unary_width, K))
        self.unary_bias = nn.Parameter(torch.zeros(*lead, n, K))
        self.pair_weight = nn.Parameter(torch.zeros(*lead, E, 2 * num_inputs, K, K))
        self.pair_bias = nn.Parameter(torch.zeros(*lead, E, K, K))

    def set_inputs(self, inputs: list[list[int]]) -> None:
        """Set the input mapping: ``inputs[i]`` = label i's columns (at most ``num_inputs`` each)."""
        n, k = self.unary_inputs.shape[0], self.pair_inputs.shape[1] // 2
        if len(inputs) != n or any(len(s) == 0 for s in inputs):
            raise ValueError(f"inputs must list 1 to {k} input columns for each of the {n} labels")
        unary = pad_subsets(inputs, self.num_features, k)
        if self.local_unary:
            self.unary_inputs.copy_(unary)
        pairs = pair_inputs(inputs, self.graph.edges)
        self.pair_inputs.copy_(pad_subsets(pairs, self.num_features, 2 * k))

    def stored_inputs(self, x: torch.Tensor | SparseInputs) -> torch.Tensor | SparseInputs:
        """x [N, D] as ``SparseInputs`` where its rows are sparse up to a constant row and the unary factors see
        all inputs: every table is then made through the nonzeros (the edges' from z's gathered columns). Else x
        in column-major order (a copy, unless it is already): a column's rows are then contiguous and the forward
        pass gathers the input columns of a row slice without transposing it (at bookmarks' shape, 55,349 x 2,150,
        that transposed copy took 0.7 s of each 4.1 s L-BFGS step)."""
        if isinstance(x, SparseInputs):
            return x
        sparse = None if self.local_unary else SparseInputs.of(x)
        return x.T.contiguous().T if sparse is None else sparse

    def forward(self, x: torch.Tensor | SparseInputs) -> Potentials:
        M = self.num_models
        pair = _local_linear(x, self.pair_inputs, self.pair_weight, M)
        if self.local_unary:
            unary = _local_linear(x, self.unary_inputs, self.unary_weight, M)
        else:  # every unary on all D columns: one product of x (through the nonzeros of SparseInputs), not a copy
            unary = linear_tables(x, self.unary_weight)  # [(M,) B, n, K]
        shared = () if M is None else (slice(None), None)  # the biases [(M,) R, *T] broadcast over the B rows
        return Potentials(unary + self.unary_bias[shared], pair + self.pair_bias[shared], self.graph)

    def label_bias(self) -> torch.Tensor | None:
        """Binary labels: state 1's unary biases [(M,) n], a view of ``unary_bias``. Moving them lifts a CRF's dual
        as it lifts the hinge's (``SmoothedLBFGS.moved_biases``): at delicious' shape (2,000 rows, a tree on the 983
        labels, lambda 0.1) the dual's quadratic term was 1e-4 on the weights and the rest on the biases, and after 150
        L-BFGS iterations (P 69.957) D rose from 65.10 to 68.88 with these moved. Moving the edges' biases at the
        same time (each edge's 2 x 2 table by a Newton step, or along its interaction alone) lowered D: they overlap
        the labels'. A CRF's certificate moves the edges' biases after these, from the marginals there
        (``edge_bias``), and moves the iterate where that lowers its objective (a block step)."""
        return self.unary_bias[..., 1] if self.num_states == 2 else None

    def edge_bias(self) -> torch.Tensor | None:
        """The edges' bias tables ``pair_bias`` [(M,) E, K, K]."""
        return self.pair_bias

    def restrict(self, mask: torch.Tensor) -> None:
        """Keep the edges where ``mask`` [E] is True, with their weights and input columns."""
        self.graph, mask = self._restricted_graph(mask)
        keep = mask.to(self.pair_weight.device)
        self.pair_inputs = self.pair_inputs[keep].clone()
        self.pair_weight = nn.Parameter(self.pair_weight.detach()[..., keep, :, :, :].clone())
        self.pair_bias = nn.Parameter(self.pair_bias.detach()[..., keep, :, :].clone())


def _local_linear(x: torch.Tensor | SparseInputs, inputs: torch.Tensor, weight: torch.Tensor,
                  num_models: int | None) -> torch.Tensor:
    """sum_p weight[(m,) r, p, ...] x[b, inputs[r, p]] [(M,) B, R, *T] of rows x [B, D], inputs [R, P] (-1: none,
    its weight unused) and weight [(M,) R, P, *T], for all M models at once. ``SparseInputs``: through z's gathered
    nonzeros (``SparseInputs.gathered_linear``). Dense rows: the columns are gathered as whole rows of x^T ([R, P, B],
    contiguous copies: on delicious' 982 edges 1.6x faster than gathering [B, R, P] entry by entry, with the
    einsum's layout copies; rows of contiguous entries where x is column-major, ``stored_inputs``) and contracted by
    one batched matmul over R."""
    (R, P), B = inputs.shape, x.shape[0]
    w = weight[None] if num_models is None else weight  # [M, R, P, *T]
    w = w * (inputs >= 0).to(w.dtype).view(1, R, P, *[1] * (w.dim() - 3))  # padded slots' weights unused
    if isinstance(x, SparseInputs):
        flat = w.movedim(1, -1).movedim(1, -1).reshape(-1, R, P)  # [M T, R, P]
        out = x.gathered_linear(inputs, flat).view(B, R, w.shape[0], *w.shape[3:]).movedim(2, 0)  # [M, B, R, *T]
    else:
        cols = x.T.index_select(0, inputs.flatten().clamp(min=0)).view(R, P, B)
        # flatten, not reshape(R, P, -1): with no edges (R = 0) the -1 cannot be inferred
        out = torch.bmm(cols.transpose(1, 2), w.movedim(0, 2).flatten(2)).view(R, B, w.shape[0], *w.shape[3:])
        out = out.permute(2, 1, 0, *range(3, out.dim()))  # [M, B, R, *T]
    return out[0] if num_models is None else out


def pair_inputs(inputs: list[list[int]], edges: torch.Tensor) -> list[list[int]]:
    """X_ij = X_i u X_j (sorted) for every edge (i, j) of ``edges`` [E, 2], from the labels' inputs X_i."""
    return [sorted(set(inputs[i]) | set(inputs[j])) for i, j in edges.tolist()]


def pad_subsets(subsets: list[list[int]], num_columns: int, width: int | None = None) -> torch.Tensor:
    """Column subsets (distinct indices in [0, num_columns)) as a LongTensor [R, width] padded with -1
    (width default: the longest subset)."""
    width = max([len(s) for s in subsets] + [1]) if width is None else width
    out = torch.full((len(subsets), width), -1, dtype=torch.long)
    for r, s in enumerate(subsets):
        if len(s) > width or any(not 0 <= int(c) < num_columns for c in s) or len(set(s)) != len(s):
            raise ValueError(f"input subset {r} must hold at most {width} distinct column indices in "
                             f"[0, {num_columns}), got {list(s)}")
        out[r, :len(s)] = torch.as_tensor([int(c) for c in s], dtype=torch.long)
    return out
