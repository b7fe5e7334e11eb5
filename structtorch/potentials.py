"""Batched pairwise potentials: the data every inference op consumes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .graph import Graph

__all__ = ["Potentials"]


@dataclass
class Potentials:
    """Log-potentials of a pairwise model on ``graph``.

    unary: [*B, n, K] (ensemble graphs: [*B, n, K] shared or [*B, T, n, K] per graph).
    pairwise: [*B, E, K, K] (ensemble graphs: [*B, T, E, K, K]); ``pairwise[..., e, a, b]``
    scores ``y[edges[e, 0]] = a`` and ``y[edges[e, 1]] = b``.
    The leading batch dims of unary and pairwise broadcast against each other.
    -inf marks an impossible state; NaN is rejected.
    """

    unary: torch.Tensor
    pairwise: torch.Tensor
    graph: Graph

    def __post_init__(self) -> None:
        u, p, g = self.unary, self.pairwise, self.graph
        if not isinstance(g, Graph):
            raise TypeError(f"graph must be a structtorch.Graph, got {type(g).__name__}")
        for name, t in (("unary", u), ("pairwise", p)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if not t.dtype.is_floating_point:
                raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if u.dtype != p.dtype:
            raise TypeError(f"unary and pairwise must share a dtype, got {u.dtype} and {p.dtype}")
        if u.device != p.device:
            raise ValueError(f"unary and pairwise must be on one device, got {u.device} and {p.device}")
        n, E, T = g.num_nodes, g.num_edges, g.num_graphs
        if u.dim() < 2 or u.shape[-2] != n:
            raise ValueError(f"unary must have shape [*B, n={n}, K], got {tuple(u.shape)}")
        K = u.shape[-1]
        if K < 1:
            raise ValueError("unary must have K >= 1 states per node")
        tree_dims = 1 if g.is_ensemble else 0
        if p.dim() < 3 + tree_dims or p.shape[-3:] != (E, K, K) or (tree_dims and p.shape[-4] != T):
            want = f"[*B, T={T}, E={E}, K={K}, K={K}]" if tree_dims else f"[*B, E={E}, K={K}, K={K}]"
            raise ValueError(f"pairwise must have shape {want}, got {tuple(p.shape)}")
        pb = p.shape[: p.dim() - 3 - tree_dims]
        ub = u.shape[:-2]
        if self.unary_per_graph:
            if u.shape[-3] != T:
                raise ValueError(
                    f"unary has more leading dims than pairwise's batch dims {tuple(pb)}, so it is read as "
                    f"per-graph unary [*B, T={T}, n={n}, K={K}], got {tuple(u.shape)}; for a shared unary "
                    f"[*B, n, K] give pairwise a batch dim (e.g. pairwise.unsqueeze(0))")
            ub = u.shape[:-3]
        try:
            torch.broadcast_shapes(ub, pb)
        except RuntimeError as err:
            raise ValueError(f"batch dims of unary {tuple(ub)} and pairwise "
                             f"{tuple(pb)} do not broadcast") from err
        with torch.no_grad():  # a sum that is finite or -inf holds no NaN and no +inf: one read, no masks
            clean = all(s < float("inf") for s in (u.sum(), p.sum()))
        if clean:
            return
        if torch.isnan(u).any() or torch.isnan(p).any():
            raise ValueError("potentials contain NaN (use -inf for impossible states)")
        if (u == float("inf")).any() or (p == float("inf")).any():
            raise ValueError("potentials contain +inf (only -inf, an impossible state, is allowed)")

    # ------------------------------------------------------------------ shapes
    @property
    def num_states(self) -> int:
        return int(self.unary.shape[-1])

    @property
    def unary_per_graph(self) -> bool:
        """Ensembles only: True when unary is per graph [*B, T, n, K] rather than shared [*B, n, K].

        Unary is per graph exactly when it has more leading dims than pairwise has batch dims
        (pairwise [*B, T, E, K, K]); write a per-graph unary with the full batch, or a shared one
        with pairwise carrying at least as many batch dims.
        """
        if not self.graph.is_ensemble:
            return False
        return self.unary.dim() - 2 > self.pairwise.dim() - 4

    @property
    def batch_shape(self) -> torch.Size:
        """Leading batch dims *B (the broadcast of unary's and pairwise's)."""
        tree_dims = 1 if self.graph.is_ensemble else 0
        pb = self.pairwise.shape[: self.pairwise.dim() - 3 - tree_dims]
        ub = self.unary.shape[:-3] if self.unary_per_graph else self.unary.shape[:-2]
        return ub if ub == pb else torch.broadcast_shapes(ub, pb)  # broadcast_shapes costs ~15 us a call

    @property
    def device(self) -> torch.device:
        return self.unary.device

    @property
    def dtype(self) -> torch.dtype:
        return self.unary.dtype

    def to(self, *args, **kwargs) -> Potentials:
        return Potentials(self.unary.to(*args, **kwargs), self.pairwise.to(*args, **kwargs), self.graph)

    def detach(self) -> Potentials:
        return Potentials(self.unary.detach(), self.pairwise.detach(), self.graph)

    def expanded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """unary [*B, (T,) n, K] and pairwise [*B, (T,) E, K, K] broadcast to the full batch shape."""
        B = self.batch_shape
        g = self.graph
        if g.is_ensemble:
            T = g.num_graphs
            u = self.unary
            if not self.unary_per_graph:  # shared unary -> per graph
                u = u.unsqueeze(-3)
            u = u.expand(*B, T, g.num_nodes, self.num_states)
            p = self.pairwise.expand(*B, T, g.num_edges, self.num_states, self.num_states)
            return u, p
        return (self.unary.expand(*B, g.num_nodes, self.num_states),
                self.pairwise.expand(*B, g.num_edges, self.num_states, self.num_states))

    def slots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch flattened and all graphs of an ensemble laid side by side: unary [B, T*n, K],
        pairwise [B, T*E, K, K] (T = 1 for a single graph), graph-major slots."""
        u, p = self.expanded()
        K, g = self.num_states, self.graph
        u = u.reshape(-1, g.num_graphs * g.num_nodes, K)
        return u, p.reshape(u.shape[0], g.num_graphs * g.num_edges, K, K)

    # ------------------------------------------------------------------ scoring
    def check_labels(self, y: torch.Tensor, name: str = "y") -> torch.Tensor:
        """Validate an assignment tensor y [*B', n] with values in [0, K) and *B' broadcastable
        against the batch shape *B; returns it as a LongTensor on the potentials' device."""
        if not isinstance(y, torch.Tensor) or y.dtype.is_floating_point or y.dtype == torch.bool or y.is_complex():
            got = y.dtype if isinstance(y, torch.Tensor) else type(y).__name__
            raise TypeError(f"{name} must be an integer (Long) tensor of shape [*B, n], got {got}")
        n, K = self.graph.num_nodes, self.num_states
        if y.dim() < 1 or y.shape[-1] != n:
            raise ValueError(f"{name} must have shape [*B, n={n}], got {tuple(y.shape)}")
        try:
            torch.broadcast_shapes(y.shape[:-1], self.batch_shape)
        except RuntimeError as err:
            raise ValueError(f"{name} must have shape [*B, n={n}] with leading dims broadcastable to the batch "
                             f"*B = {tuple(self.batch_shape)}, got {tuple(y.shape)}") from err
        if y.numel() and (y.min() < 0 or y.max() >= K):
            raise ValueError(f"{name} has labels out of range: values must lie in [0, K={K}), "
                             f"got min {int(y.min())}, max {int(y.max())}")
        return y.to(device=self.device, dtype=torch.long)

    def score(self, y: torch.Tensor) -> torch.Tensor:
        """Total log-potential of assignments y [*B, n] -> [*B] (ensembles: [*B, T], per graph).

        y's leading dims broadcast against the batch shape (e.g. y [S, *B, n] for samples).
        """
        y = self.check_labels(y)
        g = self.graph
        u, p = self.unary, self.pairwise
        edges = g.edges.to(self.device)
        if g.is_ensemble:
            y = y.unsqueeze(-2)  # [*, 1, n] against the T dim
            if not self.unary_per_graph:
                u = u.unsqueeze(-3)
        yu = y.unsqueeze(-1)
        shape = torch.broadcast_shapes(yu.shape[:-2], u.shape[:-2])
        un = torch.gather(u.expand(*shape, *u.shape[-2:]), -1, yu.expand(*shape, g.num_nodes, 1))
        total = un.squeeze(-1).sum(-1)
        if g.num_edges:
            a = y[..., edges[..., 0]] if not g.is_ensemble else _take(y, edges[..., 0])
            b = y[..., edges[..., 1]] if not g.is_ensemble else _take(y, edges[..., 1])
            K = self.num_states
            flat = p.flatten(-2)
            idx = (a * K + b).unsqueeze(-1)
            shape = torch.broadcast_shapes(idx.shape[:-2], flat.shape[:-2])
            pw = torch.gather(flat.expand(*shape, *flat.shape[-2:]), -1,
                              idx.expand(*shape, g.num_edges, 1))
            total = total + pw.squeeze(-1).sum(-1)
        else:  # no edges: still broadcast against pairwise's batch (and T) dims
            total = total + p.new_zeros(p.shape[:-3])
        return total


def _take(y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """y [*, 1, n], index [T, E] -> [*, T, E]."""
    T, E = index.shape
    yy = y.expand(*y.shape[:-2], T, y.shape[-1])
    return torch.gather(yy, -1, index.expand(*yy.shape[:-2], T, E))
