"""Entropy-smoothed LP relaxation of MAP on any pairwise graph, by star-update message passing.

The smoothed LP (Domke 2013, eqs. 6-7; Meshi et al. 2012) over the local polytope L is

    A(theta) = max_{mu in L}  <mu, theta> + eps * ( sum_i H(mu_i) + sum_e H(mu_e) ),

every node and every edge entropy counted once with weight +1, so that
``max_y score(y) <= LP(theta) <= A(theta) <= LP(theta) + eps * H_max`` with
``H_max = n log K + E log K**2`` (Domke, Thm. 1).

Its Lagrangian dual (Domke, Thm. 2, eq. 8), with one message ``lambda_{e->i}(x_i)`` per edge
``e`` and endpoint ``i``, is the convex, smooth function of the messages

    D(lambda) = eps * sum_i lse( b_i / eps ) + eps * sum_e lse( b_e / eps ),
    b_i(x_i)      = theta_i(x_i) + sum_{e ~ i} lambda_{e->i}(x_i),
    b_e(x_i, x_j) = theta_e(x_i, x_j) - lambda_{e->i}(x_i) - lambda_{e->j}(x_j),

(``lse`` = log-sum-exp over the region's states), an upper bound ``D(lambda) >= A(theta)`` for
every lambda with equality at the minimum. The pseudo-marginals at lambda are
``mu_i = softmax(b_i / eps)`` and ``mu_e = softmax(b_e / eps)`` (eq. 9), and for fixed lambda
``d D / d theta_i = mu_i``, ``d D / d theta_e = mu_e`` exactly; at the minimiser this is the
gradient of ``A`` (Danskin).

A *star update* (eq. 10) minimises D exactly over all messages into one node ``i`` (degree d):
with the edge-to-node soft max-marginals ``m_e(x_i) = eps lse_{x_j}((theta_e - lambda_{e->j}) / eps)``
and ``T = theta_i + sum_e m_e``, the minimiser is ``lambda_{e->i} = m_e - T / (d + 1)``, after
which node ``i`` and all its edges agree on ``softmax(T / ((d + 1) eps))``. Nodes of one colour
of a proper colouring share no edge, so all their star updates are independent and run as one
batched tensor op: exact block-coordinate descent, the dual never increases.

-inf potentials are handled by arc-consistency pruning (states without support in some
neighbour are impossible in every point of L), after which every exact block minimiser is
finite; messages at pruned states are set to 0 and never matter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..graph import Graph, check_float, check_int
from ..potentials import Potentials
from . import fused
from .backends import fused_active
from .tree import exp_serial, index_add_rows, log_ge1

__all__ = ["LP_WORKING_COPIES", "MarginalValue", "SmoothedLPResult", "StarSchedule", "available_memory", "smoothed_lp",
           "star_schedule", "greedy_colouring"]


# ---------------------------------------------------------------------- schedule (once per graph)
@dataclass(frozen=True)
class ColourClass:
    """The star updates of one colour: nodes [V], pairwise non-adjacent, and their H half-edges.

    Half-edge ``h = 2 e + s`` carries the message from edge e into node ``edges[e, s]``.
    Internally half-edges are stored colour by colour, so this class owns the contiguous
    internal slots ``start:stop``.
    nodes: LongTensor [V]; other: LongTensor [H], internal slot of the same edge's message into
    the other endpoint; seg: LongTensor [H], position in ``nodes`` of each half-edge's node;
    inv_size: Tensor [V], ``1 / (deg + 1)``.
    """

    nodes: torch.Tensor
    start: int
    stop: int
    other: torch.Tensor
    seg: torch.Tensor
    inv_size: torch.Tensor

    def to(self, device: torch.device) -> ColourClass:
        return ColourClass(self.nodes.to(device), self.start, self.stop, self.other.to(device),
                           self.seg.to(device), self.inv_size.to(device))


@dataclass(frozen=True)
class StarSchedule:
    """Colour classes of a graph (nodes of degree >= 1) and the internal half-edge layout.

    order: LongTensor [2E], external half-edge id of each internal slot; pos: its inverse;
    slot_node: LongTensor [2E], the receiving node of each internal slot.
    """

    colours: tuple[ColourClass, ...]
    order: torch.Tensor
    pos: torch.Tensor
    slot_node: torch.Tensor

    def to(self, device: torch.device) -> StarSchedule:
        return StarSchedule(tuple(c.to(device) for c in self.colours), self.order.to(device),
                            self.pos.to(device), self.slot_node.to(device))


def greedy_colouring(graph: Graph) -> np.ndarray:
    """A proper node colouring [n] (Welsh-Powell: largest degree first, smallest free colour)."""
    n, edges = graph.num_nodes, graph.edges.numpy()
    adj: list[list[int]] = [[] for _ in range(n)]
    for a, b in edges:
        adj[a].append(int(b))
        adj[b].append(int(a))
    colour = np.full(n, -1)
    for v in sorted(range(n), key=lambda v: (-len(adj[v]), v)):
        used = {int(colour[u]) for u in adj[v]}
        c = 0
        while c in used:
            c += 1
        colour[v] = c
    return colour


def _build_star_schedule(graph: Graph) -> StarSchedule:
    half_node = graph.edges.numpy().reshape(-1)  # [2E], half-edge 2e+s -> edges[e, s]
    deg = np.bincount(half_node, minlength=graph.num_nodes)
    colour = greedy_colouring(graph)
    order = np.argsort(colour[half_node], kind="stable")
    pos = np.empty_like(order)
    pos[order] = np.arange(len(order))
    as_long = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int64))  # noqa: E731
    classes, start = [], 0
    for c in range(int(colour.max()) + 1):
        nodes = np.flatnonzero((colour == c) & (deg > 0))
        if not len(nodes):
            continue
        local = np.full(graph.num_nodes, -1)
        local[nodes] = np.arange(len(nodes))
        half = order[start:start + int(deg[nodes].sum())]
        classes.append(ColourClass(as_long(nodes), start, start + len(half), as_long(pos[half ^ 1]),
                                   as_long(local[half_node[half]]),
                                   torch.as_tensor(1.0 / (deg[nodes] + 1.0))))
        start += len(half)
    return StarSchedule(tuple(classes), as_long(order), as_long(pos), as_long(half_node[order]))


def star_schedule(graph: Graph, device: torch.device | str = "cpu") -> StarSchedule:
    """The colour classes of ``graph`` for star updates, built once and cached per device."""
    return graph.cached("star_schedule", device, lambda: _build_star_schedule(graph))


# ---------------------------------------------------------------------- result
@dataclass
class SmoothedLPResult:
    """Output of ``smoothed_lp`` (batch dims *B of the potentials).

    value: [*B] dual value D(messages) (eq. 8), >= the smoothed LP optimum >= the LP value
        >= max_y score(y) for any messages; -inf where no assignment is possible.
        Differentiable: d value / d potentials = (unary, pairwise) below.
    unary: [*B, n, K] pseudo-marginals softmax(b_i / eps) at ``messages`` (eq. 9), detached.
    pairwise: [*B, E, K, K] pseudo-marginals softmax(b_e / eps) (stored edge orientation), detached.
    messages: [*B, E, 2, K]; ``messages[..., e, s, x]`` = lambda from edge e to node
        ``edges[e, s]`` at state x, in score units; pass back as ``messages=`` to warm-start.
    iterations: number of full sweeps (all colours) actually run.
    assignment: [*B, n] argmax of ``unary`` (lowest state on ties).
    assignment_score: [*B] ``pot.score(assignment)``, a lower bound on max_y score(y).
    """

    value: torch.Tensor
    unary: torch.Tensor
    pairwise: torch.Tensor
    messages: torch.Tensor
    iterations: int
    assignment: torch.Tensor
    assignment_score: torch.Tensor

    def decode(self) -> torch.Tensor:
        """The decoded assignment [*B, n] (argmax of the unary pseudo-marginals)."""
        return self.assignment


# ---------------------------------------------------------------------- core (flat batch [B, ...])
def _prune(unary: torch.Tensor, pair: torch.Tensor, edges: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Arc-consistency masks (alive_u [B, n, K], alive_p [B, E, K, K]), or None if nothing is -inf.

    A node state is dead if its potential is -inf or some edge gives it no alive partner state;
    an edge state is dead if its potential is -inf or either endpoint state is dead. Dead states
    have zero mass everywhere in the local polytope, so removing them changes no LP value.
    """
    alive_u, alive_p0 = unary > -math.inf, pair > -math.inf
    if bool(alive_u.all()) and bool(alive_p0.all()):
        return None
    e0, e1 = edges[:, 0], edges[:, 1]
    while True:
        alive_p = alive_p0 & alive_u.index_select(1, e0)[:, :, :, None] & alive_u.index_select(1, e1)[:, :, None, :]
        unsupported = torch.stack([~alive_p.any(-1), ~alive_p.any(-2)], 2).flatten(1, 2)  # [B, 2E, K]
        dead = torch.zeros(alive_u.shape, dtype=torch.int32, device=unary.device)
        dead.index_add_(1, edges.reshape(-1), unsupported.to(torch.int32))
        new = alive_u & (dead == 0)
        if bool((new == alive_u).all()):
            return alive_u, alive_p
        alive_u = new


# Internal layout is slot-major and batch-minor: messages [2E, K, B] (internal half-edge slots),
# unary [n, K, B], pairwise [E, K, K, B]. Gathering a star's messages then copies contiguous
# K * B blocks, and reductions over states are vectorised over the batch. As in tree.py, no op of
# the sweeps opens an OpenMP parallel region for a small tensor (index_select, index_add_rows,
# exp_serial and log_ge1 instead of advanced indexing, index_add and exp / log).
def _lse(x: torch.Tensor, dim: int) -> torch.Tensor:
    """log-sum-exp over the state dim ``dim``, -inf safe (all -inf gives -inf, never NaN)."""
    if x.shape[dim] <= 4:  # a chain of fused binary ops is fastest for few states
        parts = x.unbind(dim)
        out = parts[0]
        for t in parts[1:]:
            out = torch.logaddexp(out, t)
        return out
    m = x.amax(dim, keepdim=True).clamp(min=torch.finfo(x.dtype).min)
    return (log_ge1(exp_serial(x - m).sum(dim, keepdim=True)) + m).squeeze(dim)


def _safe_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """softmax over ``dim``; all -inf slices give zeros, not NaN."""
    return torch.nan_to_num(exp_serial(x - _lse(x, dim).unsqueeze(dim)), nan=0.0)


def _internal(unary: torch.Tensor, pair: torch.Tensor, masks: tuple | None, eps: float | torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """theta / eps (eps a float or [B, 1, 1]) with pruned states at -inf, internal layout: uT [n, K, B],
    pT [E, K, K, B]."""
    u, p = unary / eps, pair / (eps.unsqueeze(-1) if isinstance(eps, torch.Tensor) else eps)
    if masks is not None:
        u = u.masked_fill(~masks[0], -math.inf)
        p = p.masked_fill(~masks[1], -math.inf)
    return u.permute(1, 2, 0).contiguous(), p.permute(1, 2, 3, 0).contiguous()


def _to_internal(lam: torch.Tensor, sched: StarSchedule) -> torch.Tensor:
    """Messages [B, 2E, K] (external half-edge order) -> [2E, K, B] (internal slots)."""
    return lam.index_select(1, sched.order).permute(1, 2, 0).contiguous()


def _to_external(lamT: torch.Tensor, sched: StarSchedule) -> torch.Tensor:
    """Messages [2E, K, B] (internal slots) -> [B, 2E, K] (external order)."""
    return lamT.index_select(0, sched.pos).permute(2, 0, 1).contiguous()


def _beliefs(uT: torch.Tensor, pT: torch.Tensor, lamT: torch.Tensor, sched: StarSchedule
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled beliefs b_i / eps [n, K, B] and b_e / eps [E, K, K, B] (eq. 9 before normalising)."""
    E, K, _, B = pT.shape
    bn = index_add_rows(uT.clone(), sched.slot_node, lamT)
    lam = lamT.index_select(0, sched.pos).view(E, 2, K, B)
    return bn, pT - lam[:, 0, :, None, :] - lam[:, 1, None, :, :]


def _dual(uT: torch.Tensor, pT: torch.Tensor, lamT: torch.Tensor, sched: StarSchedule) -> torch.Tensor:
    """Scaled dual D / eps [B] (eq. 8 at its inner maximiser)."""
    return _dual_of_beliefs(*_beliefs(uT, pT, lamT, sched))


def _dual_of_beliefs(bn: torch.Tensor, be: torch.Tensor) -> torch.Tensor:
    """Scaled dual D / eps [B] of the scaled beliefs bn [n, K, B], be [E, K, K, B]."""
    return _lse(bn, 1).sum(0) + _lse(be.flatten(1, 2), 1).sum(0)


def _sweep(lamT: torch.Tensor, blocks: list, guard: bool) -> None:
    """One pass of star updates over all colours, in place on scaled messages lamT [2E, K, B]."""
    for c, P, uc, inv in blocks:
        # m_e(x_i) = lse_{x_j} (theta_e - lambda_{e->j}) [H, K, B]
        m = _lse(P - lamT.index_select(0, c.other).unsqueeze(2), 1)
        if uc.shape[0] == 1:  # one node in this colour (dense graphs)
            new = m - (uc + m.sum(0, keepdim=True)) * inv
        else:
            T = index_add_rows(uc.clone(), c.seg, m)  # [V, K, B]: T = theta_i + sum_e m_e
            new = m - (T * inv).index_select(0, c.seg)  # eq. (10)
        if guard:  # pruned states: m = T = -inf; any finite message will do
            new = torch.where(torch.isfinite(m), new, 0.0)
        lamT[c.start:c.stop] = new


def _blocks(uT: torch.Tensor, ph: torch.Tensor, sched: StarSchedule) -> list:
    """Per colour: (colour, its half-edge potentials [H, K, K, B], its nodes' unaries [V, K, B], 1 / star size)."""
    return [(c, ph[c.start:c.stop], uT.index_select(0, c.nodes), c.inv_size.to(uT.dtype).view(-1, 1, 1))
            for c in sched.colours]


def _solve(uT: torch.Tensor, pT: torch.Tensor, lamT: torch.Tensor, sched: StarSchedule, iters: int,
           tol: float | None, guard: bool) -> int:
    """Run up to ``iters`` sweeps in place on lamT (scaled units); returns the sweeps run.

    With ``tol``, each problem (column b) stops after its first sweep whose dual decrease is below tol:
    the problems still open are compacted into working copies whenever at most 3/4 of the working
    columns remain open (a closed problem left in them sweeps on, which only lowers its dual further).
    """
    E, K, _, B = pT.shape
    # half-edge slot h: P[h, x_other, x_self, b] (reduced over dim 1)
    ph = torch.stack([pT.transpose(1, 2), pT], 1).view(2 * E, K, K, B).index_select(0, sched.order)
    blocks = _blocks(uT, ph, sched)
    if tol is None:
        for _ in range(iters):
            _sweep(lamT, blocks, guard)
        return iters
    cols = None  # the columns of lamT in the working copies (None: all, lamT itself)
    u, p, lam = uT, pT, lamT
    prev = _dual(u, p, lam, sched)
    for it in range(iters):
        _sweep(lam, blocks, guard)
        cur = _dual(u, p, lam, sched)
        going = torch.nan_to_num(prev - cur, nan=0.0, posinf=math.inf, neginf=0.0) >= tol
        prev = cur
        count = int(going.sum())
        if count == 0 or count <= 0.75 * going.numel():
            if cols is not None:
                lamT[..., cols] = lam
            if count == 0:
                return it + 1
            keep = going.nonzero()[:, 0]
            cols = keep if cols is None else cols[keep]
            u, p, lam, prev = uT[..., cols], pT[..., cols], lamT[..., cols], prev[keep]
            blocks = _blocks(u, ph[..., cols], sched)
    if cols is not None:
        lamT[..., cols] = lam
    return iters


def _dual_and_marginals(uT: torch.Tensor, pT: torch.Tensor, lamT: torch.Tensor, sched: StarSchedule,
                        eps: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """D(lambda; theta) [B] (eq. 8) and the pseudo-marginals mu_u [B, n, K], mu_p [B, E, K, K] (eq. 9) of
    scaled, pruned potentials and messages in the internal layout."""
    bn, be = _beliefs(uT, pT, lamT, sched)
    mu_p = _safe_softmax(be.flatten(1, 2), 1).permute(2, 0, 1).unflatten(-1, be.shape[1:3])
    return eps * _dual_of_beliefs(bn, be), _safe_softmax(bn, 1).permute(2, 0, 1), mu_p


def _fused_solve(unary: torch.Tensor, pair: torch.Tensor, eps: float | torch.Tensor, lam: torch.Tensor,
                 graph: Graph, sched: StarSchedule, iters: int, tol: float | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The sweeps, the dual value and the pseudo-marginals by the fused CPU kernel (finite potentials
    [B, n, K], [B, E, K, K]; messages [B, 2E, K] in score units): (messages, value, mu_u, mu_p, sweeps run)."""
    inv = 1.0 / (eps if isinstance(eps, torch.Tensor) else unary.new_full(unary.shape[:1], eps))
    order, ptr, half = graph.cached("lp_stars", "cpu", lambda: _stars(graph, sched))
    lam, value, mu_u, mu_p, sweeps = fused.kernels().lp_solve(
        unary.contiguous(), pair.contiguous(), inv.contiguous(), lam.contiguous(), order, ptr, half, iters,
        -1.0 if tol is None else float(tol))
    return lam, value, mu_u, mu_p, int(sweeps.max()) if sweeps.numel() else 0


def _stars(graph: Graph, sched: StarSchedule) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused kernel's stars: the sweep order [V] (the colour classes' nodes, colour by colour), and the
    half-edges into each node as CSR ptr [n + 1], half [2E]."""
    half_node = graph.edges.reshape(-1)
    ptr = torch.zeros(graph.num_nodes + 1, dtype=torch.long)
    ptr[1:] = torch.bincount(half_node, minlength=graph.num_nodes).cumsum(0)
    order = torch.cat([c.nodes.cpu() for c in sched.colours]) if sched.colours else torch.zeros(0, dtype=torch.long)
    return order, ptr, torch.argsort(half_node, stable=True)


class MarginalValue(torch.autograd.Function):
    """A value [B] of the potentials unary [B, n, K], pair [B, E, K, K] whose gradient is given marginals mu_u
    [B, n, K], mu_p [B, E, K, K] computed with it by the caller (Danskin): ``smoothed_lp``'s dual value at fixed
    messages (its pseudo-marginals, eq. 9) and ``lp_map``'s optimum (the LP's solution). No gradient flows where
    the value is not finite."""

    @staticmethod
    def forward(ctx, unary, pair, value, mu_u, mu_p):  # noqa: D102
        ctx.save_for_backward(mu_u, mu_p, value)
        return value.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_value):  # noqa: D102
        mu_u, mu_p, value = ctx.saved_tensors
        g = torch.where(torch.isfinite(value), grad_value, 0.0)
        return mu_u * g[:, None, None], mu_p * g[:, None, None, None], None, None, None


# ---------------------------------------------------------------------- validation
def _check_eps(eps: float | torch.Tensor, pot: Potentials) -> float | torch.Tensor:
    """eps as a float, or as a tensor [B] (flat batch) of per-problem temperatures."""
    if isinstance(eps, torch.Tensor):
        try:
            flat = torch.broadcast_to(eps.detach(), pot.batch_shape).reshape(-1)
        except RuntimeError:
            raise ValueError(f"eps tensor of shape {list(eps.shape)} does not broadcast to the batch shape "
                             f"{list(pot.batch_shape)}") from None
        if not bool((torch.isfinite(flat) & (flat > 0)).all()):
            raise ValueError("eps must be finite and > 0 everywhere")
        return flat.to(device=pot.device, dtype=pot.dtype)
    return check_float(eps, "eps", 0.0, finite=True, expected="a finite number > 0 (or a tensor of them)")


#: tensors of [B, E, K, K] elements that ``smoothed_lp`` holds at its peak (messages, expanded pairwise
#: potentials, marginals, the sweeps' buffers and the backward pass; measured: 8.5-9 on CPU, fused or not)
LP_WORKING_COPIES = 9


def available_memory(device: torch.device) -> int | None:
    """Bytes that can still be allocated on ``device`` (Linux's MemAvailable on CPU, the CUDA driver's free
    memory on a GPU), or None where that is not known."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def _check_memory(pot: Potentials) -> None:
    """A clear MemoryError, before any sweep, for a batch whose working set exceeds the memory available
    (instead of the operating system killing the process part-way through training)."""
    B, E, K = math.prod(pot.batch_shape), pot.graph.num_edges, pot.num_states
    need = LP_WORKING_COPIES * B * E * K * K * pot.unary.element_size()
    free = available_memory(pot.unary.device)
    if free is not None and need > free:
        raise MemoryError(
            f"smoothed_lp: {B:,} problems (models x examples) on {E:,} edges need about {need / 2**30:.1f} GiB "
            f"({LP_WORKING_COPIES} tensors [B, E, K, K] in {str(pot.dtype).removeprefix('torch.')}), more than the "
            f"{free / 2**30:.1f} GiB available on {pot.unary.device}: use fewer edges (model.candidates), models "
            f"(e.g. model.restarts) or training rows (data.max_rows)")


def _check_args(pot: Potentials, iters: int, tol: float | None) -> None:
    if not isinstance(pot, Potentials):
        raise TypeError(f"smoothed_lp expects a structtorch.Potentials, got {type(pot).__name__}")
    if pot.graph.is_ensemble:
        raise ValueError("smoothed_lp needs a single graph (edges [E, 2]), got an ensemble; "
                         "run each member graph separately")
    check_int(iters, "iters", 0)
    if tol is not None:
        check_float(tol, "tol", 0.0, strict=False, expected="None or a number >= 0")


def _init_messages(pot: Potentials, messages: torch.Tensor | None, B: int) -> torch.Tensor:
    """Messages in score units, flat [B, 2E, K] (a fresh copy)."""
    E, K = pot.graph.num_edges, pot.num_states
    if messages is None:
        return pot.unary.new_zeros(B, 2 * E, K)
    want = (*pot.batch_shape, E, 2, K)
    if not isinstance(messages, torch.Tensor) or not messages.dtype.is_floating_point:
        raise TypeError(f"messages must be a floating-point tensor of shape {list(want)}")
    if tuple(messages.shape) != want:
        raise ValueError(f"messages must have shape [*B, E, 2, K] = {list(want)}, "
                         f"got {list(messages.shape)}")
    if not bool(torch.isfinite(messages).all()):
        raise ValueError("messages must be finite (no NaN or inf)")
    return messages.detach().to(device=pot.device, dtype=pot.dtype).reshape(B, 2 * E, K).clone()


# ---------------------------------------------------------------------- public op
def smoothed_lp(pot: Potentials, eps: float | torch.Tensor, iters: int, messages: torch.Tensor | None = None,
                tol: float | None = None) -> SmoothedLPResult:
    """Entropy-smoothed LP relaxation of max_y score(y) by star-update block coordinate descent.

    pot: Potentials on any single graph; unary [*B, n, K], pairwise [*B, E, K, K].
    eps: smoothing temperature > 0 (the entropy weight): a float, or a tensor broadcastable to [*B]
        (one temperature per problem, e.g. per model of a regularisation grid).
    iters: maximum number of sweeps (every node's star update once, colour by colour); 0 only
        evaluates the dual at ``messages``.
    messages: [*B, E, 2, K] warm start (``SmoothedLPResult.messages``), default zeros.
    tol: each problem of the batch stops after its first sweep whose dual decrease in units of eps
        (decrease / eps) is below tol; the call returns when every problem has stopped.

    Returns a ``SmoothedLPResult``; ``value`` [*B] is the dual D(messages) (eq. 8), non-increasing
    in the sweeps, always >= the smoothed LP optimum >= max_y score(y), and within
    eps * (n log K + E log K**2) of the (unsmoothed) LP value at convergence. Its gradient is the
    pseudo-marginals at the returned messages (exact for these messages held fixed, hence for
    iters=0, and Danskin's gradient of the optimum at convergence); the loop keeps no autograd graph.
    """
    _check_args(pot, iters, tol)
    _check_memory(pot)
    eps = _check_eps(eps, pot)  # a float or [B]
    g = pot.graph
    batch, n, E, K = pot.batch_shape, g.num_nodes, g.num_edges, pot.num_states
    unary, pair = pot.expanded()
    B = math.prod(batch)
    unary, pair = unary.reshape(B, n, K), pair.reshape(B, E, K, K)
    lam = _init_messages(pot, messages, B)
    sched = star_schedule(g, pot.device)
    e3 = eps.view(B, 1, 1) if isinstance(eps, torch.Tensor) else eps
    with torch.no_grad():
        masks = _prune(unary.detach(), pair.detach(), g.edges.to(pot.device)) if B else None
        if masks is None and fused_active(unary):  # finite potentials: the fused CPU kernel
            lam, value, mu_u, mu_p, run = _fused_solve(unary.detach(), pair.detach(), eps, lam, g, sched,
                                                       int(iters), tol)
        else:
            uT, pT = _internal(unary.detach(), pair.detach(), masks, e3)
            lamT = _to_internal(lam / e3, sched)
            run = _solve(uT, pT, lamT, sched, int(iters), tol, guard=masks is not None)
            lam = _to_external(lamT, sched) * e3
            value, mu_u, mu_p = _dual_and_marginals(uT, pT, lamT, sched, eps)
    value = MarginalValue.apply(unary, pair, value, mu_u, mu_p)
    y = mu_u.argmax(-1).reshape(*batch, n)
    return SmoothedLPResult(
        value=value.reshape(batch),
        unary=mu_u.reshape(*batch, n, K),
        pairwise=mu_p.reshape(*batch, E, K, K),
        messages=lam.reshape(*batch, E, 2, K),
        iterations=run,
        assignment=y,
        assignment_score=pot.score(y),
    )
