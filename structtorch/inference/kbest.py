"""K-best MAP on trees and forests, and MAP over ensembles of trees with a certificate (RTA).

``tree_kbest`` is a level-synchronous k-best dynamic program on a *binarised* rooted forest:
every node with more than two children gets a balanced binary tree of dummy nodes that copy
its state (identity potentials), and one super-root per graph joins the components, so each
node combines exactly two child lists. Work per example is O(n K^2 k) for the messages plus
O(n K k^2) for the top-k merges.

Excluding one assignment y_hat (RTA's worst-violator search) happens inside the program: each
message carries, next to its k best entries, one *special* entry, the restriction of y_hat
to the sender's subtree; the combination of two special entries at a node in state y_hat_v
is y_hat's restriction again and is kept out of the regular list.

Rows are gathered with ``index_select`` and written with ``index_copy_`` rather than advanced
indexing, which opens an OpenMP parallel region from 3000 elements (see ``tree.py``: such
regions cost milliseconds on a busy machine with more than one torch thread).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..graph import Graph, _root_forest
from ..potentials import Potentials

__all__ = ["tree_kbest", "ensemble_map", "ensemble_union"]

_NEG = float("-inf")


@dataclass(frozen=True)
class _Level:
    """Nodes at one depth of the binarised forest: node [S], parent [S], slot [S] (0/1: which child of
    its parent), child [S, 2] (their children; M, one past the last slot, where there is none)."""

    node: torch.Tensor
    parent: torch.Tensor
    slot: torch.Tensor
    child: torch.Tensor


@dataclass(frozen=True)
class _KBestSchedule:
    """Binarised forest over M augmented slots: N = T*n original, then G super-roots, then dummies.

    origin [M]: the original slot whose state a slot carries (super-roots: -1).
    edge_code [M]: how a slot's parent edge is built: e (stored edge e, oriented parent->child),
    NE + e (edge e transposed), 2 NE (identity: dummy), 2 NE + 1 (zeros: super-root -> component root),
    -1 for super-roots. levels: deepest first. roots [G].
    """

    num_slots: int
    num_original: int
    origin: torch.Tensor
    edge_code: torch.Tensor
    levels: tuple[_Level, ...]
    roots: torch.Tensor

    def to(self, device: torch.device) -> _KBestSchedule:
        levels = tuple(_Level(*(t.to(device) for t in (lv.node, lv.parent, lv.slot, lv.child))) for lv in self.levels)
        return _KBestSchedule(self.num_slots, self.num_original, self.origin.to(device), self.edge_code.to(device),
                              levels, self.roots.to(device))


def _build_kbest_schedule(graph: Graph) -> _KBestSchedule:
    n, E, G = graph.num_nodes, graph.num_edges, graph.num_graphs
    N, NE = G * n, G * E
    identity, zeros = 2 * NE, 2 * NE + 1
    origin = list(range(N)) + [-1] * G
    parent = [-1] * (N + G)
    edge_code = [-1] * (N + G)
    children: list[list[int]] = [[] for _ in range(N + G)]
    for t, e in enumerate(graph._edge_lists()):
        p, pe, flip = _root_forest(n, e)
        for v in range(n):
            s = t * n + v
            if p[v] >= 0:
                parent[s], edge_code[s] = t * n + p[v], t * E + pe[v] + (NE if flip[v] else 0)
            else:
                parent[s], edge_code[s] = N + t, zeros
            children[parent[s]].append(s)

    def binarise(p: int, kids: list[int]) -> list[int]:
        """p keeps at most two children; larger groups hang under dummies that copy p's state."""
        if len(kids) <= 2:
            return kids
        out = []
        for half in (kids[: len(kids) // 2], kids[len(kids) // 2:]):
            if len(half) == 1:
                out.append(half[0])
                continue
            d = len(origin)
            origin.append(origin[p])
            parent.append(p)
            edge_code.append(identity)
            children.append([])
            for c in half:
                parent[c] = d
            children[d] = binarise(d, half)
            out.append(d)
        return out

    for s in range(N + G):
        children[s] = binarise(s, children[s])
    return _levels(origin, parent, edge_code, children, N, G)


def _levels(origin, parent, edge_code, children, N, G) -> _KBestSchedule:
    """Group the binarised forest by depth (deepest first)."""
    M = len(origin)
    kids = np.full((M, 2), M)
    slot = np.zeros(M, dtype=np.int64)
    for s, cs in enumerate(children):
        kids[s, : len(cs)] = cs
        slot[cs] = np.arange(len(cs))
    by_depth, frontier = [], list(range(N, N + G))
    while frontier:
        by_depth.append(frontier)
        frontier = [c for s in frontier for c in children[s]]
    as_long = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int64))  # noqa: E731
    levels = tuple(
        _Level(as_long(nodes), as_long(np.asarray(parent)[nodes]), as_long(slot[nodes]), as_long(kids[nodes]))
        for nodes in reversed(by_depth)
    )
    return _KBestSchedule(M, N, as_long(origin), as_long(edge_code), levels, as_long(list(range(N, N + G))))


# ---------------------------------------------------------------------- the dynamic program
def _augment(pot: Potentials, sched: _KBestSchedule, exclude: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Potentials on the binarised forest: unary [M, B, K], parent-edge matrices [M, B, K, K]
    (x_parent, x_v), and the excluded assignment per slot [M, B] (None: nothing excluded)."""
    u, p = (t.transpose(0, 1) for t in pot.slots())  # [N, B, K], [NE, B, K, K]
    N, B, K = u.shape
    M, G = sched.num_slots, len(sched.roots)
    root_u = u.new_full((G, B, K), _NEG)
    root_u[..., 0] = 0.0  # a super-root has a single state
    u_aug = torch.cat([u, root_u, u.new_zeros(M - N - G, B, K)])
    identity = torch.full((K, K), _NEG, dtype=u.dtype, device=u.device).fill_diagonal_(0.0)
    table = torch.cat([p, p.transpose(-1, -2), identity.expand(1, B, K, K), u.new_zeros(1, B, K, K)])
    p_aug = table.index_select(0, sched.edge_code.clamp(min=0))
    if exclude is None:
        return u_aug, p_aug, None
    y = _exclude_rows(pot, exclude).T  # [n, B]
    y = y.repeat(N // y.shape[0], 1)  # every graph of an ensemble excludes the same assignment
    y_aug = torch.where((sched.origin >= 0)[:, None], y.index_select(0, sched.origin.clamp(min=0)), 0)
    return u_aug, p_aug, y_aug


def _exclude_rows(pot: Potentials, exclude: torch.Tensor) -> torch.Tensor:
    """exclude [*B', n] validated and broadcast to the batch: [B, n]."""
    y = pot.check_labels(exclude, "exclude")
    batch, n = pot.batch_shape, pot.graph.num_nodes
    try:
        return torch.broadcast_to(y, (*batch, n)).reshape(-1, n)
    except RuntimeError as err:
        raise ValueError(f"exclude must have shape [*B, n={n}] broadcastable to the batch {tuple(batch)}, "
                         f"got {tuple(y.shape)}") from err


def _gather(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t [S, B, *rest] flattened over rest, gathered at idx [S, B, k] -> [S, B, k]."""
    return t.flatten(2).gather(-1, idx)


def _kbest_program(u: torch.Tensor, p: torch.Tensor, y_hat: torch.Tensor | None, sched: _KBestSchedule, k: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores [G, B, k] and assignments [M, B, k] of the k best, upward lists then backtracking."""
    M, B, K = u.shape
    k1 = k + 1  # k regular entries + the special one (y_hat's restriction to the subtree)
    msgs = u.new_full((M + 1, B, K, k1), _NEG)
    msgs[M, ..., k] = 0.0  # a missing child: only the empty "special" entry
    arg_pair = torch.zeros(M, B, K, k, dtype=torch.long, device=u.device)
    arg_msg = torch.zeros_like(arg_pair)
    for level in sched.levels:
        v = level.node
        m1, m2 = msgs.index_select(0, level.child[:, 0]), msgs.index_select(0, level.child[:, 1])
        cand = m1[..., :, None] + m2[..., None, :]  # [S, B, K, k1, k1]
        uv = u.index_select(0, v)
        special = u.new_full(cand.shape[:2], _NEG)
        if y_hat is not None:
            hat = y_hat.index_select(0, v)
            special = (cand[..., k, k] + uv).gather(-1, hat[..., None]).squeeze(-1)  # score of y_hat's restriction
            is_hat = torch.nn.functional.one_hot(hat, K).bool()
            cand[..., k, k] = cand[..., k, k].masked_fill(is_hat, _NEG)  # y_hat itself is not a candidate
        top, arg = cand.flatten(-2).topk(k, -1)
        arg_pair.index_copy_(0, v, arg)
        lists = top + uv[..., None]  # [S, B, K, k]: best completions of the subtree given x_v
        if level is sched.levels[-1]:  # super-roots: the final k best over (x_root, rank)
            scores, arg = lists.flatten(-2).topk(k, -1)
            return scores, _backtrack(sched, arg, arg_pair, arg_msg, y_hat, k)
        pm = p.index_select(0, v)
        reg, arg = (pm[..., :, :, None] + lists[..., None, :, :]).flatten(-2).topk(k, -1)  # eq. of Sec. 4.1
        arg_msg.index_copy_(0, v, arg)
        sp = pm.gather(-1, hat[..., None, None].expand(*hat.shape, K, 1)).squeeze(-1) + special[..., None] \
            if y_hat is not None else special[..., None].expand(-1, -1, K)
        msgs.index_copy_(0, v, torch.cat([reg, sp[..., None]], -1))
    raise AssertionError("unreachable: the last level holds the super-roots")


def _backtrack(sched: _KBestSchedule, arg: torch.Tensor, arg_pair: torch.Tensor, arg_msg: torch.Tensor,
               y_hat: torch.Tensor | None, k: int) -> torch.Tensor:
    """States x [M, B, k] of the k best: top-down, each slot's (state, rank) from its parent's choice.

    Rank k means "special": the whole subtree follows y_hat.
    """
    M, B = arg_pair.shape[:2]
    k1 = k + 1
    x = torch.zeros(M, B, k, dtype=torch.long, device=arg.device)
    r = torch.zeros_like(x)
    x.index_copy_(0, sched.roots, arg // k)
    r.index_copy_(0, sched.roots, arg % k)
    for level in reversed(sched.levels[:-1]):
        v, par = level.node, level.parent
        xp, rp = x.index_select(0, par), r.index_select(0, par)
        pair = _gather(arg_pair.index_select(0, par), xp * k + rp.clamp(max=k - 1))
        i = torch.where(level.slot[:, None, None] == 0, pair // k1, pair % k1)
        flat = _gather(arg_msg.index_select(0, v), xp * k + i.clamp(max=k - 1))
        special = (rp == k) | (i == k)
        hat = y_hat.index_select(0, v)[..., None].expand_as(flat) if y_hat is not None else torch.zeros_like(flat)
        x.index_copy_(0, v, torch.where(special, hat, flat // k))
        r.index_copy_(0, v, torch.where(special, k, flat % k))
    return x


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
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    pot.graph.require_forest("tree_kbest")
    sched = pot.graph.cached("kbest", pot.device, lambda: _build_kbest_schedule(pot.graph))
    with torch.no_grad():
        u, p, y_hat = _augment(pot, sched, exclude)
        scores, x = _kbest_program(u, p, y_hat, sched, k)
    g, batch = pot.graph, pot.batch_shape
    ys = x[: sched.num_original].permute(1, 2, 0)  # [B, k, N]
    if g.is_ensemble:
        T, n = g.num_graphs, g.num_nodes
        return (scores.permute(1, 0, 2).reshape(*batch, T, k),
                ys.reshape(-1, k, T, n).transpose(1, 2).reshape(*batch, T, k, n))
    return scores.reshape(*batch, k), ys.reshape(*batch, k, g.num_nodes)


def ensemble_map(pot: Potentials, k: int, k_max: int | None = None, exclude: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """MAP of the mean score of T trees on the same labels, by K-best lists (RTA, Sec. 4.1).

    pot: an ensemble (graph edges [T, n-1, 2], pairwise [*B, T, n-1, K, K], unary [*B, n, K]
    or [*B, T, n, K]). Candidates are the union of every tree's k best, each scored on the whole
    ensemble in one batched gather; the best is returned with Lemma 7's certificate: it is the
    exact maximiser when its ensemble score >= the mean over trees of each tree's k-th best.
    With ``k_max``, k doubles for the uncertified examples only, until certified or k_max.
    ``exclude`` [*B, n] leaves one assignment out (the worst-violator search of training).

    Returns (y [*B, n], score [*B], certified bool [*B], k used LongTensor [*B]).
    """
    if not isinstance(pot, Potentials) or not pot.graph.is_ensemble:
        raise ValueError("ensemble_map needs Potentials on an ensemble graph (edges [T, n-1, 2])")
    pot.graph.require_spanning_trees("ensemble_map")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    k_max = k if k_max is None else k_max
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < k:
        raise ValueError(f"k_max must be an int >= k={k}, got {k_max!r}")
    u, p = pot.expanded()
    batch, n = pot.batch_shape, pot.graph.num_nodes
    u = u.reshape(-1, *u.shape[-3:])
    B = u.shape[0]
    p = p.reshape(B, *p.shape[-4:])
    ex = None if exclude is None else _exclude_rows(pot, exclude)
    y = torch.zeros(B, n, dtype=torch.long, device=u.device)
    score = u.new_full((B,), _NEG)
    certified = torch.zeros(B, dtype=torch.bool, device=u.device)
    k_used = torch.zeros(B, dtype=torch.long, device=u.device)
    todo = torch.arange(B, device=u.device)
    while True:
        sub = Potentials(u.index_select(0, todo), p.index_select(0, todo), pot.graph)
        found = _ensemble_candidates(sub, k, None if ex is None else ex.index_select(0, todo))
        for out, value in zip((y, score, certified), found):
            out.index_copy_(0, todo, value)
        k_used.index_fill_(0, todo, k)
        todo = todo[~certified.index_select(0, todo)]
        if len(todo) == 0 or k >= k_max:
            break
        k = min(2 * k, k_max)
    return y.reshape(*batch, n), score.reshape(batch), certified.reshape(batch), k_used.reshape(batch)


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
    """Best of the union of the trees' k-best lists, its mean score and Lemma 7's certificate; batch [B].

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
    return y, best, best >= bound


def _rank_scores(union: Potentials, cand: torch.Tensor) -> torch.Tensor:
    """Scores [B, C] of candidates cand [B, C, n] under batch-[B] potentials on a single graph, as quadratic
    forms of their one-hot codes o [B, C, n K]: <o, u> + <o, W o> with W [B, n K, n K] the edge tables in
    their (i, j) blocks; -inf entries count through a second form (a candidate that hits one scores -inf).
    Memory O(B C n K + B (n K)^2), whatever the number of edges."""
    u, p = union.expanded()  # [B, n, K], [B, U, K, K]
    B, n, K = u.shape
    e = union.graph.edges.to(cand.device)
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
