"""Exact inference on trees and forests by parallel tree contraction.

Every op runs the graph's cached contraction schedule (see ``Graph.schedule``): rounds that
*rake* all leaves into their parents and *compress* an independent set of single-child
nodes (semiring matrix products along paths, the tree generalisation of a parallel scan).
On any tree, a path included, this takes O(log n) batched tensor operations.

The forward contraction in the (max, +) semiring gives the MAP score, in the (logsumexp, +)
semiring log Z. Running the steps backwards recovers the argmax (backtracking), exact samples
(backward sampling), or the marginals (an outside pass), from the snapshots the forward pass
kept, without an autograd graph of the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..graph import Schedule
from ..potentials import Potentials

__all__ = ["tree_map", "tree_logz", "tree_marginals", "tree_sample"]

_CHUNK_ELEMENTS = 1 << 25  # cap on the [B, S, K, K, K] intermediate of a compress step


@dataclass
class _Tape:
    """What one contraction kept per step: the removed node's edge matrix and unary, and for
    compress steps its child's edge matrix before (``m_child``) and after (``m_new``)."""

    m_node: torch.Tensor  # [B, S, K, K] (x_parent, x_node)
    u_node: torch.Tensor  # [B, S, K]
    m_child: torch.Tensor | None = None  # [B, S, K, K] (x_node, x_child)
    m_new: torch.Tensor | None = None  # [B, S, K, K] (x_parent, x_child)


# ---------------------------------------------------------------------- layout
def _flat(pot: Potentials, op: str) -> tuple[torch.Tensor, torch.Tensor, Schedule, torch.Size]:
    """unary [B, N, K] and pairwise [B, NE, K, K] over all node/edge slots, with the schedule."""
    if not isinstance(pot, Potentials):
        raise TypeError(f"{op} expects a structtorch.Potentials, got {type(pot).__name__}")
    pot.graph.require_forest(op)
    sched = pot.graph.schedule(pot.device)
    u, p = pot.expanded()
    batch = pot.batch_shape
    K = pot.num_states
    u = u.reshape(-1, sched.num_slots, K)
    return u, p.reshape(u.shape[0], -1, K, K), sched, batch


def _edge_matrices(pair: torch.Tensor, sched: Schedule) -> torch.Tensor:
    """M [B, N, K, K]: M[:, v] = potential of v's parent edge, oriented (x_parent, x_v)."""
    B, NE, K, _ = pair.shape
    if NE == 0:
        return pair.new_zeros(B, sched.num_slots, K, K)
    pe = sched.parent_edge.clamp(min=0)
    M = pair[:, pe]
    M = torch.where(sched.flip.view(1, -1, 1, 1), M.transpose(-1, -2), M)
    return torch.where((sched.parent_edge >= 0).view(1, -1, 1, 1), M, torch.zeros((), dtype=M.dtype,
                                                                                      device=M.device))


def _out_shape(values: torch.Tensor, batch: torch.Size, sched: Schedule, ensemble: bool) -> torch.Tensor:
    """Per-graph values [B, G] -> [*B] (single graph) or [*B, T] (ensemble)."""
    return values.reshape(*batch, sched.num_groups) if ensemble else values.reshape(batch)


# ---------------------------------------------------------------------- forward contraction
def _reduce(semiring: str) -> Callable[[torch.Tensor, int], torch.Tensor]:
    if semiring == "max":
        return lambda t, dim: t.amax(dim)
    return lambda t, dim: t.logsumexp(dim)


def _chunks(B: int, S: int, K: int) -> list[slice]:
    step = max(1, _CHUNK_ELEMENTS // max(1, B * K ** 3))
    return [slice(i, min(S, i + step)) for i in range(0, S, step)]


def _contract(unary: torch.Tensor, pair: torch.Tensor, sched: Schedule, semiring: str
              ) -> tuple[torch.Tensor, torch.Tensor, list[_Tape]]:
    """Run all steps. Returns per-graph values [B, G], final unary [B, N, K] and the tape."""
    reduce = _reduce(semiring)
    U = unary.clone()
    M = _edge_matrices(pair, sched)
    B, _, K = U.shape
    tape = []
    for step in sched.steps:
        m_node, u_node = M[:, step.node], U[:, step.node]
        if step.kind == "rake":
            U.index_add_(1, step.parent, reduce(m_node + u_node.unsqueeze(-2), -1))
            tape.append(_Tape(m_node, u_node))
        else:
            m_child = M[:, step.child]
            m_new = torch.cat([
                reduce(m_node[:, c, :, :, None] + u_node[:, c, None, :, None] + m_child[:, c, None, :, :], -2)
                for c in _chunks(B, len(step.node), K)
            ], 1)  # [B, S, K(parent), K(child)]
            M[:, step.child] = m_new
            tape.append(_Tape(m_node, u_node, m_child, m_new))
    per_root = reduce(U[:, sched.roots], -1)  # [B, R]
    values = per_root.new_zeros(B, sched.num_groups).index_add_(1, sched.root_group, per_root)
    return values, U, tape


# ---------------------------------------------------------------------- backward passes
def _choose(logits: torch.Tensor, generator: torch.Generator | None, sample: bool) -> torch.Tensor:
    """argmax (sample=False) or a Gumbel-max sample (sample=True) over the last dim."""
    if sample:
        g = torch.rand(logits.shape, generator=generator, dtype=logits.dtype, device=logits.device)
        logits = logits - torch.log(-torch.log(g.clamp_min(torch.finfo(g.dtype).tiny)))
    return logits.argmax(-1)


def _row(m: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """m [*S, B, S, K, K], idx [*S, B, S] -> m[..., idx, :] [*S, B, S, K]."""
    K = m.shape[-1]
    return torch.gather(m, -2, idx[..., None, None].expand(*idx.shape, 1, K)).squeeze(-2)


def _backtrack(U: torch.Tensor, tape: list[_Tape], sched: Schedule, extra: tuple[int, ...] = (),
               generator: torch.Generator | None = None, sample: bool = False) -> torch.Tensor:
    """Assignment y [*extra, B, N] by undoing the steps: argmax (MAP) or conditional sampling."""
    B, N, K = U.shape
    y = torch.zeros(*extra, B, N, dtype=torch.long, device=U.device)
    root_logits = U[:, sched.roots].expand(*extra, B, len(sched.roots), K)
    y[..., sched.roots] = _choose(root_logits, generator, sample)
    for step, t in zip(reversed(sched.steps), reversed(tape)):
        logits = _row(t.m_node.expand(*extra, *t.m_node.shape), y[..., step.parent]) + t.u_node
        if step.kind == "compress":  # + M_child(x_node, y_child): column y_child
            mc = t.m_child.transpose(-1, -2).expand(*extra, *t.m_child.shape)
            logits = logits + _row(mc, y[..., step.child])
        y[..., step.node] = _choose(logits, generator, sample)
    return y


def _safe_exp(t: torch.Tensor) -> torch.Tensor:
    """exp with NaN (from -inf - -inf, a zero-probability context) mapped to 0."""
    return torch.nan_to_num(t.exp(), nan=0.0)


def _marginals(U: torch.Tensor, tape: list[_Tape], sched: Schedule) -> tuple[torch.Tensor, torch.Tensor]:
    """Outside pass: unary marginals [B, N, K] and joints across each node's parent edge [B, N, K, K]."""
    B, N, K = U.shape
    mu = U.new_zeros(B, N, K)
    J = U.new_zeros(B, N, K, K)  # joint across the node's *current* edge matrix, (x_parent, x_node)
    root_u = U[:, sched.roots]
    mu[:, sched.roots] = _safe_exp(root_u - root_u.logsumexp(-1, keepdim=True))
    for step, t in zip(reversed(sched.steps), reversed(tape)):
        if step.kind == "rake":
            s = t.m_node + t.u_node.unsqueeze(-2)  # [B, S, K, K]
            joint = mu[:, step.parent].unsqueeze(-1) * _safe_exp(s - s.logsumexp(-1, keepdim=True))
            J[:, step.node] = joint
            mu[:, step.node] = joint.sum(-2)
            continue
        j_new = J[:, step.child]  # (x_parent, x_child)
        for c in _chunks(B, len(step.node), K):
            s = t.m_node[:, c, :, :, None] + t.u_node[:, c, None, :, None] + t.m_child[:, c, None, :, :]
            triple = j_new[:, c, :, None, :] * _safe_exp(s - t.m_new[:, c, :, None, :])  # [B,S,Kp,Kv,Kc]
            J[:, step.node[c]] = triple.sum(-1)
            J[:, step.child[c]] = triple.sum(-3)
            mu[:, step.node[c]] = triple.sum((-3, -1))
    return mu, J


def _pair_from_joints(J: torch.Tensor, sched: Schedule, num_edge_slots: int) -> torch.Tensor:
    """Scatter per-node joints [B, N, K, K] into per-edge marginals [B, NE, K, K] (stored orientation)."""
    B, _, K, _ = J.shape
    child = torch.nonzero(sched.parent_edge >= 0).squeeze(-1)
    Jc = J[:, child]
    Jc = torch.where(sched.flip[child].view(1, -1, 1, 1), Jc.transpose(-1, -2), Jc)
    out = J.new_zeros(B, num_edge_slots, K, K)
    out[:, sched.parent_edge[child]] = Jc
    return out


def _one_hot_grads(y: torch.Tensor, sched: Schedule, num_edge_slots: int, K: int, dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """One-hot of an assignment y [B, N]: unary [B, N, K], pairwise [B, NE, K, K]."""
    oh = torch.nn.functional.one_hot(y, K).to(dtype)
    J = oh[:, sched.parent.clamp(min=0), :, None] * oh[:, :, None, :]  # (x_parent, x_node)
    return oh, _pair_from_joints(J, sched, num_edge_slots)


def _per_slot(grad: torch.Tensor, num_groups: int, num_slots: int) -> torch.Tensor:
    """Per-graph upstream grads [B, G] -> per node or edge slot [B, slots] (slots laid out graph-major)."""
    return grad.repeat_interleave(num_slots // num_groups, dim=1) if num_slots else grad[:, :0]


# ---------------------------------------------------------------------- autograd functions
class _TreeMap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, unary, pair, sched):  # noqa: D102
        with torch.no_grad():
            values, U, tape = _contract(unary, pair, sched, "max")
            y = _backtrack(U, tape, sched)
        ctx.save_for_backward(y, values)
        ctx.sched, ctx.num_edge_slots, ctx.num_states = sched, pair.shape[1], unary.shape[-1]
        ctx.mark_non_differentiable(y)
        return values, y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_values, _grad_y):  # noqa: D102
        y, values = ctx.saved_tensors
        sched = ctx.sched
        grad = torch.where(torch.isfinite(values), grad_values, 0.0)  # no subgradient at -inf
        gu, gp = _one_hot_grads(y, sched, ctx.num_edge_slots, ctx.num_states, grad.dtype)
        gu = gu * _per_slot(grad, sched.num_groups, gu.shape[1])[..., None]
        gp = gp * _per_slot(grad, sched.num_groups, gp.shape[1])[..., None, None]
        return gu, gp, None


class _TreeLogZ(torch.autograd.Function):
    @staticmethod
    def forward(ctx, unary, pair, sched):  # noqa: D102
        with torch.no_grad():
            values, _, _ = _contract(unary, pair, sched, "sum")
        ctx.save_for_backward(unary, pair)
        ctx.sched = sched
        return values

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_values):  # noqa: D102
        unary, pair = ctx.saved_tensors
        sched = ctx.sched
        mu, mu_pair = _marginal_tensors(unary, pair, sched)
        mu = mu * _per_slot(grad_values, sched.num_groups, mu.shape[1])[..., None]
        mu_pair = mu_pair * _per_slot(grad_values, sched.num_groups, mu_pair.shape[1])[..., None, None]
        return mu, mu_pair, None


def _marginal_tensors(unary: torch.Tensor, pair: torch.Tensor, sched: Schedule
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Unary [B, N, K] and pairwise [B, NE, K, K] marginals by one contraction and one outside pass."""
    with torch.no_grad():
        _, U, tape = _contract(unary, pair, sched, "sum")
        mu, J = _marginals(U, tape, sched)
    return mu, _pair_from_joints(J, sched, pair.shape[1])


# ---------------------------------------------------------------------- public ops
def tree_map(pot: Potentials) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact MAP on a tree or forest.

    Returns (score [*B], y [*B, n]) (ensembles: [*B, T], [*B, T, n]); score is differentiable
    and its gradient w.r.t. the potentials is the one-hot of y. Rows where every assignment is
    impossible score -inf (and get zero gradient).
    """
    u, p, sched, batch = _flat(pot, "tree_map")
    values, y = _TreeMap.apply(u, p, sched)
    ens = pot.graph.is_ensemble
    n = pot.graph.num_nodes
    y = y.reshape(*batch, sched.num_groups, n) if ens else y.reshape(*batch, n)
    return _out_shape(values, batch, sched, ens), y


def tree_logz(pot: Potentials) -> torch.Tensor:
    """Exact log partition function [*B] ([*B, T] for ensembles); its gradient is the marginals."""
    u, p, sched, batch = _flat(pot, "tree_logz")
    return _out_shape(_TreeLogZ.apply(u, p, sched), batch, sched, pot.graph.is_ensemble)


def tree_marginals(pot: Potentials) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact marginals: unary [*B, n, K] and pairwise [*B, E, K, K] (stored edge orientation).

    Zero-probability components (log Z = -inf) get all-zero marginals. Not differentiable.
    """
    u, p, sched, batch = _flat(pot, "tree_marginals")
    mu, mu_pair = _marginal_tensors(u, p, sched)
    g = pot.graph
    lead = (*batch, g.num_graphs) if g.is_ensemble else tuple(batch)
    K = pot.num_states
    return mu.reshape(*lead, g.num_nodes, K), mu_pair.reshape(*lead, g.num_edges, K, K)


def tree_sample(pot: Potentials, num_samples: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Exact samples y [num_samples, *B, n] ([num_samples, *B, T, n] for ensembles) from
    P(y) proportional to exp(score(y)), by backward sampling through the contraction."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    u, p, sched, batch = _flat(pot, "tree_sample")
    with torch.no_grad():
        values, U, tape = _contract(u, p, sched, "sum")
        if torch.isinf(values).any():
            raise ValueError("tree_sample: some rows have no possible assignment (log Z = -inf)")
        y = _backtrack(U, tape, sched, (num_samples,), generator, sample=True)
    g = pot.graph
    lead = (*batch, g.num_graphs) if g.is_ensemble else tuple(batch)
    return y.reshape(num_samples, *lead, g.num_nodes)
