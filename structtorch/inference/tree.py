"""Exact inference on trees and forests by parallel tree contraction.

Every op runs the graph's cached contraction schedule (see ``Graph.schedule``): rounds that
*rake* all leaves into their parents and *compress* an independent set of single-child
nodes (semiring matrix products along paths, the tree generalisation of a parallel scan).
On any tree, a path included, this takes O(log n) batched tensor operations.

The forward contraction in the (max, +) semiring gives the MAP score, in the (logsumexp, +)
semiring log Z. Running the steps backwards recovers the argmax (backtracking), exact samples
(backward sampling), or the marginals (an outside pass), from the snapshots the forward pass
kept, without an autograd graph of the loop.

Internally every tensor is slot-major and batch-minor (unary [N, K, B], edge matrices
[N, K, K, B]): the batch is the contiguous innermost dim, so the semiring products vectorise
over examples and reductions over states are cheap outer-dim reductions.

The loops run many small tensor ops, so none of them may open an OpenMP parallel region for a
small tensor: with more than one torch thread on a busy machine, every such region waits for a
descheduled worker (milliseconds). Hence rows are gathered with ``index_select`` and written
with ``index_copy_`` (parallel only past torch's 32768-element grain, unlike advanced indexing),
sums into rows go through ``index_add_rows``, exp / log avoid MKL's threaded VML on CPU
(``exp_serial``, ``log_ge1``), and the max semiring reduces with ``amax`` (``max(dim)`` always opens a
region) and recovers arguments only along the backtracked rows (``_first_argmax``).

The backend ``"compile"`` (opt-in, ``inference.backend``) runs the MAP, log Z and marginal passes through
``torch.compile`` instead: one program per schedule and pass with every step unrolled, so inductor
fuses the small ops of a step (C++/OpenMP on CPU, Triton on GPU). The backend ``"fused"`` (opt-in; see
``fused``) runs the passes of CPU tensors through hand-written C++ kernels instead: one loop nest per pass,
SIMD over batch entries, the potentials read once (on chains of 128 labels, B = 1024: MAP 3x and
marginals 6x the time of copying that many bytes, against 31-35x for the eager passes). The eager passes stay
the reference.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..graph import Schedule, check_int, choose_schedule
from ..potentials import Potentials
from . import fused
from .backends import current_backend, fused_active

__all__ = ["tree_map", "tree_logz", "tree_marginals", "tree_max_marginals", "tree_sample", "cheapest_schedule",
           "exp_serial", "index_add_rows", "log_ge1"]

_LOG2E = 1.4426950408889634


# ---------------------------------------------------------------------- thread-count independent primitives
def exp_serial(x: torch.Tensor) -> torch.Tensor:
    """exp(x), elementwise. On CPU as exp2(x log2 e): torch's float exp calls MKL's VML, which opens
    a parallel region for every call of >= 128 elements; the result differs by at most
    |x| * 2**-24 relatively (below float32 rounding for the non-positive, max-shifted x used here)."""
    return torch.exp2(x * _LOG2E) if x.device.type == "cpu" else x.exp()


def log_ge1(z: torch.Tensor) -> torch.Tensor:
    """log(z) for z in {0} or [1, inf) (sums of max-shifted exps), as log1p(z - 1) on CPU: exact
    (z - 1 is exact there) and without MKL's threaded VML log."""
    return torch.log1p(z - 1) if z.device.type == "cpu" else z.log()


def index_add_rows(target: torch.Tensor, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """target[index[i]] += source[i] along dim 0, in place and in index order; returns target.

    target [R, *S], index [I], source [I, *S]. ``index_add_`` on the first (or last) dim takes an
    expanded-index scatter path that radix-sorts in parallel regions however small the tensors;
    on a middle dim it adds row by row (a parallel region only for a row past torch's grain).
    """
    target[None, ..., None].index_add_(1, index, source[None, ..., None])
    return target


def _first_argmax(x: torch.Tensor) -> torch.Tensor:
    """Index of the first maximum along dim 1 of x [S, K, B] -> [S, B] (as ``x.max(1)``: -inf rows
    give 0). Reduced over a contiguous last dim: ``argmax`` over the strided state dim is very slow
    for B > 1, and ``max(dim)`` opens a parallel region for any size."""
    return x.transpose(1, 2).contiguous().argmax(-1)


@dataclass
class _Tape:
    """What the forward contraction kept of one step (S removed nodes; batch-minor).

    ``left`` / ``right`` ((max, +), MAP): what the maximising x_node is recomputed from along the
    backtracked rows: the scores a[x_parent, x_node] [S, K, K, B] that were maximised over x_node (rake),
    or a[x_parent, x_node] + right[x_node, x_child] [S, K, K, B] each (compress).
    ``cond``: the removed node's conditional given its context, laid out (p, node) [S, K, K, B] (rake)
    or (p, node, c) [S, K, K, K, B] (compress). (logsumexp, +): the distribution P(x_node | context),
    all zeros in a zero-probability context. (max, +): the max-conditional, the maximised sum minus
    its maximum (<= 0; -inf in an impossible context).
    """

    left: torch.Tensor | None = None
    right: torch.Tensor | None = None
    cond: torch.Tensor | None = None


# ---------------------------------------------------------------------- layout
def _flat(pot: Potentials, op: str) -> tuple[torch.Tensor, torch.Tensor, Schedule, torch.Size]:
    """Batch-minor unary [N, K, B] and pairwise [NE, K, K, B] over all node/edge slots, with the schedule."""
    if not isinstance(pot, Potentials):
        raise TypeError(f"{op} expects a structtorch.Potentials, got {type(pot).__name__}")
    pot.graph.require_forest(op)
    batch = pot.batch_shape
    sched = cheapest_schedule(pot.graph, batch.numel(), pot.num_states, pot.device)
    u, p = pot.slots()
    return u.permute(1, 2, 0), p.permute(1, 2, 3, 0), sched, batch


# Rough per-step dispatch cost and per-element cost (seconds) of the contraction loop, by device
# type: they only decide between two exact schedules, never the result. CPU values fitted on
# chains (B in {1, 64, 1024}, n in {128, 1024}, K in {2, 8}, 2 cores); CUDA values are guesses.
_STEP_COST = {"cpu": 4.5e-5, "cuda": 6e-5}
_ELEMENT_COST = {"cpu": 6e-9, "cuda": 5e-12}


def cheapest_schedule(graph, B: int, K: int, device: torch.device) -> Schedule:
    """Rake+compress (O(log n) steps, O(n K^3) work) or rake-only (O(height) steps, O(n K^2) work),
    whichever the cost model prefers for this batch size and K (``graph.choose_schedule``); both are exact."""
    return choose_schedule(lambda compress: graph.schedule(device, compress=compress), K ** 2 * B, K ** 3 * B,
                           _STEP_COST, _ELEMENT_COST, device)


def _edge_matrices(pair: torch.Tensor, sched: Schedule) -> torch.Tensor:
    """M [N, K, K, B]: M[v] = potential of v's parent edge, oriented (x_parent, x_v); roots unused."""
    NE, K, _, B = pair.shape
    if NE == 0:
        return pair.new_zeros(sched.num_slots, K, K, B)
    M = pair.index_select(0, sched.parent_edge.clamp(min=0))
    return M.index_copy_(0, sched.flipped, M.index_select(0, sched.flipped).transpose(1, 2))


def _out_shape(values: torch.Tensor, batch: torch.Size, ensemble: bool) -> torch.Tensor:
    """Per-graph values [G, B] -> [*B] (single graph) or [*B, T] (ensemble)."""
    return values.T.reshape(*batch, values.shape[0]) if ensemble else values.reshape(batch)


# ---------------------------------------------------------------------- the compile and fused backends
# Store every intermediate whose expression has more than one op rather than inline it into its readers:
# at inductor's CPU default (50 ops) the marginal pass became one C++ loop nest that recomputes each step's
# exps and products in every reader, 3-6x slower than eager.
_INDUCTOR = {"realize_opcount_threshold": 1}


def _run(fn: Callable, sched: Schedule, *tensors: torch.Tensor):
    """fn(*tensors, sched) on the backend in force (``inference.backend``): by the fused CPU kernels, by its
    compiled program for this schedule, or eagerly.

    ``"compile"``: each schedule (graph and device) and pass compiles once, kept with the schedule, with its
    steps unrolled, and again for a new batch size, K or dtype (seconds each on CPU: inductor generates and
    builds C++); past torch._dynamo's recompile limit a pass runs eagerly. Worth it where the passes are bound
    by per-op overhead (small batches, K = 2); see scripts/bench_tree.py --compile. Where torch cannot compile
    a pass (seen: torch 2.11's inductor generated C++ that does not build on an AVX-512 CPU), it runs eagerly
    from then on, with one warning.
    """
    if fused_active(tensors[0]):
        return _fused(fn, sched, *tensors)
    if current_backend() != "compile":
        return fn(*tensors, sched)
    key = ("compiled", fn.__name__)
    if key not in sched.memo:
        sched.memo[key] = torch.compile(lambda *t: fn(*t, sched), dynamic=False, options=_INDUCTOR)
    try:
        return sched.memo[key](*tensors)
    except torch._dynamo.exc.BackendCompilerFailed as err:  # inductor's InductorError is one
        warnings.warn(f"inference.backend('compile'): torch.compile failed on {fn.__name__} "
                      f"({type(err).__name__}: {str(err).splitlines()[0][:200]}); this pass runs eagerly",
                      RuntimeWarning, stacklevel=2)
        sched.memo[key] = lambda *t: fn(*t, sched)
        return fn(*tensors, sched)


def _fused(fn: Callable, sched: Schedule, unary: torch.Tensor, pair: torch.Tensor):
    """The pass ``fn`` (one of the ``_*_pass`` functions) by the fused CPU kernels: the same outputs."""
    k = fused.kernels()
    u, p = unary.permute(2, 0, 1).contiguous(), pair.permute(3, 0, 1, 2).contiguous()  # the slots' own layout
    args = (u, p, *fused.forest(sched), sched.num_groups)
    if fn is _map_pass:
        values, y = k.tree_map(*args)
        return values, y.T
    if fn is _logz_pass:
        return k.tree_logz(*args)
    _, mu, mu_pair = k.tree_marginals(*args, fn is _max_marginal_pass)
    mu = mu.permute(1, 2, 0)
    return mu if fn is _max_marginal_pass else (mu, mu_pair.permute(1, 2, 3, 0))


# ---------------------------------------------------------------------- forward contraction
def _contract(unary: torch.Tensor, pair: torch.Tensor, sched: Schedule, semiring: str, keep: str | None = "cond"
              ) -> tuple[torch.Tensor, torch.Tensor, list[_Tape]]:
    """Run all steps in the (max, +) or (logsumexp, +) semiring.

    unary [N, K, B], pair [NE, K, K, B] -> per-graph values [G, B], final unary [N, K, B], tape
    keeping ``keep`` of each step: "cond", "args" ((max, +) only: left / right) or None (empty tapes: the value alone).
    """
    U = unary.clone(memory_format=torch.contiguous_format)
    M = _edge_matrices(pair, sched)
    tape = []
    for step in sched.steps:
        a = M.index_select(0, step.node) + U.index_select(0, step.node).unsqueeze(1)  # (x_parent, x_node, b)
        right = M.index_select(0, step.child) if step.kind == "compress" else None  # (x_node, x_child, b)
        full = a if right is None else a[:, :, :, None] + right[:, None]  # compress: (p, node, c, b)
        if semiring == "max":
            out = full.amax(2)
            if keep == "args":
                t = _Tape(left=a, right=right)
            else:
                t = _Tape(cond=full - out.unsqueeze(2).clamp_min(torch.finfo(out.dtype).min) if keep else None)
        else:
            out, cond = _lse_and_cond(full, 2) if keep else (_lse(full, 2), None)
            t = _Tape(cond=cond)
        if step.kind == "rake":
            index_add_rows(U, step.parent, out)
        else:
            M.index_copy_(0, step.child, out)
        tape.append(t)
    root_u = U.index_select(0, sched.roots)
    per_root = root_u.amax(1) if semiring == "max" else _lse(root_u, 1)  # [R, B]
    values = index_add_rows(per_root.new_zeros(sched.num_groups, U.shape[2]), sched.root_group, per_root)
    return values, U, tape


def _lse(x: torch.Tensor, dim: int) -> torch.Tensor:
    """log-sum-exp over ``dim`` (all -inf slices give -inf)."""
    m = x.amax(dim, keepdim=True).clamp_min(torch.finfo(x.dtype).min)
    return (log_ge1(exp_serial(x - m).sum(dim, keepdim=True)) + m).squeeze(dim)


def _lse_and_cond(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """log-sum-exp over ``dim`` and the normalised exp (the conditional), from one exp pass.

    All -inf slices give -inf and an all-zero conditional (never NaN).
    """
    m = x.amax(dim, keepdim=True).clamp_min(torch.finfo(x.dtype).min)
    e = exp_serial(x - m)
    z = e.sum(dim, keepdim=True)  # in {0} or [1, K]: the max contributes exp(0)
    return (log_ge1(z) + m).squeeze(dim), e / z.clamp_min(1.0)


# ---------------------------------------------------------------------- backward passes
def _argmax_backtrack(U: torch.Tensor, tape: list[_Tape], sched: Schedule) -> torch.Tensor:
    """MAP assignment y [N, B] of a max-semiring contraction: each removed node's first maximiser
    given its parent's (and, compressed, its child's) state, from the same sums the forward took
    the max of."""
    N, K, B = U.shape
    y = torch.zeros(N, B, dtype=torch.long, device=U.device)
    y.index_copy_(0, sched.roots, _first_argmax(U.index_select(0, sched.roots)))
    for step, t in zip(reversed(sched.steps), reversed(tape)):
        S = len(step.node)
        yp = y.index_select(0, step.parent)[:, None, None]  # [S, 1, 1, B]
        rows = t.left.gather(1, yp.expand(S, 1, K, B)).squeeze(1)  # left[s, y_parent, x_node, b]
        if step.kind == "compress":
            yc = y.index_select(0, step.child)[:, None, None]
            rows = rows + t.right.gather(2, yc.expand(S, K, 1, B)).squeeze(2)  # + right[s, x_node, y_child, b]
        y.index_copy_(0, step.node, _first_argmax(rows))
    return y


def _row(m: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """m [S, B, R, K], idx [S, X, B] -> m[s, b, idx[s, x, b], :] as [S, X, B, K]."""
    S, X, B = idx.shape
    R, K = m.shape[-2:]
    m = m.unsqueeze(1).expand(S, X, B, R, K)
    return m.gather(-2, idx[..., None, None].expand(S, X, B, 1, K)).squeeze(-2)


def _sample_categorical(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of probs [..., K] (rows sum to 1) by inverse CDF."""
    u = torch.rand(probs.shape[:-1], generator=generator, dtype=probs.dtype, device=probs.device)
    return (probs.cumsum(-1) <= u.unsqueeze(-1)).sum(-1).clamp_max(probs.shape[-1] - 1)


def _sample_backtrack(U: torch.Tensor, tape: list[_Tape], sched: Schedule, num_samples: int,
                      generator: torch.Generator | None) -> torch.Tensor:
    """Exact samples y [N, X, B] by backward sampling through a logsumexp contraction:
    a raked node given its parent, a compressed node given its parent and child."""
    N, K, B = U.shape
    y = torch.zeros(N, num_samples, B, dtype=torch.long, device=U.device)
    root_p = _lse_and_cond(U.index_select(0, sched.roots), 1)[1].transpose(1, 2)  # [R, B, K]
    y.index_copy_(0, sched.roots, _sample_categorical(root_p.unsqueeze(1).expand(-1, num_samples, B, K), generator))
    for step, t in zip(reversed(sched.steps), reversed(tape)):
        yp = y.index_select(0, step.parent)
        if step.kind == "rake":  # rows indexed by x_parent
            probs = _row(t.cond.permute(0, 3, 1, 2), yp)
        else:  # rows indexed by (x_parent, x_child)
            rows = t.cond.permute(0, 4, 1, 3, 2).reshape(-1, B, K * K, K)
            probs = _row(rows, yp * K + y.index_select(0, step.child))
        y.index_copy_(0, step.node, _sample_categorical(probs, generator))
    return y


def _outside(root: torch.Tensor, tape: list[_Tape], sched: Schedule, semiring: str
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Outside pass from the roots' marginals ``root`` [R, K, B] down the tape's conditionals: unary
    marginals [N, K, B] and joints across each slot's parent edge [N, K, K, B].

    (logsumexp, +) with (x, sum); (max, +) with (+, max), giving max-marginals. J[v] is the joint across
    v's *current* edge matrix while undoing the steps: a rake gives J = mu_parent (x) cond(x_v | x_parent);
    a compress splits the joint across (parent, child) into the triple (parent, v, child) =
    J (x) cond(x_v | x_parent, x_child), and so into its two edges.
    """
    times, plus, zero = (torch.add, torch.amax, -math.inf) if semiring == "max" else (torch.mul, torch.sum, 0.0)
    _, K, B = root.shape
    N = len(sched.parent)
    mu = root.new_full((N, K, B), zero)
    J = root.new_full((N, K, K, B), zero)  # (x_parent, x_node, b)
    mu.index_copy_(0, sched.roots, root)
    for step, t in zip(reversed(sched.steps), reversed(tape)):
        if step.kind == "rake":
            joint = times(mu.index_select(0, step.parent).unsqueeze(2), t.cond)
        else:
            triple = times(J.index_select(0, step.child).unsqueeze(2), t.cond)  # (p, v, c, b)
            joint = plus(triple, 3)
            J.index_copy_(0, step.child, plus(triple, 1))
        J.index_copy_(0, step.node, joint)
        mu.index_copy_(0, step.node, plus(joint, 1))
    return mu, J


def _max_marginals(U: torch.Tensor, tape: list[_Tape], sched: Schedule, values: torch.Tensor) -> torch.Tensor:
    """Max-marginals [N, K, B] of a (max, +) contraction kept with ``keep="cond"`` (per-graph ``values``
    [G, B]): a root's are its final unary plus the maxima of the other trees of its graph."""
    root_u = U.index_select(0, sched.roots)  # [R, K, B]
    group = values.index_select(0, sched.root_group)  # [R, B]
    others = torch.where(torch.isfinite(group), group - root_u.amax(1), -math.inf)
    return _outside(root_u + others.unsqueeze(1), tape, sched, "max")[0]


def _pair_from_joints(J: torch.Tensor, sched: Schedule, num_edge_slots: int) -> torch.Tensor:
    """Per-slot joints [N, K, K, B] (x_parent, x_v) -> per-edge [NE, K, K, B] in stored orientation."""
    _, K, _, B = J.shape
    out = J.new_zeros(num_edge_slots, K, K, B)
    out.index_copy_(0, sched.parent_edge[sched.children], J.index_select(0, sched.children))
    flipped = sched.parent_edge[sched.flipped]
    return out.index_copy_(0, flipped, out.index_select(0, flipped).transpose(1, 2))


def _one_hot(y: torch.Tensor, sched: Schedule, num_edge_slots: int, K: int, dtype: torch.dtype
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """One-hot of an assignment y [N, B]: unary [N, K, B], pairwise [NE, K, K, B]."""
    oh = torch.nn.functional.one_hot(y, K).to(dtype).transpose(1, 2)
    J = oh.index_select(0, sched.parent.clamp(min=0)).unsqueeze(2) * oh.unsqueeze(1)  # (x_parent, x_node, b)
    return oh, _pair_from_joints(J, sched, num_edge_slots)


def _per_slot(grad: torch.Tensor, num_slots: int) -> torch.Tensor:
    """Per-graph grads [G, B] -> per node or edge slot [slots, B] (slots laid out graph-major)."""
    return grad.repeat_interleave(num_slots // grad.shape[0], dim=0) if num_slots else grad[:0]


# ---------------------------------------------------------------------- autograd functions
def _map_pass(unary: torch.Tensor, pair: torch.Tensor, sched: Schedule) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-graph MAP values [G, B] and the assignment y [N, B]."""
    values, U, tape = _contract(unary, pair, sched, "max", keep="args")
    return values, _argmax_backtrack(U, tape, sched)


def _logz_pass(unary: torch.Tensor, pair: torch.Tensor, sched: Schedule) -> torch.Tensor:
    """Per-graph log Z [G, B]."""
    return _contract(unary, pair, sched, "sum", keep=None)[0]


def _marginal_pass(unary: torch.Tensor, pair: torch.Tensor, sched: Schedule) -> tuple[torch.Tensor, torch.Tensor]:
    """Unary [N, K, B] and pairwise [NE, K, K, B] marginals (stored orientation), zero for a graph with Z = 0."""
    logz, U, tape = _contract(unary, pair, sched, "sum")
    mu, J = _outside(_lse_and_cond(U.index_select(0, sched.roots), 1)[1], tape, sched, "sum")
    possible = torch.isfinite(logz).to(mu.dtype)  # [G, B]
    mu_pair = _pair_from_joints(J, sched, pair.shape[0]) * _per_slot(possible, pair.shape[0])[:, None, None]
    return mu * _per_slot(possible, mu.shape[0])[:, None], mu_pair


def _max_marginal_pass(unary: torch.Tensor, pair: torch.Tensor, sched: Schedule) -> torch.Tensor:
    """Max-marginals [N, K, B]."""
    values, U, tape = _contract(unary, pair, sched, "max")
    return _max_marginals(U, tape, sched, values)


class _TreeMap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, unary, pair, sched):  # noqa: D102
        with torch.no_grad():
            values, y = _run(_map_pass, sched, unary, pair)
        ctx.save_for_backward(y, values)
        ctx.sched, ctx.num_edge_slots, ctx.num_states = sched, pair.shape[0], unary.shape[1]
        ctx.mark_non_differentiable(y)
        return values, y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_values, _grad_y):  # noqa: D102
        y, values = ctx.saved_tensors
        grad = torch.where(torch.isfinite(values), grad_values, 0.0)  # no subgradient at -inf
        gu, gp = _one_hot(y, ctx.sched, ctx.num_edge_slots, ctx.num_states, grad.dtype)
        return gu * _per_slot(grad, gu.shape[0])[:, None], gp * _per_slot(grad, gp.shape[0])[:, None, None], None


class _TreeLogZ(torch.autograd.Function):
    @staticmethod
    def forward(ctx, unary, pair, sched):  # noqa: D102
        with torch.no_grad():
            values = _run(_logz_pass, sched, unary, pair)
        ctx.save_for_backward(unary, pair)
        ctx.sched = sched
        return values

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_values):  # noqa: D102
        unary, pair = ctx.saved_tensors
        mu, mu_pair = _marginal_tensors(unary, pair, ctx.sched)
        return (mu * _per_slot(grad_values, mu.shape[0])[:, None],
                mu_pair * _per_slot(grad_values, mu_pair.shape[0])[:, None, None], None)


def _marginal_tensors(unary: torch.Tensor, pair: torch.Tensor, sched: Schedule
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Unary [N, K, B] and pairwise [NE, K, K, B] marginals: one contraction and one outside pass."""
    with torch.no_grad():
        return _run(_marginal_pass, sched, unary, pair)


# ---------------------------------------------------------------------- public ops
def tree_map(pot: Potentials) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact MAP on a tree or forest.

    Returns (score [*B], y [*B, n]) (ensembles: [*B, T], [*B, T, n]); score is differentiable
    and its gradient w.r.t. the potentials is the one-hot of y. Rows where every assignment is
    impossible score -inf (and get zero gradient).
    """
    u, p, sched, batch = _flat(pot, "tree_map")
    values, y = _TreeMap.apply(u, p, sched)
    g = pot.graph
    y = y.T.reshape(*_lead(batch, g), g.num_nodes)
    return _out_shape(values, batch, g.is_ensemble), y


def tree_logz(pot: Potentials) -> torch.Tensor:
    """Exact log partition function [*B] ([*B, T] for ensembles); its gradient is the marginals."""
    u, p, sched, batch = _flat(pot, "tree_logz")
    return _out_shape(_TreeLogZ.apply(u, p, sched), batch, pot.graph.is_ensemble)


def tree_marginals(pot: Potentials) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact marginals: unary [*B, n, K] and pairwise [*B, E, K, K] (stored edge orientation).

    Rows (ensembles: row and tree) with no possible assignment (log Z = -inf) get all-zero
    marginals. Not differentiable: differentiate ``tree_logz`` instead.
    """
    u, p, sched, batch = _flat(pot, "tree_marginals")
    mu, mu_pair = _marginal_tensors(u, p, sched)
    g = pot.graph
    lead = _lead(batch, g)
    K = pot.num_states
    return (mu.permute(2, 0, 1).reshape(*lead, g.num_nodes, K),
            mu_pair.permute(3, 0, 1, 2).reshape(*lead, g.num_edges, K, K))


def tree_max_marginals(pot: Potentials) -> torch.Tensor:
    """Exact max-marginals on a tree/forest: max over assignments with y_i = a of score(y), for every node i
    and state a: [*B, n, K] (ensembles: per graph, [*B, T, n, K]); -inf where y_i = a is impossible.

    One (max, +) contraction and one outside pass (``_max_marginals``), as ``tree_marginals`` in (+, x).
    """
    u, p, sched, batch = _flat(pot, "tree_max_marginals")
    with torch.no_grad():
        mm = _run(_max_marginal_pass, sched, u, p)
    g = pot.graph
    return mm.permute(2, 0, 1).reshape(*_lead(batch, g), g.num_nodes, pot.num_states)


def tree_sample(pot: Potentials, num_samples: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Exact samples y [num_samples, *B, n] ([num_samples, *B, T, n] for ensembles) from
    P(y) proportional to exp(score(y)), by backward sampling through the contraction."""
    check_int(num_samples, "num_samples", 1, expected="a positive int")
    u, p, sched, batch = _flat(pot, "tree_sample")
    if batch.numel() == 0:  # an empty batch has empty samples
        return torch.zeros(num_samples, *_lead(batch, pot.graph), pot.graph.num_nodes, dtype=torch.long,
                           device=pot.device)
    with torch.no_grad():
        values, U, tape = _contract(u, p, sched, "sum")
        if torch.isinf(values).any():
            raise ValueError("tree_sample: some rows have no possible assignment (log Z = -inf)")
        y = _sample_backtrack(U, tape, sched, num_samples, generator)  # [N, X, B]
    g = pot.graph
    return y.permute(1, 2, 0).reshape(num_samples, *_lead(batch, g), g.num_nodes)


def _lead(batch: torch.Size, graph) -> tuple[int, ...]:
    """Leading dims of per-node outputs: *B, plus T for ensembles."""
    return (*batch, graph.num_graphs) if graph.is_ensemble else tuple(batch)
