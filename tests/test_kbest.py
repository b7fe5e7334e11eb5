"""K-best inference: ``tree_kbest`` against brute force (with and without an excluded assignment),
on ensembles tree by tree, and ``ensemble_map``'s Lemma 7 certificate against brute-force
maximisation of the mean tree score; plus input validation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from structtorch import Graph, Potentials
from structtorch.inference import brute_force_kbest, brute_force_map, ensemble_map, kbest, tree_kbest
from structtorch.inference.exact import all_assignments
from structtorch.structure import random_spanning_trees

NEG_INF = float("-inf")
TOL = dict(rtol=1e-9, atol=1e-9)
BATCHES = [(), (3,), (2, 2)]
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---------------------------------------------------------------------- graphs
@hst.composite
def tree_edges(draw, n: int, shape: str | None = None) -> list[tuple[int, int]]:
    """A tree on n nodes (random parent attachment, path or star), randomly relabelled, with random
    edge orientation and edge order."""
    if n == 1:
        return []
    shape = shape or draw(hst.sampled_from(["random", "path", "star"]))
    if shape == "random":
        parents = [draw(hst.integers(0, i - 1)) for i in range(1, n)]
    elif shape == "path":
        parents = list(range(n - 1))
    else:
        parents = [0] * (n - 1)
    label = draw(hst.permutations(range(n)))
    flips = draw(hst.lists(hst.booleans(), min_size=n - 1, max_size=n - 1))
    edges = [(label[i], label[p]) if f else (label[p], label[i]) for i, p, f in zip(range(1, n), parents, flips)]
    order = draw(hst.permutations(range(n - 1)))
    return [edges[i] for i in order]


def edge_tensor(edges: list[tuple[int, int]]) -> torch.Tensor:
    return torch.tensor(edges, dtype=torch.long).reshape(-1, 2)


@hst.composite
def forests(draw) -> Graph:
    """Trees and forests (a tree with some edges deleted, possibly all) on 1..7 nodes, or a star on 8
    nodes (7 children: the binarisation puts dummies under the centre)."""
    if draw(hst.integers(0, 9)) == 0:
        n, edges = 8, draw(tree_edges(8, "star"))
    else:
        n = draw(hst.integers(1, 7))
        edges = draw(tree_edges(n))
    if edges and draw(hst.booleans()):  # forest: delete a non-empty subset of the edges
        drop = draw(hst.lists(hst.integers(0, len(edges) - 1), min_size=1, max_size=len(edges), unique=True))
        edges = [e for i, e in enumerate(edges) if i not in drop]
    return Graph(n, edge_tensor(edges))


@hst.composite
def ensembles(draw, max_nodes: int = 6, max_trees: int = 4, allow_forests: bool = False, min_nodes: int = 1
              ) -> Graph:
    """T trees on the same n nodes, edges [T, n-1, 2] (or T forests with the same edge count)."""
    n = draw(hst.integers(min_nodes, max_nodes))
    T = draw(hst.integers(1, max_trees))
    trees = [draw(tree_edges(n)) for _ in range(T)]
    if allow_forests and n > 1 and draw(hst.booleans()):
        keep = draw(hst.integers(0, n - 2))
        trees = [t[:keep] for t in trees]  # edge order is random already
    return Graph(n, torch.stack([edge_tensor(t) for t in trees]))


# ---------------------------------------------------------------------- potentials
def random_potentials(graph: Graph, K: int, batch: tuple[int, ...], seed: int, inf_prob: float, ties: bool,
                      per_tree_unary: bool = True) -> Potentials:
    """float64 potentials: Gaussian, or small integers (many exact ties), with random -inf entries."""
    gen = torch.Generator().manual_seed(seed)
    n, E, T = graph.num_nodes, graph.num_edges, graph.num_graphs
    if graph.is_ensemble:
        ushape = (*batch, T, n, K) if per_tree_unary else (*batch, n, K)
        pshape = (*batch, T, E, K, K)
    else:
        ushape, pshape = (*batch, n, K), (*batch, E, K, K)

    def values(shape):
        v = (torch.randint(-2, 3, shape, generator=gen).double() if ties
             else 1.5 * torch.randn(shape, generator=gen, dtype=torch.float64))
        return v.masked_fill(torch.rand(shape, generator=gen) < inf_prob, NEG_INF)

    return Potentials(values(ushape), values(pshape), graph)


@hst.composite
def potential_params(draw):
    return dict(K=draw(hst.sampled_from([2, 3])), batch=draw(hst.sampled_from(BATCHES)),
                seed=draw(hst.integers(0, 2**31 - 1)), inf_prob=draw(hst.sampled_from([0.0, 0.0, 0.15, 0.4])),
                ties=draw(hst.booleans()))


@hst.composite
def k_values(draw, num_assignments: int, big_limit: int = 128) -> int:
    """k from 1 to past the number of assignments; values near K**n only when K**n is small enough for
    the O(k^2) merges to stay cheap."""
    if num_assignments <= big_limit and draw(hst.booleans()):
        return draw(hst.integers(max(1, num_assignments - 2), num_assignments + 3))
    return draw(hst.integers(1, min(num_assignments + 3, 12)))


def tree_of(pot: Potentials, t: int) -> Potentials:
    """Tree t of an ensemble as a stand-alone Potentials."""
    g = pot.graph
    unary = pot.unary[..., t, :, :] if pot.unary_per_graph else pot.unary
    return Potentials(unary, pot.pairwise[..., t, :, :, :], Graph(g.num_nodes, g.edges[t]))


# ---------------------------------------------------------------------- reference and checks
def codes(y: torch.Tensor, K: int) -> torch.Tensor:
    """Index of assignments y [*, n] in all_assignments' order."""
    n = y.shape[-1]
    return (y * K ** torch.arange(n - 1, -1, -1, device=y.device)).sum(-1)


def all_scores(pot: Potentials) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores [K**n, *B] ([K**n, *B, T] for ensembles) of every assignment [K**n, n]."""
    ys = all_assignments(pot.graph.num_nodes, pot.num_states)
    y = ys.view(-1, *([1] * len(pot.batch_shape)), ys.shape[-1])
    return pot.score(y), ys


def kbest_excluding(pot: Potentials, k: int, exclude: torch.Tensor) -> torch.Tensor:
    """Reference: the k best scores [*B, k] over all assignments except exclude [*B, n] (padded with -inf)."""
    s, ys = all_scores(pot)  # [A, *B]
    ex = torch.broadcast_to(exclude, (*pot.batch_shape, pot.graph.num_nodes))
    s = s.masked_fill(codes(ys, pot.num_states).view(-1, *([1] * ex.dim()))[..., 0] == codes(ex, pot.num_states),
                      NEG_INF)
    top = s.movedim(0, -1).sort(-1, descending=True).values[..., :k]
    pad = k - top.shape[-1]
    return torch.cat([top, top.new_full((*top.shape[:-1], pad), NEG_INF)], -1) if pad > 0 else top


def check_assignments(pot: Potentials, k: int, scores: torch.Tensor, ys: torch.Tensor,
                      exclude: torch.Tensor | None = None) -> None:
    """Finite-score rows: valid labels, pot.score equal to the reported score, pairwise distinct,
    never the excluded assignment. scores [*B, k], ys [*B, k, n] of a single graph."""
    n, K = pot.graph.num_nodes, pot.num_states
    assert scores.shape == (*pot.batch_shape, k) and ys.shape == (*pot.batch_shape, k, n)
    assert ys.dtype == torch.long
    assert not torch.isnan(scores).any()
    finite = torch.isfinite(scores)
    assert (scores != float("inf")).all()
    safe = torch.where(finite[..., None], ys, 0)
    assert ((safe >= 0) & (safe < K)).all(), "label out of range in a finite-score row"
    rescored = pot.score(safe.movedim(-2, 0)).movedim(0, -1)  # [*B, k]
    torch.testing.assert_close(rescored[finite], scores[finite], **TOL)
    c = codes(safe, K)
    same = (c[..., :, None] == c[..., None, :]) & finite[..., :, None] & finite[..., None, :]
    same &= ~torch.eye(k, dtype=torch.bool)
    assert not same.any(), "duplicate assignment among finite-score rows"
    if exclude is not None:
        ex = torch.broadcast_to(exclude, (*pot.batch_shape, n))
        assert not ((c == codes(ex, K)[..., None]) & finite).any(), "excluded assignment returned"


# ---------------------------------------------------------------------- 1. tree_kbest == brute force
@settings(max_examples=200, **SETTINGS)
@given(graph=forests(), params=potential_params(), data=hst.data())
def test_tree_kbest_matches_brute_force(graph, params, data):
    pot = random_potentials(graph, **params)
    A = params["K"] ** graph.num_nodes
    k = data.draw(k_values(A), label="k")
    scores, ys = tree_kbest(pot, k)
    ref, _ = brute_force_kbest(pot, k)
    torch.testing.assert_close(scores, ref, **TOL)
    if k > A:
        assert torch.isneginf(scores[..., A:]).all()
    check_assignments(pot, k, scores, ys)


@pytest.mark.parametrize("graph", [Graph.star(8), Graph.star(11), Graph.empty(7), Graph.empty(9),
                                   Graph(10, [[9, 0], [9, 1], [9, 2], [9, 3], [9, 4], [4, 5], [4, 6], [4, 7],
                                              [4, 8]]),
                                   Graph.chain(10)],
                         ids=["star8", "star11", "empty7", "empty9", "double-star10", "chain10"])
@pytest.mark.parametrize("k", [1, 5, 40])
def test_tree_kbest_wide_nodes(graph, k):
    """Nodes with many children (and many components: many children of the super-root)."""
    pot = random_potentials(graph, 2, (3,), seed=k, inf_prob=0.1, ties=False)
    scores, ys = tree_kbest(pot, k)
    torch.testing.assert_close(scores, brute_force_kbest(pot, k)[0], **TOL)
    check_assignments(pot, k, scores, ys)


def test_tree_kbest_broadcast_batch():
    """Unary without batch dims, pairwise with them (and the other way round)."""
    g = Graph(5, [[0, 1], [1, 2], [1, 3], [3, 4]])
    pot = random_potentials(g, 3, (2, 3), seed=3, inf_prob=0.1, ties=True)
    for p in (Potentials(pot.unary[0, 0], pot.pairwise, g), Potentials(pot.unary, pot.pairwise[0, 0], g)):
        scores, ys = tree_kbest(p, 7)
        torch.testing.assert_close(scores, brute_force_kbest(p, 7)[0], **TOL)
        check_assignments(p, 7, scores, ys)


def test_tree_kbest_k1_is_map():
    g = Graph(6, [[0, 1], [0, 2], [2, 3], [2, 4], [2, 5]])
    pot = random_potentials(g, 3, (4,), seed=0, inf_prob=0.0, ties=False)
    scores, ys = tree_kbest(pot, 1)
    best, y = brute_force_map(pot)
    torch.testing.assert_close(scores[..., 0], best, **TOL)
    assert torch.equal(ys[..., 0, :], y)  # no ties with Gaussian potentials


def test_tree_kbest_all_impossible_row():
    g = Graph.chain(4)
    pot = random_potentials(g, 2, (3,), seed=1, inf_prob=0.0, ties=False)
    unary = pot.unary.clone()
    unary[0, 2] = NEG_INF
    pot = Potentials(unary, pot.pairwise, g)
    scores, ys = tree_kbest(pot, 5)
    assert torch.isneginf(scores[0]).all() and torch.isfinite(scores[1:]).all()
    torch.testing.assert_close(scores, brute_force_kbest(pot, 5)[0], **TOL)


# ---------------------------------------------------------------------- 2. exclude
@settings(max_examples=150, **SETTINGS)
@given(graph=forests(), params=potential_params(), data=hst.data())
def test_tree_kbest_exclude(graph, params, data):
    pot = random_potentials(graph, **params)
    n, K, batch = graph.num_nodes, params["K"], params["batch"]
    A = K ** n
    k = data.draw(k_values(A), label="k")
    mode = data.draw(hst.sampled_from(["map", "random", "shared", "impossible"]), label="mode")
    gen = torch.Generator().manual_seed(params["seed"] + 1)
    if mode == "map":
        exclude = brute_force_map(pot)[1]
    elif mode == "shared":  # [n], broadcast over the batch
        exclude = torch.randint(0, K, (n,), generator=gen)
    else:
        exclude = torch.randint(0, K, (*batch, n), generator=gen)
    if mode == "impossible":  # make exclude's own score -inf (a unary entry it uses)
        node = data.draw(hst.integers(0, n - 1), label="node")
        unary = pot.unary.clone()
        unary[..., node, :].scatter_(-1, exclude[..., node, None], NEG_INF)
        pot = Potentials(unary, pot.pairwise, graph)
        assert torch.isneginf(pot.score(exclude)).all()
    scores, ys = tree_kbest(pot, k, exclude=exclude)
    torch.testing.assert_close(scores, kbest_excluding(pot, k, exclude), **TOL)
    check_assignments(pot, k, scores, ys, exclude)


def test_tree_kbest_exclude_second_best_becomes_first():
    g = Graph(5, [[0, 1], [0, 2], [0, 3], [0, 4]])
    pot = random_potentials(g, 2, (6,), seed=5, inf_prob=0.0, ties=False)
    s_all, y_all = tree_kbest(pot, 4)
    s_ex, y_ex = tree_kbest(pot, 3, exclude=y_all[:, 0])
    torch.testing.assert_close(s_ex, s_all[:, 1:], **TOL)
    assert torch.equal(y_ex, y_all[:, 1:])


def test_tree_kbest_exclude_single_node_and_k_equal_all():
    """n = 1 (no edges) and k = K**n: every other assignment is listed, then one -inf pad."""
    g = Graph.empty(1)
    pot = Potentials(torch.tensor([[0.5, 2.0, -1.0]], dtype=torch.float64), torch.zeros(0, 3, 3).double(), g)
    scores, ys = tree_kbest(pot, 3, exclude=torch.tensor([1]))
    torch.testing.assert_close(scores, torch.tensor([0.5, -1.0, NEG_INF], dtype=torch.float64))
    assert ys[:2, 0].tolist() == [0, 2]


# ---------------------------------------------------------------------- 3. ensembles, tree by tree
@settings(max_examples=80, **SETTINGS)
@given(graph=ensembles(allow_forests=True), params=potential_params(), per_tree=hst.booleans(),
       use_exclude=hst.booleans(), data=hst.data())
def test_tree_kbest_ensemble_equals_each_tree(graph, params, per_tree, use_exclude, data):
    pot = random_potentials(graph, per_tree_unary=per_tree, **params)
    n, K, T, batch = graph.num_nodes, params["K"], graph.num_graphs, params["batch"]
    k = data.draw(k_values(K ** n, big_limit=40), label="k")
    exclude = torch.randint(0, K, (*batch, n), generator=torch.Generator().manual_seed(params["seed"])) \
        if use_exclude else None
    scores, ys = tree_kbest(pot, k, exclude=exclude)
    assert scores.shape == (*batch, T, k) and ys.shape == (*batch, T, k, n)
    for t in range(T):
        single = tree_of(pot, t)
        s_t, _ = tree_kbest(single, k, exclude=exclude)
        torch.testing.assert_close(scores[..., t, :], s_t, **TOL)
        ref = brute_force_kbest(single, k)[0] if exclude is None else kbest_excluding(single, k, exclude)
        torch.testing.assert_close(scores[..., t, :], ref, **TOL)
        check_assignments(single, k, scores[..., t, :], ys[..., t, :, :], exclude)


def test_tree_kbest_ensemble_shared_unary_equals_per_tree_copy():
    g = Graph(4, torch.tensor([[[0, 1], [1, 2], [2, 3]], [[3, 0], [0, 2], [1, 0]]]))
    pot = random_potentials(g, 3, (2,), seed=9, inf_prob=0.1, ties=False, per_tree_unary=False)
    copy = Potentials(pot.unary[:, None].expand(2, 2, 4, 3).contiguous(), pot.pairwise, g)
    s1, y1 = tree_kbest(pot, 6)
    s2, y2 = tree_kbest(copy, 6)
    torch.testing.assert_close(s1, s2, **TOL)
    assert torch.equal(y1[torch.isfinite(s1)], y2[torch.isfinite(s2)])


# ---------------------------------------------------------------------- 4. ensemble_map and its certificate
def ensemble_reference(pot: Potentials, exclude: torch.Tensor | None) -> torch.Tensor:
    """max over assignments (!= exclude) of the mean tree score, [*B]."""
    s, ys = all_scores(pot)  # [A, *B, T]
    ens = s.mean(-1)  # [A, *B]
    if exclude is not None:
        ex = torch.broadcast_to(exclude, (*pot.batch_shape, pot.graph.num_nodes))
        hit = codes(ys, pot.num_states).view(-1, *([1] * (ex.dim() - 1))) == codes(ex, pot.num_states)
        ens = ens.masked_fill(hit, NEG_INF)
    return ens.max(0).values


def check_ensemble_answer(pot, k, k_max, exclude, y, score, cert, k_used) -> torch.Tensor:
    """Shapes, y's own ensemble score, never better than the optimum, exact when certified. Returns the
    brute-force optimum."""
    batch, n, K = pot.batch_shape, pot.graph.num_nodes, pot.num_states
    assert y.shape == (*batch, n) and score.shape == batch and cert.shape == batch and k_used.shape == batch
    assert cert.dtype == torch.bool and y.dtype == torch.long
    assert ((y >= 0) & (y < K)).all()
    best = ensemble_reference(pot, exclude)
    finite = torch.isfinite(score)  # score -inf: nothing possible (but exclude), y is unspecified
    torch.testing.assert_close(pot.score(y).mean(-1)[finite], score[finite], **TOL)  # y has the returned score
    assert (score <= best + 1e-9).all()  # a real assignment: never above the optimum
    torch.testing.assert_close(score[cert], best[cert], **TOL)  # Lemma 7: certified means exact
    if exclude is not None:
        ex = torch.broadcast_to(exclude, (*batch, n))
        assert not ((y == ex).all(-1) & torch.isfinite(score)).any(), "returned the excluded assignment"
    kmax = k if k_max is None else k_max
    assert ((k_used >= k) & (k_used <= kmax)).all()
    if k_max is None:
        assert (k_used == k).all()
    else:  # doubling from k, capped at k_max; an uncertified answer used all of k_max
        ratio = torch.div(k_used, k, rounding_mode="floor")
        power_of_two = (k_used % k == 0) & (ratio & (ratio - 1) == 0)
        assert (power_of_two | (k_used == k_max)).all(), k_used
        assert (k_used[~cert] == k_max).all()
    return best


@hst.composite
def ensemble_cases(draw, max_nodes: int = 6, max_trees: int = 5, max_assignments: int | None = None):
    """A random ensemble (shared or per-tree unary, ties, -inf) and an exclude: None, one tree's MAP
    (often the ensemble's MAP too) or a random assignment."""
    params = draw(potential_params())
    K = params["K"]
    if max_assignments is not None:
        while K ** max_nodes > max_assignments:
            max_nodes -= 1
    # n >= 2: n = 1 (edges [T, 0, 2]) crashes ensemble_map, see test_ensemble_map_single_node
    graph = draw(ensembles(max_nodes=max_nodes, max_trees=max_trees, min_nodes=2))
    pot = random_potentials(graph, per_tree_unary=draw(hst.booleans()), **params)
    mode = draw(hst.sampled_from(["none", "none", "map", "random"]))
    exclude = None
    if mode == "map":
        exclude = brute_force_map(tree_of(pot, 0))[1]
    elif mode == "random":
        exclude = torch.randint(0, K, (*params["batch"], graph.num_nodes),
                                generator=torch.Generator().manual_seed(params["seed"]))
    return pot, exclude


@settings(max_examples=300, **SETTINGS)
@given(case=ensemble_cases(), data=hst.data())
def test_ensemble_map_never_certifies_a_wrong_answer(case, data):
    pot, exclude = case
    A = pot.num_states ** pot.graph.num_nodes
    k = data.draw(hst.integers(1, 4) if A > 81 else hst.sampled_from([1, 2, 3, 4, A]), label="k")
    y, score, cert, k_used = ensemble_map(pot, k, exclude=exclude)
    check_ensemble_answer(pot, k, None, exclude, y, score, cert, k_used)
    if k >= A:
        assert cert.all(), "k = K**n lists every assignment: must be certified"


@settings(max_examples=100, **SETTINGS)
@given(case=ensemble_cases(max_assignments=81))
def test_ensemble_map_doubling_to_all_assignments_is_exact(case):
    """k = 1, k_max = K**n: doubling ends certified (at the latest when the lists hold everything)."""
    pot, exclude = case
    A = pot.num_states ** pot.graph.num_nodes
    y, score, cert, k_used = ensemble_map(pot, 1, k_max=A, exclude=exclude)
    assert cert.all()
    best = check_ensemble_answer(pot, 1, A, exclude, y, score, cert, k_used)
    torch.testing.assert_close(score, best, **TOL)


@settings(max_examples=80, **SETTINGS)
@given(case=ensemble_cases(), data=hst.data())
def test_ensemble_map_k_max(case, data):
    """Any k <= k_max: k used is k * 2**j or k_max, uncertified rows used k_max, certified rows are exact."""
    pot, exclude = case
    k = data.draw(hst.integers(1, 4), label="k")
    k_max = data.draw(hst.integers(k, 13), label="k_max")
    out = ensemble_map(pot, k, k_max=k_max, exclude=exclude)
    check_ensemble_answer(pot, k, k_max, exclude, *out)


@settings(max_examples=150, **SETTINGS)
@given(case=ensemble_cases(), data=hst.data())
def test_ensemble_map_answer_no_single_label_change_improves(case, data):
    """The K-best lists' winner is polished by single-label changes (ICM on the union graph): no assignment one
    label away from the answer (other than exclude) has a higher mean tree score. Without the polish the winner
    of small lists often has a better neighbour when the trees disagree."""
    pot, exclude = case
    k = data.draw(hst.integers(1, 2), label="k")
    y, score, _, _ = ensemble_map(pot, k, exclude=exclude)
    n, K = pot.graph.num_nodes, pot.num_states
    finite = torch.isfinite(score)
    ex = None if exclude is None else torch.broadcast_to(exclude, y.shape)
    for label in range(n):
        for state in range(K):
            other = y.clone()
            other[..., label] = state
            neighbour = pot.score(other).mean(-1)
            if ex is not None:
                neighbour = neighbour.masked_fill((other == ex).all(-1), NEG_INF)
            assert (neighbour[finite] <= score[finite] + 1e-9).all(), (label, state)


def test_polish_updates_only_the_changed_labels_neighbours_as_a_full_recompute_would():
    """``_polish`` keeps each label's local scores and updates the changed label's neighbours only; on random
    30-label ensembles (finite tables, K = 2 and 3, with and without exclude) it makes the same changes as
    recomputing every local score after each change (``incremental=False``, what -inf tables take)."""
    for trial in range(6):
        n, T, B, K = 30, 5, 8, 2 + trial % 2
        gen = torch.Generator().manual_seed(trial)
        graph = random_spanning_trees(n, T, gen)
        pot = Potentials(torch.randn(B, T, n, K, generator=gen, dtype=torch.float64),
                         torch.randn(B, T, n - 1, K, K, generator=gen, dtype=torch.float64), graph)
        union = kbest.ensemble_union(pot)
        start = torch.randint(0, K, (B, n), generator=gen)
        exclude = None if trial < 2 else torch.randint(0, K, (B, n), generator=gen)
        if exclude is not None:  # half the rows one change away from exclude
            exclude[: B // 2] = start[: B // 2]
            exclude[: B // 2, 0] = (exclude[: B // 2, 0] + 1) % K
        recomputed = kbest._polish(union, start, exclude, incremental=False)
        assert not torch.equal(recomputed, start)  # it changed something
        assert torch.equal(kbest._polish(union, start, exclude), recomputed), trial


def test_ensemble_map_certifies_with_a_single_tree():
    """T = 1, k = 1: the tree's best is its own bound, so it must be certified (exact arithmetic)."""
    g = Graph(5, torch.tensor([[[0, 1], [0, 2], [2, 3], [2, 4]]]))
    pot = random_potentials(g, 3, (8,), seed=2, inf_prob=0.1, ties=False)
    y, score, cert, _ = ensemble_map(pot, 1)
    assert cert.all()
    torch.testing.assert_close(score, ensemble_reference(pot, None), **TOL)


@pytest.mark.parametrize("batch", [(), (3,)])
def test_ensemble_map_single_node(batch):
    g = Graph(1, torch.zeros(2, 0, 2, dtype=torch.long))
    pot = random_potentials(g, 3, batch, seed=0, inf_prob=0.0, ties=False)
    out = ensemble_map(pot, 3)  # k = K**n: every assignment is a candidate, so always certified
    check_ensemble_answer(pot, 3, None, None, *out)
    assert out[2].all()


def test_ensemble_map_batch_shapes_and_broadcast():
    """Batch (2, 3), shared unary without batch dims."""
    g = Graph(4, torch.tensor([[[0, 1], [1, 2], [2, 3]], [[0, 2], [0, 3], [1, 3]], [[1, 0], [1, 2], [1, 3]]]))
    pot = random_potentials(g, 2, (2, 3), seed=4, inf_prob=0.0, ties=False)
    pot = Potentials(pot.unary[0, 0, 0], pot.pairwise, g)  # unary [n, K], shared by every tree and row
    out = ensemble_map(pot, 2, k_max=16)
    check_ensemble_answer(pot, 2, 16, None, *out)
    assert out[2].all()


def test_ensemble_map_never_returns_exclude():
    g = Graph(2, torch.tensor([[[0, 1]]]))
    unary = torch.tensor([[0.99, 0.40], [0.09, 0.93]], dtype=torch.float64)
    pairwise = torch.tensor([[[[NEG_INF, NEG_INF], [-1.54, NEG_INF]]]], dtype=torch.float64)  # only (1, 0) possible
    pot = Potentials(unary, pairwise, g)
    exclude = torch.tensor([1, 0])
    y, score, cert, _ = ensemble_map(pot, 1, k_max=4, exclude=exclude)
    assert torch.isneginf(score) and cert
    assert not torch.equal(y, exclude)


def test_ensemble_map_pairwise_without_batch_dims():
    """Per-tree unary [B, T, n, K] with pairwise shared by the batch [T, E, K, K]."""
    g = Graph(5, torch.tensor([[[0, 1], [1, 2], [2, 3], [3, 4]], [[4, 0], [4, 1], [4, 2], [4, 3]]]))
    pot = random_potentials(g, 3, (6,), seed=8, inf_prob=0.1, ties=True)
    pot = Potentials(pot.unary, pot.pairwise[0], g)
    assert pot.unary_per_graph and pot.batch_shape == (6,)
    out = ensemble_map(pot, 1, k_max=3 ** 5)
    check_ensemble_answer(pot, 1, 3 ** 5, None, *out)
    assert out[2].all()


# ---------------------------------------------------------------------- 4b. exact=True: every assignment scored
def lowest_maximiser(pot: Potentials, exclude: torch.Tensor | None) -> torch.Tensor:
    """Reference: the first assignment [*B, n] in all_assignments' order whose mean tree score is the max (exclude
    left out), by enumeration."""
    s, ys = all_scores(pot)
    ens = s.mean(-1)  # [A, *B]
    if exclude is not None:
        ex = torch.broadcast_to(exclude, (*pot.batch_shape, pot.graph.num_nodes))
        ens = ens.masked_fill(codes(ys, pot.num_states).view(-1, *([1] * (ex.dim() - 1))) == codes(ex, pot.num_states),
                              NEG_INF)
    return ys[ens.argmax(0)]


@settings(max_examples=300, **SETTINGS)
@given(case=ensemble_cases(max_nodes=7), small=hst.booleans())
def test_ensemble_map_exact_is_the_lowest_maximiser(case, small):
    """exact=True: the maximiser (the lowest one on ties) of every row, certified, k used 0, upper == score; ties,
    -inf entries, exclude; with tables of 4 scores (``small``) the rows and first halves are split into many."""
    pot, exclude = case
    old = kbest.ENUMERATED_ELEMENTS
    kbest.ENUMERATED_ELEMENTS = 4 if small else old
    try:
        found = kbest.ensemble_search(pot, 2, exclude=exclude, exact=True)
    finally:
        kbest.ENUMERATED_ELEMENTS = old
    y, score, upper, cert, k_used = found
    check_ensemble_answer(pot, 1, None, exclude, y, score, cert, torch.ones_like(k_used))
    assert cert.all() and (k_used == 0).all()
    assert torch.equal(upper, score)
    best = ensemble_reference(pot, exclude)
    torch.testing.assert_close(score, best, **TOL)
    T = pot.graph.num_graphs
    if T & (T - 1) == 0:  # 1, 2 or 4 trees: the mean of small-integer ties is exact, so is "the lowest maximiser"
        possible = torch.isfinite(best)
        assert torch.equal(y[possible], lowest_maximiser(pot, exclude)[possible])


def test_ensemble_map_exact_agrees_with_doubling_k_to_every_assignment():
    """10 trees on 9 labels: the K-best search doubling k to K**n lists everything, so both answers are exact."""
    g = random_spanning_trees(9, 10, torch.Generator().manual_seed(3))
    pot = random_potentials(g, 2, (12,), seed=5, inf_prob=0.0, ties=False)
    exclude = torch.randint(0, 2, (12, 9), generator=torch.Generator().manual_seed(1))
    for ex in (None, exclude):
        y, score, cert, _ = ensemble_map(pot, 4, exact=True, exclude=ex)
        y_k, score_k, cert_k, _ = ensemble_map(pot, 4, k_max=2**9, exclude=ex)
        assert cert.all() and cert_k.all()
        assert torch.equal(y, y_k)
        torch.testing.assert_close(score, score_k, **TOL)


def test_ensemble_map_exact_only_exclude_possible_returns_another_assignment():
    g = Graph(2, torch.tensor([[[0, 1]]]))
    unary = torch.tensor([[0.99, 0.40], [0.09, 0.93]], dtype=torch.float64)
    pairwise = torch.tensor([[[[NEG_INF, NEG_INF], [-1.54, NEG_INF]]]], dtype=torch.float64)  # only (1, 0) possible
    y, score, cert, _ = ensemble_map(Potentials(unary, pairwise, g), 1, exclude=torch.tensor([1, 0]), exact=True)
    assert torch.isneginf(score) and cert
    assert not torch.equal(y, torch.tensor([1, 0]))


def test_ensemble_map_exact_rejects_too_many_assignments():
    g = random_spanning_trees(23, 2, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="at most 4194304: got K=2, n=23"):
        ensemble_map(random_potentials(g, 2, (1,), seed=0, inf_prob=0.0, ties=False), 2, exact=True)


# ---------------------------------------------------------------------- 5. bad input
def _tree_pot(batch=(2,)):
    return random_potentials(Graph.chain(3), 2, batch, seed=0, inf_prob=0.0, ties=False)


def _ensemble_pot(batch=(2,)):
    g = Graph(3, torch.tensor([[[0, 1], [1, 2]], [[0, 2], [2, 1]]]))
    return random_potentials(g, 2, batch, seed=0, inf_prob=0.0, ties=False)


@pytest.mark.parametrize("k", [0, -1, 2.0, 1.5, True, "3", None])
def test_tree_kbest_rejects_bad_k(k):
    with pytest.raises(ValueError, match="k must be a positive int"):
        tree_kbest(_tree_pot(), k)


@pytest.mark.parametrize("k", [0, -2])
def test_ensemble_map_rejects_nonpositive_k(k):
    with pytest.raises(ValueError, match="k must be a positive int"):
        ensemble_map(_ensemble_pot(), k)


def test_ensemble_map_rejects_non_int_k_with_k_max():
    with pytest.raises(ValueError, match="k must be a positive int"):
        ensemble_map(_ensemble_pot(), 1.5, k_max=4)


def test_ensemble_map_non_int_k_error_names_k():
    with pytest.raises(ValueError, match="k must be a positive int"):
        ensemble_map(_ensemble_pot(), 1.5)


@pytest.mark.parametrize("k_max", [1, 0, 3.0, True])
def test_ensemble_map_rejects_bad_k_max(k_max):
    with pytest.raises(ValueError, match="k_max must be an int >= k"):
        ensemble_map(_ensemble_pot(), 2, k_max=k_max)


@pytest.mark.parametrize("op", ["tree_kbest", "ensemble_map"])
def test_exclude_wrong_last_dim(op):
    pot = _tree_pot() if op == "tree_kbest" else _ensemble_pot()
    fn = tree_kbest if op == "tree_kbest" else ensemble_map
    with pytest.raises(ValueError, match=r"exclude must have shape \[\*B, n=3\]"):
        fn(pot, 2, exclude=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"exclude must have shape"):
        fn(pot, 2, exclude=torch.tensor(0))


@pytest.mark.parametrize("op", ["tree_kbest", "ensemble_map"])
@pytest.mark.parametrize("bad", [3, -1])
def test_exclude_labels_out_of_range(op, bad):
    pot = _tree_pot() if op == "tree_kbest" else _ensemble_pot()
    fn = tree_kbest if op == "tree_kbest" else ensemble_map
    exclude = torch.zeros(2, 3, dtype=torch.long)
    exclude[1, 2] = bad
    with pytest.raises(ValueError, match="exclude has labels out of range"):
        fn(pot, 2, exclude=exclude)


@pytest.mark.parametrize("op", ["tree_kbest", "ensemble_map"])
def test_exclude_float_dtype(op):
    pot = _tree_pot() if op == "tree_kbest" else _ensemble_pot()
    fn = tree_kbest if op == "tree_kbest" else ensemble_map
    with pytest.raises(TypeError, match="exclude must be an integer"):
        fn(pot, 2, exclude=torch.zeros(2, 3))


@pytest.mark.parametrize("op", ["tree_kbest", "ensemble_map"])
def test_exclude_batch_mismatch(op):
    pot = _tree_pot() if op == "tree_kbest" else _ensemble_pot()
    fn = tree_kbest if op == "tree_kbest" else ensemble_map
    with pytest.raises(ValueError, match="exclude"):
        fn(pot, 2, exclude=torch.zeros(5, 3, dtype=torch.long))


def test_tree_kbest_rejects_non_tree():
    pot = random_potentials(Graph.complete(4), 2, (), seed=0, inf_prob=0.0, ties=False)
    with pytest.raises(ValueError, match="needs a tree or forest"):
        tree_kbest(pot, 2)


def test_ensemble_with_a_cycle_rejected():
    g = Graph(4, torch.tensor([[[0, 1], [1, 2], [2, 3]], [[0, 1], [1, 2], [0, 2]]]))  # tree 1: triangle + 3
    pot = random_potentials(g, 2, (), seed=0, inf_prob=0.0, ties=False)
    with pytest.raises(ValueError, match="needs a tree or forest"):
        tree_kbest(pot, 2)
    with pytest.raises(ValueError, match="needs a tree or forest"):
        ensemble_map(pot, 2)


def test_ensemble_map_rejects_non_ensemble():
    with pytest.raises(ValueError, match="ensemble graph"):
        ensemble_map(_tree_pot(), 2)
    with pytest.raises(ValueError, match="ensemble graph"):
        ensemble_map("not potentials", 2)


def test_tree_kbest_rejects_non_potentials():
    with pytest.raises(TypeError, match="Potentials"):
        tree_kbest((torch.zeros(3, 2), torch.zeros(2, 2, 2)), 2)


# ---------------------------------------------------------------------- empty batches and non-spanning ensembles
@pytest.mark.parametrize("batch", [(0,), (2, 0)])
def test_kbest_and_ensemble_map_on_an_empty_batch(batch):
    scores, ys = tree_kbest(_tree_pot(batch), 3)
    assert (scores.shape, scores.dtype, ys.shape, ys.dtype) == ((*batch, 3), torch.float64, (*batch, 3, 3),
                                                                torch.long)
    pot = _ensemble_pot(batch)
    scores, ys = tree_kbest(pot, 3)
    assert scores.shape == (*batch, 2, 3) and ys.shape == (*batch, 2, 3, 3)
    y, score, certified, k_used = ensemble_map(pot, 2, k_max=8, exclude=torch.zeros(3, dtype=torch.long))
    assert (y.shape, y.dtype) == ((*batch, 3), torch.long)
    assert (score.shape, score.dtype) == (batch, torch.float64)
    assert (certified.shape, certified.dtype, k_used.shape, k_used.dtype) == (batch, torch.bool, batch, torch.long)


def test_ensemble_map_rejects_members_that_are_not_spanning_trees():
    forests = Graph(4, torch.tensor([[[0, 1], [1, 2]], [[0, 1], [2, 3]]]))  # [T, 2, 2]: n - 2 edges per member
    pot = random_potentials(forests, 2, (2,), seed=0, inf_prob=0.0, ties=False)
    tree_kbest(pot, 2)  # forests are fine for per-tree k-best
    with pytest.raises(ValueError, match=r"ensemble_map needs an ensemble graph of spanning trees, edges "
                                         r"\[T, n-1, 2\] = \[T, 3, 2\] for n = 4 nodes, got edges \[2, 2, 2\]"):
        ensemble_map(pot, 2)


def test_ensemble_map_names_the_member_with_a_cycle():
    g = Graph(4, torch.tensor([[[0, 1], [1, 2], [2, 3]], [[0, 1], [1, 2], [0, 2]]]))  # member 1: triangle + 3
    pot = random_potentials(g, 2, (), seed=0, inf_prob=0.0, ties=False)
    with pytest.raises(ValueError, match="ensemble_map needs a tree or forest, but member 1 of the ensemble"):
        ensemble_map(pot, 2)


def test_ensemble_map_on_one_node():
    g = Graph(1, torch.zeros(3, 0, 2, dtype=torch.long))
    pot = Potentials(torch.tensor([[0.5, 2.0, -1.0]], dtype=torch.float64), torch.zeros(1, 3, 0, 3, 3).double(), g)
    y, score, certified, _ = ensemble_map(pot, 2)
    assert y.tolist() == [[1]] and score.tolist() == [2.0] and certified.tolist() == [True]


# ---------------------------------------------------------------------- both contraction schedules
SCHEDULES = ["compress", "rake_only"]


def forced_schedule(name: str):
    """Force tree_kbest's schedule: rake+compress (per-step cost dominates) or rake-only (per-candidate cost
    dominates)."""
    from unittest import mock

    from structtorch.inference import kbest

    step, candidate = (1.0, 0.0) if name == "compress" else (0.0, 1.0)
    return mock.patch.multiple(kbest, _STEP_COST={"cpu": step}, _CANDIDATE_COST={"cpu": candidate})


@pytest.mark.parametrize("schedule", SCHEDULES)
@settings(max_examples=100, **SETTINGS)
@given(graph=forests(), params=potential_params(), use_exclude=hst.booleans(), data=hst.data())
def test_tree_kbest_each_schedule_matches_brute_force(schedule, graph, params, use_exclude, data):
    pot = random_potentials(graph, **params)
    k = data.draw(k_values(params["K"] ** graph.num_nodes), label="k")
    exclude = torch.randint(0, params["K"], (*params["batch"], graph.num_nodes),
                            generator=torch.Generator().manual_seed(params["seed"])) if use_exclude else None
    with forced_schedule(schedule):
        scores, ys = tree_kbest(pot, k, exclude=exclude)
    ref = brute_force_kbest(pot, k)[0] if exclude is None else kbest_excluding(pot, k, exclude)
    torch.testing.assert_close(scores, ref, **TOL)
    check_assignments(pot, k, scores, ys, exclude)


@pytest.mark.parametrize("n", [2, 9, 40])
def test_tree_kbest_schedules_agree_on_long_chains(n):
    """Chains (many compress rounds) with ties and -inf: both schedules give the same scores (brute force
    where it is small enough) and valid, distinct assignments."""
    pot = random_potentials(Graph.chain(n), 2, (3,), seed=n, inf_prob=0.05, ties=True)
    out = {}
    for schedule in SCHEDULES:
        with forced_schedule(schedule):
            out[schedule] = tree_kbest(pot, 6)
        check_assignments(pot, 6, *out[schedule])
    torch.testing.assert_close(out["compress"][0], out["rake_only"][0], **TOL)
    if n <= 12:
        torch.testing.assert_close(out["compress"][0], brute_force_kbest(pot, 6)[0], **TOL)


# ---------------------------------------------------------------------- 6. the fused CPU kernel (backend "fused")
@pytest.mark.parametrize("check", [test_tree_kbest_matches_brute_force, test_tree_kbest_exclude,
                                   test_tree_kbest_ensemble_equals_each_tree, test_tree_kbest_all_impossible_row,
                                   test_tree_kbest_exclude_single_node_and_k_equal_all,
                                   test_ensemble_map_never_certifies_a_wrong_answer, test_ensemble_map_k_max,
                                   test_ensemble_map_doubling_to_all_assignments_is_exact],
                         ids=lambda f: f.__name__.removeprefix("test_"))
def test_fused_kernel_passes_the_brute_force_checks(fused_kernels, check):
    """The k-best kernel (``csrc/kbest_cpu.cpp``) and the candidates' scores of ``ensemble_map`` on backend
    "fused": the same brute-force checks as the eager program, forests, ensembles, ties, -inf and exclusion."""
    check()


@pytest.mark.parametrize("k", [1, 7, 32])
@pytest.mark.parametrize("shared", [False, True])
def test_fused_kernel_gives_the_eager_scores_on_large_ensembles(fused_kernels, k, shared):
    """At RTA's sizes (10 random spanning trees of 60 labels, 40 rows over the threads, float32 and float64) the
    fused k best scores equal the eager program's, and each assignment has its score."""
    from structtorch.inference import backend
    from structtorch.inference.kbest import _own_tree_scores
    from structtorch.structure import random_spanning_trees

    g = random_spanning_trees(60, 10, torch.Generator().manual_seed(k))
    for dtype in (torch.float32, torch.float64):
        gen = torch.Generator().manual_seed(k)
        unary = torch.randn(40, *(() if shared else (10,)), 60, 2, generator=gen, dtype=dtype)
        pot = Potentials(unary, torch.randn(40, 10, 59, 2, 2, generator=gen, dtype=dtype), g)
        scores, ys = tree_kbest(pot, k)
        with backend("eager"):
            ref, _ = tree_kbest(pot, k)
        torch.testing.assert_close(scores, ref)
        own = torch.stack([_own_tree_scores(pot, ys[:, :, r]) for r in range(k)], -1)  # [B, T, k]
        torch.testing.assert_close(own, scores)
