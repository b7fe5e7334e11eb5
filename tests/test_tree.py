"""Exact tree inference (tree_map, tree_logz, tree_marginals, tree_sample) against brute force,
sequential references, autograd, exact sampling, and bad input."""

from __future__ import annotations

import math
import threading
import warnings

import numpy as np
import pytest
import torch
from conftest import (
    NEG_INF,
    assert_no_nan,
    assert_same_values,
    assignment_index,
    ensemble_potentials,
    graphs,
    make_potentials,
    member,
    one_hot_assignment,
    potentials,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from structtorch import Graph, Potentials
from structtorch import inference as inf
from structtorch.inference.exact import all_assignments

BOTH_DTYPES = (torch.float64, torch.float32)


# ---------------------------------------------------------------------- brute-force agreement
def check_against_brute_force(pot: Potentials) -> None:
    """tree_map / tree_logz / tree_marginals / tree_max_marginals equal enumeration (MAP up to ties)."""
    dtype, B, n, K = pot.dtype, pot.batch_shape, pot.graph.num_nodes, pot.num_states
    lead = (*B, pot.graph.num_graphs) if pot.graph.is_ensemble else tuple(B)

    score, y = inf.tree_map(pot)
    bf_score, _ = inf.brute_force_map(pot)
    assert score.shape == lead and score.dtype == dtype
    assert y.shape == (*lead, n) and y.dtype == torch.long
    assert ((y >= 0) & (y < K)).all()
    assert_same_values(score, bf_score, dtype)
    y_score = pot.score(y) if not pot.graph.is_ensemble else ensemble_member_scores(pot, y)
    assert_same_values(y_score, bf_score, dtype)  # the assignment is a true argmax
    assert_same_values(y_score, score, dtype)  # score(tree_map y) == tree_map score

    logz = inf.tree_logz(pot)
    bf_logz = inf.brute_force_logz(pot)
    assert logz.shape == lead and logz.dtype == dtype
    assert_same_values(logz, bf_logz, dtype)

    mu, mu_pair = inf.tree_marginals(pot)
    bf_mu, bf_pair = inf.brute_force_marginals(pot)
    assert mu.shape == (*lead, n, K) and mu_pair.shape == (*lead, pot.graph.num_edges, K, K)
    assert_same_values(mu, bf_mu, dtype)
    assert_same_values(mu_pair, bf_pair, dtype)

    mm = inf.tree_max_marginals(pot)
    assert mm.shape == (*lead, n, K)
    assert_same_values(mm, brute_force_max_marginals(pot), dtype)

    impossible = bf_logz == NEG_INF
    assert (score[impossible] == NEG_INF).all() and (logz[impossible] == NEG_INF).all()
    assert (mu[impossible] == 0).all() and (mu_pair[impossible] == 0).all() and (mm[impossible] == NEG_INF).all()
    assert_no_nan(score, logz, mu, mu_pair, mm)


def brute_force_max_marginals(pot: Potentials) -> torch.Tensor:
    """max over all assignments with y_i = a of score(y): [*B, (T,) n, K], by enumeration."""
    from structtorch.inference.exact import all_scores

    scores, ys = all_scores(pot)  # [*B, (T,) A], [A, n]
    pick = (ys.T[:, None, :] == torch.arange(pot.num_states)[None, :, None])  # [n, K, A]
    return scores[..., None, None, :].masked_fill(~pick, NEG_INF).amax(-1)


def ensemble_member_scores(pot: Potentials, y: torch.Tensor) -> torch.Tensor:
    """score of member t's assignment y[..., t, :] under member t: [*B, T]."""
    return torch.stack([member(pot, t).score(y[..., t, :]) for t in range(pot.graph.num_graphs)], -1)


@settings(max_examples=100, deadline=None)
@given(potentials(graphs(forest=False), dtypes=BOTH_DTYPES))
def test_trees_match_brute_force(pot):
    check_against_brute_force(pot)


@settings(max_examples=100, deadline=None)
@given(potentials(graphs(forest=True), dtypes=BOTH_DTYPES))
def test_forests_match_brute_force(pot):
    check_against_brute_force(pot)


@pytest.mark.parametrize("graph", [Graph(1, []), Graph.empty(4), Graph.chain(8), Graph.star(8),
                                   Graph(6, [[5, 4], [3, 4], [0, 3], [2, 0], [1, 2]])],
                         ids=["single-node", "isolated", "chain", "star", "relabelled-path"])
@pytest.mark.parametrize("dtype", BOTH_DTYPES)
def test_fixed_graphs_match_brute_force(graph, dtype):
    check_against_brute_force(make_potentials(graph, 3, (2,), dtype, seed=5, inf_prob=0.2))


def test_impossible_rows_score_neg_inf_without_nan():
    """Every assignment of row 0 (a forest) and row 1 (a tree) is impossible."""
    forest, tree = Graph(4, [[0, 1], [2, 3]]), Graph.chain(4)
    for g in (forest, tree):
        pot = make_potentials(g, 2, (3,), seed=0)
        unary, pair = pot.unary.clone(), pot.pairwise.clone()
        unary[0, 2] = NEG_INF  # node 2 has no possible state
        pair[1, 0] = NEG_INF  # edge 0 has no possible pair
        pot = Potentials(unary, pair, g)
        score, _ = inf.tree_map(pot)
        logz = inf.tree_logz(pot)
        mu, mu_pair = inf.tree_marginals(pot)
        assert score[:2].tolist() == [NEG_INF, NEG_INF] and logz[:2].tolist() == [NEG_INF, NEG_INF]
        assert torch.isfinite(score[2]) and torch.isfinite(logz[2])
        assert (mu[:2] == 0).all() and (mu_pair[:2] == 0).all()
        torch.testing.assert_close(mu[2].sum(-1), torch.ones(4, dtype=mu.dtype))
        assert_no_nan(score, logz, mu, mu_pair)


@settings(max_examples=60, deadline=None)
@given(ensemble_potentials())
def test_ensembles_match_each_tree_and_brute_force(pot):
    """Ensemble results [*B, T] equal running every tree on its own, and brute force."""
    check_against_brute_force(pot)
    score, y = inf.tree_map(pot)
    logz = inf.tree_logz(pot)
    mu, mu_pair = inf.tree_marginals(pot)
    for t in range(pot.graph.num_graphs):
        single = member(pot, t)
        s_t, y_t = inf.tree_map(single)
        torch.testing.assert_close(score[..., t], s_t)
        torch.testing.assert_close(pot.score(y[..., t, :])[..., t], single.score(y_t))
        torch.testing.assert_close(logz[..., t], inf.tree_logz(single))
        m_t, mp_t = inf.tree_marginals(single)
        torch.testing.assert_close(mu[..., t, :, :], m_t)
        torch.testing.assert_close(mu_pair[..., t, :, :, :], mp_t)


@settings(max_examples=40, deadline=None)
@given(potentials(batch_shapes=[(2,), (2, 3), (1, 2)], broadcast=False))
def test_float32_matches_float64(pot):
    p32 = pot.to(torch.float32)
    s64, s32 = inf.tree_map(pot)[0], inf.tree_map(p32)[0]
    assert s32.dtype == torch.float32
    torch.testing.assert_close(s32.double(), s64, rtol=1e-4, atol=1e-4)
    l32 = inf.tree_logz(p32)
    assert l32.dtype == torch.float32
    torch.testing.assert_close(l32.double(), inf.tree_logz(pot), rtol=1e-4, atol=1e-4)
    for a, b in zip(inf.tree_marginals(p32), inf.tree_marginals(pot)):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(potentials(batch_shapes=[(2,), (2, 3), (3, 2)], broadcast=False),
       st.sampled_from(["unary", "pairwise", "size-one"]))
def test_broadcast_batch_dims_equal_expanded(pot, which):
    """unary or pairwise without batch dims, or with size-1 batch dims, gives what the expanded tensors give."""
    lead = (0,) * len(pot.batch_shape)
    unary, pair = pot.unary, pot.pairwise
    if which == "unary":
        unary = unary[lead]
    elif which == "pairwise":
        pair = pair[lead]
    else:
        unary, pair = unary[:1], pair[..., :1, :, :, :]
    small = Potentials(unary, pair, pot.graph)
    full = Potentials(*small.expanded(), pot.graph)
    assert small.batch_shape == full.batch_shape
    for a, b in zip(inf.tree_map(small), inf.tree_map(full)):
        assert torch.equal(a, b)
    torch.testing.assert_close(inf.tree_logz(small), inf.tree_logz(full))
    for a, b in zip(inf.tree_marginals(small), inf.tree_marginals(full)):
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------------- autograd
def leaf_potentials(pot: Potentials) -> tuple[Potentials, torch.Tensor, torch.Tensor]:
    unary = pot.unary.detach().clone().requires_grad_()
    pair = pot.pairwise.detach().clone().requires_grad_()
    return Potentials(unary, pair, pot.graph), unary, pair


def upstream_weights(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(1), dtype=dtype) + 0.5


GRADCHECK_GRAPHS = {
    "relabelled-tree": Graph(6, [[3, 1], [1, 0], [4, 1], [2, 4], [4, 5]]),
    "forest": Graph(6, [[3, 1], [0, 1], [2, 5]]),
    "chain": Graph.chain(7),
    "star": Graph.star(5),
    "single-node": Graph(1, []),
}
ENSEMBLE = Graph(4, torch.tensor([[[0, 1], [1, 2], [3, 2]], [[2, 0], [0, 3], [1, 3]], [[3, 1], [1, 0], [1, 2]]]))


@pytest.mark.parametrize("name", list(GRADCHECK_GRAPHS))
@pytest.mark.parametrize("broadcast_unary", [False, True])
def test_logz_gradcheck(name, broadcast_unary):
    g = GRADCHECK_GRAPHS[name]
    pot = make_potentials(g, 3, (2,), torch.float64, seed=7)
    unary = pot.unary[0] if broadcast_unary else pot.unary  # [n, K] broadcast against pairwise [2, ...]
    unary = unary.detach().clone().requires_grad_()
    pair = pot.pairwise.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda u, p: inf.tree_logz(Potentials(u, p, g)), (unary, pair))


@pytest.mark.parametrize("per_graph_unary", [True, False], ids=["per-tree-unary", "shared-unary"])
def test_logz_gradcheck_ensemble(per_graph_unary):
    pot = make_potentials(ENSEMBLE, 2, (2,), torch.float64, seed=3, per_graph_unary=per_graph_unary)
    unary = pot.unary.detach().clone().requires_grad_()
    pair = pot.pairwise.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda u, p: inf.tree_logz(Potentials(u, p, ENSEMBLE)), (unary, pair))


def expand_marginals(pot: Potentials, mu: torch.Tensor, mu_pair: torch.Tensor, w: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """w-weighted marginals summed down to the (possibly broadcast) shapes of unary and pairwise."""
    gu = w[..., None, None] * mu
    if pot.graph.is_ensemble and not pot.unary_per_graph:
        gu = gu.sum(-3)
    gp = w[..., None, None, None] * mu_pair
    return gu.sum_to_size(pot.unary.shape), gp.sum_to_size(pot.pairwise.shape)


@settings(max_examples=60, deadline=None)
@given(st.one_of(potentials(), ensemble_potentials()))
def test_logz_gradient_is_marginals(pot):
    pot, unary, pair = leaf_potentials(pot)
    logz = inf.tree_logz(pot)
    w = upstream_weights(logz.shape, logz.dtype)
    (logz * w).sum().backward()
    mu, mu_pair = inf.tree_marginals(pot)
    want_u, want_p = expand_marginals(pot, mu, mu_pair, w)
    assert_no_nan(unary.grad, pair.grad)
    torch.testing.assert_close(unary.grad, want_u)
    torch.testing.assert_close(pair.grad, want_p)


def map_one_hot(pot: Potentials, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One-hot of tree_map's y: [*lead, n, K] and [*lead, E, K, K] (pairwise[e, a, b]: y[e0]=a, y[e1]=b)."""
    g, K = pot.graph, pot.num_states
    if not g.is_ensemble:
        return one_hot_assignment(y, g.edges, K, pot.dtype)
    parts = [one_hot_assignment(y[..., t, :], g.edges[t], K, pot.dtype) for t in range(g.num_graphs)]
    return torch.stack([u for u, _ in parts], -3), torch.stack([p for _, p in parts], -4)


@settings(max_examples=60, deadline=None)
@given(st.one_of(potentials(dtypes=BOTH_DTYPES), ensemble_potentials()))
def test_map_score_gradient_is_one_hot_of_assignment(pot):
    pot, unary, pair = leaf_potentials(pot)
    score, y = inf.tree_map(pot)
    w = upstream_weights(score.shape, score.dtype)
    (score * w).sum().backward()
    oh_u, oh_p = map_one_hot(pot, y)
    w = torch.where(torch.isfinite(score), w, 0.0)  # -inf rows: zero gradient
    want_u, want_p = expand_marginals(pot, oh_u, oh_p, w)
    assert_no_nan(unary.grad, pair.grad)
    torch.testing.assert_close(unary.grad, want_u)
    torch.testing.assert_close(pair.grad, want_p)


def test_map_gradient_edge_orientation():
    """pairwise[e, a, b] scores y[edges[e, 0]] = a, y[edges[e, 1]] = b, for either stored direction."""
    g = Graph(3, [[1, 0], [1, 2]])
    unary = torch.tensor([[0.0, 5.0], [3.0, 0.0], [0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    pair = torch.zeros(2, 2, 2, dtype=torch.float64)
    pair[1, 0, 1] = 2.0  # y1 = 0, y2 = 1
    pair.requires_grad_()
    score, y = inf.tree_map(Potentials(unary, pair, g))
    assert y.tolist() == [1, 0, 1] and score.item() == 10.0
    score.backward()
    want = torch.zeros(2, 2, 2, dtype=torch.float64)
    want[0, 0, 1] = 1  # edge (1, 0): y1 = 0, y0 = 1
    want[1, 0, 1] = 1  # edge (1, 2): y1 = 0, y2 = 1
    assert torch.equal(pair.grad, want)
    assert torch.equal(unary.grad, torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64))


def test_impossible_rows_have_zero_gradients():
    g = Graph(5, [[0, 1], [1, 2], [3, 4]])  # a forest: row 0 has its impossible node in one component
    pot = make_potentials(g, 3, (2,), seed=2)
    unary = pot.unary.clone()
    unary[0, 4] = NEG_INF
    pot, u, p = leaf_potentials(Potentials(unary, pot.pairwise, g))
    for value in (inf.tree_map(pot)[0], inf.tree_logz(pot)):
        u.grad = p.grad = None
        assert value[0] == NEG_INF and torch.isfinite(value[1])
        value.sum().backward()
        assert_no_nan(u.grad, p.grad)
        assert (u.grad[0] == 0).all() and (p.grad[0] == 0).all()
        torch.testing.assert_close(u.grad[1].sum(-1), torch.ones(5, dtype=torch.float64))


# ---------------------------------------------------------------------- sampling
def chi_square_pvalue(samples: torch.Tensor, pot: Potentials) -> float:
    """Goodness of fit of samples [S, n] to the Gibbs distribution of a single-row pot.

    Assignments of zero probability must never be drawn; bins expected below 5 are pooled."""
    n, K = pot.graph.num_nodes, pot.num_states
    scores = pot.score(all_assignments(n, K)).double()  # [K**n], all_assignments order
    prob = torch.softmax(scores, 0).numpy()
    counts = torch.bincount(assignment_index(samples, K), minlength=K**n).numpy()
    assert counts[prob == 0].sum() == 0, "sampled an impossible assignment"
    expected = prob * len(samples)
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return float(chisquare(obs[keep], exp[keep] * obs.sum() / exp[keep].sum()).pvalue)


def single_row(pot: Potentials, index: tuple[int, ...]) -> Potentials:
    return Potentials(*(t[index] for t in pot.expanded()), pot.graph)


NUM_SAMPLES = 20_000


@pytest.mark.parametrize("graph,K", [
    (Graph(4, [[2, 0], [0, 1], [3, 0]]), 3),  # a star with relabelled centre
    (Graph(4, [[3, 2], [1, 2], [0, 1]]), 2),  # a reversed path (exercises compress)
    (Graph(5, [[0, 3], [4, 1]]), 3),  # a forest with an isolated node
])
def test_samples_follow_gibbs_distribution(graph, K):
    pot = make_potentials(graph, K, (2,), torch.float64, seed=11, inf_prob=0.1)
    assert torch.isfinite(inf.tree_logz(pot)).all()
    ys = inf.tree_sample(pot, NUM_SAMPLES, generator=torch.Generator().manual_seed(0))
    assert ys.shape == (NUM_SAMPLES, 2, graph.num_nodes) and ys.dtype == torch.long
    for b in range(2):
        assert chi_square_pvalue(ys[:, b], single_row(pot, (b,))) > 1e-3


def test_samples_follow_gibbs_distribution_float32():
    pot = make_potentials(Graph.chain(4), 3, (), torch.float32, seed=4)
    ys = inf.tree_sample(pot, NUM_SAMPLES, generator=torch.Generator().manual_seed(1))
    assert ys.shape == (NUM_SAMPLES, 4)
    assert chi_square_pvalue(ys, pot) > 1e-3


@pytest.mark.parametrize("per_graph_unary", [True, False])
def test_ensemble_samples_follow_each_tree(per_graph_unary):
    edges = torch.tensor([[[0, 1], [1, 2], [2, 3]], [[3, 0], [0, 2], [1, 0]], [[1, 3], [2, 3], [3, 0]]])
    g = Graph(4, edges)
    pot = make_potentials(g, 2, (2,), torch.float64, seed=9, per_graph_unary=per_graph_unary)
    ys = inf.tree_sample(pot, NUM_SAMPLES, generator=torch.Generator().manual_seed(2))
    assert ys.shape == (NUM_SAMPLES, 2, 3, 4)
    for b in range(2):
        for t in range(3):
            assert chi_square_pvalue(ys[:, b, t], single_row(member(pot, t), (b,))) > 1e-3


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_sample_shape_and_support(batch):
    pot = make_potentials(Graph(6, [[0, 1], [2, 1], [1, 3], [4, 5]]), 3, batch, seed=1, inf_prob=0.3)
    pot = Potentials(pot.unary.index_fill(-1, torch.tensor([0]), 0.0),  # all-zeros stays possible
                     pot.pairwise.index_fill(-1, torch.tensor([0]), 0.0), pot.graph)
    ys = inf.tree_sample(pot, 50, generator=torch.Generator().manual_seed(0))
    assert ys.shape == (50, *batch, 6)
    assert ((ys >= 0) & (ys < 3)).all()
    assert torch.isfinite(pot.score(ys)).all()  # -inf states are never sampled


def test_sampling_is_reproducible_with_a_generator():
    pot = make_potentials(Graph.chain(5), 3, (2,), seed=0)
    a = inf.tree_sample(pot, 100, generator=torch.Generator().manual_seed(42))
    b = inf.tree_sample(pot, 100, generator=torch.Generator().manual_seed(42))
    c = inf.tree_sample(pot, 100, generator=torch.Generator().manual_seed(43))
    assert torch.equal(a, b) and not torch.equal(a, c)


# ---------------------------------------------------------------------- long paths and deep trees
def chain_reference(unary: torch.Tensor, pair: torch.Tensor) -> dict[str, torch.Tensor]:
    """Viterbi and forward-backward along a chain: unary [*B, n, K], pair [*B, n-1, K, K] as (i, i+1)."""
    n = unary.shape[-2]
    alpha, delta, back = [unary[..., 0, :]], [unary[..., 0, :]], []
    for i in range(1, n):
        alpha.append(unary[..., i, :] + (alpha[-1][..., :, None] + pair[..., i - 1, :, :]).logsumexp(-2))
        best, arg = (delta[-1][..., :, None] + pair[..., i - 1, :, :]).max(-2)
        delta.append(unary[..., i, :] + best)
        back.append(arg)
    beta = [torch.zeros_like(unary[..., 0, :])]
    for i in range(n - 2, -1, -1):
        nxt = unary[..., i + 1, :] + beta[0]
        beta.insert(0, (pair[..., i, :, :] + nxt[..., None, :]).logsumexp(-1))
    logz = alpha[-1].logsumexp(-1)
    map_score, last = delta[-1].max(-1)
    y = [last]
    for arg in reversed(back):
        y.insert(0, arg.gather(-1, y[0][..., None])[..., 0])
    mu = torch.stack([(a + b - logz[..., None]).exp() for a, b in zip(alpha, beta)], -2)
    mu_pair = torch.stack([
        (alpha[i][..., :, None] + pair[..., i, :, :] + (unary[..., i + 1, :] + beta[i + 1])[..., None, :]
         - logz[..., None, None]).exp() for i in range(n - 1)], -3)
    return dict(logz=logz, score=map_score, y=torch.stack(y, -1), mu=mu, mu_pair=mu_pair)


def feasible_random_potentials(graph: Graph, K: int, batch: tuple[int, ...], seed: int) -> Potentials:
    """float64 potentials with -inf entries everywhere except state 0 (so all-zeros stays possible)."""
    pot = make_potentials(graph, K, batch, torch.float64, seed=seed, inf_prob=0.2)
    u = pot.unary.clone()
    u[..., 0] = u[..., 0].nan_to_num(neginf=0.0)
    p = pot.pairwise.clone()
    p[..., 0, 0] = p[..., 0, 0].nan_to_num(neginf=0.0)
    return Potentials(u, p, graph)


@pytest.mark.parametrize("reverse", [False, True], ids=["chain", "reversed-chain"])
def test_long_chain_matches_viterbi_and_forward_backward(reverse):
    n, K = 200, 3
    edges = torch.stack([torch.arange(n - 1), torch.arange(1, n)], 1)
    if reverse:  # stored as (i+1, i), in reverse order
        edges = edges.flip(0).flip(1)
    pot = feasible_random_potentials(Graph(n, edges), K, (2,), seed=21)
    pair = pot.pairwise.flip(-3).transpose(-1, -2) if reverse else pot.pairwise  # oriented (i, i+1)
    ref = chain_reference(pot.unary, pair)
    score, y = inf.tree_map(pot)
    torch.testing.assert_close(score, ref["score"], rtol=1e-10, atol=1e-9)
    assert torch.equal(y, ref["y"])
    torch.testing.assert_close(pot.score(y), score, rtol=1e-10, atol=1e-9)
    torch.testing.assert_close(inf.tree_logz(pot), ref["logz"], rtol=1e-10, atol=1e-9)
    mu, mu_pair = inf.tree_marginals(pot)
    torch.testing.assert_close(mu, ref["mu"], rtol=1e-7, atol=1e-10)
    ref_pair = ref["mu_pair"].flip(-3).transpose(-1, -2) if reverse else ref["mu_pair"]
    torch.testing.assert_close(mu_pair, ref_pair, rtol=1e-7, atol=1e-10)


def rooted_at_zero(n: int, edges: list[list[int]]) -> tuple[list[int], list[int], list[int]]:
    """BFS order from node 0, parent and parent edge of every node."""
    adj = [[] for _ in range(n)]
    for e, (a, b) in enumerate(edges):
        adj[a].append((b, e))
        adj[b].append((a, e))
    order, parent, parent_edge = [0], [-1] * n, [-1] * n
    for v in order:
        for u, e in adj[v]:
            if u != 0 and parent[u] == -1:
                parent[u], parent_edge[u] = v, e
                order.append(u)
    assert len(order) == n, "not a tree"
    return order, parent, parent_edge


def tree_reference(pot: Potentials) -> dict[str, torch.Tensor]:
    """Sequential two-pass belief propagation on a tree, one node at a time."""
    unary, pair = pot.expanded()
    edges = pot.graph.edges.tolist()
    n = pot.graph.num_nodes
    order, parent, pe = rooted_at_zero(n, edges)
    children = [[] for _ in range(n)]
    M = [None] * n  # M[v]: v's parent edge as (x_parent, x_v)
    for v in order[1:]:
        children[parent[v]].append(v)
        m = pair[..., pe[v], :, :]
        M[v] = m if edges[pe[v]][0] == parent[v] else m.transpose(-1, -2)
    out = {}
    for kind in ("max", "sum"):
        reduce = (lambda t, d: t.amax(d)) if kind == "max" else (lambda t, d: t.logsumexp(d))
        inside = [unary[..., v, :] for v in range(n)]  # unary + messages from the subtree
        msg = [None] * n
        for v in reversed(order[1:]):
            msg[v] = reduce(M[v] + inside[v][..., None, :], -1)
            inside[parent[v]] = inside[parent[v]] + msg[v]
        out[kind] = reduce(inside[0], -1)
        if kind == "max":
            y = [None] * n
            y[0] = inside[0].argmax(-1)
            for v in order[1:]:
                row = M[v].gather(-2, y[parent[v]][..., None, None].expand(*y[0].shape, 1, M[v].shape[-1]))
                y[v] = (row[..., 0, :] + inside[v]).argmax(-1)
            out["y"] = torch.stack(y, -1)
            continue
        logz = out["sum"]
        outside = [torch.zeros_like(inside[0]) for _ in range(n)]
        mu = [None] * n
        mu_pair = [None] * len(edges)
        mu[0] = (inside[0] - logz[..., None]).exp()
        for v in order[1:]:
            p = parent[v]
            ctx = unary[..., p, :] + outside[p] + sum((msg[c] for c in children[p] if c != v), 0.0)
            outside[v] = (ctx[..., :, None] + M[v]).logsumexp(-2)
            mu[v] = (inside[v] + outside[v] - logz[..., None]).exp()
            joint = (ctx[..., :, None] + M[v] + inside[v][..., None, :] - logz[..., None, None]).exp()
            mu_pair[pe[v]] = joint if edges[pe[v]][0] == p else joint.transpose(-1, -2)
        out["mu"], out["mu_pair"] = torch.stack(mu, -2), torch.stack(mu_pair, -3)
    return out


def big_tree(n: int, seed: int, deep: bool) -> Graph:
    """Random attachment (deep=False) or attachment to one of the 3 newest nodes (deep=True, depth ~ n/2),
    randomly relabelled, random edge orientation."""
    gen = torch.Generator().manual_seed(seed)
    edges = []
    for i in range(1, n):
        low = max(0, i - 3) if deep else 0
        edges.append([int(torch.randint(low, i, (1,), generator=gen)), i])
    label = torch.randperm(n, generator=gen)
    e = label[torch.tensor(edges)]
    flip = torch.rand(n - 1, generator=gen) < 0.5
    return Graph(n, torch.where(flip[:, None], e.flip(1), e))


@pytest.mark.parametrize("deep", [False, True], ids=["random-tree", "deep-tree"])
def test_big_tree_matches_sequential_reference(deep):
    pot = feasible_random_potentials(big_tree(300, seed=5, deep=deep), 3, (2,), seed=8)
    ref = tree_reference(pot)
    score, y = inf.tree_map(pot)
    torch.testing.assert_close(score, ref["max"], rtol=1e-10, atol=1e-9)
    torch.testing.assert_close(pot.score(y), ref["max"], rtol=1e-10, atol=1e-9)
    assert torch.equal(y, ref["y"])
    torch.testing.assert_close(inf.tree_logz(pot), ref["sum"], rtol=1e-10, atol=1e-9)
    mu, mu_pair = inf.tree_marginals(pot)
    torch.testing.assert_close(mu, ref["mu"], rtol=1e-7, atol=1e-10)
    torch.testing.assert_close(mu_pair, ref["mu_pair"], rtol=1e-7, atol=1e-10)


def test_tree_reference_matches_brute_force():
    """The sequential reference itself agrees with enumeration on a small tree."""
    pot = feasible_random_potentials(big_tree(7, seed=1, deep=False), 3, (2,), seed=3)
    ref = tree_reference(pot)
    torch.testing.assert_close(ref["sum"], inf.brute_force_logz(pot))
    torch.testing.assert_close(ref["max"], inf.brute_force_map(pot)[0])
    torch.testing.assert_close(pot.score(ref["y"]), ref["max"])
    mu, mu_pair = inf.brute_force_marginals(pot)
    torch.testing.assert_close(ref["mu"], mu)
    torch.testing.assert_close(ref["mu_pair"], mu_pair)
    chain = feasible_random_potentials(Graph.chain(6), 2, (3,), seed=4)
    ref = chain_reference(chain.unary, chain.pairwise)
    torch.testing.assert_close(ref["logz"], inf.brute_force_logz(chain))
    torch.testing.assert_close(ref["score"], inf.brute_force_map(chain)[0])
    torch.testing.assert_close(ref["mu_pair"], inf.brute_force_marginals(chain)[1])


# ---------------------------------------------------------------------- brute force itself
def test_all_assignments_order():
    ys = all_assignments(3, 2)
    assert ys.tolist() == [[a, b, c] for a in range(2) for b in range(2) for c in range(2)]
    assert torch.equal(assignment_index(ys, 2), torch.arange(8))


def test_brute_force_on_a_hand_computed_model():
    unary = torch.tensor([[0.0, 1.0], [2.0, 0.0]], dtype=torch.float64)
    pair = torch.tensor([[[0.0, 3.0], [0.0, 0.0]]], dtype=torch.float64)  # y0 = 0, y1 = 1 gets +3
    pot = Potentials(unary, pair, Graph(2, [[0, 1]]))
    scores = torch.tensor([2.0, 3.0, 3.0, 1.0], dtype=torch.float64)  # 00, 01, 10, 11
    torch.testing.assert_close(inf.brute_force_logz(pot), scores.logsumexp(0))
    score, y = inf.brute_force_map(pot)
    assert score.item() == 3.0 and y.tolist() == [0, 1]  # ties: lowest index wins
    p = scores.softmax(0)
    mu, mu_pair = inf.brute_force_marginals(pot)
    torch.testing.assert_close(mu[0], torch.stack([p[0] + p[1], p[2] + p[3]]))
    torch.testing.assert_close(mu_pair[0], p.reshape(2, 2))


# ---------------------------------------------------------------------- bad input
TREE_OPS = {
    "tree_map": inf.tree_map,
    "tree_logz": inf.tree_logz,
    "tree_marginals": inf.tree_marginals,
    "tree_sample": lambda pot: inf.tree_sample(pot, 3),
}


@pytest.mark.parametrize("op", list(TREE_OPS))
@pytest.mark.parametrize("graph", [Graph(3, [[0, 1], [1, 2], [2, 0]]), Graph.grid(2, 3), Graph.complete(4),
                                   Graph(4, torch.tensor([[[0, 1], [1, 2], [2, 3]], [[0, 1], [1, 2], [2, 0]]]))],
                         ids=["triangle", "grid", "complete", "ensemble-with-cycle"])
def test_tree_ops_reject_graphs_with_cycles(op, graph):
    pot = make_potentials(graph, 2)
    with pytest.raises(ValueError, match=rf"{op} needs a tree or forest.*cycle"):
        TREE_OPS[op](pot)


@pytest.mark.parametrize("op", list(TREE_OPS))
def test_tree_ops_reject_non_potentials(op):
    with pytest.raises(TypeError, match=rf"{op} expects a structtorch.Potentials"):
        TREE_OPS[op]((torch.zeros(3, 2), torch.zeros(2, 2, 2)))


@pytest.mark.parametrize("num_samples", [0, -5, 2.5, True, "10"])
def test_tree_sample_rejects_bad_num_samples(num_samples):
    pot = make_potentials(Graph.chain(3), 2)
    with pytest.raises(ValueError, match="num_samples must be a positive int"):
        inf.tree_sample(pot, num_samples)


def test_tree_sample_rejects_impossible_rows():
    pot = make_potentials(Graph.chain(3), 2, (2,))
    unary = pot.unary.clone()
    unary[1, 2] = NEG_INF
    with pytest.raises(ValueError, match="no possible assignment"):
        inf.tree_sample(Potentials(unary, pot.pairwise, pot.graph), 5)


@pytest.mark.parametrize("op", [inf.brute_force_map, inf.brute_force_logz, inf.brute_force_marginals,
                                lambda pot: inf.brute_force_kbest(pot, 2)])
@pytest.mark.parametrize("n,K", [(21, 2), (11, 4), (13, 3)])
def test_brute_force_rejects_too_many_assignments(op, n, K):
    pot = make_potentials(Graph.chain(n), K)
    with pytest.raises(ValueError, match=rf"K\*\*n <= 2\*\*20.*K={K}, n={n}"):
        op(pot)


def test_brute_force_at_the_size_limit_works():
    pot = make_potentials(Graph.chain(10), 4, dtype=torch.float32)  # 4**10 == 2**20 assignments
    torch.testing.assert_close(inf.brute_force_logz(pot), inf.tree_logz(pot), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("k", [0, -1, 1.5])
def test_brute_force_kbest_rejects_bad_k(k):
    with pytest.raises(ValueError, match="k must be a positive int"):
        inf.brute_force_kbest(make_potentials(Graph.chain(3), 2), k)


# ---------------------------------------------------------------------- device
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@settings(max_examples=15, deadline=None)
@given(st.one_of(potentials(), ensemble_potentials()))
def test_cuda_matches_cpu(pot):
    gpu = pot.to("cuda")
    s_cpu, y_cpu = inf.tree_map(pot)
    s_gpu, y_gpu = inf.tree_map(gpu)
    assert s_gpu.device.type == "cuda" and y_gpu.device.type == "cuda"
    torch.testing.assert_close(s_gpu.cpu(), s_cpu)
    if pot.graph.is_ensemble:
        torch.testing.assert_close(ensemble_member_scores(pot, y_gpu.cpu()), s_cpu)
    else:
        torch.testing.assert_close(pot.score(y_gpu.cpu()), s_cpu)
    torch.testing.assert_close(inf.tree_logz(gpu).cpu(), inf.tree_logz(pot))
    for a, b in zip(inf.tree_marginals(gpu), inf.tree_marginals(pot)):
        torch.testing.assert_close(a.cpu(), b)
    if torch.isfinite(inf.tree_logz(pot)).all():
        ys = inf.tree_sample(gpu, 4, generator=torch.Generator("cuda").manual_seed(0))  # [4, *B, (T,) n]
        scores = ensemble_member_scores(gpu, ys) if pot.graph.is_ensemble else gpu.score(ys)
        assert ys.device.type == "cuda" and torch.isfinite(scores).all()


# ---------------------------------------------------------------------- both schedules are exact
@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_forced_schedule_matches_brute_force(monkeypatch, compress, seed):
    """Rake+compress and rake-only schedules (chosen by a cost model at run time) are both exact."""
    import structtorch.inference.tree as tree_mod

    monkeypatch.setattr(tree_mod, "cheapest_schedule", lambda g, B, K, d: g.schedule(d, compress=compress))
    gen = torch.Generator().manual_seed(seed)
    n = 7
    parent = [int(torch.randint(0, i, (), generator=gen)) for i in range(1, n)]
    g = Graph(n, torch.tensor([[p, i + 1] for i, p in enumerate(parent)]))
    unary = torch.randn(3, n, 3, generator=gen, dtype=torch.float64)
    pair = torch.randn(3, n - 1, 3, 3, generator=gen, dtype=torch.float64)
    unary[0, 2, 1] = float("-inf")
    pot = Potentials(unary, pair, g)
    score, y = inf.tree_map(pot)
    torch.testing.assert_close(score, inf.brute_force_map(pot)[0])
    torch.testing.assert_close(pot.score(y), score)
    torch.testing.assert_close(inf.tree_logz(pot), inf.brute_force_logz(pot))
    for got, want in zip(inf.tree_marginals(pot), inf.brute_force_marginals(pot)):
        torch.testing.assert_close(got, want)


def test_cost_model_prefers_levels_for_large_batches_and_states():
    """Large B*K favours the O(n K^2) rake-only schedule; small batches the O(log n)-step contraction."""
    from structtorch.inference.tree import cheapest_schedule

    g = Graph.chain(512)
    cpu = torch.device("cpu")
    assert cheapest_schedule(g, 1, 2, cpu) is g.schedule(cpu, compress=True)
    assert cheapest_schedule(g, 1024, 8, cpu) is g.schedule(cpu, compress=False)


# ---------------------------------------------------------------------- empty batches and odd sizes
EMPTY_GRAPHS = {
    "path": Graph.chain(5),  # the compress steps of a path
    "star": Graph.star(4),
    "forest": Graph(5, [[0, 1], [3, 4]]),
    "no-edges": Graph.empty(3),
    "ensemble": Graph(4, torch.tensor([[[0, 1], [1, 2], [2, 3]], [[0, 3], [1, 3], [2, 3]]])),
}


@pytest.mark.parametrize("batch", [(0,), (2, 0)])
@pytest.mark.parametrize("name", list(EMPTY_GRAPHS))
@pytest.mark.parametrize("dtype", BOTH_DTYPES)
def test_tree_ops_on_an_empty_batch_give_empty_outputs(name, batch, dtype):
    """A filtered-out batch is legitimate: every op returns empty outputs of the right shape and dtype."""
    g = EMPTY_GRAPHS[name]
    pot = make_potentials(g, 3, batch, dtype)
    lead, n, E = (*batch, 2) if g.is_ensemble else batch, g.num_nodes, g.num_edges
    score, y = inf.tree_map(pot)
    assert (score.shape, score.dtype, y.shape, y.dtype) == (lead, dtype, (*lead, n), torch.long)
    logz = inf.tree_logz(pot)
    assert (logz.shape, logz.dtype) == (lead, dtype)
    mu, mu_pair = inf.tree_marginals(pot)
    assert (mu.shape, mu_pair.shape, mu.dtype) == ((*lead, n, 3), (*lead, E, 3, 3), dtype)
    ys = inf.tree_sample(pot, 4)
    assert (ys.shape, ys.dtype) == ((4, *lead, n), torch.long)


def test_empty_batch_gradients_are_empty():
    unary = torch.zeros(0, 5, 2, dtype=torch.float64, requires_grad=True)
    pot = Potentials(unary, torch.zeros(0, 4, 2, 2, dtype=torch.float64), Graph.chain(5))
    (inf.tree_logz(pot).sum() + inf.tree_map(pot)[0].sum()).backward()
    assert unary.grad.shape == (0, 5, 2)


def test_tree_sample_with_one_state_and_one_node():
    pot = make_potentials(Graph.chain(4), 1, (2,))
    assert torch.equal(inf.tree_sample(pot, 3), torch.zeros(3, 2, 4, dtype=torch.long))
    single = make_potentials(Graph.empty(1), 3, (2,), seed=1)
    ys = inf.tree_sample(single, 500, generator=torch.Generator().manual_seed(0))
    assert ys.shape == (500, 2, 1) and set(ys.unique().tolist()) <= {0, 1, 2}


@pytest.mark.parametrize("fn", [inf.brute_force_map, inf.brute_force_logz, inf.brute_force_marginals,
                                lambda pot: inf.brute_force_kbest(pot, 2)])
def test_brute_force_rejects_non_potentials(fn):
    with pytest.raises(TypeError, match="brute force inference expects a structtorch.Potentials, got tuple"):
        fn((torch.zeros(3, 2), torch.zeros(2, 2, 2)))


@pytest.mark.parametrize("batch", [(0,), (3, 0)])
def test_brute_force_on_an_empty_batch(batch):
    pot = make_potentials(Graph.chain(3), 2, batch)
    assert inf.brute_force_map(pot)[1].shape == (*batch, 3)
    assert inf.brute_force_logz(pot).shape == batch
    assert inf.brute_force_kbest(pot, 2)[1].shape == (*batch, 2, 3)


# ---------------------------------------------------------------------- max-marginals
@settings(max_examples=60, deadline=None)
@given(pot=st.one_of(potentials(), ensemble_potentials()))
def test_tree_max_marginals_equal_enumeration(pot):
    """max over assignments with y_i = a, for every node and state (ensembles: per tree), -inf where impossible."""
    mm = inf.tree_max_marginals(pot)
    ref = brute_force_max_marginals(pot)
    assert mm.shape == ref.shape
    assert_same_values(mm, ref, pot.dtype)


# ---------------------------------------------------------------------- the compiled passes (backend "compile")
# Every test of the compiled passes runs on one xdist worker (``--dist loadgroup``): inductor's start-up is paid
# once, and a schedule's compiled programs (kept with the schedule) serve every test on the same graph and shapes.
COMPILE_GROUP = pytest.mark.xdist_group("compile")


@pytest.fixture
def compiled():
    """tree_map / tree_logz / tree_marginals through torch.compile; failing loudly rather than falling back to
    eager when dynamo's recompile limit is hit (every schedule here compiles its own program)."""
    import torch._dynamo

    with inf.backend("compile"), torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True):
        yield


COMPILE_GRAPHS = {
    "chain": (Graph.chain(8), torch.float64),
    "chain-float32": (Graph.chain(8), torch.float32),
    "star": (Graph.star(6), torch.float64),
    "forest": (Graph(7, [[0, 1], [2, 1], [1, 3], [5, 6]]), torch.float64),
    "ensemble": (ENSEMBLE, torch.float64),
}


@COMPILE_GROUP
@pytest.mark.parametrize("name", list(COMPILE_GRAPHS))
def test_compiled_passes_match_brute_force(compiled, name):
    graph, dtype = COMPILE_GRAPHS[name]
    check_against_brute_force(make_potentials(graph, 3, (2,), dtype, seed=5, inf_prob=0.2))


@COMPILE_GROUP
def test_compiled_logz_gradcheck(compiled):
    g = GRADCHECK_GRAPHS["chain"]
    pot = make_potentials(g, 3, (2,), torch.float64, seed=7)
    unary, pair = (t.detach().clone().requires_grad_() for t in (pot.unary, pot.pairwise))
    assert torch.autograd.gradcheck(lambda u, p: inf.tree_logz(Potentials(u, p, g)), (unary, pair))


@COMPILE_GROUP
def test_compiled_equals_eager_with_impossible_rows(compiled):
    # the graph, K, batch shape and dtype of COMPILE_GRAPHS["chain"]: on the worker that ran that case, the passes'
    # programs are compiled already (kept with the schedule) and run here on other potentials
    graph, dtype = COMPILE_GRAPHS["chain"]
    pot = make_potentials(graph, 3, (2,), dtype, seed=11, inf_prob=0.3)
    unary = pot.unary.clone()
    unary[0] = NEG_INF  # a row with no possible assignment
    pot = Potentials(unary, pot.pairwise, pot.graph)
    outs = []
    for name in ("compile", "eager"):
        with inf.backend(name):
            outs.append((*inf.tree_map(pot), inf.tree_logz(pot), *inf.tree_marginals(pot),
                         inf.tree_max_marginals(pot)))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert_no_nan(*outs[0])


def test_a_pass_that_torch_cannot_compile_runs_eagerly_with_one_warning(monkeypatch):
    """torch 2.11's inductor generated C++ that did not build on an AVX-512 CPU: the pass falls back to eager."""

    class Failed(torch._dynamo.exc.BackendCompilerFailed):
        def __init__(self) -> None:
            RuntimeError.__init__(self, "CppCompileError: C++ compile error\n(the compiler's output)")

    def broken_compile(fn, **kwargs):
        def run(*tensors):
            raise Failed()
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    pot = make_potentials(Graph.chain(7), 3, (4,), torch.float64, seed=2)
    with inf.backend("compile"), pytest.warns(RuntimeWarning, match="torch.compile failed on _logz_pass"):
        logz = inf.tree_logz(pot)
    torch.testing.assert_close(logz, inf.tree_logz(pot))
    with inf.backend("compile"), warnings.catch_warnings():
        warnings.simplefilter("error")  # once per schedule and pass: the second call runs eagerly, silently
        torch.testing.assert_close(inf.tree_logz(pot), logz)


@COMPILE_GROUP
def test_compiled_programs_live_with_their_schedule(compiled):
    """A pass compiles once per schedule and is kept on the schedule (freed with its graph): no global cache."""
    g = Graph.chain(6)
    pot = make_potentials(g, 2, (3,), torch.float64, seed=1)
    inf.tree_logz(pot)
    sched = next(s for s in (g.schedule("cpu", compress=c) for c in (True, False)) if s.memo)
    assert list(sched.memo) == [("compiled", "_logz_pass")]
    program = sched.memo[("compiled", "_logz_pass")]
    inf.tree_logz(pot)
    assert sched.memo[("compiled", "_logz_pass")] is program


# ---------------------------------------------------------------------- the fused CPU kernels (backend "fused")
@settings(max_examples=100, deadline=None)
@given(pot=st.one_of(potentials(graphs(forest=True), dtypes=BOTH_DTYPES), ensemble_potentials()))
def test_fused_passes_match_brute_force(fused_kernels, pot):
    """MAP, log Z, marginals and max-marginals of the fused kernels on random forests and ensembles
    (-inf entries, ties, empty batches) against enumeration."""
    check_against_brute_force(pot)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("graph", "K"), [(Graph(1, []), 3), (Graph.empty(4), 3), (Graph.chain(40), 3),
                                          (Graph.star(9), 3), (Graph.chain(40), 20)],
                         ids=["single-node", "isolated", "long-chain", "star", "long-chain-K20"])
def test_fused_equals_eager(fused_kernels, graph, K, threads):
    """The fused kernels give the eager passes' values over a batch of several chunks (600 rows; at K = 20 the
    chunks shrink to 4 rows to stay in cache), split over one or two threads, with impossible rows; MAP
    assignments score the MAP value."""
    pot = make_potentials(graph, K, (600,), torch.float64, seed=3, inf_prob=0.1)
    unary = pot.unary.clone()
    unary[0] = NEG_INF  # a row with no possible assignment
    pot = Potentials(unary, pot.pairwise, pot.graph)
    outs = []
    default_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for name in ("fused", "eager"):
            with inf.backend(name):
                outs.append((inf.tree_map(pot)[0], inf.tree_logz(pot), *inf.tree_marginals(pot),
                             inf.tree_max_marginals(pot)))
    finally:
        torch.set_num_threads(default_threads)
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    score, y = inf.tree_map(pot)
    torch.testing.assert_close(pot.score(y)[1:], score[1:])
    assert_no_nan(*outs[0])


def test_fused_logz_gradcheck(fused_kernels):
    g = GRADCHECK_GRAPHS["chain"]
    pot = make_potentials(g, 3, (2,), torch.float64, seed=7)
    unary, pair = (t.detach().clone().requires_grad_() for t in (pot.unary, pot.pairwise))
    assert torch.autograd.gradcheck(lambda u, p: inf.tree_logz(Potentials(u, p, g)), (unary, pair))


@pytest.mark.parametrize("value", ["Fused", True, None])
def test_unknown_backend_is_refused(value):
    before = inf.current_backend()
    with pytest.raises(ValueError, match="backend must be one of eager, compile, fused"):
        with inf.backend(value):
            pass
    with pytest.raises(ValueError, match="backend must be one of eager, compile, fused"):
        inf.set_backend(value)
    assert inf.current_backend() == before


def test_backend_blocks_nest_and_restore_on_error(fused_kernels):
    """A block's backend holds inside it and the enclosing one comes back when it exits, on an error too; the
    process default is what code outside every block sees."""
    assert inf.current_backend() == "fused"
    with pytest.raises(KeyError):
        with inf.backend("eager"):
            assert inf.current_backend() == "eager"
            raise KeyError("stop")
    assert inf.current_backend() == "fused"


def test_a_thread_does_not_see_another_threads_backend(fused_kernels):
    seen = []
    worker = threading.Thread(target=lambda: seen.append(inf.current_backend()))
    worker.start()
    worker.join()
    assert seen == ["eager"] and inf.current_backend() == "fused"


def test_a_failed_build_is_reported_and_changes_no_backend(monkeypatch):
    """Without a working compiler, backend("fused") raises a RuntimeError that says so and nothing changes."""
    import torch.utils.cpp_extension

    from structtorch.inference import fused

    def no_compiler(*args, **kwargs):
        raise OSError("c++: command not found")

    monkeypatch.setitem(fused._BUILT, "module", None)
    monkeypatch.setitem(fused._BUILT, "error", None)  # the failure this test provokes is forgotten after it
    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    monkeypatch.setattr(fused, "_load_built", lambda folder: None)  # nothing built on this machine
    with pytest.raises(RuntimeError, match="building the fused CPU kernels .* failed"):
        with inf.backend("fused"):
            pass
    before = inf.current_backend()
    with pytest.raises(RuntimeError, match="building the fused CPU kernels .* failed"):
        inf.set_backend("fused")
    assert inf.current_backend() == before


@pytest.mark.parametrize("dtype", BOTH_DTYPES)
@pytest.mark.parametrize("K", [2, 5])
def test_fused_sum_pass_folds_its_scales(fused_kernels, dtype, K):
    """Uniform potentials on a chain of 300: every message sums K equal terms, so the sum pass's scale grows
    by K per node and is folded back into the log domain many times; log Z = n log K and the marginals are
    uniform, exactly."""
    n, B = 300, 3
    pot = Potentials(torch.zeros(B, n, K, dtype=dtype), torch.zeros(B, n - 1, K, K, dtype=dtype), Graph.chain(n))
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(inf.tree_logz(pot), torch.full((B,), n * math.log(K), dtype=dtype), **tol)
    mu, mu_pair = inf.tree_marginals(pot)
    torch.testing.assert_close(mu, torch.full_like(mu, 1 / K), **tol)
    torch.testing.assert_close(mu_pair, torch.full_like(mu_pair, 1 / K**2), **tol)


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path):
    """torch's loader takes the build lock on every load: one left by a killed process made later runs wait forever
    (fused=auto); a lock older than STALE_LOCK_SECONDS is removed with a warning, a fresh one (a build under way)
    is kept."""
    import os
    import time

    from structtorch.inference import fused

    lock = tmp_path / "lock"
    lock.touch()
    fused._clear_stale_lock(lock)
    assert lock.exists()
    old = time.time() - fused.STALE_LOCK_SECONDS - 60
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="stale build lock"):
        fused._clear_stale_lock(lock)
    assert not lock.exists()


def test_an_up_to_date_build_loads_without_the_build_lock(tmp_path):
    """A lock left by a process killed while loading (torch's loader takes it on every load) no longer stalls the
    next run: the kernels built from today's sources load without it. The load runs in a fresh process against a
    copy of the build folder; torch's loader would wait on the lock forever."""
    import os
    import shutil
    import subprocess
    import sys

    from structtorch.inference import fused

    if not fused.built():
        pytest.skip("the fused kernels are not built on this machine")
    fused.kernels()  # writes sources.sha1 beside a build from before it existed
    copy = tmp_path / fused.build_directory().name
    shutil.copytree(fused.build_directory(), copy)
    (copy / "lock").touch()  # fresh: _clear_stale_lock keeps it
    code = "from structtorch.inference import fused; fused.kernels(); print(fused.build_directory())"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(copy) and (copy / "lock").exists()
