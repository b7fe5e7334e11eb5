"""K-best MAP on trees and forests, and MAP over ensembles of trees with a certificate (RTA).

``tree_kbest`` runs the k-best (max, +) semiring, whose elements are descending k-lists, on the same
rake / compress contraction schedule as the other tree ops (see ``Graph.schedule`` and ``tree.py``),
so a chain of n takes O(log n) steps. Each slot v keeps a k-list U[v][x_v] (the subtree raked into
v) and its parent edge a k-list matrix E[v][x_parent, x_v] (the path contracted between them):

  rake v into p:     U[p][x_p] <- top_k ( U[p][x_p] (x) top_k over x_v of (E[v][x_p, x_v] (x) U[v][x_v]) )
  compress v (p, c): E[c][x_p, x_c] <- top_k over x_v of ( (E[v][x_p, x_v] (x) U[v][x_v]) (x) E[c][x_v, x_c] )

where (x) is the k-best product of two descending lists, top_k of a_i + b_j over the rank pairs with
(i + 1)(j + 1) <= k (any other sum has k sums at least as large above it). The forest is first
*binarised* (a node with more than two children gets a balanced binary tree of dummy nodes that copy
its state, identity potentials) and one super-root per graph (a single state) joins its components, so
a rake step folds at most two leaves into a parent (two sub-steps with distinct parents), and the k best
are the super-root's list. The steps keep the arguments of every top-k; backtracking undoes them in
reverse, turning (state, rank) of each slot into its children's. Work per example: O(n K^3 k log k) on
the compress schedule, O(n K^2 k log k) on the rake-only (level-synchronous) one; the cheaper one for
the batch size and k runs (both exact, as in ``tree.py``).

Excluding one assignment y_hat (RTA's worst-violator search) takes the k + 1 best and drops y_hat
where it is among them (else the (k + 1)-th): the k best of the others either way.

``ensemble_map``'s answers that Lemma 7 leaves uncertified at k_max are then polished by single-label
changes on the union graph (``_polish``, iterated conditional modes): the answer only scores higher, so
the certificate and the upper bound stay sound.

Rows are gathered with ``index_select`` and written with ``index_copy_`` rather than advanced
indexing, which opens an OpenMP parallel region from 3000 elements (see ``tree.py``: such
regions cost milliseconds on a busy machine with more than one torch thread).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ..graph import Graph, Step, check_int, choose_schedule, contraction_steps, root_forest
from ..potentials import Potentials
from . import fused
from .backends import fused_active
from .exact import all_assignments, assignment_index

__all__ = ["EnsembleSearch", "cheapest_schedule", "tree_kbest", "ensemble_enumerate", "ensemble_map", "ensemble_search",
           "ensemble_union"]

_NEG = float("-inf")
#: ``ensemble_enumerate``: at most this many assignments K**n (RTA enumerates up to 22 labels: ``exact_labels``)
MAX_ENUMERATED = 2**22
#: ``ensemble_enumerate``: scores per block (first halves x second halves, or rows x first halves x cross terms)
ENUMERATED_ELEMENTS = 2**18


@dataclass(frozen=True)
class _KBestSchedule:
    """Contraction schedule of the binarised forest over M augmented slots: N = T*n original, then G
    super-roots, then dummies.

    origin [M]: the original slot whose state a slot carries (super-roots: -1).
    edge_code [M]: how a slot's parent edge is built: e (stored edge e, oriented parent->child),
    NE + e (edge e transposed), 2 NE (identity: dummy), 2 NE + 1 (zeros: super-root -> component root),
    -1 for super-roots. steps: rake / compress steps (``graph.Step``), a rake's parents distinct.
    roots [G]: the super-roots. num_raked / num_compressed: nodes the steps remove.
    """

    num_slots: int
    num_original: int
    origin: torch.Tensor
    edge_code: torch.Tensor
    steps: tuple[Step, ...]
    roots: torch.Tensor
    num_raked: int
    num_compressed: int

    def to(self, device: torch.device) -> _KBestSchedule:
        steps = tuple(Step(s.kind, s.node.to(device), s.parent.to(device), None if s.child is None else
                           s.child.to(device)) for s in self.steps)
        return _KBestSchedule(self.num_slots, self.num_original, self.origin.to(device), self.edge_code.to(device),
                              steps, self.roots.to(device), self.num_raked, self.num_compressed)


def _build_kbest_schedule(graph: Graph, compress: bool) -> _KBestSchedule:
    n, E, G = graph.num_nodes, graph.num_edges, graph.num_graphs
    N, NE = G * n, G * E
    identity, zeros = 2 * NE, 2 * NE + 1
    origin = list(range(N)) + [-1] * G
    parent = [-1] * (N + G)
    edge_code = [-1] * (N + G)
    children: list[list[int]] = [[] for _ in range(N + G)]
    for t, e in enumerate(graph.edge_lists()):
        p, pe, flip = root_forest(n, e)
        for v in range(n):
            s = t * n + v
            if p[v] >= 0:
                parent[s], edge_code[s] = t * n + p[v], t * E + pe[v] + (NE if flip[v] else 0)
            else:
                parent[s], edge_code[s] = N + t, zeros
            children[parent[s]].append(s)

    def binarise(p: int, kids: list[int]) -> None:
        """p keeps at most two children; larger groups hang under dummies that copy p's state."""
        if len(kids) <= 2:
            return
        for half in (kids[: len(kids) // 2], kids[len(kids) // 2:]):
            if len(half) == 1:
                continue
            d = len(origin)
            origin.append(origin[p])
            parent.append(p)
            edge_code.append(identity)
            for c in half:
                parent[c] = d
            binarise(d, half)

    for s in range(N + G):
        binarise(s, children[s])
    as_long = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int64))  # noqa: E731
    steps = []
    for kind, node, par, child in contraction_steps(np.asarray(parent), compress):
        if kind == "rake":  # at most two leaves per parent: the first of each parent, then the second
            first = np.zeros(len(node), dtype=bool)
            first[np.unique(par, return_index=True)[1]] = True
            steps += [Step(kind, as_long(node[m]), as_long(par[m])) for m in (first, ~first) if m.any()]
        else:
            steps.append(Step(kind, as_long(node), as_long(par), as_long(child)))
    return _KBestSchedule(len(origin), N, as_long(origin), as_long(edge_code), tuple(steps),
                          as_long(list(range(N, N + G))),
                          sum(len(s.node) for s in steps if s.kind == "rake"),
                          sum(len(s.node) for s in steps if s.kind == "compress"))


# Rough per-step and per-candidate costs (seconds), by device type: they only choose between two exact
# schedules, never the result. CPU values fitted on chains and random trees (B = 64, K = 2, k in 1..32,
# n in 16..1024, one thread); CUDA values are guesses.
_STEP_COST = {"cpu": 7e-5, "cuda": 6e-4}
_CANDIDATE_COST = {"cpu": 1.1e-8, "cuda": 5e-11}


def cheapest_schedule(graph: Graph, B: int, K: int, k: int, device: torch.device) -> _KBestSchedule:
    """Rake+compress (O(log n) steps, O(n K^3 k log k) work) or rake-only (O(height) steps, O(n K^2 k log k)
    work), whichever the cost model prefers for this batch size, K and k (``graph.choose_schedule``); both are
    exact."""
    P = len(_rank_pairs(k, "cpu")[0])
    return choose_schedule(
        lambda compress: graph.cached(("kbest", compress), device, lambda: _build_kbest_schedule(graph, compress)),
        (K * K + K) * P * B, (K * K + K ** 3) * P * B, _STEP_COST, _CANDIDATE_COST, device)


# ---------------------------------------------------------------------- the k-best semiring program
def _augment(pot: Potentials, sched: _KBestSchedule) -> tuple[torch.Tensor, torch.Tensor]:
    """Potentials on the binarised forest: unary [M, B, K] and parent-edge matrices [M, B, K, K] (x_parent, x_v)."""
    u, p = (t.transpose(0, 1) for t in pot.slots())  # [N, B, K], [NE, B, K, K]
    N, B, K = u.shape
    M, G = sched.num_slots, len(sched.roots)
    root_u = u.new_full((G, B, K), _NEG)
    root_u[..., 0] = 0.0  # a super-root has a single state
    u_aug = torch.cat([u, root_u, u.new_zeros(M - N - G, B, K)])
    identity = torch.full((K, K), _NEG, dtype=u.dtype, device=u.device).fill_diagonal_(0.0)
    table = torch.cat([p, p.transpose(-1, -2), identity.expand(1, B, K, K), u.new_zeros(1, B, K, K)])
    return u_aug, table.index_select(0, sched.edge_code.clamp(min=0))


def _exclude_rows(pot: Potentials, exclude: torch.Tensor) -> torch.Tensor:
    """exclude [*B', n] validated and broadcast to the batch: [B, n]."""
    y = pot.check_labels(exclude, "exclude")
    batch, n = pot.batch_shape, pot.graph.num_nodes
    try:
        return torch.broadcast_to(y, (*batch, n)).reshape(-1, n)
    except RuntimeError as err:
        raise ValueError(f"exclude must have shape [*B, n={n}] broadcastable to the batch {tuple(batch)}, "
                         f"got {tuple(y.shape)}") from err


def _rank_pairs(k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank pairs (I [P], J [P]) with (i + 1)(j + 1) <= k: the only sums a_i + b_j of two descending k-lists
    that the k best may need (P ~ k ln k)."""
    i = np.repeat(np.arange(k), k // np.arange(1, k + 1))
    j = np.concatenate([np.arange(k // (r + 1)) for r in range(k)])
    return torch.as_tensor(i, device=device), torch.as_tensor(j, device=device)


def _product_index(K: int, k: int, I: torch.Tensor, J: torch.Tensor) -> dict[str, torch.Tensor]:
    """Flat positions of every candidate sum of the three k-best products, so that each operand is one
    gather of a contiguous tensor (no broadcasting over tiny inner dims, no transposed copies).

    below: E[v] [K(p), K(v), k] at (x_p, x_v, I[q]) and U[v] [K(v), k] at (x_v, J[q]), laid out (x_p, x_v, q);
    path: A [K(p), K(v), k] at (x_p, x_v, I[q]) and E[c] [K(v), K(c), k] at (x_v, x_c, J[q]), laid out
    (x_p, x_c, x_v, q).
    """
    xp, xv, q = (t.reshape(-1) for t in torch.meshgrid(*(torch.arange(m, device=I.device) for m in (K, K, len(I))),
                                                         indexing="ij"))
    xp3, xc3, xv3, q3 = (t.reshape(-1) for t in torch.meshgrid(
        *(torch.arange(m, device=I.device) for m in (K, K, K, len(I))), indexing="ij"))
    return {"below_e": (xp * K + xv) * k + I[q], "below_u": xv * k + J[q],
            "path_a": (xp3 * K + xv3) * k + I[q3], "path_e": (xv3 * K + xc3) * k + J[q3]}


def _gather(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t [S, B, *rest] flattened over rest, gathered at idx [S, B, k] -> [S, B, k] (int64)."""
    return t.flatten(2).gather(-1, idx).long()


def _select_last(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t [..., L] at idx [Q] along its last dim: [..., Q], by a gather with the index broadcast (stride 0);
    ``index_select`` along a last dim copies one strided slice per index (tree_kbest on 10 random trees of 983
    labels, 26 rows, k = 32, 2 cores: 56 s with it, 21 s with this; 174 labels, 64 rows, k = 16: 14.8 s, 7.8 s)."""
    return t.gather(-1, idx.expand(*t.shape[:-1], len(idx)))


def _take(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """table [P] at idx (any shape), without advanced indexing."""
    return table.index_select(0, idx.reshape(-1)).view_as(idx)


def _kbest_program(u: torch.Tensor, p: torch.Tensor, sched: _KBestSchedule, k: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores [G, B, k] and states [M, B, k] of the k best: the contraction, then backtracking.

    u [M, B, K], p [M, B, K, K]. Lists are the last dim: U [M, B, K, k], E [M, B, K(parent), K(v), k].
    The tape keeps each step's top-k arguments as int32 (half the memory; they are below K k^2).
    """
    M, B, K = u.shape
    I, J = _rank_pairs(k, u.device)
    P, at = len(I), _product_index(K, k, I, J)
    U = u.new_full((M, B, K, k), _NEG)
    U[..., 0] = u
    E = u.new_full((M, B, K, K, k), _NEG)
    E[..., 0] = p
    tape = []
    for step in sched.steps:
        v = step.node
        S = len(v)
        # E[v] (x) U[v]: [S, B, K(parent), K(v) P]
        below = (_select_last(E.index_select(0, v).flatten(2), at["below_e"])
                 + _select_last(U.index_select(0, v).flatten(2), at["below_u"])).view(S, B, K, K * P)
        if step.kind == "rake":
            lists, arg_leaf = below.topk(k, -1)  # [S, B, K(parent), k] over (x_v, pair)
            up = _select_last(U.index_select(0, step.parent), I) + _select_last(lists, J)
            new, arg_up = up.topk(k, -1)
            U.index_copy_(0, step.parent, new)
            tape.append((arg_leaf.int(), arg_up.int()))
        else:
            a, arg_node = below.view(S, B, K, K, P).topk(k, -1)  # [S, B, K(parent), K(v), k]
            path = (_select_last(a.flatten(2), at["path_a"])
                    + _select_last(E.index_select(0, step.child).flatten(2), at["path_e"]))
            new, arg_path = path.view(S, B, K, K, K * P).topk(k, -1)  # [S, B, K(parent), K(child), k]
            E.index_copy_(0, step.child, new)
            tape.append((arg_node.int(), arg_path.int()))
    scores = U.index_select(0, sched.roots)[:, :, 0]  # a super-root's single state
    return scores, _backtrack(sched, tape, I, J, B, K, k)


def _backtrack(sched: _KBestSchedule, tape: list, I: torch.Tensor, J: torch.Tensor, B: int, K: int, k: int
               ) -> torch.Tensor:
    """States x [M, B, k] of the k best, undoing the steps in reverse: each slot's state, its rank in U
    (``ru``) and its rank in its parent edge's E (``re``), as the lists were at that point."""
    M, P = sched.num_slots, len(I)
    x = torch.zeros(M, B, k, dtype=torch.long, device=I.device)
    ru, re = torch.zeros_like(x), torch.zeros_like(x)
    ru.index_copy_(0, sched.roots, torch.arange(k, device=I.device).expand(len(sched.roots), B, k))
    for step, (arg_below, arg_above) in zip(reversed(sched.steps), reversed(tape)):
        v, par = step.node, step.parent
        xp = x.index_select(0, par)
        if step.kind == "rake":
            q = _gather(arg_above, xp * k + ru.index_select(0, par))  # pair (rank in the older U[p], rank in lists)
            ru.index_copy_(0, par, _take(I, q))
            flat = _gather(arg_below, xp * k + _take(J, q))  # (x_v, pair) of lists[x_p]
            xv, q = flat // P, flat % P
        else:
            c = step.child
            flat = _gather(arg_above, (xp * K + x.index_select(0, c)) * k + re.index_select(0, c))
            xv, q = flat // P, flat % P  # x_v, pair (rank in E[v] (x) U[v], rank in the older E[c])
            re.index_copy_(0, c, _take(J, q))
            q = _gather(arg_below, (xp * K + xv) * k + _take(I, q))
        x.index_copy_(0, v, xv)
        re.index_copy_(0, v, _take(I, q))
        ru.index_copy_(0, v, _take(J, q))
    return x


def _drop_excluded(scores: torch.Tensor, x: torch.Tensor, y_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best except y_hat from the k + 1 best: scores [G, B, k+1], x [G, n, B, k+1], y_hat [B, n] ->
    [G, B, k], [G, n, B, k]. Drops y_hat where it is among the finite entries, else the last."""
    k = scores.shape[-1] - 1
    hit = (x == y_hat.T[None, :, :, None]).all(1) & torch.isfinite(scores)  # [G, B, k+1]
    drop = torch.where(hit.any(-1), hit.to(torch.uint8).argmax(-1), k)
    ranks = torch.arange(k, device=scores.device)
    keep = ranks + (ranks >= drop[..., None])  # [G, B, k]
    return scores.gather(-1, keep), x.gather(-1, keep[:, None].expand(*x.shape[:-1], k))


# ---------------------------------------------------------------------- public ops
def tree_kbest(pot: Potentials, k: int, exclude: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best distinct assignments of a tree or forest, descending.

    Returns scores [*B, k] and ys [*B, k, n] (ensembles: [*B, T, k], [*B, T, k, n]). Where fewer
    than k (possible) assignments exist, the remaining scores are -inf and their ys unspecified.
    exclude: LongTensor [*B, n] or None; that one assignment is left out of every list (inside
    the dynamic program), e.g. the true labelling when searching for the worst violator.
    """
    if not isinstance(pot, Potentials):
        raise TypeError(f"tree_kbest expects a structtorch.Potentials, got {type(pot).__name__}")
    check_int(k, "k", 1, expected="a positive int")
    pot.graph.require_forest("tree_kbest")
    g, batch = pot.graph, pot.batch_shape
    y_hat = None if exclude is None else _exclude_rows(pot, exclude)
    kk = k if y_hat is None else k + 1
    with torch.no_grad():
        if fused_active(pot.unary) and batch.numel() > 0:
            scores, x = _fused_kbest(pot, kk)
        else:
            sched = cheapest_schedule(g, batch.numel(), pot.num_states, kk, pot.device)
            scores, x = _kbest_program(*_augment(pot, sched), sched, kk)
            x = x[: sched.num_original]
        G, n = g.num_graphs, g.num_nodes
        x = x.reshape(G, n, x.shape[1], kk)
        if y_hat is not None:
            scores, x = _drop_excluded(scores, x, y_hat)
    ys = x.permute(2, 0, 3, 1)  # [B, G, k, n]
    if g.is_ensemble:
        return scores.permute(1, 0, 2).reshape(*batch, G, k), ys.reshape(*batch, G, k, n)
    return scores.reshape(*batch, k), ys.reshape(*batch, k, n)


def _fused_kbest(pot: Potentials, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores [G, B, k] and states [T n, B, k] of the k best by the fused CPU kernel (``csrc/kbest_cpu.cpp``)."""
    u, p = (t.contiguous() for t in pot.slots())
    sched = pot.graph.schedule("cpu")
    scores, x = fused.kernels().tree_kbest(u, p, *fused.forest(sched), sched.num_groups, k)
    return scores.permute(1, 0, 2), x.permute(1, 0, 2)


class EnsembleSearch(NamedTuple):
    """``ensemble_search``'s answer, batch [*B]: the best candidate y [*B, n] and its mean tree score, an upper
    bound on the max of the mean tree score (Lemma 7: max(score, mean over trees of each tree's k-th best);
    equal to score where certified), Lemma 7's certificate (bool) and the K used (long)."""

    y: torch.Tensor
    score: torch.Tensor
    upper: torch.Tensor
    certified: torch.Tensor
    k_used: torch.Tensor


def ensemble_map(pot: Potentials, k: int, k_max: int | None = None, exclude: torch.Tensor | None = None,
                 exact: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """MAP of the mean score of T trees on the same labels, by K-best lists (RTA, Sec. 4.1).

    pot: an ensemble (graph edges [T, n-1, 2], pairwise [*B, T, n-1, K, K], unary [*B, n, K]
    or [*B, T, n, K]). Candidates are the union of every tree's k best, each scored on the whole
    ensemble in one batched gather; the best is returned with Lemma 7's certificate: it is the
    exact maximiser when its ensemble score >= the mean over trees of each tree's k-th best.
    With ``k_max``, k doubles for the uncertified examples only, until certified or k_max.
    ``exclude`` [*B, n] leaves one assignment out (the worst-violator search of training).
    ``exact``: every assignment is scored instead (``ensemble_enumerate``, K**n <= ``MAX_ENUMERATED``): the
    maximiser, certified, with k used 0.

    Returns (y [*B, n], score [*B], certified bool [*B], k used LongTensor [*B]); ``ensemble_search``
    also returns an upper bound on the max.
    """
    y, score, _, certified, k_used = ensemble_search(pot, k, k_max, exclude, exact)
    return y, score, certified, k_used


def ensemble_search(pot: Potentials, k: int, k_max: int | None = None, exclude: torch.Tensor | None = None,
                    exact: bool = False) -> EnsembleSearch:
    """``ensemble_map`` with the upper bound of Lemma 7's argument: an assignment in no tree's k-best list scores
    at most the mean of the trees' k-th best scores on every tree, so max(best candidate, that mean) bounds
    the max of the mean tree score from above whether or not the search is certified (with ``exact``: the max)."""
    if not isinstance(pot, Potentials) or not pot.graph.is_ensemble:
        raise ValueError("ensemble_map needs Potentials on an ensemble graph (edges [T, n-1, 2])")
    pot.graph.require_spanning_trees("ensemble_map")
    check_int(k, "k", 1, expected="a positive int")
    k_max = k if k_max is None else k_max
    check_int(k_max, "k_max", k, expected=f"an int >= k={k}")
    u, p = pot.expanded()
    batch, n = pot.batch_shape, pot.graph.num_nodes
    u = u.reshape(-1, *u.shape[-3:])
    B = u.shape[0]
    p = p.reshape(B, *p.shape[-4:])
    if exact:  # scored tree by tree as the K-best answers are
        y = ensemble_enumerate(pot, exclude).reshape(B, n)
        score = _own_tree_scores(Potentials(u, p, pot.graph), y[:, None].expand(-1, pot.graph.num_graphs, -1))
        score = score.mean(-1).reshape(batch)
        return EnsembleSearch(y.reshape(*batch, n), score, score, torch.ones_like(score, dtype=torch.bool),
                              torch.zeros_like(score, dtype=torch.long))
    ex = None if exclude is None else _exclude_rows(pot, exclude)
    y = torch.zeros(B, n, dtype=torch.long, device=u.device)
    score, bound = u.new_full((B,), _NEG), u.new_full((B,), _NEG)
    k_used = torch.zeros(B, dtype=torch.long, device=u.device)
    todo = torch.arange(B, device=u.device)
    while True:
        sub = Potentials(u.index_select(0, todo), p.index_select(0, todo), pot.graph)
        found = _ensemble_candidates(sub, k, None if ex is None else ex.index_select(0, todo))
        for out, value in zip((y, score, bound), found):
            out.index_copy_(0, todo, value)
        k_used.index_fill_(0, todo, k)
        todo = todo[(score < bound).index_select(0, todo)]
        if len(todo) == 0 or k >= k_max:
            break
        k = min(2 * k, k_max)
    if len(todo):  # uncertified at k_max: their winners polished (answers that only score higher)
        _polish_rows(Potentials(u, p, pot.graph), todo, y, score, ex)
    certified = score >= bound
    return EnsembleSearch(y.reshape(*batch, n), score.reshape(batch), torch.maximum(score, bound).reshape(batch),
                          certified.reshape(batch), k_used.reshape(batch))


@torch.no_grad()
def ensemble_enumerate(pot: Potentials, exclude: torch.Tensor | None = None) -> torch.Tensor:
    """The maximiser y [*B, n] of an ensemble's mean tree score (ties: the lowest assignment in ``all_assignments``'
    order), by scoring all K**n assignments (at most ``MAX_ENUMERATED``), meet in the middle: on the union graph
    the score is <c, v> + c^T G c + const with c(y) the indicators [y_i = s] of the states s > 0 and G the edges'
    interactions (upper block-triangular: edges (i, j) with i < j). With the labels split into a first half A and
    the rest B, a batch row's scores are one table [K**|A|, K**|B|]: the halves' own scores on its margins plus
    c_A G_AB c_B^T (two matrix products). Only the rows a of that table that may hold the maximum are computed
    (``_unpruned``: branch and bound), in blocks of at most ``ENUMERATED_ELEMENTS`` scores. -inf entries
    (impossible states) count through the same form of their indicators: an assignment that meets one scores -inf.
    ``exclude`` [*B, n] leaves one assignment out (where nothing else is possible, another assignment is still
    returned)."""
    n, K = pot.graph.num_nodes, pot.num_states
    if K**n > MAX_ENUMERATED:
        raise ValueError(f"ensemble_enumerate scores K**n assignments, at most {MAX_ENUMERATED}: got K={K}, n={n} "
                         f"({K**n}); use the K-best search (exact=False)")
    union = ensemble_union(pot)
    u, p = union.expanded()
    u, p = u.reshape(-1, n, K), p.reshape(-1, *p.shape[-3:])
    e = union.graph.edges.to(u.device)
    forms = [_indicator_form(u.nan_to_num(neginf=0.0), p.nan_to_num(neginf=0.0), e)]
    if u.isneginf().any() or p.isneginf().any():  # the number of -inf terms an assignment meets, in the same form
        forms.append(_indicator_form(u.isneginf().to(u.dtype), p.isneginf().to(u.dtype), e))
    h = n - n // 2
    ys_a, ys_b = all_assignments(h, K, u.device), all_assignments(n - h, K, u.device)
    c_a, c_b = (_indicators(ys, K).to(u.dtype) for ys in (ys_a, ys_b))  # [K**h, h (K-1)], [K**(n-h), (n-h) (K-1)]
    ex = None if exclude is None else assignment_index(_exclude_rows(pot, exclude), K)
    R, S_a, S_b = len(u), len(ys_a), len(ys_b)
    cut = h * (K - 1)
    rows = max(1, ENUMERATED_ELEMENTS // (S_a * max(n - h, 1) * (K - 1)))  # rows per chunk: cross factors [r, S_a, m]
    best = torch.zeros(R, dtype=torch.long, device=u.device)
    for lo in range(0, R, rows):
        r = slice(lo, min(lo + rows, R))
        halves = [_halves(form, r, c_a, c_b, cut) for form in forms]
        value, ex_r = u.new_full((r.stop - lo,), _NEG), None if ex is None else ex[r]
        for pairs in _unpruned(halves, c_b, ex_r).split(max(1, ENUMERATED_ELEMENTS // S_b)):
            i, a = pairs.unbind(1)  # [P]: a row of the chunk, a first half of it
            table = _pair_table(halves[0], i, a, c_b)  # [P, S_b], all but the first half's own scores
            if len(halves) > 1:  # the -inf terms each assignment meets
                table.masked_fill_(_pair_table(halves[1], i, a, c_b) + halves[1][0][i, a, None] > 0.5, _NEG)
            if ex_r is not None:
                hit = (a == ex_r[i] // S_b).nonzero()[:, 0]
                table[hit, ex_r[i[hit]] % S_b] = _NEG
            total = table.amax(-1) + halves[0][0][i, a]  # [P] (amax: 3x max's speed)
            top = value.new_full(value.shape, _NEG).scatter_reduce(0, i, total, "amax")
            order = torch.arange(len(i), device=i.device)
            first = torch.full_like(best[r], len(i)).scatter_reduce(  # each row's first pair at its top: lowest a
                0, i, torch.where(total == top[i], order, len(i)), "amin")
            better = (top > value).nonzero()[:, 0]  # earlier pairs win ties: the lowest assignment
            at = first[better]
            value[better] = top[better]
            best[lo + better] = a[at] * S_b + table[at].argmax(-1)
    y = torch.cat([ys_a[best // S_b], ys_b[best % S_b]], -1)
    if ex is not None:  # only exclude was possible (all -inf): still another assignment
        y[best == ex, 0] = (y[best == ex, 0] + 1) % K
    return y.reshape(*pot.batch_shape, n)


def _indicator_form(u: torch.Tensor, p: torch.Tensor, e: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The score of u [R, n, K], p [R, U, K, K] on edges e [U, 2] (i < j) as <c, v> + c^T G c + const in the
    indicators c [n (K-1)] of the states s > 0: (v [R, n (K-1)], G [R, n (K-1), n (K-1)], const [R]). Each table
    splits into p(s, t) = p(0, 0) + (p(s, 0) - p(0, 0)) + (p(0, t) - p(0, 0)) + g(s, t), g 0 where s or t is 0."""
    R, n, K = u.shape
    base = p[..., :1, :1]
    g = p - p[..., :, :1] - p[..., :1, :] + base  # [R, U, K, K]
    unary = u.index_add(1, e[:, 0], p[..., :, 0] - base[..., 0]).index_add(1, e[:, 1], p[..., 0, :] - base[..., 0, :])
    v = (unary[..., 1:] - unary[..., :1]).reshape(R, n * (K - 1))
    G = u.new_zeros(R, n, n, K - 1, K - 1)
    G[:, e[:, 0], e[:, 1]] = g[..., 1:, 1:]
    const = unary[..., 0].sum(-1) + base.flatten(1).sum(-1)
    return v, G.transpose(2, 3).reshape(R, n * (K - 1), n * (K - 1)), const


def _halves(form: tuple[torch.Tensor, ...], r: slice, c_a: torch.Tensor, c_b: torch.Tensor, cut: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For rows r of an indicator form: the first half's scores with the constant [r, S_a], the second half's
    [r, 1, S_b] and the cross terms' left factor c_A G_AB [r, S_a, (n - h)(K-1)]."""
    v, G, const = (t[r] for t in form)
    s_a = ((c_a @ G[:, :cut, :cut]) * c_a).sum(-1) + v[:, :cut] @ c_a.T + const[:, None]
    s_b = ((c_b @ G[:, cut:, cut:]) * c_b).sum(-1) + v[:, cut:] @ c_b.T
    return s_a, s_b[:, None, :], c_a @ G[:, :cut, cut:]


def _unpruned(halves: list[tuple[torch.Tensor, ...]], c_b: torch.Tensor, excluded: torch.Tensor | None
              ) -> torch.Tensor:
    """The (row, first half a) pairs [P, 2] (row-major) that may hold a row's maximum: branch and bound. Each a is
    bounded by s_A(a) + max s_B + the sum of its positive cross terms (c_B is 0/1), against the best of the pairs
    (a, c0) with c0 the second half's own best; only the a whose bound reaches it can hold the maximum (a 1e-5
    relative slack absorbs rounding). Measured: 0.1% of birds' first halves kept on a trained model, 1.3% of
    yeast's, 2-5% on random potentials."""
    s_a, s_b, cross = halves[0]  # [r, S_a], [r, 1, S_b], [r, S_a, m]
    top_b, c0 = s_b[:, 0].max(-1)
    x0 = c_b[c0][:, None, :]  # [r, 1, m]
    first = s_a + top_b[:, None] + (cross * x0).sum(-1)  # [r, S_a]: the pairs (a, c0)
    if len(halves) > 1:  # -inf terms: a pair that meets one is no candidate
        h_a, h_b, h_cross = halves[1]
        first = first.masked_fill(h_a + h_b[:, 0].gather(1, c0[:, None]) + (h_cross * x0).sum(-1) > 0.5, _NEG)
    if excluded is not None:
        rows = (excluded % s_b.shape[-1] == c0).nonzero()[:, 0]
        first[rows, excluded[rows] // s_b.shape[-1]] = _NEG
    low = first.amax(-1, keepdim=True)  # [r, 1]
    bound = s_a + top_b[:, None] + cross.clamp_min(0).sum(-1)
    return (bound + 1e-5 * (bound.abs() + low.abs()) >= low).nonzero()


def _pair_table(half: tuple[torch.Tensor, ...], i: torch.Tensor, a: torch.Tensor, c_b: torch.Tensor
                ) -> torch.Tensor:
    """s_B + c_A G_AB c_B^T of row i, first half a, for every second half: [P, S_b]."""
    _, s_b, cross = half
    return torch.addmm(s_b[i, 0], cross[i, a], c_b.T)


def _indicators(ys: torch.Tensor, K: int) -> torch.Tensor:
    """[A, n (K-1)] the indicators [y_i = s], s = 1..K-1, of assignments ys [A, n]."""
    return torch.nn.functional.one_hot(ys, K)[..., 1:].flatten(-2)


@dataclass(frozen=True)
class _Union:
    """The union graph of an ensemble: ``graph`` (every distinct label pair once, (i, j) with i < j), and for
    each of the T (n-1) tree edges (trees one after the other) its ``slot`` [T (n-1)] in it and whether it is
    stored the other way round (``flip`` [T (n-1)] bool)."""

    graph: Graph
    slot: torch.Tensor
    flip: torch.Tensor

    def to(self, device: torch.device) -> _Union:
        return _Union(self.graph, self.slot.to(device), self.flip.to(device))


def _build_union(graph: Graph) -> _Union:
    e = graph.edges.reshape(-1, 2)
    lo, hi = e.amin(1), e.amax(1)
    pairs, slot = torch.unique(lo * graph.num_nodes + hi, return_inverse=True)
    union = torch.stack([pairs // graph.num_nodes, pairs % graph.num_nodes], 1)
    return _Union(Graph(graph.num_nodes, union), slot, e[:, 0] > e[:, 1])


def ensemble_union(pot: Potentials) -> Potentials:
    """The ensemble's mean score as one model on its union graph: unary [*B, n, K] (the mean of per-graph
    unaries), pairwise [*B, U, K, K] with U <= min(T (n-1), n (n-1) / 2) distinct label pairs, each the sum of
    its trees' tables / T; ``score`` then equals the mean of the trees' scores."""
    union = pot.graph.cached("ensemble_union", pot.device, lambda: _build_union(pot.graph))
    T, K = pot.graph.num_graphs, pot.num_states
    u = pot.unary.mean(-3) if pot.unary_per_graph else pot.unary
    p = pot.pairwise.flatten(-4, -3)  # [*B, T (n-1), K, K]
    p = torch.where(union.flip[:, None, None], p.transpose(-1, -2), p) / T
    q = p.new_zeros(*p.shape[:-3], union.graph.num_edges, K, K).index_add_(-3, union.slot, p)
    return Potentials(u, q, union.graph)


def _ensemble_candidates(pot: Potentials, k: int, exclude: torch.Tensor | None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best of the union of the trees' k-best lists, its mean score and Lemma 7's bound (the mean over trees of
    their k-th best, -inf where a tree has fewer than k assignments: then every assignment is a candidate);
    batch [B]. The best is the maximiser when its score >= the bound.

    Candidates are ranked by ``_rank_scores`` (the union graph as one dense quadratic form: O(B T k n K)
    memory); the winner and each tree's k-th best are then scored tree by tree with the same arithmetic,
    so the certificate compares like with like."""
    tree_scores, ys = tree_kbest(pot, k, exclude)  # [B, T, k], [B, T, k, n]
    B, T, _, n = ys.shape
    cand = ys.reshape(B, T * k, n)
    padding = torch.isneginf(tree_scores.reshape(B, T * k))  # fewer than k assignments: no candidate
    idx = _rank_scores(ensemble_union(pot), cand).masked_fill(padding, _NEG).argmax(-1)  # [B]
    y = cand.gather(1, idx[:, None, None].expand(B, 1, n)).squeeze(1)
    best = _own_tree_scores(pot, y[:, None].expand(B, T, n)).mean(-1)
    best = best.masked_fill(padding.gather(1, idx[:, None])[:, 0], _NEG)
    # Lemma 7: the best candidate is the maximiser when it scores >= the mean over trees of their k-th best
    kth = _own_tree_scores(pot, ys[:, :, -1])
    bound = kth.masked_fill(torch.isneginf(tree_scores[..., -1]), _NEG).mean(-1)
    if exclude is not None:  # nothing but exclude is possible (score -inf): still return another assignment
        other = exclude.clone()
        other[:, 0] = (other[:, 0] + 1) % pot.num_states
        y = torch.where(((y == exclude).all(-1) & torch.isneginf(best))[:, None], other, y)
    return y, best, bound


def _polish_rows(pot: Potentials, rows: torch.Tensor, y: torch.Tensor, score: torch.Tensor,
                 exclude: torch.Tensor | None) -> None:
    """Replace y [B, n] and its mean tree score [B] at ``rows`` by ``_polish``'s answer where that scores higher
    (in place); pot: batch-[B] ensemble potentials, exclude [B, n] or None."""
    sub = Potentials(pot.unary.index_select(0, rows), pot.pairwise.index_select(0, rows), pot.graph)
    ex = None if exclude is None else exclude.index_select(0, rows)
    polished = _polish(ensemble_union(sub), y.index_select(0, rows), ex)
    value = _own_tree_scores(sub, polished[:, None].expand(-1, pot.graph.num_graphs, -1)).mean(-1)
    better = value > score.index_select(0, rows)
    if ex is not None:  # where only exclude is possible, the answer stays the other assignment it has
        better &= (polished != ex).any(-1)
    y.index_copy_(0, rows[better], polished[better])
    score.index_copy_(0, rows[better], value[better])


def _polish(union: Potentials, y: torch.Tensor, exclude: torch.Tensor | None, incremental: bool | None = None
            ) -> torch.Tensor:
    """Iterated conditional modes on the ensemble's union graph: from y [B, n], change the one label (to the
    state) that raises the mean tree score most, while one does (at most 10 n changes; never to ``exclude``).
    The K-best lists hold each tree's own best assignments; where the trees disagree (hundreds of labels) their
    union can miss assignments that single changes of its winner reach (measured at delicious' 983 labels: +37
    on a K-best winner's mean score). A candidate is only replaced by a better one, so Lemma 7 stays sound.

    local [B, n, K], each label's score terms for each of its states given the others, is computed once; a change
    of label l then updates only l's neighbours (O(degree K)); ``incremental=False`` (the default, None, where a
    pairwise table holds -inf, as -inf - -inf has no value) recomputes it after every change instead."""
    u, p = union.expanded()  # [B, n, K], [B, U, K, K]
    e = union.graph.edges.to(y.device)
    B, n, K = u.shape
    if incremental is None:
        incremental = not bool(torch.isneginf(p).any())
    if incremental:
        inc, side, other = _incidence(union.graph, y.device)  # [n, d]: edge (U: none), l its 2nd end, neighbour
        p = torch.cat([p, p.new_zeros(B, 1, K, K)], 1)  # edge U: zeros, the padding
    y = y.clone()
    local = _local_scores(u, p[:, :len(e)], e, y)
    for _ in range(10 * n):  # each change raises the score, so ICM ends; the cap bounds rounding's drift in local
        gain = (local - local.gather(-1, y[..., None])).nan_to_num(nan=_NEG)
        gain = gain.scatter(-1, y[..., None], _NEG)  # a change, not the state y already has
        if exclude is not None:  # the one change that would give exclude: only where y differs from it once
            differs = y != exclude
            once = (differs.sum(-1) == 1).nonzero().squeeze(-1)
            label = differs.long().argmax(-1).index_select(0, once)
            gain[once, label, exclude[once, label]] = _NEG
        value, flat = gain.flatten(1).max(-1)
        step = (value > 0).nonzero().squeeze(-1)
        if len(step) == 0:
            break
        label, new = flat[step] // K, flat[step] % K
        old = y[step, label]
        y[step, label] = new
        if not incremental:
            local = _local_scores(u, p, e, y)
            continue
        edges, second, nb = inc[label], side[label], other[label]  # [b, d]
        table = p[step[:, None], edges]  # [b, d, K, K]: the changed label's edges
        as_first = _table_slice(table, new, -2) - _table_slice(table, old, -2)  # l = i: row y_l of each table
        as_second = _table_slice(table, new, -1) - _table_slice(table, old, -1)  # l = j: column y_l
        delta = torch.where(second[..., None], as_second, as_first)  # [b, d, K]: the neighbours' terms, each state
        local.index_put_((step[:, None].expand_as(nb), nb), delta, accumulate=True)
    return y


def _table_slice(table: torch.Tensor, state: torch.Tensor, dim: int) -> torch.Tensor:
    """Row (dim=-2) or column (dim=-1) ``state`` [b] of each pairwise table [b, d, K, K]: [b, d, K]."""
    b, d, K = table.shape[:3]
    index = state.view(b, 1, 1, 1).expand(b, d, *((1, K) if dim == -2 else (K, 1)))
    return table.gather(dim, index).squeeze(dim)


def _local_scores(u: torch.Tensor, p: torch.Tensor, e: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """local [B, n, K]: u [B, n, K] plus, for each edge e = (i, j) [U, 2] of p [B, U, K, K], p[e, :, y_j] at i and
    p[e, y_i, :] at j: the score terms that depend on each label's state, the others fixed at y [B, n]."""
    B, U, K = len(y), len(e), u.shape[-1]
    to_i = p.gather(-1, y[:, e[:, 1], None, None].expand(B, U, K, 1)).squeeze(-1)
    to_j = p.gather(-2, y[:, e[:, 0], None, None].expand(B, U, 1, K)).squeeze(-2)
    return u.index_add(1, e[:, 0], to_i).index_add(1, e[:, 1], to_j)


def _incidence(graph: Graph, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each node's edges [n, d] (padded with num_edges), whether the node is their second end [n, d] and the
    neighbour at their other end [n, d] (d: the largest degree), cached on the graph."""
    def build() -> torch.Tensor:
        e, n, U = graph.edges.reshape(-1, 2).cpu(), graph.num_nodes, graph.num_edges
        ends = torch.cat([e[:, 0], e[:, 1]])
        order = torch.argsort(ends, stable=True)
        degree = torch.bincount(ends, minlength=n)
        d = max(int(degree.max()) if U else 0, 1)
        slot = torch.arange(2 * U) - torch.repeat_interleave(torch.cumsum(degree, 0) - degree, degree)
        inc = torch.full((n, d), U, dtype=torch.long)
        side = torch.zeros(n, d, dtype=torch.bool)
        other = torch.arange(n)[:, None].repeat(1, d)
        edge, second = order % U, order >= U
        inc[ends[order], slot] = edge
        side[ends[order], slot] = second
        other[ends[order], slot] = torch.where(second, e[edge, 0], e[edge, 1])
        return torch.stack([inc, side.long(), other])
    inc, side, other = graph.cached("incidence", device, build)
    return inc, side.bool(), other


def _rank_scores(union: Potentials, cand: torch.Tensor) -> torch.Tensor:
    """Scores [B, C] of candidates cand [B, C, n] under batch-[B] potentials on a single graph, as quadratic
    forms of their one-hot codes o [B, C, n K]: <o, u> + <o, W o> with W [B, n K, n K] the edge tables in
    their (i, j) blocks; -inf entries count through a second form (a candidate that hits one scores -inf).
    Memory O(B C n K + B (n K)^2), whatever the number of edges; fused (CPU): the sum of each candidate's terms.
    """
    u, p = union.expanded()  # [B, n, K], [B, U, K, K]
    e = union.graph.edges.to(cand.device)
    if fused_active(u):  # the fused kernel sums each candidate's terms: O(B C (n + U))
        return fused.kernels().score_assignments(u.contiguous(), p.contiguous(), e.contiguous(), cand.contiguous())
    B, n, K = u.shape
    rows = (e[:, 0, None, None] * K + torch.arange(K, device=cand.device)[:, None]).expand(-1, K, K)
    cols = (e[:, 1, None, None] * K + torch.arange(K, device=cand.device)[None, :]).expand(-1, K, K)
    flat = (rows * (n * K) + cols).reshape(-1)  # [U K K] positions in W
    o = torch.nn.functional.one_hot(cand, K).to(u.dtype).flatten(-2)  # [B, C, n K]

    def form(pair: torch.Tensor, unary: torch.Tensor) -> torch.Tensor:  # <o, unary> + <o, W o>
        W = pair.new_zeros(B, (n * K) ** 2).index_add_(1, flat, pair.reshape(B, len(flat))).view(B, n * K, n * K)
        return ((o @ W) * o).sum(-1) + (o @ unary.reshape(B, n * K, 1)).squeeze(-1)

    score = form(p.nan_to_num(neginf=0.0), u.nan_to_num(neginf=0.0))
    hits = form(torch.isneginf(p).to(u.dtype), torch.isneginf(u).to(u.dtype))
    return score.masked_fill(hits > 0, _NEG)


def _own_tree_scores(pot: Potentials, y: torch.Tensor) -> torch.Tensor:
    """Score of y[:, t] on tree t alone: y [B, T, n] -> [B, T] (batch [B] ensemble potentials)."""
    u, p = pot.expanded()  # [B, T, n, K], [B, T, E, K, K]
    edges = pot.graph.edges.to(y.device).expand(y.shape[0], -1, -1, -1)  # [B, T, E, 2]
    a, b = y.gather(-1, edges[..., 0]), y.gather(-1, edges[..., 1])
    pair = p.flatten(-2).gather(-1, (a * pot.num_states + b)[..., None]).squeeze(-1)
    return u.gather(-1, y[..., None]).squeeze(-1).sum(-1) + pair.sum(-1)
